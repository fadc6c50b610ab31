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

}  // namespace
