// tests/test_rules.cpp — every rule of the spec on small hand-checkable cases: first directly on
// the shared rule functions of src/plan/rules.h, then through crisp::plan with crafted Q/K whose
// attention masses are exact binary fractions (so the expected sets are computed by hand, not by
// another implementation).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "crisp/crisp.h"
#include "oracle.h"
#include "plan/proxy.h"
#include "plan/rules.h"
#include "test_util.h"

namespace {

using crisp::rules::cumulative_blocks;
using crisp::rules::kl_term;

// ---------------------------------------------------------------- rules.h directly

TEST(RulesDirect, NoiseFloorIsStrict) {
  using crisp::rules::kFloorMean;
  using crisp::rules::noise_floor_keeps;
  using crisp::rules::noise_floor_threshold;
  // A block exactly at alpha * mu is NOT kept; the next representable value above is.
  const double at = noise_floor_threshold(kFloorMean, 0.125, 2.0, 1.0, 0, 10);
  EXPECT_EQ(at, 0.25);
  EXPECT_FALSE(noise_floor_keeps(0.25, at));
  EXPECT_TRUE(noise_floor_keeps(std::nextafter(0.25, 1.0), at));
  // zero mass at a zero floor
  EXPECT_FALSE(noise_floor_keeps(0.0, noise_floor_threshold(kFloorMean, 0.0, 1.0, 1.0, 0, 10)));
  EXPECT_EQ(crisp::rules::noise_floor_first(10), 1);
  EXPECT_EQ(crisp::rules::noise_floor_last(10), 8);  // mean over pv[1 .. N-2]
}

TEST(RulesDirect, NoiseFloorKinds) {
  using namespace crisp::rules;
  // N = 8: the uniform level is 1/8; uniform_alpha 2 -> 1/4. The mean floor alpha * mu = 3 * 1/16.
  EXPECT_EQ(noise_floor_threshold(kFloorUniform, 1 / 16.0, 3.0, 2.0, 0, 8), 0.25);
  EXPECT_EQ(noise_floor_threshold(kFloorMean, 1 / 16.0, 3.0, 2.0, 0, 8), 3 / 16.0);
  EXPECT_EQ(noise_floor_threshold(kFloorMax, 1 / 16.0, 3.0, 2.0, 0, 8), 0.25);   // uniform is larger
  EXPECT_EQ(noise_floor_threshold(kFloorMax, 1 / 16.0, 5.0, 2.0, 0, 8), 5 / 16.0);  // mean is larger
  EXPECT_FALSE(floor_uses_mean(kFloorUniform));
  EXPECT_TRUE(floor_uses_mean(kFloorMean));
  EXPECT_TRUE(floor_uses_mean(kFloorMax));
}

TEST(RulesDirect, UniformFloorStopsRisingBelowItsBlocks) {
  using namespace crisp::rules;
  // uniform_floor_blocks 32: at N = 8 the level is 1/32, not 1/8; at N >= 32 the plain 1/N; 0 = off.
  EXPECT_EQ(noise_floor_threshold(kFloorUniform, 0.0, 1.0, 1.0, 32, 8), 1 / 32.0);
  EXPECT_EQ(noise_floor_threshold(kFloorUniform, 0.0, 1.0, 2.0, 32, 8), 2 / 32.0);
  EXPECT_EQ(noise_floor_threshold(kFloorUniform, 0.0, 1.0, 1.0, 32, 32), 1 / 32.0);
  EXPECT_EQ(noise_floor_threshold(kFloorUniform, 0.0, 1.0, 1.0, 32, 64), 1 / 64.0);
  EXPECT_EQ(noise_floor_threshold(kFloorUniform, 0.0, 1.0, 1.0, 0, 8), 1 / 8.0);
  // kFloorMax takes the larger of the mean floor and the capped uniform one.
  EXPECT_EQ(noise_floor_threshold(kFloorMax, 1 / 16.0, 1.0, 1.0, 32, 8), 1 / 16.0);
  // The mean floor does not read it.
  EXPECT_EQ(noise_floor_threshold(kFloorMean, 1 / 16.0, 3.0, 1.0, 32, 8), 3 / 16.0);
}

TEST(RulesDirect, LastRowsHeldFloorIsTheTwoConditionRule) {
  using namespace crisp::rules;
  // Off, or a held floor at or below N: the last rows' mass is taken as it is.
  EXPECT_EQ(last_rows_mass_scale(false, 8, 32), 1.0);
  EXPECT_EQ(last_rows_mass_scale(true, 32, 32), 1.0);
  EXPECT_EQ(last_rows_mass_scale(true, 40, 32), 1.0);
  EXPECT_EQ(last_rows_mass_scale(true, 8, 32), 4.0);
  EXPECT_EQ(threshold_floor_blocks(true, 32), 0);
  EXPECT_EQ(threshold_floor_blocks(false, 32), 32);
  // max(all, last * scale) > u / N keeps exactly the blocks with all > u / N or last > u / max(N, F).
  std::mt19937_64 rng(crisp_test::test_seed());
  std::uniform_real_distribution<double> mass(0.0, 0.3);
  int kept = 0, checked = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const int32_t N = 2 + static_cast<int32_t>(rng() % 40);
    const int64_t F = static_cast<int64_t>(rng() % 64);
    const double u = 0.5 + mass(rng) * 5.0;
    const double plain = u / N, held = u / std::max<int64_t>(N, F);
    // Masses around their floors, so that every combination of the two conditions occurs.
    const double all = plain * mass(rng) / 0.15, last = held * mass(rng) / 0.15;
    if (std::abs(all - plain) < 1e-9 || std::abs(last - held) < 1e-9) continue;  // no boundary cases
    const double threshold = noise_floor_threshold(kFloorUniform, 0.0, 1.0, u, threshold_floor_blocks(true, F), N);
    const bool one_score = noise_floor_keeps(crisp::proxy::with_last_rows(all, last * last_rows_mass_scale(true, N, F)), threshold);
    EXPECT_EQ(one_score, all > plain || last > held) << "N=" << N << " F=" << F << " all=" << all << " last=" << last;
    kept += one_score;
    ++checked;
  }
  EXPECT_GT(kept, checked / 10);  // both outcomes occur
  EXPECT_LT(kept, checked - checked / 10);
}

