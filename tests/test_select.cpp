// tests/test_select.cpp — the shared selection pipeline of src/plan/select.h on hand-checkable
// cases: the per-side order anchor -> VS rule -> min_budget -> max_budget over a plain serial
// primitives policy, and the ordered walks, whose bucket form (what the device's radix select
// asks of a digit bucket and its ties) must keep exactly what the entry-by-entry walk keeps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "plan/plan_params.h"
#include "plan/select.h"
#include "test_util.h"

namespace {

using crisp::PlanParams;
namespace select = crisp::select;

// The simplest primitives policy: serial loops over one side's pooled mass, with the token walk
// over `tokens` in rank order.
struct SerialSide {
  std::vector<double> pooled, tokens;
  int32_t block = 1;
  std::vector<char> flags = std::vector<char>(pooled.size(), 0);

  std::vector<int32_t> rank_order() const {
    std::vector<int32_t> order(pooled.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return crisp::rules::ranks_before(pooled[a], a, pooled[b], b);
    });
    return order;
  }
  int32_t kept() const { return static_cast<int32_t>(std::count(flags.begin(), flags.end(), char(1))); }

  int32_t num_blocks() const { return static_cast<int32_t>(pooled.size()); }
  double mass(int32_t b) const { return pooled[b]; }
  double sum_mass(int32_t first, int32_t last) const {
    return std::accumulate(pooled.begin() + first, pooled.begin() + last + 1, 0.0);
  }
  template <typename Pred>
  void keep_where(Pred pred) {
    for (size_t b = 0; b < flags.size(); ++b) flags[b] = flags[b] || pred(static_cast<int32_t>(b));
  }
  void add_in_rank_order(int32_t target) {
    for (int32_t b : rank_order())
      if (kept() < target) flags[b] = 1;
  }
  void trim_in_rank_order(int32_t limit) {
    std::vector<char> out(flags.size(), 0);
    out[0] = 1;
    int32_t count = 1;
    for (int32_t b : rank_order())
      if (flags[b] && !out[b] && count < limit) {
        out[b] = 1;
        ++count;
      }
    if (kept() > limit) flags = out;
  }
  int64_t walk_tokens(const select::TokenWalk& walk, bool mark_blocks) {
    std::vector<int64_t> order(tokens.size() - static_cast<size_t>(walk.first));
    std::iota(order.begin(), order.end(), walk.first);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return crisp::rules::ranks_before(tokens[a], a, tokens[b], b);
    });
    double running = 0.0;
    int64_t count = 0;
    for (int64_t t : order) {
      if (!select::walk_keeps(walk.rule, running, count, tokens[t])) break;
      if (mark_blocks) flags[t / block] = 1;
      running += tokens[t];
      ++count;
    }
    return count;
  }
};

std::vector<int32_t> flagged(const std::vector<char>& flags) {
  std::vector<int32_t> out;
  for (size_t b = 0; b < flags.size(); ++b)
    if (flags[b]) out.push_back(static_cast<int32_t>(b));
  return out;
}

PlanParams params_of(const char* preset, int block) {
  // The crisp preset's crafted cases check the v1 mean floor (crisp_v1_config); the others, the preset.
  crisp::Config c = std::string(preset) == "crisp" ? crisp_test::crisp_v1_config() : crisp::Config::from_preset(preset);
  c.block_size = block;
  return crisp::plan_params(c);
}

// Eight blocks; floor = mean of pv[1..6] = (8+1+1+1+1+12)/6 / 64 = 4/64: blocks above 4/64 are
// 1 (8/64) and 6 (12/64), and 7 (16/64) beyond the floor's range.
const std::vector<double> kPooled = {20 / 64.0, 8 / 64.0, 1 / 64.0, 1 / 64.0, 1 / 64.0, 1 / 64.0, 12 / 64.0, 16 / 64.0};

TEST(SelectPipeline, NoiseFloorThenBudgets) {
  PlanParams p = params_of("crisp", 64);
  SerialSide side{kPooled, {}};
  select::select_side(p, crisp::rules::kRouteVs, 8 * 64, true, side);
  EXPECT_EQ(flagged(side.flags), (std::vector<int32_t>{0, 1, 6, 7}));

  // min_budget 5 blocks: block 2 is the best unflagged one (ties 2..5 go to the smaller index).
  p.min_budget = 5 * 64;
  SerialSide with_min{kPooled, {}};
  select::select_side(p, crisp::rules::kRouteVs, 8 * 64, true, with_min);
  EXPECT_EQ(flagged(with_min.flags), (std::vector<int32_t>{0, 1, 2, 6, 7}));

  // max_budget 2 blocks: the anchor and the best other flagged block (7).
  p.min_budget = 0;
  p.max_budget = 2 * 64;
  SerialSide with_max{kPooled, {}};
  select::select_side(p, crisp::rules::kRouteVs, 8 * 64, true, with_max);
  EXPECT_EQ(flagged(with_max.flags), (std::vector<int32_t>{0, 7}));
}

