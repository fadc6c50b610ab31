// src/cuda/async_copy.cuh — the 16-byte cp.async copies (sm_80+) and the XOR swizzle of their
// shared-memory destinations, shared by the portable kernel's tile copies
// (src/cuda/attention_kernel.cuh) and the Hopper kernel's paged K/V producer
// (src/cuda/hopper/mainloop_producer.cuh), so both place a 16-byte chunk the same way.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace crisp {
namespace cuda_detail {

// Byte offset of (row, 16-byte chunk) in a swizzled tile with kRowBytes bytes per row: chunk c of
// row r lands at chunk c ^ (r % 8). With kRowBytes = 128 this is TMA's 128-byte swizzle
// (CU_TENSOR_MAP_SWIZZLE_128B) of a 1024-byte-aligned tile, the layout wgmma's descriptors read.
template <int kRowBytes>
__device__ __forceinline__ uint32_t swizzled_bytes(int row, int chunk) {
  return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}
__device__ __forceinline__ void cp_async_16_full(uint32_t smem_addr, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr), "l"(gmem));
}
// src_bytes = 0 zero-fills the chunk and reads nothing from gmem (any mapped address stands in).
__device__ __forceinline__ void cp_async_16_zfill(uint32_t smem_addr, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes));
}

}  // namespace cuda_detail
}  // namespace crisp