TEST(RulesDirect, SlashSideHeldFloorFollowsOrOverrides) {
  using crisp::rules::side_floor_blocks;
  // -1 (the default): the slash side holds the vertical side's floor.
  EXPECT_EQ(side_floor_blocks(false, 32, -1), 32);
  EXPECT_EQ(side_floor_blocks(true, 32, -1), 32);
  // 0 or any count: the slash side's own; the vertical side never reads it.
  EXPECT_EQ(side_floor_blocks(false, 32, 0), 0);
  EXPECT_EQ(side_floor_blocks(false, 32, 20), 20);
  EXPECT_EQ(side_floor_blocks(true, 32, 0), 32);
  EXPECT_EQ(side_floor_blocks(true, 0, 20), 0);
}

TEST(ProxyRules, LastRowsAreTheLastROfLAndTheirMassIsTheLarger) {
  using namespace crisp::proxy;
  EXPECT_FALSE(in_last_rows(111, 128, 16));
  EXPECT_TRUE(in_last_rows(112, 128, 16));
  EXPECT_TRUE(in_last_rows(127, 128, 16));
  EXPECT_FALSE(in_last_rows(127, 128, 0));  // off
  EXPECT_TRUE(in_last_rows(0, 8, 16));       // R > L: every row
  EXPECT_EQ(last_rows_inverse(128, 16), 1 / 16.0);
  EXPECT_EQ(last_rows_inverse(8, 16), 1 / 8.0);
  EXPECT_EQ(with_last_rows(0.02, 0.5), 0.5);
  EXPECT_EQ(with_last_rows(0.3, 0.1), 0.3);
}

TEST(RulesDirect, PeRowFloorIsStrict) {
  using crisp::rules::pe_floor_keeps;
  // Row 3 has 4 entries: the uniform level 1/4; pe_alpha 2 -> 1/2.
  EXPECT_EQ(crisp::rules::pe_row_floor(2.0, 3), 0.5);
  EXPECT_FALSE(pe_floor_keeps(0.5, 3, 2.0));
  EXPECT_TRUE(pe_floor_keeps(std::nextafter(0.5, 1.0), 3, 2.0));
  EXPECT_FALSE(pe_floor_keeps(1.0, 0, 1.0));  // row 0's only entry is at its level (kept as the diagonal)
  EXPECT_TRUE(pe_floor_keeps(1.0, 0, 0.5));
}

TEST(RulesDirect, CumulativeBlocks) {
  // count // B + 1, clamped to [min_blocks, N].
  EXPECT_EQ(cumulative_blocks(0, 64, 0, 10), 1);
  EXPECT_EQ(cumulative_blocks(63, 64, 0, 10), 1);
  EXPECT_EQ(cumulative_blocks(64, 64, 0, 10), 2);
  EXPECT_EQ(cumulative_blocks(200, 64, 0, 10), 4);
  EXPECT_EQ(cumulative_blocks(1000, 64, 0, 10), 10);  // 16 clamped to N
  EXPECT_EQ(cumulative_blocks(10, 64, 3, 10), 3);     // raised to min_blocks
  EXPECT_EQ(cumulative_blocks(200, 128, 0, 10), 2);
  EXPECT_TRUE(crisp::rules::cumulative_within(0.75, 0.75));  // "<= gamma"
  EXPECT_FALSE(crisp::rules::cumulative_within(std::nextafter(0.75, 1.0), 0.75));
}

TEST(RulesDirect, CumulativeCountHandExample) {
  // x = (0.125, 0.5, 0.125, 0.25), gamma = 0.75: sorted 0.5, 0.25, 0.125, 0.125, running sums
  // 0.5, 0.75, 0.875, 1 -> two within gamma -> count = 3. (Checks the oracle's reading.)
  EXPECT_EQ(oracle::cumulative_count({0.125, 0.5, 0.125, 0.25}, 0.75), 3);
  EXPECT_EQ(oracle::cumulative_count({0.125, 0.5, 0.125, 0.25}, 0.4), 1);
  EXPECT_EQ(oracle::cumulative_count({0.125, 0.5, 0.125, 0.25}, 1.0), 5);  // every entry within: n + 1
}

TEST(RulesDirect, BudgetBlocks) {
  EXPECT_EQ(crisp::rules::min_budget_blocks(0, 64, 10), 0);
  EXPECT_EQ(crisp::rules::min_budget_blocks(1, 64, 10), 1);
  EXPECT_EQ(crisp::rules::min_budget_blocks(64, 64, 10), 1);
  EXPECT_EQ(crisp::rules::min_budget_blocks(65, 64, 10), 2);     // ceil
  EXPECT_EQ(crisp::rules::min_budget_blocks(1024, 128, 5), 5);   // capped at N
  EXPECT_EQ(crisp::rules::max_budget_blocks(0, 64, 10), 10);     // 0 = no maximum
  EXPECT_EQ(crisp::rules::max_budget_blocks(10, 64, 10), 1);     // at least the anchor
  EXPECT_EQ(crisp::rules::max_budget_blocks(200, 64, 10), 3);    // floor
  EXPECT_EQ(crisp::rules::max_budget_blocks(100000, 64, 10), 10);
}

