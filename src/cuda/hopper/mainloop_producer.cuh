// src/cuda/hopper/mainloop_producer.cuh — the Hopper kernel's producer: one thread loads each work
// item's query block once and then, for each listed key block, the K and the V tile (B keys x d
// dims each) into the shared-memory ring with TMA (cp.async.bulk.tensor, 128-byte swizzle),
// completing on the "full" mbarriers; it waits on a ring slot's "empty" mbarrier before reusing it.
// The walk over the CSR column list is the only place the sparsity appears: every load is a whole
// tile at a gathered block address.
#pragma once
#include <cuda.h>  // CUtensorMap (a type only; nothing is linked from the driver library)

#include <cstdint>

#include "cuda/attention_params.h"
#include "cuda/hopper/shared_storage.cuh"
#include "cuda/hopper/sm90_primitives.cuh"
#include "cuda/hopper/tile_scheduler.cuh"
#include "cuda/hopper/tile_shape.h"
#include "plan/rules.h"

namespace crisp {
namespace cuda_detail {
namespace hopper {

#if defined(CRISP_HOPPER_DEVICE_CODE)

template <int kDim, int kBlock, bool kPacked>
class ProducerMainloop {
 public:
  using Shape = TileShape<kDim, kBlock>;
  static constexpr int kStages = Shape::kStages;
  static constexpr int kHalves = kDim / kHalfCols;  // TMA boxes per tile

  __device__ __forceinline__ explicit ProducerMainloop(const SharedStorage<kDim, kBlock>& storage)
      : storage_(storage) {}

  // Waits until the consumers released the query buffer (and the item slot), which they do once
  // the last S = QK^T of the previous item is done; only then is the next item taken, so an item
  // is committed to this CTA as late as possible.
  __device__ __forceinline__ void wait_query_free() const {
    if (items_done_ > 0) mbar_wait(storage_.bar_q_empty(), (items_done_ - 1) & 1);
  }

  // Hands item `code` to the consumers. -1 (no more) completes the query barrier's phase without
  // data, so the consumers read -1 and stop; returns whether there is an item to load.
  __device__ __forceinline__ bool publish(int32_t code) const {
    *storage_.item_slot = code;
    if (code < 0) {
      mbar_arrive(storage_.bar_q());
      return false;
    }
    return true;
  }

  // Issues the loads of one item: its query block, then the K and V tiles of its listed key blocks.
  __device__ __forceinline__ void load(const CUtensorMap& map_q, const CUtensorMap& map_k, const CUtensorMap& map_v,
                                       const attention::Params& p, const WorkItem& it) {
    const layout::SequenceBases bases = p.plan.seqs[it.s];
    int32_t num_tiles;
    const int32_t* row_cols = row_columns<kPacked>(p, it, bases, num_tiles);
    // TMA coordinates are int32. Query position rB is q row token_offset + rB - (n_k - n_q) (spec
    // §11): in a chunk's first row the rows before its first query are another sequence's (or, at
    // a negative coordinate, zeros); the consumers mask nothing for them and never store them.
    const int32_t q_token0 = static_cast<int32_t>(bases.token_offset - rules::first_query_position(bases.n, bases.n_q));
    const int32_t kv_token0 = static_cast<int32_t>(bases.kv_offset);
    const int32_t kv_head = it.h / p.q_per_kv;
    load_query(map_q, p, it, q_token0 + it.r * kBlock, kv_head);
    for (int j = 0; j < num_tiles; ++j)
      load_key_value(map_k, map_v, tiles_done_ + j, kv_token0 + row_cols[j] * kBlock, kv_head);
    tiles_done_ += num_tiles;
    ++items_done_;
  }

 private:
  __device__ __forceinline__ void load_query(const CUtensorMap& map_q, const attention::Params& p, const WorkItem& it,
                                             int q_token, int32_t kv_head) const {
    const uint32_t bar_q = storage_.bar_q();
    const uint32_t q_smem = storage_.q();
    mbar_expect_tx(bar_q, Shape::kTileBytes);
    if constexpr (kPacked) {
      // Head i of the group: 128 / g queries from the tile's offset, at rows i 128 / g (a multiple
      // of 8 rows, so each box starts a 128-byte swizzle atom).
      const int rows_per_head = kBlock / p.packed_group;
      const int first_query = q_token + (it.h % p.packed_group) * rows_per_head;
      for (int i = 0; i < p.packed_group; ++i) {
#pragma unroll
        for (int x = 0; x < kHalves; ++x)
          tma_load(q_smem + x * Shape::kHalfBytes + i * rows_per_head * 128, &map_q, x * kHalfCols, first_query,
                   kv_head * p.packed_group + i, bar_q);
      }
    } else {
#pragma unroll
      for (int x = 0; x < kHalves; ++x)
        tma_load(q_smem + x * Shape::kHalfBytes, &map_q, x * kHalfCols, q_token, it.h, bar_q);
    }
  }

  // The K and V tiles of ring tile t (key block at `key_token`), each once its slot is free (the
  // first kStages tiles find the ring empty).
  __device__ __forceinline__ void load_key_value(const CUtensorMap& map_k, const CUtensorMap& map_v, uint32_t t,
                                                 int key_token, int32_t kv_head) const {
    const int stage = t % kStages;
    const uint32_t reuse_parity = ((t / kStages) - 1) & 1;
    const bool reuse = t >= kStages;
    load_ring_tile(map_k, storage_.k(stage), storage_.bar_k_full(stage), storage_.bar_k_empty(stage), reuse,
                   reuse_parity, key_token, kv_head);
    load_ring_tile(map_v, storage_.v(stage), storage_.bar_v_full(stage), storage_.bar_v_empty(stage), reuse,
                   reuse_parity, key_token, kv_head);
  }
  // One tile into `dst`, completing on `bar_full`; with `reuse`, after the consumers released the
  // slot's previous tile on `bar_empty`.
  __device__ __forceinline__ void load_ring_tile(const CUtensorMap& map, uint32_t dst, uint32_t bar_full,
                                                 uint32_t bar_empty, bool reuse, uint32_t reuse_parity,
                                                 int key_token, int32_t kv_head) const {
    if (reuse) mbar_wait(bar_empty, reuse_parity);
    mbar_expect_tx(bar_full, Shape::kTileBytes);
#pragma unroll
    for (int x = 0; x < kHalves; ++x)
      tma_load(dst + x * Shape::kHalfBytes, &map, x * kHalfCols, key_token, kv_head, bar_full);
  }

  // A copy, not a reference: the compiler then keeps the addresses in registers from the start, and
  // the loops compile as they did when they were written inside the kernel.
  const SharedStorage<kDim, kBlock> storage_;
  uint32_t tiles_done_ = 0, items_done_ = 0;
};

#endif  // CRISP_HOPPER_DEVICE_CODE

}  // namespace hopper
}  // namespace cuda_detail
}  // namespace crisp
