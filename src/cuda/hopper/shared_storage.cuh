// src/cuda/hopper/shared_storage.cuh — the Hopper kernel's shared memory as addresses: the query
// tile, the K and V rings, their mbarriers and the work-item slot (layout: TileShape), and the
// pipeline's barrier set-up. Both roles walk the same items and tiles in the same order, so the
// running tile count t gives the ring slot (t % kStages) and the barrier phase ((t / kStages) & 1).
#pragma once
#include <cstdint>

#include "cuda/hopper/sm90_primitives.cuh"
#include "cuda/hopper/tile_shape.h"

namespace crisp {
namespace cuda_detail {
namespace hopper {

#if defined(CRISP_HOPPER_DEVICE_CODE)

template <int kDim, int kBlock>
struct SharedStorage {
  using Shape = TileShape<kDim, kBlock>;
  static constexpr int kStages = Shape::kStages;

  uint32_t base;  // shared-window address of the layout, 1024-byte aligned (the swizzle atom)
  // The item the producer hands over (-1 = no more): written before the query block's barrier
  // completes (the producer's arrive.expect_tx releases), read by the consumers after they waited
  // on it (acquire). compute-sanitizer's racecheck does not model mbarrier waits as ordering
  // (bench/RESULTS.md, sessions 7, 8 and 20: a slot on its own arrive-completed mbarrier was
  // reported too), so the slot is written and read with atomics, which it does not report.
  int32_t* item_slot;

  // Aligns the dynamic shared memory `smem_raw` to 1024 bytes.
  __device__ __forceinline__ explicit SharedStorage(unsigned char* smem_raw)
      : base((smem_u32(smem_raw) + 1023u) & ~1023u),
        item_slot(reinterpret_cast<int32_t*>(smem_raw + (base - smem_u32(smem_raw)) + Shape::kItemSlotOffset)) {}

  __device__ __forceinline__ void publish_item(int32_t code) const { atomicExch(item_slot, code); }
  __device__ __forceinline__ int32_t read_item() const { return atomicAdd(item_slot, 0); }
  // The loader warps' item ring (paged K/V with several loader warps, mainloop_producer.cuh): entry
  // e of 2, written by loader warp 0 before its arrival on bar_item_ring_full(e), read by the other
  // loader warps after their wait (atomics, as the item slot).
  __device__ __forceinline__ int32_t* ring_item(int e) const {
    return item_slot + (Shape::kItemRingOffset - Shape::kItemSlotOffset) / 4 + e;
  }
  __device__ __forceinline__ void publish_ring_item(int e, int32_t code) const { atomicExch(ring_item(e), code); }
  // A sliding window (§12): the item's first two listed key blocks (its only tiles that can cross
  // the window's edge, besides the diagonal), written by the producer's leader before the query
  // block's barrier completes, read by the consumers after their wait (atomics, as the item slot).
  __device__ __forceinline__ int32_t* window_col(int j) const {
    return item_slot + (Shape::kWindowColsOffset - Shape::kItemSlotOffset) / 4 + j;
  }
  __device__ __forceinline__ void publish_window_cols(int32_t first, int32_t second) const {
    atomicExch(window_col(0), first);
    atomicExch(window_col(1), second);
  }
  __device__ __forceinline__ int32_t read_window_col(int j) const { return atomicAdd(window_col(j), 0); }
  __device__ __forceinline__ int32_t read_ring_item(int e) const { return atomicAdd(ring_item(e), 0); }

  __device__ __forceinline__ uint32_t q() const { return base + Shape::kQOffset; }
  __device__ __forceinline__ uint32_t k(int stage) const { return base + Shape::kKOffset + stage * Shape::kTileBytes; }
  __device__ __forceinline__ uint32_t v(int stage) const { return base + Shape::kVOffset + stage * Shape::kTileBytes; }
  // Barriers: the query block loaded (q full), K and V tiles loaded (full) and released (empty) per
  // stage, the query block released (q empty: every S = QK^T of its item is done).
  __device__ __forceinline__ uint32_t bar_q() const { return base + Shape::kBarrierOffset; }
  __device__ __forceinline__ uint32_t bar_k_full(int stage) const { return bar_q() + 8u * (1 + stage); }
  __device__ __forceinline__ uint32_t bar_v_full(int stage) const { return bar_q() + 8u * (1 + kStages + stage); }
  __device__ __forceinline__ uint32_t bar_k_empty(int stage) const { return bar_q() + 8u * (1 + 2 * kStages + stage); }
  __device__ __forceinline__ uint32_t bar_v_empty(int stage) const { return bar_q() + 8u * (1 + 3 * kStages + stage); }
  __device__ __forceinline__ uint32_t bar_q_empty() const { return bar_q() + 8u * (1 + 4 * kStages); }
  // The item ring's barriers: entry e written (full) and read by every reader (empty).
  __device__ __forceinline__ uint32_t bar_item_ring_full(int e) const {
    return base + Shape::kItemRingBarrierOffset + 8u * e;
  }
  __device__ __forceinline__ uint32_t bar_item_ring_empty(int e) const {
    return base + Shape::kItemRingBarrierOffset + 8u * (2 + e);
  }

  // One thread initialises the barriers; the caller synchronises the CTA before any use.
  // kRingReaders: the loader warps that read the item ring (0: no ring).
  template <int kRingReaders = 0>
  __device__ __forceinline__ void init_barriers() const {
    mbar_init(bar_q(), 1);
    if constexpr (kRingReaders > 0) {
      for (int e = 0; e < 2; ++e) {
        mbar_init(bar_item_ring_full(e), 1);
        mbar_init(bar_item_ring_empty(e), kRingReaders);  // each reader warp's leader arrives
      }
    }
    // NOTE: one arrival per consumer warp (each warp releases a buffer after its own wgmma wait).
    mbar_init(bar_q_empty(), Shape::kConsumers * 4);
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      mbar_init(bar_k_full(st), 1);
      mbar_init(bar_v_full(st), 1);
      mbar_init(bar_k_empty(st), Shape::kConsumers * 4);
      mbar_init(bar_v_empty(st), Shape::kConsumers * 4);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
};

#endif  // CRISP_HOPPER_DEVICE_CODE

}  // namespace hopper
}  // namespace cuda_detail
}  // namespace crisp
