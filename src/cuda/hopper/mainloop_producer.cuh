// src/cuda/hopper/mainloop_producer.cuh — the Hopper kernel's producer: one thread loads each work
// item's query block once and then, for each listed key block, the K and the V tile (B keys x d
// dims each; one load each, or one per box for paged K/V) into the shared-memory ring with TMA
// (cp.async.bulk.tensor, 128-byte swizzle),
// completing on the "full" mbarriers; it waits on a ring slot's "empty" mbarrier before reusing it.
// The walk over the CSR column list is the only place the sparsity appears: every load is a whole
// tile at a gathered block address.
// Paged K/V: the producer's whole warp takes part (ProducerMainloop::loading_thread): lane i looks
// up the page of the tile's box i, one tile ahead of the loads, and issues that box's TMA loads;
// lane 0 (the leader) alone does every mbarrier operation, so each tile's bytes are counted once.
// kLoaderWarps > 1 (paged K/V at B = 128, the default kernel; kPagedLoaderWarps in
// hopper_attention.cu): TMA takes a warp's boxes one lane at a time, so the boxes of a tile are
// spread over several warps of the producer warpgroup: half of them load K, half V, and of a
// tensor's warps warp w issues the boxes i with i % (warps per tensor) = w. Warp 0 takes the items
// and the query blocks and hands each item to the other loader warps through a two-entry ring.
#pragma once
#include <cuda.h>  // CUtensorMap (a type only; nothing is linked from the driver library)

#include <cstdint>

#include "common/kv_rows.h"
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

// kWindow: the launch has a sliding window (§12): the item's first two key blocks go to the consumers.
template <int kDim, int kBlock, bool kPacked, int kLoaderWarps = 1, bool kWindow = false>
class ProducerMainloop {
 public:
  using Shape = TileShape<kDim, kBlock>;
  static constexpr int kStages = Shape::kStages;
  static constexpr int kHalves = kDim / kHalfCols;  // 64-dim parts of a row

  __device__ __forceinline__ explicit ProducerMainloop(const SharedStorage<kDim, kBlock>& storage)
      : storage_(storage) {}

  // Loader warps per tensor (kLoaderWarps > 1: half K, half V; 1: the one warp loads both).
  static constexpr int kTensorWarps = kLoaderWarps > 1 ? kLoaderWarps / 2 : 1;
  static_assert(kLoaderWarps == 1 || ((kLoaderWarps == 2 || kLoaderWarps == 4) && Shape::kProducerThreads >= 32 * kLoaderWarps),
                "1 loader warp, or 2 or 4 of a producer warpgroup");

  // Whether producer thread `producer_thread` (0 = the role's first) takes part in the loads: the
  // leader, and with paged K/V the rest of its warp (lanes look up page ids); with kLoaderWarps > 1
  // (a kernel launched for paged K/V only) every thread of the loader warps. The others return.
  static __device__ __forceinline__ bool loading_thread(const attention::Params& p, int producer_thread) {
    if constexpr (kLoaderWarps > 1) return producer_thread < 32 * kLoaderWarps;
    return producer_thread == 0 || (producer_thread < 32 && p.block_table != nullptr);
  }

  // Waits until the consumers released the query buffer (and the item slot), which they do once
  // the last S = QK^T of the previous item is done; only then is the next item taken, so an item
  // is committed to this CTA as late as possible.
  __device__ __forceinline__ void wait_query_free() const {
    if (items_done_ > 0) mbar_wait(storage_.bar_q_empty(), (items_done_ - 1) & 1);
  }

  // The next item from `scheduler` (its code, -1 for none, and the item in `it`): the leader takes
  // it, and with paged K/V hands it to the other lanes.
  __device__ __forceinline__ int32_t take_item(TileScheduler& scheduler, const attention::Params& p,
                                               WorkItem& it) const {
    int32_t code = -1;
    if (leader()) code = scheduler.next(p, it);
    if (p.block_table == nullptr) return code;  // the leader alone
    it.h = __shfl_sync(kWarp, it.h, 0);
    it.s = __shfl_sync(kWarp, it.s, 0);
    it.r = __shfl_sync(kWarp, it.r, 0);
    return __shfl_sync(kWarp, code, 0);
  }

