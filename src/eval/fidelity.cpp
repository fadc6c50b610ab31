// src/eval/fidelity.cpp — see fidelity.h.
#include "eval/fidelity.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "plan/rules.h"

namespace crisp {
namespace eval {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Output and LSE buffers of one run, with their views.
struct RunBuffers {
  std::vector<float> out, lse;
  TensorView out_view, lse_view;
  RunBuffers(int64_t heads, int64_t tokens, int64_t dim)
      : out(static_cast<size_t>(heads * tokens * dim)), lse(static_cast<size_t>(heads * tokens)) {
    out_view = TensorView::contiguous(out.data(), DType::f32, heads, tokens, dim);
    lse_view = TensorView::contiguous2d(lse.data(), DType::f32, heads, tokens);
  }
};

// The decision of `form` at `threshold`, through the routing rule itself.
Route decide(const RoutingSample& s, RoutingForm form, double threshold, int64_t w_sink, int64_t w_local) {
  const int32_t routing = form == RoutingForm::absolute ? rules::kRoutingCstruct : rules::kRoutingCstructRel;
  const int32_t code = rules::route_head(routing, s.c_struct, s.jsd, s.n, w_sink, w_local, threshold, threshold, 0.0);
  return code == rules::kRouteVs ? Route::vs : Route::pe;
}

bool has_decision(const RoutingSample& s) { return s.route_jsd != Route::dense; }

}  // namespace

const char* to_string(RoutingForm form) { return form == RoutingForm::absolute ? "cstruct" : "cstruct_rel"; }

LayerFidelity evaluate_layer(const TensorView& q, const TensorView& k, const TensorView& v,
                             const std::vector<PolicySpec>& policies, const Config& routing_config,
                             const Options& options) {
  LayerFidelity result;
  result.n = q.tokens();
  result.num_q_heads = q.heads();
  const int64_t hq = q.heads(), hkv = k.heads(), n = q.tokens(), d = q.dim();

  // Fidelity is measured against full causal attention: a policy with a sliding window (§12)
  // computes other attention, and is refused rather than scored against it.
  for (const PolicySpec& policy : policies)
    if (policy.config.window != 0)
      throw Error("policy", "sets window = " + std::to_string(policy.config.window),
                  "no sliding window in eval fidelity (it compares with full causal attention)");
  // The baseline: dense attention, run once (not at all when no policy is evaluated: the
  // routing comparison alone needs only the plans).
  RunBuffers dense(policies.empty() ? 0 : hq, n, d);
  RunBuffers sparse(policies.empty() ? 0 : hq, n, d);
  if (!policies.empty()) {
    const Plan dense_layout = dense_plan(hq, hkv, d, {0, n}, routing_config.block_size, routing_config.softmax_scale);
    attend(q, k, v, dense_layout, dense.out_view, dense.lse_view, options);
  }
  for (const PolicySpec& policy : policies) {
    // The dense preset is the baseline itself: comparing it with itself still goes through
    // compare(), so its row shows recall 1 and error 0 only because compare() says so.
    const bool is_dense = policy.config.dense;
    Plan p = is_dense ? dense_plan(hq, hkv, d, {0, n}, policy.config.block_size, policy.config.softmax_scale)
                      : plan(q, k, policy.config, {}, options);
    if (!is_dense) attend(q, k, v, p, sparse.out_view, sparse.lse_view, options);
    const RunBuffers& run = is_dense ? dense : sparse;
    const std::vector<HeadMetrics> m = compare(run.out_view, run.lse_view, dense.out_view, dense.lse_view);
    std::vector<PolicyHeadMetrics> heads(static_cast<size_t>(hq));
    for (int64_t h = 0; h < hq; ++h) {
      const HeadPlan& hp = p.sequences.front().heads[static_cast<size_t>(h)];
      heads[h].route = hp.route;
      heads[h].density = hp.density;
      heads[h].recall_mean = m[h].recall_mean;
      heads[h].recall_min = m[h].recall_min;
      heads[h].rel_error = m[h].rel_error;
    }
    result.metrics.push_back(std::move(heads));
    result.plans.push_back(std::move(p));
  }

  // Routing: the same config planned with each routing. The jsd plan also carries C_struct
  // (computed for every routed head), the cstruct plan gives the decisions at tau_proxy.
  Config by_cstruct = routing_config;
  by_cstruct.dense = false;
  by_cstruct.routing = Routing::cstruct;
  Config by_jsd = by_cstruct;
  by_jsd.routing = Routing::jsd;
  const Plan plan_cstruct = plan(q, k, by_cstruct, {}, options);
  const Plan plan_jsd = plan(q, k, by_jsd, {}, options);
  const auto& heads_c = plan_cstruct.sequences.front().heads;
  const auto& heads_j = plan_jsd.sequences.front().heads;
  const bool short_sequence = !heads_j.empty() && heads_j.front().route == Route::dense;
  if (!short_sequence) {
    for (int64_t h = 0; h < hq; ++h) {
      RoutingSample s;
      s.n = n;
      s.c_struct = heads_j[h].c_struct;
      s.jsd = heads_j[h].jsd;
      s.route_cstruct = heads_c[h].route;
      s.route_jsd = heads_j[h].route;
      result.routing.push_back(s);
    }
  }
  return result;
}

double agreement(const std::vector<Route>& a, const std::vector<Route>& b) {
  if (a.size() != b.size())
    throw Error("agreement", "decision lists of " + std::to_string(a.size()) + " and " +
                                 std::to_string(b.size()) + " heads",
                "lists of equal length");
  int64_t compared = 0, same = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == Route::dense || b[i] == Route::dense) continue;
    ++compared;
    same += a[i] == b[i];
  }
  return compared ? static_cast<double>(same) / compared : std::numeric_limits<double>::quiet_NaN();
}