TEST(SelectPipeline, NoiseFloorUniformAndMax) {
  // kPooled has N = 8: the uniform level is 1/8 = 8/64, the mean floor (alpha 1) 4/64.
  const auto select_with = [](crisp::VsFloor floor, double alpha, double uniform_alpha) {
    PlanParams p = params_of("crisp", 64);
    p.vs_floor = floor;
    p.alpha = alpha;
    p.uniform_alpha = uniform_alpha;
    p.uniform_floor_blocks = 0;  // the preset's floor hold below 32 blocks: tested on its own
    SerialSide side{kPooled, {}};
    select::select_side(p, crisp::rules::kRouteVs, 8 * 64, true, side);
    return flagged(side.flags);
  };
  using crisp::VsFloor;
  using V = std::vector<int32_t>;
  // uniform, uniform_alpha 1: block 1 sits exactly at 8/64 and is not kept (strict).
  EXPECT_EQ(select_with(VsFloor::uniform, 1.0, 1.0), (V{0, 6, 7}));
  // uniform_alpha 0.5: 4/64, block 1 kept; alpha is not read.
  EXPECT_EQ(select_with(VsFloor::uniform, 100.0, 0.5), (V{0, 1, 6, 7}));
  // uniform_alpha 0.125: 1/64, blocks 2..5 sit exactly at it and are not kept.
  EXPECT_EQ(select_with(VsFloor::uniform, 1.0, 0.125), (V{0, 1, 6, 7}));
  // max: the uniform level 8/64 is above the mean floor 4/64.
  EXPECT_EQ(select_with(VsFloor::max, 1.0, 1.0), (V{0, 6, 7}));
  // max: the mean floor 2.5 * 4/64 = 10/64 is above the uniform level 4/64.
  EXPECT_EQ(select_with(VsFloor::max, 2.5, 0.5), (V{0, 6, 7}));
  EXPECT_EQ(select_with(VsFloor::uniform, 2.5, 0.5), (V{0, 1, 6, 7}));
  // max: 3.5 * 4/64 = 14/64 keeps only block 7 (16/64).
  EXPECT_EQ(select_with(VsFloor::max, 3.5, 1.0), (V{0, 7}));
  // mean (the default) is unchanged by uniform_alpha.
  EXPECT_EQ(select_with(VsFloor::mean, 1.0, 100.0), (V{0, 1, 6, 7}));
}

TEST(SelectPipeline, PeFloorIsTheRowUniformLevel) {
  PlanParams p = params_of("crisp", 64);  // the v1 configuration: coverage
  EXPECT_TRUE(select::pe_walks(p));
  const PlanParams preset = crisp::plan_params(crisp::Config::from_preset("crisp"));
  EXPECT_FALSE(select::pe_walks(preset));  // the preset's row floor (session 26)
  EXPECT_EQ(preset.pe_alpha, 0.5);
  p.pe_rule = crisp::PeRule::coverage;
  EXPECT_TRUE(select::pe_walks(p));
  p.pe_rule = crisp::PeRule::floor;
  EXPECT_FALSE(select::pe_walks(p));
  // Row 4 has 5 entries: level 1/5 at pe_alpha 1, 2/5 at pe_alpha 2.
  p.pe_alpha = 1.0;
  EXPECT_FALSE(select::pe_floor_keeps(p, 4, 0.2));
  EXPECT_TRUE(select::pe_floor_keeps(p, 4, 0.21));
  EXPECT_TRUE(select::pe_floor_keeps(p, 9, 0.11));  // row 9: level 1/10
  p.pe_alpha = 2.0;
  EXPECT_FALSE(select::pe_floor_keeps(p, 4, 0.4));
  EXPECT_TRUE(select::pe_floor_keeps(p, 4, 0.41));
  // A row's entries sum to 1, so at pe_alpha >= 1 at most r of its r + 1 entries pass, and a row
  // of equal entries keeps none.
  p.pe_alpha = 1.0;
  const double row[4] = {0.5, 0.25, 0.125, 0.125};  // row 3: level 1/4
  int kept = 0;
  for (double x : row) kept += select::pe_floor_keeps(p, 3, x);
  EXPECT_EQ(kept, 1);
}

TEST(SelectPipeline, PeHeadKeepsAnchorAndMinBudgetOnly) {
  PlanParams p = params_of("crisp", 64);
  p.min_budget = 3 * 64;
  p.max_budget = 64;  // max_budget does not clamp PE heads
  SerialSide side{kPooled, {}};
  select::select_side(p, crisp::rules::kRoutePe, 8 * 64, false, side);
  EXPECT_EQ(flagged(side.flags), (std::vector<int32_t>{0, 6, 7}));
}