  // Hands item `code` to the consumers (and, with kLoaderWarps > 1, to the other loader warps
  // through the item ring). -1 (no more) completes the query barrier's phase without data, so the
  // consumers read -1 and stop; returns whether there is an item to load.
  __device__ __forceinline__ bool publish(int32_t code) {
    if (leader()) {
      storage_.publish_item(code);
      if (code < 0) mbar_arrive(storage_.bar_q());
      if constexpr (kLoaderWarps > 1) {
        // Entry e holds items e, e + 2, ...: item k waits until every other loader warp has read
        // item k - 2.
        const uint32_t k = items_published_++, e = k & 1;
        if (k >= 2) mbar_wait(storage_.bar_item_ring_empty(e), ((k >> 1) - 1) & 1);
        storage_.publish_ring_item(e, code);
        mbar_arrive(storage_.bar_item_ring_full(e));
      }
    }
    return code >= 0;
  }

  // The loop of loader warp `warp` > 0 (kLoaderWarps > 1): each item from the ring, in the order
  // warp 0 took them, and its share of the item's K or V boxes; returns after the -1.
  __device__ __forceinline__ void stream_tiles(const CUtensorMap& map_k, const CUtensorMap& map_v,
                                               const attention::Params& p, int warp) {
    static_assert(kLoaderWarps > 1, "warp 0 alone takes the items");
    const bool loads_key = warp < kTensorWarps;
    const int box_way = warp % kTensorWarps;
    for (uint32_t k = 0;; ++k) {
      const uint32_t e = k & 1;
      mbar_wait(storage_.bar_item_ring_full(e), (k >> 1) & 1);
      const int32_t code = storage_.read_ring_item(e);
      __syncwarp(kWarp);  // every lane has read the entry before it is released
      if (leader()) mbar_arrive(storage_.bar_item_ring_empty(e));
      if (code < 0) return;
      const WorkItem it = decode_item(p, code);
      const layout::SequenceBases bases = p.plan.seqs[it.s];
      int32_t num_tiles;
      const int32_t* row_cols = row_columns<kPacked>(p, it, bases, num_tiles);
      load_paged_item(loads_key ? &map_k : nullptr, loads_key ? nullptr : &map_v, box_way, p,
                      it.s * static_cast<int32_t>(p.table_stride), static_cast<int32_t>(bases.n), row_cols, num_tiles,
                      it.h / p.q_per_kv);
      tiles_done_ += num_tiles;
    }
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
    // A sliding window: the consumers mask the row's first tiles at the window's edge (their key
    // blocks handed over with the item, before the query barrier's arrival).
    if (kWindow && leader()) storage_.publish_window_cols(row_cols[0], row_cols[num_tiles > 1 ? 1 : 0]);
    if (leader()) load_query(map_q, p, it, q_token0 + it.r * kBlock, kv_head);
    if (p.block_table == nullptr) {
      const int32_t kv_token0 = static_cast<int32_t>(bases.kv_offset);
      for (int j = 0; j < num_tiles; ++j) {
        const int32_t key = kv_token0 + row_cols[j] * kBlock;
        load_key_value(&map_k, &map_v, tiles_done_ + j,
                       [&](const CUtensorMap& map, uint32_t dst, uint32_t bar_full, uint32_t bar_empty, bool reuse,
                           uint32_t reuse_parity) {
                         load_ring_tile(map, dst, bar_full, bar_empty, reuse, reuse_parity, key, kv_head);
                       });
      }
    } else {
      // With kLoaderWarps > 1, warp 0 loads its share of K's boxes only.
      load_paged_item(&map_k, kLoaderWarps > 1 ? nullptr : &map_v, /*box_way=*/0, p,
                      it.s * static_cast<int32_t>(p.table_stride), static_cast<int32_t>(bases.n), row_cols, num_tiles,
                      kv_head);
    }
    tiles_done_ += num_tiles;
    ++items_done_;
  }

 private:
  static constexpr unsigned kWarp = 0xffffffffu;  // paged K/V: every lane of the producer warp

  // Lane 0 does every mbarrier operation and the query's loads (and, with contiguous K/V, the only
  // loading thread, every load).
  static __device__ __forceinline__ bool leader() { return threadIdx.x % 32 == 0; }

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

