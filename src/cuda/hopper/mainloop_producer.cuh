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
    const int32_t kv_head = it.h / p.q_per_kv;
    load_query(map_q, p, it, q_token0 + it.r * kBlock, kv_head);
    if (p.block_table == nullptr) {
      const int32_t kv_token0 = static_cast<int32_t>(bases.kv_offset);
      for (int j = 0; j < num_tiles; ++j)
        load_key_value(map_k, map_v, p, tiles_done_ + j, nullptr, 0, kv_token0 + row_cols[j] * kBlock, kv_head);
    } else {
      const int32_t* table_row = p.block_table + it.s * static_cast<int32_t>(p.table_stride);
      const int32_t n = static_cast<int32_t>(bases.n);
      for (int j = 0; j < num_tiles; ++j)
        load_key_value(map_k, map_v, p, tiles_done_ + j, table_row, n, row_cols[j] * kBlock, kv_head);
    }
    tiles_done_ += num_tiles;
    ++items_done_;
  }

 private:
  // Paged K/V: the TMA token coordinate of the box holding key position `key` (the box's pool row).
  // Boxes past the sequence's last key or on a page id outside the pool read at the pool's end,
  // which TMA fills with zeros (the portable kernel reads such page ids as zero keys too). 32-bit
  // arithmetic: the host takes paged K/V here only below 2^31 pool rows; the page size and pool
  // rows are read from the kernel parameters where needed, not kept in registers (the producer
  // runs in 32).
  static __device__ __forceinline__ int32_t paged_box_token(const attention::Params& p, const int32_t* table_row,
                                                            int32_t n, int32_t key) {
    const int32_t pool_rows = static_cast<int32_t>(p.pool_rows);
    if (key >= n) return pool_rows;
    // A negative id wraps to a huge page; one multiply instead of a division for the range check.
    const uint64_t page_row = static_cast<uint64_t>(static_cast<uint32_t>(table_row[key / p.page_size])) *
                              static_cast<uint32_t>(p.page_size);
    if (page_row + static_cast<uint32_t>(p.page_size) > static_cast<uint64_t>(pool_rows)) return pool_rows;
    return static_cast<int32_t>(page_row) + key % p.page_size;
  }

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

  // The K and V tiles of ring tile t, each once its slot is free (the first kStages tiles find
  // the ring empty). Contiguous K/V (table_row null): the key block at token `key`. Paged: the key
  // block at sequence position `key` (n keys), through the sequence's page ids `table_row`.
  __device__ __forceinline__ void load_key_value(const CUtensorMap& map_k, const CUtensorMap& map_v,
                                                 const attention::Params& p, uint32_t t, const int32_t* table_row,
                                                 int32_t n, int32_t key, int32_t kv_head) const {
    const int stage = t % kStages;
    const uint32_t reuse_parity = ((t / kStages) - 1) & 1;
    const bool reuse = t >= kStages;
    if (table_row != nullptr) {
      load_paged_tiles(map_k, map_v, p, stage, reuse, reuse_parity, table_row, n, key, kv_head);
      return;
    }
    load_ring_tile(map_k, p, storage_.k(stage), storage_.bar_k_full(stage), storage_.bar_k_empty(stage), reuse,
                   reuse_parity, key, kv_head);
    load_ring_tile(map_v, p, storage_.v(stage), storage_.bar_v_full(stage), storage_.bar_v_empty(stage), reuse,
                   reuse_parity, key, kv_head);
  }

  // NOTE: page ids are read kPageIdsAtOnce at a time, so their global-memory latencies overlap
  // instead of one dependent read per box (at pages of 16 tokens a 128-key tile is 8 boxes); two
  // keep the producer within its registers (four spilled 8-36 bytes in the B = 128 kernels).
  static constexpr int kPageIdsAtOnce = 2;

  // Paged K/V: the K and V tiles of one ring slot share their page lookups. B / box rows boxes per
  // tile (the maps' box, paged_box_rows: each inside one page, each starting a swizzle atom),
  // together the tile's bytes on each full barrier; the slot's previous K and V released first.
  __device__ __forceinline__ void load_paged_tiles(const CUtensorMap& map_k, const CUtensorMap& map_v,
                                                   const attention::Params& p, int stage, bool reuse,
                                                   uint32_t reuse_parity, const int32_t* table_row, int32_t n,
                                                   int32_t key, int32_t kv_head) const {
    const uint32_t k_full = storage_.bar_k_full(stage), v_full = storage_.bar_v_full(stage);
    const uint32_t k_dst = storage_.k(stage), v_dst = storage_.v(stage);
    if (reuse) {
      mbar_wait(storage_.bar_k_empty(stage), reuse_parity);
      mbar_wait(storage_.bar_v_empty(stage), reuse_parity);
    }
    mbar_expect_tx(k_full, Shape::kTileBytes);
    mbar_expect_tx(v_full, Shape::kTileBytes);
    const int box = paged_box_rows(p.page_size, kBlock);
    for (int row0 = 0; row0 < kBlock; row0 += kPageIdsAtOnce * box) {
      int32_t token[kPageIdsAtOnce];
#pragma unroll
      for (int i = 0; i < kPageIdsAtOnce; ++i) {
        const int row = row0 + i * box;
        token[i] = row < kBlock ? paged_box_token(p, table_row, n, key + row) : 0;
      }
#pragma unroll
      for (int i = 0; i < kPageIdsAtOnce; ++i) {
        const int row = row0 + i * box;
        if (row >= kBlock) break;
#pragma unroll
        for (int x = 0; x < kHalves; ++x) {
          tma_load(k_dst + x * Shape::kHalfBytes + row * 128, &map_k, x * kHalfCols, token[i], kv_head, k_full);
          tma_load(v_dst + x * Shape::kHalfBytes + row * 128, &map_v, x * kHalfCols, token[i], kv_head, v_full);
        }
      }
    }
  }
  // Contiguous K/V: one tile into `dst` at token `key`, completing on `bar_full`; with `reuse`,
  // after the consumers released the slot's previous tile on `bar_empty`.
  __device__ __forceinline__ void load_ring_tile(const CUtensorMap& map, const attention::Params& p, uint32_t dst,
                                                 uint32_t bar_full, uint32_t bar_empty, bool reuse,
                                                 uint32_t reuse_parity, int32_t key, int32_t kv_head) const {
    (void)p;
    if (reuse) mbar_wait(bar_empty, reuse_parity);
    mbar_expect_tx(bar_full, Shape::kTileBytes);
#pragma unroll
    for (int x = 0; x < kHalves; ++x) tma_load(dst + x * Shape::kHalfBytes, &map, x * kHalfCols, key, kv_head, bar_full);
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