TEST(SelectPipeline, CumulativeCountsTokensWithinGammaPlusOne) {
  PlanParams p = params_of("flexprefill", 64);
  p.gamma = 0.5;
  p.min_budget = 0;
  p.block_size = 1;  // one token per block, to count by hand
  // Sorted tokens 5/16 + 3/16 = 1/2 are within gamma, + 1/8 is over: count = 2 + 1 = 3 tokens,
  // 3 // B + 1 = 4 blocks, in rank order of pv: 0 (anchor), 7, 6, 1.
  SerialSide side{kPooled, {1 / 32.0, 5 / 16.0, 1 / 16.0, 3 / 16.0, 1 / 32.0, 1 / 8.0, 1 / 8.0, 1 / 8.0}};
  select::select_side(p, crisp::rules::kRouteVs, 8, true, side);
  EXPECT_EQ(flagged(side.flags), (std::vector<int32_t>{0, 1, 6, 7}));
}

TEST(SelectPipeline, TopkMarksForcedAndTopTokenBlocks) {
  PlanParams p = params_of("minference", 64);
  const int64_t n = 8 * 64;
  p.vertical_tokens = crisp::rules::kTopkForcedVerticalTokens + 2;  // two tokens beyond the forced ones
  std::vector<double> tokens(n, 0.0);
  tokens[5 * 64 + 3] = 0.5;  // block 5
  tokens[2 * 64] = 0.25;     // block 2
  tokens[7 * 64] = 0.125;    // block 7: third, over the budget
  SerialSide side{kPooled, tokens, 64};
  select::select_side(p, crisp::rules::kRouteVs, n, true, side);
  // Block 0 holds the 30 forced tokens (and is the anchor).
  EXPECT_EQ(flagged(side.flags), (std::vector<int32_t>{0, 2, 5}));
}

// The bucket walk the device runs (whole runs of entries, then the ties of the stopping run)
// keeps the same number of entries as the entry-by-entry walk, for every stopping rule.
int64_t entry_walk(const std::vector<double>& sorted, const select::WalkRule& w) {
  double running = 0.0;
  int64_t kept = 0;
  for (double x : sorted) {
    if (!select::walk_keeps(w, running, kept, x)) break;
    running += x;
    ++kept;
  }
  return kept;
}
int64_t bucket_walk(const std::vector<double>& sorted, const select::WalkRule& w) {
  double G = 0.0;
  int64_t C = 0;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    double mass = 0.0;
    while (j < sorted.size() && sorted[j] == sorted[i]) mass += sorted[j++];
    const int64_t count = static_cast<int64_t>(j - i);
    if (select::walk_stops_within(w, G, mass, C, count))
      return C + select::walk_ties_kept(w, G, C, sorted[i], count);
    G += mass;
    C += count;
    i = j;
  }
  return C;
}

TEST(SelectWalk, BucketWalkKeepsWhatTheEntryWalkKeeps) {
  const uint64_t seed = crisp_test::test_seed(11);
  SCOPED_TRACE(crisp_test::seed_trace(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    // Masses on a coarse grid of binary fractions, so ties are common and sums are exact.
    std::vector<double> x(1 + rng() % 40);
    for (double& v : x) v = static_cast<double>(rng() % 6) / 16.0;
    std::sort(x.begin(), x.end(), [](double a, double b) { return a > b; });
    // A walk that keeps nothing at all (target 0 before the first entry, k = 0) is decided before
    // the device's walk starts (the config's ranges, init_token_select_kernel), not by buckets.
    const double target = static_cast<double>(1 + rng() % 64) / 16.0;
    const int64_t k = 1 + static_cast<int64_t>(rng() % x.size());
    for (const select::WalkRule w : {select::WalkRule{select::kMassBefore, target, 0},
                                     select::WalkRule{select::kMassInclusive, target, 0},
                                     select::WalkRule{select::kCount, 0.0, k}})
      EXPECT_EQ(bucket_walk(x, w), entry_walk(x, w)) << "mode " << w.mode << " target " << target << " k " << k;
  }
}

TEST(SelectWalk, StoppingRulesAtTheBoundary) {
  // §4: kept while the running sum BEFORE the entry is below the target.
  const select::WalkRule before{select::kMassBefore, 1.0, 0};
  EXPECT_TRUE(select::walk_keeps(before, 0.75, 0, 0.5));
  EXPECT_FALSE(select::walk_keeps(before, 1.0, 0, 0.5));
  // §3 cumulative: kept while the running sum INCLUDING it is within the target.
  const select::WalkRule inclusive{select::kMassInclusive, 1.0, 0};
  EXPECT_TRUE(select::walk_keeps(inclusive, 0.5, 0, 0.5));
  EXPECT_FALSE(select::walk_keeps(inclusive, 0.75, 0, 0.5));
  // topk: the first k.
  const select::WalkRule count{select::kCount, 0.0, 3};
  EXPECT_TRUE(select::walk_keeps(count, 0.0, 2, 0.0));
  EXPECT_FALSE(select::walk_keeps(count, 0.0, 3, 0.0));
}

}  // namespace