  // The K and V tiles of ring tile t, K first, each through load_tile(map, dst, bar_full,
  // bar_empty, reuse, reuse_parity): into its slot's buffer `dst`, completing on `bar_full`; with
  // `reuse` (the first kStages tiles find the ring empty), once the consumers released the slot's
  // previous tile on `bar_empty`, the phase of parity `reuse_parity`.
  template <typename LoadTile>
  // A null map is a tensor another loader warp loads (kLoaderWarps > 1).
  __device__ __forceinline__ void load_key_value(const CUtensorMap* map_k, const CUtensorMap* map_v, uint32_t t,
                                                 LoadTile&& load_tile) const {
    const int stage = t % kStages;
    const uint32_t reuse_parity = ((t / kStages) - 1) & 1;
    const bool reuse = t >= kStages;
    if (map_k != nullptr)
      load_tile(*map_k, storage_.k(stage), storage_.bar_k_full(stage), storage_.bar_k_empty(stage), reuse, reuse_parity);
    if (map_v != nullptr)
      load_tile(*map_v, storage_.v(stage), storage_.bar_v_full(stage), storage_.bar_v_empty(stage), reuse, reuse_parity);
  }

  // Contiguous K/V: one tile at token `key`, one load of all its parts, parts first (load_key_value's
  // tile loader).
  __device__ __forceinline__ void load_ring_tile(const CUtensorMap& map, uint32_t dst, uint32_t bar_full,
                                                 uint32_t bar_empty, bool reuse, uint32_t reuse_parity, int32_t key,
                                                 int32_t kv_head) const {
    if (reuse) mbar_wait(bar_empty, reuse_parity);
    mbar_expect_tx(bar_full, Shape::kTileBytes);
    tma_load_4d(dst, &map, key, kv_head, bar_full);
  }

  // Paged K/V. A key tile is B / box rows boxes (the maps' box, paged_box_rows: each inside one
  // page, each starting a swizzle atom), at most B / 16 = 8, so lane i owns box i of every tile:
  // it reads that box's page id (the ids of a tile are consecutive entries of the table row: one
  // coalesced read), one tile ahead, while the warp waits for a free slot and issues the current
  // tile's boxes, so the reads' latency is off the load path. The key blocks come from the CSR row
  // 32 at a time (lane l holds column 32 c + l). Registers are few (40 a thread at B = 128): a
  // lane keeps its next page id, not its pool row, and recomputes the tile's key block.
  // `map_k` / `map_v`: the tensors this warp loads (nullptr: another warp's); `box_way`: its boxes
  // are those i with i % kTensorWarps = box_way.
  __device__ __forceinline__ void load_paged_item(const CUtensorMap* map_k, const CUtensorMap* map_v, int box_way,
                                                  const attention::Params& p, int32_t table_row, int32_t n,
                                                  const int32_t* row_cols, int32_t num_tiles, int32_t kv_head) const {
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int box_row = lane * paged_box_rows(p.page_size, kBlock);  // this lane's box: rows from box_row
    int32_t cols = lane < num_tiles ? row_cols[lane] : 0;           // columns 32 c .. 32 c + 31
    int32_t page_id = look_up_page(p, table_row, n, __shfl_sync(kWarp, cols, 0) * kBlock, box_row);
    for (int j = 0; j < num_tiles; ++j) {
      // The pool row of this lane's box in tile j, from the id read during the previous tile.
      const int32_t token = box_token(p, page_id, __shfl_sync(kWarp, cols, j % 32) * kBlock + box_row);
      const int following = j + 1;
      if (following < num_tiles) {  // the same on every lane
        if (following % 32 == 0) cols = following + lane < num_tiles ? row_cols[following + lane] : 0;
        page_id = look_up_page(p, table_row, n, __shfl_sync(kWarp, cols, following % 32) * kBlock, box_row);
      }
      load_key_value(map_k, map_v, tiles_done_ + j,
                     [&](const CUtensorMap& map, uint32_t dst, uint32_t bar_full, uint32_t bar_empty, bool reuse,
                         uint32_t reuse_parity) {
                       load_paged_tile(map, p, dst, bar_full, bar_empty, reuse, reuse_parity, token, kv_head, box_way);
                     });
    }
  }