TEST(RulesDirect, JsdHandValues) {
  // Disjoint point masses a = (1, 0), p = (0, 1): m = (1/2, 1/2), each KL = log 2,
  // D = sqrt(log 2 / 2 + log 2 / 2) = sqrt(log 2).
  const double a[2] = {1.0, 0.0}, p[2] = {0.0, 1.0};
  double kla = 0, klp = 0;
  for (int c = 0; c < 2; ++c) {
    const double m = 0.5 * (a[c] + p[c]);
    kla += kl_term(a[c], m);
    klp += kl_term(p[c], m);
  }
  EXPECT_NEAR(std::sqrt(0.5 * kla + 0.5 * klp), std::sqrt(std::log(2.0)), 1e-15);
  // 0 log 0 = 0.
  EXPECT_EQ(kl_term(0.0, 0.5), 0.0);
  // a = (1/2, 1/2), p = (1, 0): m = (3/4, 1/4);
  // KL(a||m) = 1/2 log(2/3) + 1/2 log 2, KL(p||m) = log(4/3).
  const double expected = std::sqrt(0.5 * (0.5 * std::log(2.0 / 3.0) + 0.5 * std::log(2.0)) + 0.5 * std::log(4.0 / 3.0));
  const double got = std::sqrt(0.5 * (kl_term(0.5, 0.75) + kl_term(0.5, 0.25)) + 0.5 * (kl_term(1.0, 0.75) + kl_term(0.0, 0.25)));
  EXPECT_NEAR(got, expected, 1e-15);
  EXPECT_NEAR(expected, 0.4645014, 1e-6);  // by hand: sqrt(0.5*0.1438410 + 0.5*0.2876821)
}

TEST(RulesDirect, RoutingThresholds) {
  using namespace crisp::rules;
  EXPECT_EQ(route_head(kRoutingCstruct, 0.25, 0, 1000, 128, 128, 0.25, 4, 0.1), kRouteVs);  // >= is VS
  EXPECT_EQ(route_head(kRoutingCstruct, std::nextafter(0.25, 0.0), 0, 1000, 128, 128, 0.25, 4, 0.1), kRoutePe);
  // C_rel = 0.5 * 1024 / 256 = 2.
  EXPECT_EQ(route_head(kRoutingCstructRel, 0.5, 0, 1024, 128, 128, 0.25, 2.0, 0.1), kRouteVs);
  EXPECT_EQ(route_head(kRoutingCstructRel, 0.5, 0, 1024, 128, 128, 0.25, 2.5, 0.1), kRoutePe);
  EXPECT_DOUBLE_EQ(cstruct_relative(0.5, 1024, 128, 128), 2.0);
  // jsd: PE iff D < tau.
  EXPECT_EQ(route_head(kRoutingJsd, 0.9, 0.05, 1000, 128, 128, 0.25, 4, 0.1), kRoutePe);
  EXPECT_EQ(route_head(kRoutingJsd, 0.0, 0.1, 1000, 128, 128, 0.25, 4, 0.1), kRouteVs);
  EXPECT_EQ(route_head(kRoutingNone, 0.0, 0.0, 1000, 128, 128, 0.25, 4, 0.1), kRouteVs);
}

TEST(RulesDirect, StructuralSet) {
  using crisp::rules::in_structural_set;
  // p = 1000, w_sink = 4, w_local = 3: sink {0..3}, local {998, 999, 1000}.
  EXPECT_TRUE(in_structural_set(3, 1000, 4, 3));
  EXPECT_FALSE(in_structural_set(4, 1000, 4, 3));
  EXPECT_FALSE(in_structural_set(997, 1000, 4, 3));
  EXPECT_TRUE(in_structural_set(998, 1000, 4, 3));
  EXPECT_TRUE(in_structural_set(1000, 1000, 4, 3));
  EXPECT_FALSE(in_structural_set(1001, 1000, 4, 3));  // a future key is never local
}

TEST(RulesDirect, TieOrder) {
  using crisp::rules::ranks_before;
  EXPECT_TRUE(ranks_before(0.5, 7, 0.25, 1));   // larger value first
  EXPECT_TRUE(ranks_before(0.5, 1, 0.5, 7));    // equal: smaller index first
  EXPECT_FALSE(ranks_before(0.5, 7, 0.5, 1));
  EXPECT_FALSE(ranks_before(0.5, 3, 0.5, 3));   // strict
}

TEST(RulesDirect, SlashCover) {
  using namespace crisp::rules;
  // From query block 9, slash distance-block 6 reaches key block 3 (both covers) and 2 (exact only).
  EXPECT_TRUE(slash_reaches(9, 3, 6, kCoverExact));
  EXPECT_TRUE(slash_reaches(9, 2, 6, kCoverExact));
  EXPECT_FALSE(slash_reaches(9, 1, 6, kCoverExact));
  EXPECT_FALSE(slash_reaches(9, 4, 6, kCoverExact));
  EXPECT_TRUE(slash_reaches(9, 3, 6, kCoverSingle));
  EXPECT_FALSE(slash_reaches(9, 2, 6, kCoverSingle));
  const bool flags[10] = {true, false, false, false, false, false, true, false, false, false};
  EXPECT_TRUE(covered_by_slash(9, 9, flags, kCoverExact));   // slash 0 -> diagonal
  EXPECT_TRUE(covered_by_slash(9, 8, flags, kCoverExact));   // slash 0 -> r - 1 (exact)
  EXPECT_FALSE(covered_by_slash(9, 8, flags, kCoverSingle));
  EXPECT_TRUE(covered_by_slash(9, 2, flags, kCoverExact));
  EXPECT_FALSE(covered_by_slash(9, 2, flags, kCoverSingle));
  EXPECT_FALSE(covered_by_slash(9, 5, flags, kCoverExact));
}

