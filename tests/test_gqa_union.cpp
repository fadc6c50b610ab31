// tests/test_gqa_union.cpp — spec §10, crisp::gqa_union: every head of a GQA group gets the union of
// the group's layouts, row by row (hand-checked case), and on a real crisp plan the union is a
// superset of every member, well formed, identical within a group, and at least as dense.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "crisp/crisp.h"
#include "crisp/error.h"
#include "crisp/workload.h"
#include "test_util.h"

namespace {

crisp::HeadPlan head_with_rows(const std::vector<std::vector<int32_t>>& rows) {
  crisp::HeadPlan h;
  h.route = crisp::Route::vs;
  h.vertical = {0};  // the anchors (check_well_formed wants them)
  h.slash = {0};
  h.row_ptr = {0};
  for (const auto& r : rows) {
    h.col.insert(h.col.end(), r.begin(), r.end());
    h.row_ptr.push_back(static_cast<int32_t>(h.col.size()));
  }
  h.density = static_cast<double>(h.col.size()) / (rows.size() * (rows.size() + 1) / 2);
  return h;
}

TEST(GqaUnion, EachGroupRunsTheUnionOfItsRows) {
  // 4 query heads, 2 kv heads (groups {0, 1} and {2, 3}), one sequence of N = 5 blocks; every row
  // holds its anchors (0, r and, for slash 0's exact cover, r - 1).
  crisp::Plan plan = crisp::dense_plan(4, 2, 64, {0, 640}, 128);
  auto& heads = plan.sequences[0].heads;
  heads[0] = head_with_rows({{0}, {0, 1}, {0, 1, 2}, {0, 2, 3}, {0, 3, 4}});
  heads[1] = head_with_rows({{0}, {0, 1}, {0, 1, 2}, {0, 1, 2, 3}, {0, 1, 3, 4}});
  heads[2] = heads[0];
  heads[3] = heads[0];
  const crisp::Plan u = crisp::gqa_union(plan);
  u.check_well_formed();
  const std::vector<int32_t> group0_ptr = {0, 1, 3, 6, 10, 14};
  const std::vector<int32_t> group0_col = {0, 0, 1, 0, 1, 2, 0, 1, 2, 3, 0, 1, 3, 4};
  for (int h : {0, 1}) {
    EXPECT_EQ(u.sequences[0].heads[h].row_ptr, group0_ptr) << "head " << h;
    EXPECT_EQ(u.sequences[0].heads[h].col, group0_col) << "head " << h;
    EXPECT_DOUBLE_EQ(u.sequences[0].heads[h].density, 14.0 / 15.0);
  }
  for (int h : {2, 3}) {
    EXPECT_EQ(u.sequences[0].heads[h].col, heads[0].col) << "head " << h;
    EXPECT_DOUBLE_EQ(u.sequences[0].heads[h].density, 12.0 / 15.0);
  }
  EXPECT_DOUBLE_EQ(u.density(), (14.0 + 14.0 + 12.0 + 12.0) / 60.0);
  // Route and VS choices stay the head's own.
  EXPECT_EQ(u.sequences[0].heads[1].route, crisp::Route::vs);
}

TEST(GqaUnion, CrispPlanUnionIsASupersetPerGroup) {
  const int64_t Hq = 8, Hkv = 2, d = 64;
  crisp::WorkloadSpec spec = crisp_test::workload_spec(Hq, Hkv, d, {1500, 2600}, 31);
  crisp::Workload w = crisp::make_workload(spec);
  const auto q = crisp::TensorView::contiguous(w.q.data(), crisp::DType::f32, Hq, w.total_tokens, d);
  const auto k = crisp::TensorView::contiguous(w.k.data(), crisp::DType::f32, Hkv, w.total_tokens, d);
  crisp::Config cfg = crisp::Config::from_preset("crisp");
  const crisp::Plan plan = crisp::plan(q, k, cfg, w.cu_seqlens);
  const crisp::Plan u = crisp::gqa_union(plan);
  u.check_well_formed();
  EXPECT_GE(u.density(), plan.density());
  for (std::size_t s = 0; s < plan.sequences.size(); ++s) {
    const auto& seq = plan.sequences[s];
    for (int32_t r = 0; r < seq.num_blocks; ++r) {
      for (int64_t h = 0; h < Hq; ++h) {
        const auto& own = seq.heads[h];
        const auto& un = u.sequences[s].heads[h];
        const auto& first = u.sequences[s].heads[(h / (Hq / Hkv)) * (Hq / Hkv)];
        EXPECT_TRUE(std::includes(un.col.begin() + un.row_ptr[r], un.col.begin() + un.row_ptr[r + 1],
                                  own.col.begin() + own.row_ptr[r], own.col.begin() + own.row_ptr[r + 1]))
            << "sequence " << s << ", head " << h << ", row " << r;
        EXPECT_EQ(un.col, first.col);
      }
    }
  }
}

// gqa_union on a bad plan: a crisp::Error naming "plan", never a crash.
void expect_plan_error(const crisp::Plan& plan) {
  try {
    crisp::gqa_union(plan);
    ADD_FAILURE() << "no error";
  } catch (const crisp::Error& e) {
    EXPECT_EQ(e.argument(), "plan") << e.what();
  }
}

// A batch of chunks (spec §11): the union keeps the rows before first_row empty and its density
// is over the chunk's rows, so it stays a well-formed plan (it failed check_well_formed before).
TEST(GqaUnion, UnionOfChunksIsWellFormed) {
  crisp::Batch chunks;
  chunks.cu_seqlens_q = {0, 1, 301};
  chunks.cu_seqlens_k = {0, 1000, 2300};
  crisp::Plan plan = crisp::dense_plan(4, 2, 64, chunks, 128);
  // Head 1 of each sequence drops the blocks between the anchors of its rows: the union is head 0's.
  for (auto& seq : plan.sequences) {
    crisp::HeadPlan& sparse = seq.heads[1];
    sparse.route = crisp::Route::vs;
    sparse.vertical = {0};
    sparse.slash = {0};
    sparse.row_ptr = {0};
    sparse.col.clear();
    for (int32_t r = 0; r < seq.num_blocks; ++r) {
      if (r >= seq.first_row)
        for (int32_t c = 0; c <= r; ++c)
          if (c == 0 || c >= r - 1) sparse.col.push_back(c);
      sparse.row_ptr.push_back(static_cast<int32_t>(sparse.col.size()));
    }
    sparse.density = static_cast<double>(sparse.col.size()) /
                     static_cast<double>(seq.num_blocks * (seq.num_blocks + 1) / 2 -
                                         seq.first_row * (seq.first_row + 1) / 2);
  }
  plan.check_well_formed();
  const crisp::Plan u = crisp::gqa_union(plan);
  EXPECT_NO_THROW(u.check_well_formed());
  for (std::size_t s = 0; s < u.sequences.size(); ++s)
    for (int64_t h = 0; h < 4; ++h) {
      EXPECT_EQ(u.sequences[s].heads[h].col, plan.sequences[s].heads[h - h % 2].col) << s << "/" << h;
      EXPECT_DOUBLE_EQ(u.sequences[s].heads[h].density, 1.0) << s << "/" << h;  // the dense head's rows
    }
}

TEST(GqaUnion, KvHeadsThatDoNotDivideAreAnError) {
  crisp::Plan plan = crisp::dense_plan(4, 2, 64, {0, 256}, 128);
  plan.num_kv_heads = 3;
  expect_plan_error(plan);
}

// A plan whose CSR arrays are inconsistent is refused before any row is read (no out-of-bounds
// read).
TEST(GqaUnion, MalformedPlanIsAnError) {
  crisp::Plan plan = crisp::dense_plan(4, 2, 64, {0, 640}, 128);
  plan.sequences[0].heads[1].row_ptr.resize(3);  // N = 5 needs 6 entries
  expect_plan_error(plan);
}

}  // namespace