  // Starts the read of the page id of the box at rows [box_row, box_row + box) of the key tile at
  // sequence position `key` (n keys): -1, read from nowhere, for a lane past the tile's boxes and a
  // box past the sequence. The value is first used by box_token, a tile later.
  static __device__ __forceinline__ int32_t look_up_page(const attention::Params& p, int32_t table_row, int32_t n,
                                                         int32_t key, int box_row) {
    const int32_t position = key + box_row;
    return box_row < kBlock && position < n
               ? p.block_table[table_row + kv_rows::page_of(position, p.page_size, p.page_shift)]
               : -1;
  }

  // The TMA token coordinate (pool row) of the box at sequence position `position` on page
  // `page_id`. Boxes past the sequence's last key or on a page id outside the pool read at the
  // pool's end, which TMA fills with zeros (the portable kernel reads such page ids as zero keys
  // too). 32-bit arithmetic: the host takes paged K/V here only below 2^31 pool rows; the page size
  // and pool rows are read from the kernel parameters where needed, not kept in registers.
  static __device__ __forceinline__ int32_t box_token(const attention::Params& p, int32_t page_id, int32_t position) {
    const int32_t pool_rows = static_cast<int32_t>(p.pool_rows);
    // A negative id (-1 included) wraps to a huge page; one multiply instead of a division for the
    // range check.
    const uint64_t page_row = static_cast<uint64_t>(static_cast<uint32_t>(page_id)) * static_cast<uint32_t>(p.page_size);
    if (page_row + static_cast<uint32_t>(p.page_size) > static_cast<uint64_t>(pool_rows)) return pool_rows;
    return static_cast<int32_t>(page_row) + kv_rows::row_in_page(position, p.page_size, p.page_shift);
  }

  // Paged K/V: one tile of one tensor as boxes, box i at the pool row `token` of lane i, this
  // warp's boxes only (i % kTensorWarps = box_way). The leader of the tensor's first warp counts
  // the tile's bytes once (the other warps' boxes may complete before it: a barrier's transaction
  // count may go below zero within a phase, and the phase cannot complete before that arrival);
  // then each lane with a box issues that box's load itself, without a shuffle and a leader-only
  // branch per box. TMA takes its operands in uniform registers, so the compiler still issues a
  // warp's boxes one after another; dropping the per-box shuffle took pages of 16 from 1.49x to
  // about 1.25x contiguous (bench/RESULTS.md, session 16). A box is one load of all its parts,
  // groups first (tile_shape.h, TileLayout): box i starts at row i x box rows. Every lane runs it.
  __device__ __forceinline__ void load_paged_tile(const CUtensorMap& map, const attention::Params& p, uint32_t dst,
                                                  uint32_t bar_full, uint32_t bar_empty, bool reuse,
                                                  uint32_t reuse_parity, int32_t token, int32_t kv_head,
                                                  int box_way) const {
    if (reuse) mbar_wait(bar_empty, reuse_parity);
    if (leader() && box_way == 0) mbar_expect_tx(bar_full, Shape::kTileBytes);
    __syncwarp(kWarp);  // the bytes are expected before any box can complete (not required, clearer)
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int box_row = lane * paged_box_rows(p.page_size, kBlock);
    // box_row x 128 x parts is tile_row_bytes of the groups-first layout at a box's first row (a
    // multiple of 8), written out: the call form compiles to different producer code, not measured.
    if (box_row < kBlock && lane % kTensorWarps == box_way) {
      if (!kv_page_boxes(/*paged=*/true, kLoaderWarps > 1, p.page_size, kBlock))
        tma_load_4d(dst, &map, token, kv_head, bar_full);  // lane 0: the whole tile, parts first
      else tma_load_5d(dst + box_row * 128 * kHalves, &map, token, kv_head, bar_full);
    }
  }

  // A copy, not a reference: the compiler then keeps the addresses in registers from the start, and
  // the loops compile as they did when they were written inside the kernel.
  const SharedStorage<kDim, kBlock> storage_;
  uint32_t tiles_done_ = 0, items_done_ = 0, items_published_ = 0;  // items_published_: kLoaderWarps > 1
};

#endif  // CRISP_HOPPER_DEVICE_CODE

}  // namespace hopper
}  // namespace cuda_detail
}  // namespace crisp