double routing_statistic(const RoutingSample& sample, RoutingForm form, int64_t w_sink, int64_t w_local) {
  return form == RoutingForm::absolute ? sample.c_struct
                                       : rules::cstruct_relative(sample.c_struct, sample.n, w_sink, w_local);
}

double agreement_at(const std::vector<RoutingSample>& samples, RoutingForm form, double threshold, int64_t w_sink,
                    int64_t w_local) {
  int64_t compared = 0, same = 0;
  for (const RoutingSample& s : samples) {
    if (!has_decision(s)) continue;
    ++compared;
    same += decide(s, form, threshold, w_sink, w_local) == s.route_jsd;
  }
  return compared ? static_cast<double>(same) / compared : std::numeric_limits<double>::quiet_NaN();
}

double pick_threshold(double lo, double hi) {
  if (std::isinf(hi)) return lo * (1.0 + 1e-9) + 1e-12;  // just above the largest statistic
  if (std::isinf(lo)) return hi;                          // the smallest statistic: every head VS
  return 0.5 * (lo + hi);
}

ThresholdSweep sweep_threshold(const std::vector<RoutingSample>& samples, RoutingForm form, int64_t w_sink,
                               int64_t w_local, const std::vector<double>& grid) {
  // (statistic, JSD says VS) of every sample with a decision, ascending by statistic.
  std::vector<std::pair<double, bool>> points;
  for (const RoutingSample& s : samples) {
    if (!has_decision(s)) continue;
    const double x = routing_statistic(s, form, w_sink, w_local);
    if (!std::isfinite(x))
      throw Error("samples", "a routed head has a non-finite C_struct", "finite routing statistics");
    points.emplace_back(x, s.route_jsd == Route::vs);
  }
  if (points.empty()) throw Error("samples", "no head with a routing decision", "at least one routed head");
  std::sort(points.begin(), points.end());

  ThresholdSweep sweep;
  sweep.form = form;
  sweep.samples = static_cast<int64_t>(points.size());
  const int64_t total = sweep.samples;
  // Threshold in (lo, hi] with lo = the previous distinct statistic: every point >= hi is VS.
  // Start below everything (all VS): agreement = number of JSD-VS points.
  int64_t agree = 0;
  for (const auto& p : points) agree += p.second;
  double lo = -kInf;
  int64_t best_agree = -1;
  double best_width = -1.0;
  size_t i = 0;
  while (true) {
    const double hi = i < points.size() ? points[i].first : kInf;
    const double width = hi - lo;  // inf for the two open-ended ranges
    // Most agreement first; among equal ones the widest range (the most robust choice).
    if (agree > best_agree || (agree == best_agree && width > best_width)) {
      best_agree = agree;
      best_width = width;
      sweep.best_lo = lo;
      sweep.best_hi = hi;
    }
    if (i >= points.size()) break;
    // Raise the threshold past this statistic: all points equal to it turn PE.
    const double x = points[i].first;
    while (i < points.size() && points[i].first == x) {
      agree += points[i].second ? -1 : 1;
      ++i;
    }
    lo = x;
  }
  sweep.best_agreement = static_cast<double>(best_agree) / static_cast<double>(total);
  sweep.best_threshold = pick_threshold(sweep.best_lo, sweep.best_hi);
  for (double t : grid) sweep.grid.push_back({t, agreement_at(samples, form, t, w_sink, w_local)});
  return sweep;
}

}  // namespace eval
}  // namespace crisp