TEST(RulesDirect, PeCoverage) {
  EXPECT_DOUBLE_EQ(crisp::rules::pe_coverage_target(0.25, 10), 2.5);
  EXPECT_TRUE(crisp::rules::pe_keeps_next(2.4, 2.5));
  EXPECT_FALSE(crisp::rules::pe_keeps_next(2.5, 2.5));  // sum before reached the target: stop
}

TEST(RulesDirect, ShortSequences) {
  using crisp::rules::is_short_sequence;
  EXPECT_TRUE(is_short_sequence(1, 128, 0, 0));
  EXPECT_TRUE(is_short_sequence(256, 128, 0, 0));   // N = 2
  EXPECT_FALSE(is_short_sequence(257, 128, 0, 0));  // N = 3
  EXPECT_TRUE(is_short_sequence(128, 64, 0, 0));
  EXPECT_FALSE(is_short_sequence(129, 64, 0, 0));
  EXPECT_TRUE(is_short_sequence(1024, 128, 1024, 0));   // n <= min_budget
  EXPECT_FALSE(is_short_sequence(1025, 128, 1024, 0));
  EXPECT_TRUE(is_short_sequence(900, 128, 0, 900));     // n <= dense_below
  EXPECT_EQ(crisp::rules::num_blocks(1000, 128), 8);
  EXPECT_EQ(crisp::rules::block_end(7, 128, 1000), 1000);
  EXPECT_EQ(crisp::rules::proxy_rows(50, 128), 50);
  EXPECT_EQ(crisp::rules::causal_blocks(8), 36);
}

// Short prompts at finer blocks: below fine_blocks_below keys a call runs at B = 64 with the held
// floors doubled (the same tokens); at or above it, and at B = 64, nothing changes.
TEST(RulesDirect, FineBlocksBelowResolvesTheBlockSizeAndTheHolds) {
  crisp::Config c = crisp::Config::from_preset("crisp");
  ASSERT_EQ(c.block_size, 128);
  c.set("fine_blocks_below=4096");
  c.set("uniform_floor_slash_blocks=20");
  const crisp::Config fine = c.for_keys(4095);
  EXPECT_EQ(fine.block_size, 64);
  EXPECT_EQ(fine.uniform_floor_blocks, 2 * c.uniform_floor_blocks);
  EXPECT_EQ(fine.uniform_floor_slash_blocks, 40);
  EXPECT_EQ(fine.fine_blocks_below, 0);  // resolved once: resolving again changes nothing
  EXPECT_EQ(fine.for_keys(100).block_size, 64);
  EXPECT_EQ(fine.for_keys(100).uniform_floor_blocks, fine.uniform_floor_blocks);
  const crisp::Config coarse = c.for_keys(4096);
  EXPECT_EQ(coarse.block_size, 128);
  EXPECT_EQ(coarse.uniform_floor_blocks, c.uniform_floor_blocks);
  EXPECT_EQ(coarse.uniform_floor_slash_blocks, 20);
  // -1 (follow the vertical side) and 0 (off) keep their meaning.
  c.set("uniform_floor_slash_blocks=-1");
  EXPECT_EQ(c.for_keys(10).uniform_floor_slash_blocks, -1);
  c.set("uniform_floor_slash_blocks=0");
  EXPECT_EQ(c.for_keys(10).uniform_floor_slash_blocks, 0);
  // Already at 64: no finer block size to go to.
  c.set("block_size=64");
  EXPECT_EQ(c.for_keys(10).block_size, 64);
  EXPECT_EQ(c.for_keys(10).uniform_floor_blocks, c.uniform_floor_blocks);
  // Off (0, the default of every preset but what the evaluation picks).
  EXPECT_EQ(crisp::Config::from_preset("flexprefill").for_keys(10).block_size, 128);
  EXPECT_THROW(c.set("fine_blocks_below=-1"), crisp::Error);
}

// Through crisp::plan: a prompt below the threshold is planned exactly as the same prompt with
// block_size 64 and the doubled hold set by hand; one at the threshold as the plain preset; in a
// varlen batch the longest sequence decides for all.
TEST(RulesDirect, FineBlocksBelowPlansAsTheExplicitFineConfig) {
  const std::vector<int64_t> lens = {700, 1900};
  crisp::WorkloadSpec spec = crisp_test::workload_spec(4, 2, 32, lens, 7);
  crisp::Workload w = crisp::make_workload(spec);
  crisp::Options opt;
  opt.precision = crisp::Precision::f64;
  const auto plan_with = [&](const crisp::Config& cfg) { return crisp::plan(w.q_view(), w.k_view(), cfg, w.cu_seqlens, opt); };
  crisp::Config rule = crisp::Config::from_preset("crisp");
  rule.set("fine_blocks_below=2000");
  crisp::Config by_hand = crisp::Config::from_preset("crisp");
  by_hand.set("block_size=64");
  by_hand.set("uniform_floor_blocks=" + std::to_string(2 * by_hand.uniform_floor_blocks));
  const crisp::Plan fine = plan_with(rule), expected = plan_with(by_hand);
  ASSERT_EQ(fine.block_size, 64);
  EXPECT_EQ(fine.config.block_size, 64);
  EXPECT_EQ(fine.config.fine_blocks_below, 0);
  ASSERT_EQ(fine.sequences.size(), expected.sequences.size());
  for (size_t s = 0; s < fine.sequences.size(); ++s)
    for (size_t h = 0; h < fine.sequences[s].heads.size(); ++h) {
      EXPECT_EQ(fine.sequences[s].heads[h].row_ptr, expected.sequences[s].heads[h].row_ptr);
      EXPECT_EQ(fine.sequences[s].heads[h].col, expected.sequences[s].heads[h].col);
    }
  rule.set("fine_blocks_below=1900");  // the longest sequence has 1900 keys: not below
  const crisp::Plan coarse = plan_with(rule), preset = plan_with(crisp::Config::from_preset("crisp"));
  ASSERT_EQ(coarse.block_size, 128);
  for (size_t s = 0; s < coarse.sequences.size(); ++s)
    for (size_t h = 0; h < coarse.sequences[s].heads.size(); ++h)
      EXPECT_EQ(coarse.sequences[s].heads[h].col, preset.sequences[s].heads[h].col);
}

