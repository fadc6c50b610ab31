// src/eval/frontier.h — the frontier harness of `crisp eval pareto`: every point of a knob sweep
// (src/eval/sweep.h) measured against density on captured real attention (recall, recall of the
// top-mass blocks, output error). Results live in one JSON document that is RESUMABLE: a
// (point, unit) pair already in it is not computed again, so a run can be stopped and re-run, or a
// sweep extended. (The NIAH frontier on a real model is crisp-llama-eval's, on the same FrontierFile.)
//
//   FrontierFile file = FrontierFile::open(path, settings, "--json");   // resumes if it exists
//   run_capture_frontier(settings, points, file, hooks);
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "crisp/crisp.h"
#include "eval/frontier_file.h"
#include "eval/sweep.h"

namespace crisp {
namespace eval {

// Shared by the frontier runners: the dense point first (added when the sweeps lack it: every other
// point is read against it), and the seconds of a run so far for progress lines.
void put_dense_first(std::vector<FrontierPoint>& points);
double seconds_since(std::chrono::steady_clock::time_point start);

struct FrontierHooks {
  std::function<void(const std::string& line)> progress;  // one line per computed pair
};

// Captures frontier: every layer of every capture directory (`crisp-llama-eval capture`), every
// point; a unit is one (capture, layer). `top_mass_share` defines the top-mass blocks (see top_mass_recall).
struct CaptureFrontierSettings {
  std::vector<std::string> captures;
  double top_mass_share = 0.9;
  Options options;
  int64_t stop_after = 0;  // > 0: stop after this many layers computed in this run
};
int64_t run_capture_frontier(const CaptureFrontierSettings& settings, std::vector<FrontierPoint> points,
                             FrontierFile& file, const FrontierHooks& hooks);

// The true causal attention mass of query head `head` per block pair: mass[r * N + c] = sum over the
// queries i of block r of the softmax weight query i gives the keys of block c (so row r sums to
// the number of queries in block r). q [Hq, n, d], k [Hkv, n, d], float32; scale 0 = 1/sqrt(d).
std::vector<double> block_masses(const TensorView& q, const TensorView& k, int64_t head, int block_size, double scale);

// Recall of the top-mass blocks of one head: per query-block row r, T_r is the smallest set of key
// blocks, heaviest first, whose true mass reaches `share` of the row's mass; the result is
// sum_r |T_r ∩ kept_r| / sum_r |T_r|, kept_r the blocks the plan keeps in row r.
double top_mass_recall(const std::vector<double>& masses, int32_t num_blocks, const HeadPlan& head, double share);

}  // namespace eval
}  // namespace crisp
