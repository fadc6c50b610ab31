// tools/gpu_timing.h — what the GPU benchmarks of the `crisp` command share: CUDA error checks
// that become command failures, an owning device buffer, and event timing (median of repeated
// runs after warm-up). CUDA builds only.
#pragma once
#if defined(CRISP_WITH_CUDA)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "commands.h"
#include "common/half.h"
#include "crisp/workload.h"

namespace crisp_cli {
namespace gpu {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw CommandFailure(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(status));
}

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(std::size_t bytes) { check(cudaMalloc(&ptr, bytes), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// Median milliseconds of fn() on `stream` over `reps` runs after `warmup` runs (CUDA events).
template <typename Fn>
double time_ms(cudaStream_t stream, int warmup, int reps, Fn fn) {
  for (int i = 0; i < warmup; ++i) fn();
  check(cudaStreamSynchronize(stream), "warm-up");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    fn();
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float t = 0.f;
    check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return median(ms);
}

// Median milliseconds of each of `runs` on `stream`, the runs interleaved: `warmup` rounds, then
// `reps` rounds of every run once, round i starting at run i % runs.size() (so each run is the
// round's first, after the previous round's last, in an equal share of the rounds). Runs compared
// with each other are then measured under the same clocks:
// the GPU's clocks drift over a long benchmark (heat, power), and timing one run's reps after
// another's puts that drift into their ratio.
inline std::vector<double> time_interleaved_ms(cudaStream_t stream, int warmup, int reps,
                                               const std::vector<std::function<void()>>& runs) {
  for (int i = 0; i < warmup; ++i)
    for (const auto& run : runs) run();
  check(cudaStreamSynchronize(stream), "warm-up");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<std::vector<double>> ms(runs.size());
  for (int i = 0; i < reps; ++i)
    for (std::size_t j = 0; j < runs.size(); ++j) {
      const std::size_t r = (static_cast<std::size_t>(i) + j) % runs.size();
      check(cudaEventRecord(start, stream), "cudaEventRecord");
      runs[r]();
      check(cudaEventRecord(stop, stream), "cudaEventRecord");
      check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float t = 0.f;
      check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
      ms[r].push_back(t);
    }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::vector<double> medians;
  for (std::vector<double>& m : ms) medians.push_back(median(std::move(m)));
  return medians;
}

// Recall per query, exp(LSE - LSE_dense), over every (head, query): mean and minimum.
struct Recall {
  double mean = 0.0, min = 0.0;
};
inline Recall recall_against_dense(const std::vector<float>& lse, const std::vector<float>& lse_dense) {
  double sum = 0.0, lowest = 1e300;
  for (std::size_t i = 0; i < lse.size(); ++i) {
    const double r = std::exp(static_cast<double>(lse[i]) - lse_dense[i]);
    sum += r;
    lowest = std::min(lowest, r);
  }
  return {sum / static_cast<double>(lse.size()), lowest};
}

// The seeded structured workload (crisp/workload.h) of one sequence, as bf16 q [H, n, d] and
// k / v [Hkv, n, d]: the inputs of every GPU benchmark.
struct Bf16Workload {
  std::vector<uint16_t> q, k, v;
};
inline std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < static_cast<int64_t>(x.size()); ++i) out[i] = crisp::half::float_to_bf16(x[i]);
  return out;
}
inline Bf16Workload bf16_workload(int64_t heads, int64_t kv_heads, int64_t dim, int64_t n, uint64_t seed,
                                  double diffuse_share) {
  crisp::WorkloadSpec spec;
  spec.num_q_heads = heads;
  spec.num_kv_heads = kv_heads;
  spec.head_dim = dim;
  spec.seq_lens = {n};
  spec.seed = seed;
  spec.diffuse_head_share = diffuse_share;
  const crisp::Workload w = crisp::make_workload(spec);
  return {to_bf16(w.q), to_bf16(w.k), to_bf16(w.v)};
}

}  // namespace gpu
}  // namespace crisp_cli
#endif