// ---------------------------------------------------------------- crafted inputs through the API
//
// d = 2, softmax_scale = 1, B = 64, Hq = Hkv = 1. Every query is q = (1, 0). A "live" key is
// (0, 0) (logit 0), a "dead" key is (-2000, 0) (logit -2000: exp underflows to exactly 0 in float
// and double). With m live keys visible to every proxy row, A is exactly 1/m on each of them and 0
// elsewhere, so every mass below is an exact binary fraction.
struct Crafted {
  int64_t n;
  std::vector<float> q, k, v;
  explicit Crafted(int64_t n_, const std::vector<int64_t>& live) : n(n_), q(2 * n_, 0.f), k(2 * n_, 0.f), v(2 * n_, 0.f) {
    for (int64_t t = 0; t < n; ++t) {
      q[2 * t] = 1.0f;
      k[2 * t] = -2000.0f;
      v[2 * t] = static_cast<float>(t % 7);
      v[2 * t + 1] = 1.0f;
    }
    for (int64_t j : live) k[2 * j] = 0.0f;
  }
  crisp::Plan plan(crisp::Config cfg, crisp::Precision precision = crisp::Precision::f64) {
    cfg.set("softmax_scale=1");
    cfg.set("block_size=64");
    crisp::Options opt;
    opt.precision = precision;
    return crisp::plan(crisp::TensorView::contiguous(q.data(), crisp::DType::f32, 1, n, 2),
                       crisp::TensorView::contiguous(k.data(), crisp::DType::f32, 1, n, 2), cfg, {}, opt);
  }
};

std::vector<int32_t> row(const crisp::HeadPlan& h, int r) {
  return std::vector<int32_t>(h.col.begin() + h.row_ptr[r], h.col.begin() + h.row_ptr[r + 1]);
}

using V = std::vector<int32_t>;

// n = 640, N = 10, L = 64, proxy rows p_i = 576 + i. Live keys 64, 128, 192 (blocks 1, 2, 3) and
// 576 (block 9, the first key of the proxy rows' own block), so A = 1/4 on each for every row:
//   pv = 0.25 at blocks 1, 2, 3, 9; 0 elsewhere.        mu_v = mean(pv[1..8]) = 0.75/8.
//   distances p_i - j: 576 -> i (block 0); 192 -> 384+i (6); 128 -> 448+i (7); 64 -> 512+i (8)
//   ps = 0.25 at distance-blocks 0, 6, 7, 8.             mu_s = 0.75/8.
const std::vector<int64_t> kLive4 = {64, 128, 192, 576};

TEST(RulesCrafted, NoiseFloorPlantedBlocks) {
  for (auto precision : {crisp::Precision::f64, crisp::Precision::f32}) {
    Crafted c(640, kLive4);
    crisp::Config cfg = crisp_test::crisp_v1_config();
    cfg.set("routing=none");
    crisp::HeadPlan h = c.plan(cfg, precision).sequences.at(0).heads.at(0);
    EXPECT_EQ(h.route, crisp::Route::vs);
    EXPECT_EQ(h.vertical, (V{0, 1, 2, 3, 9}));
    EXPECT_EQ(h.slash, (V{0, 6, 7, 8}));
    // Row 9 by hand: verticals 0,1,2,3,9; slash 0 -> 9 and 8; 6 -> 3, 2; 7 -> 2, 1; 8 -> 1, 0.
    EXPECT_EQ(row(h, 9), (V{0, 1, 2, 3, 8, 9}));
    // Row 5: verticals 0,1,2,3,(9 > 5 no); slash 0 -> 5, 4; 6, 7, 8 > 5 reach nothing.
    EXPECT_EQ(row(h, 5), (V{0, 1, 2, 3, 4, 5}));
    // Row 8 (exact): slash 6 -> 2, 1; 7 -> 1, 0; 8 -> 0; slash 0 -> 8, 7.
    EXPECT_EQ(row(h, 8), (V{0, 1, 2, 3, 7, 8}));
  }
}

TEST(RulesCrafted, NoiseFloorStrictAtThreshold) {
  // n = 640 (N = 10, mean over pv[1..8]); live keys 64, 128, 192, 256 (blocks 1-4, all visible to
  // every proxy row): pv[1..4] = 0.25, mu_v = 1/8, alpha = 2 puts the threshold exactly at 0.25:
  // strict ">" keeps none of them. Slightly below 2 keeps all four.
  Crafted c(640, {64, 128, 192, 256});
  crisp::Config cfg = crisp_test::crisp_v1_config();
  cfg.set("routing=none");
  cfg.set("alpha=2");
  EXPECT_EQ(c.plan(cfg).sequences[0].heads[0].vertical, (V{0}));
  EXPECT_EQ(c.plan(cfg, crisp::Precision::f32).sequences[0].heads[0].vertical, (V{0}));
  cfg.set("alpha=1.999");
  EXPECT_EQ(c.plan(cfg).sequences[0].heads[0].vertical, (V{0, 1, 2, 3, 4}));
}

