// src/cuda/hopper/sm90_primitives.cuh — the Hopper synchronisation and copy instructions the
// kernel's roles share, as inline PTX (sm_90a): mbarriers (with transaction counts), named
// barriers, TMA tile loads, wgmma shared-memory descriptors.
#pragma once
#include <cuda.h>  // CUtensorMap (a type only; nothing is linked from the driver library)
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/hopper/wgmma.cuh"  // CRISP_HOPPER_DEVICE_CODE

namespace crisp {
namespace cuda_detail {
namespace hopper {

#if defined(CRISP_HOPPER_DEVICE_CODE)

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_LOOP:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_LOOP;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// One 3-D box (64 dims x the map's box tokens x 1 head: B, or 128 / g for a packed query tile)
// into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int dim0, int token, int head,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(dim0), "r"(token), "r"(head), "r"(bar)
      : "memory");
}

// A 4-D box of a contiguous K/V map (make_tile_map: dims 0-63, tokens, head, parts; the box holds
// every part) at coordinates (0, token, head, 0), completing on `bar`.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int token, int head, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %2}], [%5];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(token), "r"(head), "r"(bar)
      : "memory");
}

// A 5-D box of a paged K/V map (make_paged_tile_map: dims 0-63, 8 rows, parts, 8-row groups, head)
// at coordinates (0, 0, 0, token / 8, head): a box of rows from `token` (a multiple of 8), groups
// first (tile_shape.h, TileLayout), completing on `bar`.
__device__ __forceinline__ void tma_load_5d(uint32_t dst, const CUtensorMap* map, int token, int head, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %2, %2, %3, %4}], [%5];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(token >> 3), "r"(head), "r"(bar)
      : "memory");
}

// wgmma shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride
// byte offsets (each >> 4).
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(leading_bytes >> 4) << 16) |
         (static_cast<uint64_t>(stride_bytes >> 4) << 32) | (1ull << 62);
}
// The descriptor `units` 16-byte units further on: a 32-bit add to the start-address field (bits
// 0-13), which cannot carry into the next field while the address stays inside shared memory
// (228 KB = 14592 units < 2^14); a 64-bit add costs a carry chain and register moves per wgmma.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t units) {
  const uint32_t lo = static_cast<uint32_t>(desc) + units, hi = static_cast<uint32_t>(desc >> 32);
  return (static_cast<uint64_t>(hi) << 32) | lo;
}
#endif  // CRISP_HOPPER_DEVICE_CODE

}  // namespace hopper
}  // namespace cuda_detail
}  // namespace crisp
