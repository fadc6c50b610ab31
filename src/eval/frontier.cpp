// src/eval/frontier.cpp — see frontier.h.
#include "eval/frontier.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <utility>

#include "crisp/npy.h"
#include "eval/fidelity.h"
#include "eval/json_file.h"

namespace crisp {
namespace eval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

}  // namespace

void put_dense_first(std::vector<FrontierPoint>& points) {
  const auto it = std::find_if(points.begin(), points.end(), [](const FrontierPoint& p) { return p.name == kDensePoint; });
  if (it == points.end()) {
    FrontierPoint dense;
    dense.name = dense.policy = kDensePoint;
    dense.config = Config::from_preset(kDensePoint);
    points.insert(points.begin(), dense);
  } else {
    std::rotate(points.begin(), it, it + 1);
  }
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::vector<double> block_masses(const TensorView& q, const TensorView& k, int64_t head, int block_size, double scale) {
  if (q.dtype != DType::f32 || k.dtype != DType::f32 || q.device != Device::cpu || k.device != Device::cpu) {
    throw Error("q/k", "are not float32 CPU tensors", "float32 captures");
  }
  const int64_t n = q.tokens(), d = q.dim();
  const int64_t group = q.heads() / std::max<int64_t>(1, k.heads());
  const int64_t kv_head = head / std::max<int64_t>(1, group);
  const int64_t blocks = (n + block_size - 1) / block_size;
  const double s = scale > 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(d));
  const float* qd = static_cast<const float*>(q.data);
  const float* kd = static_cast<const float*>(k.data);
  std::vector<double> masses(static_cast<std::size_t>(blocks * blocks), 0.0);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t r = 0; r < blocks; ++r) {
    std::vector<double> scores(static_cast<std::size_t>(n));
    for (int64_t i = r * block_size; i < std::min(n, (r + 1) * block_size); ++i) {
      double top = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0.0;
        for (int64_t x = 0; x < d; ++x) dot += static_cast<double>(qd[q.offset(head, i, x)]) * kd[k.offset(kv_head, j, x)];
        scores[j] = dot * s;
        top = std::max(top, scores[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j <= i; ++j) sum += (scores[j] = std::exp(scores[j] - top));
      for (int64_t j = 0; j <= i; ++j) masses[static_cast<std::size_t>(r * blocks + j / block_size)] += scores[j] / sum;
    }
  }
  return masses;
}

double top_mass_recall(const std::vector<double>& masses, int32_t num_blocks, const HeadPlan& head, double share) {
  if (!(share > 0.0 && share <= 1.0)) throw Error("top_mass_share", "is " + std::to_string(share), "a share in (0, 1]");
  int64_t top_total = 0, top_kept = 0;
  std::vector<int32_t> order;
  for (int32_t r = 0; r < num_blocks; ++r) {
    const double* row = masses.data() + static_cast<std::size_t>(r) * num_blocks;
    order.resize(static_cast<std::size_t>(r) + 1);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    const double row_mass = std::accumulate(row, row + r + 1, 0.0);
    const auto kept_begin = head.col.begin() + head.row_ptr[r];
    const auto kept_end = head.col.begin() + head.row_ptr[r + 1];
    double covered = 0.0;
    for (int32_t c : order) {
      if (covered >= share * row_mass) break;
      covered += row[c];
      ++top_total;
      top_kept += std::binary_search(kept_begin, kept_end, c);
    }
  }
  return top_total ? static_cast<double>(top_kept) / static_cast<double>(top_total) : 1.0;
}

int64_t run_capture_frontier(const CaptureFrontierSettings& settings, std::vector<FrontierPoint> points,
                             FrontierFile& file, const FrontierHooks& hooks) {
  put_dense_first(points);
  for (const FrontierPoint& p : points) file.add_point(p);
  file.begin_run();
  const Config routing = Config::from_preset("crisp");
  int64_t computed_layers = 0;
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& dir : settings.captures) {
    const Capture capture = read_capture(dir, "--captures");
    if (capture.layers.empty())
      throw Error("--captures", "'" + dir + "/meta.json' lists no layers", "a capture of at least one layer");
    for (const CaptureLayer& f : capture.layers) {
      const int64_t layer = f.layer;
      const std::string unit = dir + "#" + std::to_string(layer);
      std::vector<PolicySpec> pending;
      for (const FrontierPoint& p : points) {
        if (!file.has(p.name, unit)) pending.push_back({p.name, p.config});
      }
      if (pending.empty()) continue;
      if (settings.stop_after > 0 && computed_layers >= settings.stop_after) {
        file.finish(false);
        return computed_layers;
      }
      const std::string where = "--captures " + dir + " layer " + std::to_string(layer);
      NpyArray q = read_npy(f.q), k = read_npy(f.k), v = read_npy(f.v);
      const TensorView qv = q.view(where + " q", 3), kv = k.view(where + " k", 3), vv = v.view(where + " v", 3);
      const LayerFidelity lf = evaluate_layer(qv, kv, vv, pending, routing, settings.options);
      // The true block masses, once per (head, block size) for every pending point.
      std::map<std::pair<int64_t, int>, std::vector<double>> masses;
      for (std::size_t p = 0; p < pending.size(); ++p) {
        const Plan& plan = lf.plans[p];
        const SequencePlan& seq = plan.sequences.front();
        double density = 0, recall = 0, recall_min = 1, top = 0, top_min = 1, error = 0, error_max = 0;
        for (int64_t h = 0; h < lf.num_q_heads; ++h) {
          const PolicyHeadMetrics& m = lf.metrics[p][static_cast<std::size_t>(h)];
          auto& mass = masses[{h, plan.block_size}];
          if (mass.empty()) mass = block_masses(qv, kv, h, plan.block_size, pending[p].config.softmax_scale);
          const double t = top_mass_recall(mass, seq.num_blocks, seq.heads[static_cast<std::size_t>(h)],
                                           settings.top_mass_share);
          density += m.density;
          recall += m.recall_mean;
          recall_min = std::min(recall_min, m.recall_min);
          top += t;
          top_min = std::min(top_min, t);
          error += m.rel_error;
          error_max = std::max(error_max, m.rel_error);
        }
        const double heads = static_cast<double>(lf.num_q_heads);
        file.record(pending[p].name, unit,
                    {{"capture", dir}, {"layer", layer}, {"length", lf.n}, {"heads", lf.num_q_heads},
                     {"density_mean", density / heads}, {"recall_mean", recall / heads}, {"recall_min", recall_min},
                     {"top_mass_recall_mean", top / heads}, {"top_mass_recall_min", top_min},
                     {"rel_error_mean", error / heads}, {"rel_error_max", error_max}});
      }
      ++computed_layers;
      if (hooks.progress) {
        char line[512];
        std::snprintf(line, sizeof line, "%s layer %lld (n = %lld): %zu points (%.0f s)", dir.c_str(),
                      static_cast<long long>(layer), static_cast<long long>(lf.n), pending.size(), seconds_since(start));
        hooks.progress(line);
      }
      file.checkpoint();
    }
  }
  file.finish(true);
  return computed_layers;
}

}  // namespace eval
}  // namespace crisp
