// src/eval/fidelity.h — attention fidelity of the sparse policies on real attention maps
// (spec §9), and the calibration of the C_struct routing thresholds against JSD routing (§2).
//
//   LayerFidelity f = evaluate_layer(q, k, v, policies, routing_config);   // one captured layer
//   ThresholdSweep s = sweep_threshold(samples, RoutingForm::absolute);     // tau_proxy
//
// evaluate_layer runs the dense attention once (the baseline), then every policy's plan + attend
// on the same inputs and crisp::compare against the dense run. The routing comparison plans the
// same inputs twice, once with routing=cstruct and once with routing=jsd (every other parameter
// from the routing config), and keeps both statistics and both decisions of every head.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "crisp/crisp.h"

namespace crisp {
namespace eval {

// One policy to evaluate: a name for the report and the config it runs.
struct PolicySpec {
  std::string name;
  Config config;
};

// §9 metrics of one (policy, query head) against the dense run of the same inputs.
struct PolicyHeadMetrics {
  Route route = Route::dense;
  double density = 1.0;
  double recall_mean = 1.0;
  double recall_min = 1.0;
  double rel_error = 0.0;
};

// Routing statistics and decisions of one query head.
struct RoutingSample {
  int64_t n = 0;                 // sequence length the statistics were measured at
  double c_struct = 0.0;         // §2 C_struct (w_sink / w_local of the routing config)
  double jsd = 0.0;              // §2 JS distance
  Route route_cstruct = Route::dense;  // decision of routing=cstruct at the config's tau_proxy
  Route route_jsd = Route::dense;      // decision of routing=jsd at the config's tau
};

struct LayerFidelity {
  int64_t n = 0;
  int64_t num_q_heads = 0;
  // [policy][head], policies in the order given.
  std::vector<std::vector<PolicyHeadMetrics>> metrics;
  // [head]; empty when the sequence is short (§7: every head dense, no statistics).
  std::vector<RoutingSample> routing;
  // Chosen block layouts of every policy (plan order), kept for the figures.
  std::vector<Plan> plans;
};

// q [Hq, n, d], k/v [Hkv, n, d] CPU views of one sequence. With no policies only the routing
// comparison runs (no attention at all: cheap enough for long captures). `routing_config` gives w_sink,
// w_local, tau_proxy, tau and block_size for the routing comparison (its routing field is
// ignored). Throws crisp::Error on bad input (as crisp::plan / attend do).
LayerFidelity evaluate_layer(const TensorView& q, const TensorView& k, const TensorView& v,
                             const std::vector<PolicySpec>& policies, const Config& routing_config,
                             const Options& options = {});

// Share of heads on which two decision lists agree (dense entries are skipped; 0 heads compared
// gives NaN). Throws crisp::Error if the lists differ in length.
double agreement(const std::vector<Route>& a, const std::vector<Route>& b);

// The two forms of the C_struct rule (§2): absolute C_struct >= tau_proxy, or relative
// C_struct * n / (w_sink + w_local) >= rho.
enum class RoutingForm { absolute, relative };
const char* to_string(RoutingForm form);

// The statistic a form thresholds (C_struct, or C_rel through rules::cstruct_relative).
double routing_statistic(const RoutingSample& sample, RoutingForm form, int64_t w_sink, int64_t w_local);

struct SweepPoint {
  double threshold = 0.0;
  double agreement = 0.0;  // share of samples whose thresholded decision equals route_jsd
};

// The result of sweeping the threshold of one form over a set of samples.
struct ThresholdSweep {
  RoutingForm form = RoutingForm::absolute;
  int64_t samples = 0;
  // Every distinct decision set: the threshold range (lo, hi] gives the same decisions, so the
  // sweep is exact, not a grid. best_lo / best_hi bound the range of maximal agreement (the
  // widest one when several ranges tie; hi = +inf when routing everything PE is best).
  double best_lo = 0.0;
  double best_hi = 0.0;
  double best_threshold = 0.0;  // a representative of (best_lo, best_hi]: see pick_threshold
  double best_agreement = 0.0;
  // Agreement on a caller-given grid (for tables and figures).
  std::vector<SweepPoint> grid;
};

// Sweeps the threshold of `form` over `samples` (dense samples skipped) against their JSD
// decisions and evaluates `grid` too. Throws crisp::Error if no sample has a decision.
ThresholdSweep sweep_threshold(const std::vector<RoutingSample>& samples, RoutingForm form, int64_t w_sink,
                               int64_t w_local, const std::vector<double>& grid = {});

// Agreement of one fixed threshold of `form` with the JSD decisions of `samples`.
double agreement_at(const std::vector<RoutingSample>& samples, RoutingForm form, double threshold, int64_t w_sink,
                    int64_t w_local);

// A representative threshold of the range (lo, hi]: the midpoint for a finite range, and for the
// open-ended range (lo, +inf) lo itself nudged up (lo * (1 + 1e-9) + 1e-12).
double pick_threshold(double lo, double hi);

}  // namespace eval
}  // namespace crisp
