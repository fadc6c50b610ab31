// src/eval/structured_frontier.cpp — the structured-workload frontier (structured_frontier.h).
#include "eval/structured_frontier.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "plan/rules.h"

namespace crisp {
namespace eval {
namespace {

using nlohmann::json;

bool row_keeps(const HeadPlan& head, int32_t r, int32_t block) {
  const auto first = head.col.begin() + head.row_ptr[static_cast<std::size_t>(r)];
  const auto last = head.col.begin() + head.row_ptr[static_cast<std::size_t>(r) + 1];
  return std::binary_search(first, last, block);
}

// Mean and minimum of the finite entries (NaN, NaN when there are none).
std::pair<double, double> mean_min(const std::vector<double>& values) {
  double sum = 0.0, lo = std::numeric_limits<double>::infinity();
  int64_t count = 0;
  for (double v : values) {
    if (std::isnan(v)) continue;
    sum += v;
    lo = std::min(lo, v);
    ++count;
  }
  if (count == 0) return {std::nan(""), std::nan("")};
  return {sum / static_cast<double>(count), lo};
}

// Density of the heads of one kind (causal-block weighted as Plan::density), null when none.
json kind_density(const Plan& plan, const std::vector<bool>& of_kind) {
  const SequencePlan& seq = plan.sequences.front();
  const double causal_per_head = static_cast<double>(rules::causal_blocks(seq.num_blocks));
  double kept = 0.0, causal = 0.0;
  for (std::size_t h = 0; h < seq.heads.size(); ++h) {
    if (!of_kind[h]) continue;
    kept += static_cast<double>(seq.heads[h].col.size());
    causal += causal_per_head;
  }
  return causal > 0.0 ? json(kept / causal) : json(nullptr);
}

json finite_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

}  // namespace

std::vector<double> needle_blocks_kept(const Plan& plan, const Workload& workload) {
  const SequencePlan& seq = plan.sequences.front();
  const int64_t group = plan.num_q_heads / plan.num_kv_heads;
  std::vector<double> out(static_cast<std::size_t>(plan.num_q_heads), std::nan(""));
  for (int64_t h = 0; h < plan.num_q_heads; ++h) {
    if (workload.head_is_diffuse[static_cast<std::size_t>(h)]) continue;  // its queries carry no needle
    const HeadPlan& head = seq.heads[static_cast<std::size_t>(h)];
    int64_t pairs = 0, kept = 0;
    for (int64_t position : workload.needle_positions[static_cast<std::size_t>(h / group)]) {
      const auto nb = static_cast<int32_t>(position / plan.block_size);
      for (int32_t r = nb; r < seq.num_blocks; ++r) {
        ++pairs;
        kept += row_keeps(head, r, nb) ? 1 : 0;
      }
    }
    if (pairs > 0) out[static_cast<std::size_t>(h)] = static_cast<double>(kept) / static_cast<double>(pairs);
  }
  return out;
}

std::vector<std::vector<double>> tail_output_errors(const Workload& workload, const std::vector<Plan>& plans,
                                                    int64_t queries) {
  const WorkloadSpec& spec = workload.spec;
  const int64_t n = workload.total_tokens, d = spec.head_dim, Hq = spec.num_q_heads;
  const int64_t group = Hq / spec.num_kv_heads;
  if (queries < 1 || queries > n)
    throw Error("error_queries", "is " + std::to_string(queries), "a count in [1, " + std::to_string(n) + "] (the tokens)");
  for (const Plan& p : plans) {
    if (p.sequences.size() != 1 || p.num_q_heads != Hq || p.head_dim != d)
      throw Error("plans", "do not match the workload", "one-sequence plans of this workload");
    if (p.softmax_scale != plans.front().softmax_scale)
      throw Error("plans", "have different softmax scales", "one softmax scale for every point");
  }
  const double scale = plans.empty() ? 1.0 / std::sqrt(static_cast<double>(d)) : plans.front().softmax_scale;
  const std::size_t P = plans.size();
  std::vector<std::vector<double>> errors(P, std::vector<double>(static_cast<std::size_t>(Hq), 0.0));
  for (int64_t h = 0; h < Hq; ++h) {
    const float* qh = workload.q.data() + h * n * d;
    const float* kh = workload.k.data() + (h / group) * n * d;
    const float* vh = workload.v.data() + (h / group) * n * d;
    std::vector<double> diff2(P, 0.0);
    double dense2 = 0.0;
#pragma omp parallel
    {
      std::vector<double> weight(static_cast<std::size_t>(n));
      std::vector<double> dense_out(static_cast<std::size_t>(d)), out(static_cast<std::size_t>(d));
      std::vector<double> my_diff2(P, 0.0);
      double my_dense2 = 0.0;
#pragma omp for schedule(dynamic, 4)
      for (int64_t i = n - queries; i < n; ++i) {
        const float* qi = qh + i * d;
        double top = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          const float* kj = kh + j * d;
          double s = 0.0;
          for (int64_t x = 0; x < d; ++x) s += static_cast<double>(qi[x]) * kj[x];
          weight[static_cast<std::size_t>(j)] = s * scale;
          top = std::max(top, s * scale);
        }
        for (int64_t j = 0; j <= i; ++j) weight[static_cast<std::size_t>(j)] = std::exp(weight[static_cast<std::size_t>(j)] - top);
        // out = sum over the keys [begin, end) of the weights times V; returns the weight sum.
        auto accumulate = [&](int64_t begin, int64_t end, std::vector<double>& acc) {
          double z = 0.0;
          for (int64_t j = begin; j < end; ++j) {
            const double w = weight[static_cast<std::size_t>(j)];
            const float* vj = vh + j * d;
            z += w;
            for (int64_t x = 0; x < d; ++x) acc[static_cast<std::size_t>(x)] += w * vj[x];
          }
          return z;
        };
        std::fill(dense_out.begin(), dense_out.end(), 0.0);
        const double z_dense = accumulate(0, i + 1, dense_out);
        for (int64_t x = 0; x < d; ++x) {
          dense_out[static_cast<std::size_t>(x)] /= z_dense;
          my_dense2 += dense_out[static_cast<std::size_t>(x)] * dense_out[static_cast<std::size_t>(x)];
        }
        for (std::size_t p = 0; p < P; ++p) {
          const Plan& plan = plans[p];
          const HeadPlan& head = plan.sequences.front().heads[static_cast<std::size_t>(h)];
          const int64_t B = plan.block_size, r = i / B;
          std::fill(out.begin(), out.end(), 0.0);
          double z = 0.0;
          for (int32_t e = head.row_ptr[static_cast<std::size_t>(r)]; e < head.row_ptr[static_cast<std::size_t>(r) + 1]; ++e) {
            const int64_t c = head.col[static_cast<std::size_t>(e)];
            z += accumulate(c * B, std::min(c * B + B, i + 1), out);
          }
          for (int64_t x = 0; x < d; ++x) {
            const double delta = (z > 0.0 ? out[static_cast<std::size_t>(x)] / z : 0.0) - dense_out[static_cast<std::size_t>(x)];
            my_diff2[p] += delta * delta;
          }
        }
      }
#pragma omp critical
      {
        dense2 += my_dense2;
        for (std::size_t p = 0; p < P; ++p) diff2[p] += my_diff2[p];
      }
    }
    for (std::size_t p = 0; p < P; ++p)
      errors[p][static_cast<std::size_t>(h)] = dense2 > 0.0 ? std::sqrt(diff2[p] / dense2) : 0.0;
  }
  return errors;
}

int64_t run_structured_frontier(const StructuredFrontierSettings& settings, std::vector<FrontierPoint> points,
                                FrontierFile& file, const FrontierHooks& hooks) {
  if (settings.lengths.empty()) throw Error("--lengths", "is empty", "at least one length");
  if (settings.seeds.empty()) throw Error("--split", "gives no seeds", "at least one structured seed");
  put_dense_first(points);
  for (const FrontierPoint& p : points) file.add_point(p);
  file.begin_run();
  int64_t computed = 0;
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t seed : settings.seeds) {
    for (int64_t length : settings.lengths) {
      const std::string unit = "seed" + std::to_string(seed) + "-n" + std::to_string(length);
      std::vector<const FrontierPoint*> pending;
      for (const FrontierPoint& p : points)
        if (!file.has(p.name, unit)) pending.push_back(&p);
      if (pending.empty()) continue;
      if (settings.stop_after > 0 && computed >= settings.stop_after) {
        file.finish(false);
        return computed;
      }
      WorkloadSpec spec = settings.workload;
      spec.seq_lens = {length};
      spec.seed = seed;
      Workload workload = make_workload(spec);
      const TensorView q = workload.q_view(), k = workload.k_view();
      std::vector<Plan> plans;
      for (const FrontierPoint* p : pending) plans.push_back(crisp::plan(q, k, p->config, {}, settings.options));
      const std::vector<std::vector<double>> errors = tail_output_errors(workload, plans, settings.error_queries);
      const std::vector<bool>& no_local = workload.head_has_no_local;
      const std::vector<bool>& diffuse = workload.head_is_diffuse;
      std::vector<bool> structured(diffuse.size());
      for (std::size_t h = 0; h < structured.size(); ++h) structured[h] = !diffuse[h] && !no_local[h];
      for (std::size_t p = 0; p < pending.size(); ++p) {
        const auto [kept_mean, kept_min] = mean_min(needle_blocks_kept(plans[p], workload));
        const double error_mean = mean_min(errors[p]).first;
        const double error_max = *std::max_element(errors[p].begin(), errors[p].end());
        file.record(pending[p]->name, unit,
                    {{"seed", seed},
                     {"length", length},
                     {"heads", spec.num_q_heads},
                     {"density", plans[p].density()},
                     {"vs_share", plans[p].vs_share()},
                     {"needles_kept_mean", finite_or_null(kept_mean)},
                     {"needles_kept_min", finite_or_null(kept_min)},
                     {"rel_error_mean", error_mean},
                     {"rel_error_max", error_max},
                     {"density_structured", kind_density(plans[p], structured)},
                     {"density_no_local", kind_density(plans[p], no_local)},
                     {"density_diffuse", kind_density(plans[p], diffuse)}});
      }
      ++computed;
      if (hooks.progress) {
        char line[256];
        std::snprintf(line, sizeof line, "%s: %zu points (%.0f s)", unit.c_str(), pending.size(), seconds_since(start));
        hooks.progress(line);
      }
      file.checkpoint();
    }
  }
  file.finish(true);
  return computed;
}

}  // namespace eval
}  // namespace crisp
