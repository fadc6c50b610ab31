// Tests of src/eval/fidelity.{h,cpp}: the agreement of routing decisions, the exact threshold
// sweep behind the tau_proxy / rho calibration (crafted samples with a known answer), and the
// per-layer evaluation on small random inputs.
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "eval/fidelity.h"
#include "plan/rules.h"

namespace ev = crisp::eval;
using crisp::Route;

namespace {

ev::RoutingSample sample(double c_struct, Route jsd_route, int64_t n = 4096) {
  ev::RoutingSample s;
  s.n = n;
  s.c_struct = c_struct;
  s.jsd = 0.5;
  s.route_cstruct = Route::vs;
  s.route_jsd = jsd_route;
  return s;
}

}  // namespace

TEST(FidelityAgreement, CountsEqualDecisionsAndSkipsDense) {
  const std::vector<Route> a = {Route::vs, Route::pe, Route::vs, Route::dense, Route::pe};
  const std::vector<Route> b = {Route::vs, Route::vs, Route::vs, Route::vs, Route::pe};
  EXPECT_DOUBLE_EQ(ev::agreement(a, b), 3.0 / 4.0);  // the dense entry is not compared
  EXPECT_DOUBLE_EQ(ev::agreement(b, b), 1.0);
}

TEST(FidelityAgreement, NothingComparedIsNaNAndLengthsMustMatch) {
  EXPECT_TRUE(std::isnan(ev::agreement({Route::dense}, {Route::vs})));
  EXPECT_TRUE(std::isnan(ev::agreement({}, {})));
  EXPECT_THROW(ev::agreement({Route::vs}, {Route::vs, Route::pe}), crisp::Error);
}

TEST(FidelitySweep, SeparableSamplesGiveFullAgreementAtTheMidpoint) {
  // JSD: PE below 0.25, VS from 0.375: every threshold in (0.25, 0.375] reproduces it.
  const std::vector<ev::RoutingSample> s = {sample(0.125, Route::pe), sample(0.375, Route::vs),
                                            sample(0.25, Route::pe), sample(0.5, Route::vs)};
  const ev::ThresholdSweep sweep = ev::sweep_threshold(s, ev::RoutingForm::absolute, 128, 128);
  EXPECT_EQ(sweep.samples, 4);
  EXPECT_DOUBLE_EQ(sweep.best_agreement, 1.0);
  EXPECT_DOUBLE_EQ(sweep.best_lo, 0.25);
  EXPECT_DOUBLE_EQ(sweep.best_hi, 0.375);
  EXPECT_DOUBLE_EQ(sweep.best_threshold, 0.3125);
  EXPECT_DOUBLE_EQ(ev::agreement_at(s, ev::RoutingForm::absolute, sweep.best_threshold, 128, 128), 1.0);
  // The boundary is inclusive on the VS side (C_struct >= tau_proxy is VS).
  EXPECT_DOUBLE_EQ(ev::agreement_at(s, ev::RoutingForm::absolute, 0.375, 128, 128), 1.0);
  EXPECT_DOUBLE_EQ(ev::agreement_at(s, ev::RoutingForm::absolute, 0.25, 128, 128), 0.75);
}

TEST(FidelitySweep, TiedRangesPreferTheWidest) {
  // Agreement 4/5 on (0.125, 0.25] (width 0.125) and on (0.375, 0.875] (width 0.5); 3/5 elsewhere.
  const std::vector<ev::RoutingSample> s = {sample(0.125, Route::pe), sample(0.25, Route::vs),
                                            sample(0.375, Route::pe), sample(0.875, Route::vs),
                                            sample(0.9375, Route::vs)};
  const ev::ThresholdSweep sweep = ev::sweep_threshold(s, ev::RoutingForm::absolute, 128, 128);
  EXPECT_DOUBLE_EQ(sweep.best_agreement, 0.8);
  EXPECT_DOUBLE_EQ(sweep.best_lo, 0.375);
  EXPECT_DOUBLE_EQ(sweep.best_hi, 0.875);
  EXPECT_DOUBLE_EQ(sweep.best_threshold, 0.625);
}

TEST(FidelitySweep, EqualStatisticsMoveTogether) {
  // Two samples share C_struct 0.25 with opposite JSD decisions: no threshold separates them.
  const std::vector<ev::RoutingSample> s = {sample(0.25, Route::pe), sample(0.25, Route::vs),
                                            sample(0.5, Route::vs)};
  const ev::ThresholdSweep sweep = ev::sweep_threshold(s, ev::RoutingForm::absolute, 128, 128);
  EXPECT_NEAR(sweep.best_agreement, 2.0 / 3.0, 1e-15);
}