TEST(RulesCrafted, NoiseFloorZeroFloorKeepsNothing) {
  // Only sink keys live: every non-anchor vertical has mass exactly 0 = alpha * mu. None is kept.
  Crafted c(640, {0, 1, 2, 3});
  crisp::Config cfg = crisp_test::crisp_v1_config();
  cfg.set("routing=none");
  EXPECT_EQ(c.plan(cfg).sequences[0].heads[0].vertical, (V{0}));
}

TEST(RulesCrafted, CStructExactValues) {
  Crafted c(640, kLive4);
  crisp::Config cfg = crisp_test::crisp_v1_config();
  // w_sink = w_local = 64: no live key in the sink; key 576 is within 64 of every proxy row: 1/4.
  cfg.set("w_sink=64");
  cfg.set("w_local=64");
  EXPECT_DOUBLE_EQ(c.plan(cfg).sequences[0].heads[0].c_struct, 0.25);
  // w_local = 32: only rows i < 32 see key 576 as local: 1/4 * 1/2.
  cfg.set("w_local=32");
  EXPECT_DOUBLE_EQ(c.plan(cfg).sequences[0].heads[0].c_struct, 0.125);
  // w_sink = 129 adds keys 64 and 128: 0.125 + 0.5.
  cfg.set("w_sink=129");
  EXPECT_DOUBLE_EQ(c.plan(cfg).sequences[0].heads[0].c_struct, 0.625);
  // Keys counted once when sink and local overlap (w_local = 640 covers everything).
  cfg.set("w_local=640");
  EXPECT_DOUBLE_EQ(c.plan(cfg).sequences[0].heads[0].c_struct, 1.0);
}

TEST(RulesCrafted, CStructRoutingBoundaryIsInclusive) {
  Crafted c(640, kLive4);
  crisp::Config cfg = crisp_test::crisp_v1_config();
  cfg.set("w_sink=64");
  cfg.set("w_local=64");
  cfg.set("routing=cstruct");
  cfg.set("tau_proxy=0.25");  // C_struct = 0.25 exactly: VS (">=")
  EXPECT_EQ(c.plan(cfg).sequences[0].heads[0].route, crisp::Route::vs);
  cfg.set("tau_proxy=0.2500001");
  EXPECT_EQ(c.plan(cfg).sequences[0].heads[0].route, crisp::Route::pe);
  // cstruct_rel: C_rel = 0.25 * 640 / 128 = 1.25.
  cfg.set("routing=cstruct_rel");
  cfg.set("rho=1.25");
  EXPECT_EQ(c.plan(cfg).sequences[0].heads[0].route, crisp::Route::vs);
  cfg.set("rho=1.2500001");
  EXPECT_EQ(c.plan(cfg).sequences[0].heads[0].route, crisp::Route::pe);
}

