// tests/test_plan_layout.cpp — index helpers of src/plan/plan_layout.h that the CUDA planner uses
// on the device, checked here on the host (they are the same CRISP_HD functions).
#include <gtest/gtest.h>

#include <cstdint>

#include "plan/plan_layout.h"

namespace {

// Every tile of the triangle decodes to its (row, column), in order, up to 4096 x 4096 tiles
// (N = 262144 key blocks at the PE logits' 64-block tiles, far beyond any sequence).
TEST(PlanLayout, TriangleTilesDecodeRowByRow) {
  for (const int64_t tiles : {1, 2, 3, 16, 17, 64, 1000, 4096}) {
    int64_t t = 0;
    for (int32_t row = 0; row < tiles; ++row)
      for (int32_t col = 0; col <= row; ++col, ++t) {
        int32_t r = -1, c = -1;
        crisp::layout::triangle_tile(t, r, c);
        ASSERT_EQ(r, row) << "tile " << t << " of " << tiles;
        ASSERT_EQ(c, col) << "tile " << t << " of " << tiles;
      }
    EXPECT_EQ(t, crisp::layout::triangle_tiles(tiles));
  }
}

// Near 2^31 tiles (where the square root's rounding matters most): boundaries of rows decode to
// column 0 and the tile before each to the previous row's last column.
TEST(PlanLayout, TriangleTilesDecodeAtLargeIndices) {
  for (int64_t row = 65000; row < 65600; ++row) {
    const int64_t first = crisp::layout::triangle_tiles(row);
    int32_t r = -1, c = -1;
    crisp::layout::triangle_tile(first, r, c);
    EXPECT_EQ(r, row);
    EXPECT_EQ(c, 0);
    crisp::layout::triangle_tile(first - 1, r, c);
    EXPECT_EQ(r, row - 1);
    EXPECT_EQ(c, row - 1);
  }
}

// The correction of the square root's estimate: from estimates off by up to 3 rows either way
// (the square root itself is exact at every boundary tested above, so this is where the
// correction is exercised), every tile of the first 200 rows and of rows near 65000 finds its row.
TEST(PlanLayout, TriangleRowCorrectsAnEstimateEitherWay) {
  for (const int64_t first_row : {int64_t{0}, int64_t{65000}}) {
    for (int64_t row = first_row; row < first_row + 200; ++row) {
      const int64_t begin = crisp::layout::triangle_tiles(row);
      for (const int64_t t : {begin, begin + row / 2, begin + row}) {
        for (int64_t off = -3; off <= 3; ++off)
          ASSERT_EQ(crisp::layout::triangle_row_from(t, row + off), row) << "tile " << t << ", estimate off by " << off;
      }
    }
  }
}

}  // namespace