TEST(FidelitySweep, AllPeIsAnOpenRangeAboveTheLargestStatistic) {
  const std::vector<ev::RoutingSample> s = {sample(0.25, Route::pe), sample(0.5, Route::pe)};
  const ev::ThresholdSweep sweep = ev::sweep_threshold(s, ev::RoutingForm::absolute, 128, 128);
  EXPECT_DOUBLE_EQ(sweep.best_agreement, 1.0);
  EXPECT_DOUBLE_EQ(sweep.best_lo, 0.5);
  EXPECT_TRUE(std::isinf(sweep.best_hi));
  EXPECT_GT(sweep.best_threshold, 0.5);
  EXPECT_DOUBLE_EQ(ev::agreement_at(s, ev::RoutingForm::absolute, sweep.best_threshold, 128, 128), 1.0);
}

TEST(FidelitySweep, AllVsTakesTheSmallestStatistic) {
  const std::vector<ev::RoutingSample> s = {sample(0.25, Route::vs), sample(0.5, Route::vs)};
  const ev::ThresholdSweep sweep = ev::sweep_threshold(s, ev::RoutingForm::absolute, 128, 128);
  EXPECT_DOUBLE_EQ(sweep.best_agreement, 1.0);
  EXPECT_TRUE(std::isinf(sweep.best_lo));
  EXPECT_DOUBLE_EQ(sweep.best_threshold, 0.25);
}

TEST(FidelitySweep, RelativeFormAbsorbsTheLengthDependence) {
  // The same two kinds of head at 1024 and 4096 tokens: the absolute C_struct of each falls 4x
  // with n, C_rel = C_struct * n / 256 does not. Only the relative form separates all four.
  const std::vector<ev::RoutingSample> s = {sample(0.5, Route::vs, 1024), sample(0.2, Route::pe, 1024),
                                            sample(0.125, Route::vs, 4096), sample(0.05, Route::pe, 4096)};
  const ev::ThresholdSweep abs = ev::sweep_threshold(s, ev::RoutingForm::absolute, 128, 128);
  const ev::ThresholdSweep rel = ev::sweep_threshold(s, ev::RoutingForm::relative, 128, 128);
  EXPECT_DOUBLE_EQ(abs.best_agreement, 0.75);
  EXPECT_DOUBLE_EQ(rel.best_agreement, 1.0);
  EXPECT_NEAR(rel.best_lo, 0.8, 1e-12);  // 0.2 * 1024 / 256
  EXPECT_NEAR(rel.best_hi, 2.0, 1e-12);  // 0.5 * 1024 / 256
  EXPECT_NEAR(ev::routing_statistic(s[2], ev::RoutingForm::relative, 128, 128), 2.0, 1e-12);
}

TEST(FidelitySweep, GridMatchesAgreementAtAndDenseSamplesAreSkipped) {
  std::vector<ev::RoutingSample> s = {sample(0.125, Route::pe), sample(0.375, Route::vs), sample(0.25, Route::vs)};
  s.push_back(sample(0.0, Route::dense));
  const std::vector<double> grid = {0.0, 0.2, 0.3, 0.4};
  const ev::ThresholdSweep sweep = ev::sweep_threshold(s, ev::RoutingForm::absolute, 128, 128, grid);
  EXPECT_EQ(sweep.samples, 3);
  ASSERT_EQ(sweep.grid.size(), grid.size());
  const double expected[] = {2.0 / 3.0, 1.0, 2.0 / 3.0, 1.0 / 3.0};
  for (size_t i = 0; i < grid.size(); ++i) {
    EXPECT_DOUBLE_EQ(sweep.grid[i].threshold, grid[i]);
    EXPECT_NEAR(sweep.grid[i].agreement, expected[i], 1e-15) << "threshold " << grid[i];
  }
}

TEST(FidelitySweep, NoRoutedSampleIsAnError) {
  EXPECT_THROW(ev::sweep_threshold({}, ev::RoutingForm::absolute, 128, 128), crisp::Error);
  EXPECT_THROW(ev::sweep_threshold({sample(0.5, Route::dense)}, ev::RoutingForm::absolute, 128, 128), crisp::Error);
  ev::RoutingSample bad = sample(std::numeric_limits<double>::quiet_NaN(), Route::vs);
  EXPECT_THROW(ev::sweep_threshold({bad}, ev::RoutingForm::absolute, 128, 128), crisp::Error);
}