TEST(RulesCrafted, CumulativeCountsTokens) {
  Crafted c(640, kLive4);
  crisp::Config cfg = crisp_test::crisp_v1_config();
  cfg.set("routing=none");
  cfg.set("vs_budget=cumulative");
  // v has four entries 0.25: gamma 0.95 -> running sums 0.25, 0.5, 0.75 within -> count 4 ->
  // 4 // 64 + 1 = 1 block: the anchor only.
  // u has 256 entries 1/256 (t in [0,64) and [384,576)): 243 within 0.95 -> count 244 ->
  // 244 // 64 + 1 = 4 blocks: the anchor, then ps ties 0.25 at 6, 7, 8.
  cfg.set("gamma=0.95");
  crisp::HeadPlan h = c.plan(cfg).sequences[0].heads[0];
  EXPECT_EQ(h.vertical, (V{0}));
  EXPECT_EQ(h.slash, (V{0, 6, 7, 8}));
  // gamma = 1: every running sum (1.0 after the 4th, then + 0s) is within -> count = n + 1 = 641
  // -> 641 // 64 + 1 = 11, clamped to N = 10: all blocks.
  cfg.set("gamma=1");
  h = c.plan(cfg).sequences[0].heads[0];
  EXPECT_EQ(h.vertical, (V{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  // min_budget = 192 tokens -> 3 blocks: the vertical budget 1 is raised to 3: anchor, then top
  // pv in tie order among equal 0.25 masses (blocks 1, 2, 3, 9): smaller index first -> {0, 1, 2}.
  // The slash budget 4 is already above it.
  cfg.set("gamma=0.95");
  cfg.set("min_budget=192");
  h = c.plan(cfg).sequences[0].heads[0];
  EXPECT_EQ(h.vertical, (V{0, 1, 2}));
  EXPECT_EQ(h.slash, (V{0, 6, 7, 8}));
}

TEST(RulesCrafted, MaxBudgetTrimsInTieOrder) {
  Crafted c(640, kLive4);
  crisp::Config cfg = crisp_test::crisp_v1_config();
  cfg.set("routing=none");
  // noise floor keeps {0,1,2,3,9}; max_budget 192 -> 3 blocks: the anchor + the two first in tie order.
  cfg.set("max_budget=192");
  crisp::HeadPlan h = c.plan(cfg).sequences[0].heads[0];
  EXPECT_EQ(h.vertical, (V{0, 1, 2}));
  EXPECT_EQ(h.slash, (V{0, 6, 7}));
  // max_budget below one block still keeps the anchor.
  cfg.set("max_budget=10");
  h = c.plan(cfg).sequences[0].heads[0];
  EXPECT_EQ(h.vertical, (V{0}));
  EXPECT_EQ(h.slash, (V{0}));
}

TEST(RulesCrafted, SlashCoverSingleVsExact) {
  Crafted c(640, kLive4);
  crisp::Config cfg = crisp_test::crisp_v1_config();
  cfg.set("routing=none");
  cfg.set("slash_cover=single");
  crisp::HeadPlan h = c.plan(cfg).sequences[0].heads[0];
  // Row 9 single: verticals 0,1,2,3,9; slash 0 -> 9; 6 -> 3; 7 -> 2; 8 -> 1.
  EXPECT_EQ(row(h, 9), (V{0, 1, 2, 3, 9}));
  EXPECT_EQ(row(h, 5), (V{0, 1, 2, 3, 5}));
  // Row 7: slash 6 -> 1; 7 -> 0; verticals 0..3.
  EXPECT_EQ(row(h, 7), (V{0, 1, 2, 3, 7}));
  cfg.set("slash_cover=exact");
  h = c.plan(cfg).sequences[0].heads[0];
  EXPECT_EQ(row(h, 7), (V{0, 1, 2, 3, 6, 7}));
}

TEST(RulesCrafted, TopkForcedAndBudget) {
  Crafted c(640, kLive4);
  crisp::Config cfg = crisp::Config::from_preset("minference");
  // 30 forced first keys (block 0) + the top 4 remaining tokens by v (the live keys 64, 128, 192,
  // 576) with vertical_tokens = 34.
  cfg.set("vertical_tokens=34");
  cfg.set("slash_tokens=164");
  crisp::HeadPlan h = c.plan(cfg).sequences[0].heads[0];
  EXPECT_EQ(h.route, crisp::Route::vs);
  EXPECT_EQ(h.vertical, (V{0, 1, 2, 3, 9}));
  // u[t] = 1/256 for t in [384, 576) (one row each), and for t < 64 from key 576; forced t < 100 ->
  // blocks 0, 1; the next 64 tokens in tie order are the smallest remaining indices with u = 1/256:
  // 384..447 -> block 6.
  EXPECT_EQ(h.slash, (V{0, 1, 6}));
  // A budget of 33: forced 30 + top 3 (64, 128, 192) -> block 9 not reached.
  cfg.set("vertical_tokens=33");
  h = c.plan(cfg).sequences[0].heads[0];
  EXPECT_EQ(h.vertical, (V{0, 1, 2, 3}));
}

// q = 0 everywhere: every logit 0, so P[r, c] = 1/(r + 1) exactly, abar = 1/N and A[i, j] = 1/(p_i+1).
struct Flat {
  int64_t n, d = 4;
  std::vector<float> q, k;
  explicit Flat(int64_t n_) : n(n_), q(static_cast<size_t>(n_ * 4), 0.f), k(static_cast<size_t>(n_ * 4), 0.f) {
    for (int64_t t = 0; t < n; ++t) k[static_cast<size_t>(t * 4 + t % 4)] = 1.0f;  // any keys: q = 0 ignores them
  }
  crisp::HeadPlan plan(crisp::Config cfg) {
    cfg.set("block_size=64");
    crisp::Options opt;
    opt.precision = crisp::Precision::f64;
    return crisp::plan(crisp::TensorView::contiguous(q.data(), crisp::DType::f32, 1, n, d),
                       crisp::TensorView::contiguous(k.data(), crisp::DType::f32, 1, n, d), cfg, {}, opt)
        .sequences.at(0)
        .heads.at(0);
  }
};

TEST(RulesCrafted, PeGlobalCoverageIncludesCrossingEntry) {
  // N = 10, pe_gamma = 0.25 -> target 2.5. Entries by P descending, ties by r*N + c:
  // (0,0)=1 -> 1; (1,0)=.5 -> 1.5; (1,1)=.5 -> 2; (2,0)=1/3 -> 2.33; (2,1) crosses -> 2.67 (kept);
  // (2,2) not kept.
  Flat f(640);
  crisp::Config cfg = crisp_test::crisp_v1_config();
  cfg.set("tau_proxy=1");  // C_struct < 1 -> PE
  cfg.set("pe_gamma=0.25");
  cfg.set("slash_cover=single");
  crisp::HeadPlan h = f.plan(cfg);
  ASSERT_EQ(h.route, crisp::Route::pe);
  EXPECT_EQ(h.vertical, (V{0}));
  EXPECT_EQ(h.slash, (V{0}));
  EXPECT_EQ(row(h, 0), (V{0}));
  EXPECT_EQ(row(h, 1), (V{0, 1}));
  EXPECT_EQ(row(h, 2), (V{0, 1, 2}));  // (2,0), (2,1) from PE, 2 the diagonal
  EXPECT_EQ(row(h, 5), (V{0, 5}));
  EXPECT_EQ(h.col.size(), 1u + 2u + 3u + 7u * 2u);
  // Exact cover: slash 0 also reaches r - 1.
  cfg.set("slash_cover=exact");
  h = f.plan(cfg);
  EXPECT_EQ(row(h, 5), (V{0, 4, 5}));
  // pe_gamma = 0.2 -> target 2: (1,1) ends at exactly 2, so (2,0) is not kept: row 2 = {0, 2}.
  cfg.set("slash_cover=single");
  cfg.set("pe_gamma=0.2");
  h = f.plan(cfg);
  EXPECT_EQ(row(h, 2), (V{0, 2}));
  EXPECT_EQ(row(h, 1), (V{0, 1}));
}

TEST(RulesCrafted, PeRowFloorOnUniformRows) {
  // q = 0: every row of P is uniform, P[r, c] = 1 / (r + 1) exactly, i.e. at the row's level.
  Flat f(640);  // N = 10 at B = 64
  crisp::Config cfg = crisp_test::crisp_v1_config();
  cfg.set("tau_proxy=1");  // C_struct < 1 -> PE
  cfg.set("routing=cstruct");
  cfg.set("slash_cover=single");
  cfg.set("pe_rule=floor");
  cfg.set("pe_alpha=1");
  // pe_alpha 1: no entry is strictly above its level; only {0, r} remain.
  crisp::HeadPlan h = f.plan(cfg);
  ASSERT_EQ(h.route, crisp::Route::pe);
  EXPECT_EQ(h.vertical, (V{0}));
  EXPECT_EQ(h.slash, (V{0}));
  EXPECT_EQ(row(h, 0), (V{0}));
  EXPECT_EQ(row(h, 5), (V{0, 5}));
  EXPECT_EQ(h.col.size(), 1u + 9u * 2u);
  // pe_alpha 0.5: every entry is above half its level: dense.
  cfg.set("pe_alpha=0.5");
  h = f.plan(cfg);
  EXPECT_EQ(h.col.size(), 55u);
  EXPECT_EQ(row(h, 5), (V{0, 1, 2, 3, 4, 5}));
}

TEST(RulesCrafted, JsdAndCStructClosedForm) {
  // q = 0: abar = 1/N; A[i, j] = 1/(p_i + 1), so with n a multiple of B (blocks 0..N-2 fully
  // visible): pv[b] = (B/L) sum_i 1/(p_i+1), pv[N-1] = (1/L) sum_i (i+1)/(p_i+1);
  // C_struct = (1/L) sum_i min(p_i + 1, |S_i|)/(p_i + 1) with disjoint windows |S_i| = w_sink + w_local.
  const int64_t n = 640, B = 64, L = 64, N = 10;
  Flat f(n);
  crisp::Config cfg = crisp_test::crisp_v1_config();
  cfg.set("routing=jsd");
  crisp::HeadPlan h = f.plan(cfg);
  std::vector<double> pv(N, 0.0);
  double cs = 0.0;
  for (int64_t i = 0; i < L; ++i) {
    const double p1 = static_cast<double>(n - L + i + 1);
    for (int b = 0; b < N - 1; ++b) pv[b] += B / p1 / L;
    pv[N - 1] += (i + 1) / p1 / L;
    cs += (128.0 + 128.0) / p1 / L;
  }
  double d2 = 0.0;
  for (int b = 0; b < N; ++b) {
    const double a = 1.0 / N, m = 0.5 * (a + pv[b]);
    d2 += 0.5 * a * std::log(a / m) + 0.5 * pv[b] * std::log(pv[b] / m);
  }
  EXPECT_NEAR(h.jsd, std::sqrt(d2), 1e-12);
  EXPECT_NEAR(h.c_struct, cs, 1e-12);
  // D is small here (about 0.064): PE at tau = 0.1, VS at tau = 0.01.
  EXPECT_LT(h.jsd, 0.1);
  EXPECT_EQ(h.route, crisp::Route::pe);
  cfg.set("tau=0.01");
  EXPECT_EQ(f.plan(cfg).route, crisp::Route::vs);
}

TEST(RulesCrafted, TieOrderSmallerIndexFirst) {
  // q = 0: pv[0..N-2] are exactly equal (identical values summed identically), pv[N-1] smaller.
  // cumulative with gamma such that count = 200 tokens-ish -> 200 // 64 + 1 = 4 blocks: the anchor
  // plus blocks 1, 2, 3 (ties -> smaller index first).
  Flat f(640);
  crisp::Config cfg = crisp_test::crisp_v1_config();
  cfg.set("routing=none");
  cfg.set("vs_budget=cumulative");
  // v[j] = (1/L) sum_i 1/(p_i+1) ~ 1/608 for j < 576: 200 tokens ~ 0.329; pick gamma = 0.33.
  cfg.set("gamma=0.33");
  crisp::HeadPlan h = f.plan(cfg);
  EXPECT_EQ(h.vertical, (V{0, 1, 2, 3}));
  EXPECT_EQ(h.slash, (V{0, 1, 2, 3}));
}

TEST(RulesCrafted, DenseFallbackShortSequences) {
  for (int64_t n : {1, 5, 64, 100, 128}) {  // N <= 2 at B = 64
    Flat f(n);
    crisp::HeadPlan h = f.plan(crisp_test::crisp_v1_config());
    EXPECT_EQ(h.route, crisp::Route::dense) << "n=" << n;
    EXPECT_TRUE(std::isnan(h.c_struct)) << "n=" << n;
    EXPECT_TRUE(std::isnan(h.jsd)) << "n=" << n;
    EXPECT_DOUBLE_EQ(h.density, 1.0);
    EXPECT_TRUE(h.vertical.empty());
    EXPECT_TRUE(h.slash.empty());
  }
  {
    Flat f(129);  // N = 3: planned
    EXPECT_NE(f.plan(crisp_test::crisp_v1_config()).route, crisp::Route::dense);
  }
  {
    // n <= min_budget -> dense; one token more -> planned.
    crisp::Config cfg = crisp_test::crisp_v1_config();
    cfg.set("min_budget=640");
    Flat f(640);
    EXPECT_EQ(f.plan(cfg).route, crisp::Route::dense);
    Flat g(641);
    EXPECT_NE(g.plan(cfg).route, crisp::Route::dense);
  }
  {
    crisp::Config cfg = crisp_test::crisp_v1_config();
    cfg.set("dense_below=640");
    Flat f(640);
    EXPECT_EQ(f.plan(cfg).route, crisp::Route::dense);
  }
  {
    // FlexPrefill preset: min_budget 1024 -> n = 1000 dense.
    Flat f(1000);
    EXPECT_EQ(f.plan(crisp::Config::from_preset("flexprefill")).route, crisp::Route::dense);
  }
}

}  // namespace
