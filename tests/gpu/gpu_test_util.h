// tests/gpu/gpu_test_util.h — helpers shared by the GPU test files: an owning device allocation and
// the random block layout the attention tests run the kernels on.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <random>

#include "crisp/plan.h"

namespace crisp_gpu_test {

// One cudaMalloc, freed on scope exit. `ptr` is null when the allocation failed (tests check it).
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(std::size_t bytes) {
    if (cudaMalloc(&ptr, bytes) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// A random layout of the plan's shape: per (sequence, head, row) the anchors (block 0, and blocks
// r and r-1 that the local slash anchor reaches under the exact cover) plus each other block c
// with probability `keep`. Routed PE (its entries are free-form).
inline crisp::Plan random_plan(const crisp::Plan& dense, double keep, uint64_t seed) {
  crisp::Plan plan = dense;
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution take(keep);
  for (auto& sp : plan.sequences) {
    for (auto& hp : sp.heads) {
      hp.route = crisp::Route::pe;
      hp.vertical = {0};
      hp.slash = {0};
      hp.row_ptr.assign(1, 0);
      hp.col.clear();
      for (int32_t r = 0; r < sp.num_blocks; ++r) {
        for (int32_t c = 0; c <= r; ++c)
          if (c == 0 || c >= r - 1 || take(rng)) hp.col.push_back(c);
        hp.row_ptr.push_back(static_cast<int32_t>(hp.col.size()));
      }
      hp.density = static_cast<double>(hp.col.size()) /
                   (static_cast<double>(sp.num_blocks) * (sp.num_blocks + 1) / 2.0);
    }
  }
  return plan;
}

}  // namespace crisp_gpu_test