namespace {

struct RandomQkv {
  int64_t hq, hkv, n, d;
  std::vector<float> q, k, v;
  RandomQkv(int64_t hq_, int64_t hkv_, int64_t n_, int64_t d_, unsigned seed) : hq(hq_), hkv(hkv_), n(n_), d(d_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    q.resize(hq * n * d);
    k.resize(hkv * n * d);
    v.resize(hkv * n * d);
    for (float& x : q) x = normal(rng);
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    // A strong sink on key 0 of kv head 0, so at least one head is structural.
    for (int64_t x = 0; x < d; ++x) k[x] = 3.0f;
  }
  crisp::TensorView qv() { return crisp::TensorView::contiguous(q.data(), crisp::DType::f32, hq, n, d); }
  crisp::TensorView kv() { return crisp::TensorView::contiguous(k.data(), crisp::DType::f32, hkv, n, d); }
  crisp::TensorView vv() { return crisp::TensorView::contiguous(v.data(), crisp::DType::f32, hkv, n, d); }
};

std::vector<ev::PolicySpec> policies(int block) {
  std::vector<ev::PolicySpec> out;
  for (const char* name : {"dense", "crisp", "flexprefill", "minference"}) {
    crisp::Config c = crisp::Config::from_preset(name);
    c.block_size = block;
    out.push_back({name, c});
  }
  return out;
}

}  // namespace

TEST(FidelityLayer, DenseIsExactAndRoutingMatchesTheRule) {
  RandomQkv in(4, 2, 640, 32, 7);
  crisp::Config routing = crisp::Config::from_preset("crisp");
  routing.block_size = 64;
  const ev::LayerFidelity f = ev::evaluate_layer(in.qv(), in.kv(), in.vv(), policies(64), routing);
  ASSERT_EQ(f.metrics.size(), 4u);
  ASSERT_EQ(f.plans.size(), 4u);
  for (const ev::PolicyHeadMetrics& m : f.metrics[0]) {  // dense against itself
    EXPECT_EQ(m.route, Route::dense);
    EXPECT_EQ(m.density, 1.0);
    EXPECT_EQ(m.recall_mean, 1.0);
    EXPECT_EQ(m.rel_error, 0.0);
  }
  for (size_t p = 1; p < 4; ++p) {
    for (const ev::PolicyHeadMetrics& m : f.metrics[p]) {
      EXPECT_GT(m.density, 0.0);
      EXPECT_LE(m.density, 1.0);
      EXPECT_GT(m.recall_min, 0.0);
      EXPECT_LE(m.recall_min, m.recall_mean);
      EXPECT_LE(m.recall_mean, 1.0 + 1e-6);
      EXPECT_GE(m.rel_error, 0.0);
    }
  }
  ASSERT_EQ(f.routing.size(), 4u);
  for (size_t h = 0; h < 4; ++h) {
    const ev::RoutingSample& s = f.routing[h];
    EXPECT_EQ(s.n, 640);
    ASSERT_TRUE(std::isfinite(s.c_struct));
    ASSERT_TRUE(std::isfinite(s.jsd));
    EXPECT_EQ(s.route_cstruct, s.c_struct >= routing.tau_proxy ? Route::vs : Route::pe);
    EXPECT_EQ(s.route_jsd, s.jsd < routing.tau ? Route::pe : Route::vs);
    // The crisp policy plans with the preset's routing (the calibrated relative form): its
    // decision follows from the same C_struct.
    ASSERT_EQ(routing.routing, crisp::Routing::cstruct_rel);
    const double c_rel = crisp::rules::cstruct_relative(s.c_struct, s.n, routing.w_sink, routing.w_local);
    EXPECT_EQ(f.metrics[1][h].route, c_rel >= routing.rho ? Route::vs : Route::pe) << "C_rel " << c_rel;
    // The sweep at the config's threshold reproduces the cstruct plan's decisions.
    EXPECT_EQ(ev::agreement_at({s}, ev::RoutingForm::absolute, routing.tau_proxy, 128, 128),
              s.route_cstruct == s.route_jsd ? 1.0 : 0.0);
  }
}

TEST(FidelityLayer, ShortSequenceHasNoRoutingSamples) {
  RandomQkv in(2, 1, 100, 16, 3);  // N = 2 blocks of 64: dense (§7)
  crisp::Config routing = crisp::Config::from_preset("crisp");
  routing.block_size = 64;
  const ev::LayerFidelity f = ev::evaluate_layer(in.qv(), in.kv(), in.vv(), policies(64), routing);
  EXPECT_TRUE(f.routing.empty());
  for (const auto& per_policy : f.metrics)
    for (const ev::PolicyHeadMetrics& m : per_policy) EXPECT_EQ(m.route, Route::dense);
}
