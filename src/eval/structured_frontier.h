// src/eval/structured_frontier.h — the frontier harness on the structured synthetic workload
// (docs/workload.md), where the truth is known: which key blocks hold the planted needles each
// structured head retrieves. Per (seed, length) unit every sweep point is planned on the CPU and
// measured by density, the needle blocks kept (per head that retrieves needles) and the output
// error of the last queries against dense attention (float64). Results go to the same resumable
// frontier JSON as the model and capture frontiers (src/eval/frontier.h), mode "structured".
//
//   StructuredFrontierSettings s; s.lengths = {8192, 32768}; s.seeds = {11, 12, 13};
//   run_structured_frontier(s, points, file, hooks);
#pragma once
#include <cstdint>
#include <vector>

#include "crisp/crisp.h"
#include "crisp/workload.h"
#include "eval/frontier.h"

namespace crisp {
namespace eval {

struct StructuredFrontierSettings {
  WorkloadSpec workload;           // shapes and knobs; seq_lens and seed are set per unit
  std::vector<int64_t> lengths;    // one sequence of each length
  std::vector<uint64_t> seeds;     // workload seeds
  int64_t error_queries = 256;     // the output error is measured over the last this many queries
  Options options;                 // CPU planner threads
  int64_t stop_after = 0;          // > 0: stop after this many units computed in this run
};

// Units computed in this run (each: one workload, every pending point).
int64_t run_structured_frontier(const StructuredFrontierSettings& settings, std::vector<FrontierPoint> points,
                                FrontierFile& file, const FrontierHooks& hooks);

// Per query head of a one-sequence plan of `workload`: the share of pairs (query block r, needle
// block nb) with r >= nb whose row r keeps nb, over the needles of the head's KV head; NaN for a
// head that retrieves no needle (a diffuse head, or a workload without needles).
std::vector<double> needle_blocks_kept(const Plan& plan, const Workload& workload);

// Relative output error of each plan's attention against dense attention on the last `queries`
// queries of a one-sequence workload, per plan and query head: ||O_plan - O_dense|| / ||O_dense||
// over those rows (Frobenius), in float64, with the softmax scale 1/sqrt(d). Throws crisp::Error
// naming `error_queries` when queries is not in [1, n].
std::vector<std::vector<double>> tail_output_errors(const Workload& workload, const std::vector<Plan>& plans,
                                                    int64_t queries);

}  // namespace eval
}  // namespace crisp
