// src/cuda/hopper/tile_scheduler.cuh — the Hopper kernel's work order: which work item a CTA takes
// next, what an item code means (query block, head, sequence), its CSR row of key blocks, and the
// query rows a consumer thread owns in it.
//
// Work items are numbered as the portable kernel's CTAs (heads fastest, then sequences, then query
// blocks from the last, heaviest one; or, for a row-subset launch, the listed items in order), and
// taken in the plan's work order (heaviest rows first) when it has one. CTA b first takes position
// b of that list; with a work counter (persistent CTAs, grid < item count) it then takes position
// grid + atomicAdd(counter, 1) each time its consumers are past the last S = QK^T of the current
// item, so an SM that finishes early takes the next heaviest row (dynamic
// longest-processing-time-first scheduling).
#pragma once
#include <cstdint>

#include "cuda/attention_params.h"
#include "cuda/hopper/wgmma.cuh"  // CRISP_HOPPER_DEVICE_CODE
#include "plan/plan_layout.h"

namespace crisp {
namespace cuda_detail {
namespace hopper {

#if defined(CRISP_HOPPER_DEVICE_CODE)

struct WorkItem {
  int32_t h, s, r;  // r < 0 (a shorter sequence of a varlen batch) or r < first_row: nothing to do
};

// 32-bit arithmetic: the host launches fewer than 2^31 items, and the producer runs in 40
// registers (64-bit divisions spill there).
__device__ __forceinline__ WorkItem decode_item(const attention::Params& p, int32_t item_code) {
  const int32_t H = p.num_q_heads;
  const int32_t S = p.plan.num_sequences;
  const uint32_t item = static_cast<uint32_t>(item_code);
  WorkItem it;
  it.h = static_cast<int32_t>(item % static_cast<uint32_t>(H));
  if (p.row_items == nullptr) {
    const uint32_t rest = item / static_cast<uint32_t>(H);
    it.s = static_cast<int32_t>(rest % static_cast<uint32_t>(S));
    const int32_t from_end = static_cast<int32_t>(rest / static_cast<uint32_t>(S));
    it.r = p.plan.seqs[it.s].num_blocks - 1 - from_end;
  } else {
    const attention::RowItem listed = p.row_items[item / static_cast<uint32_t>(H)];
    it.s = listed.sequence;
    it.r = listed.query_block;
  }
  return it;
}

// The CSR row of an item: its column list and length (>= 1: every row lists its diagonal block).
// Packed (GQA packing), the group's union row.
template <bool kPacked>
__device__ __forceinline__ const int32_t* row_columns(const attention::Params& p, const WorkItem& it,
                                                      const layout::SequenceBases& bases, int32_t& num_tiles) {
  const int32_t H = p.num_q_heads;
  if constexpr (kPacked) {
    const int32_t kv = it.h / p.packed_group, num_kv = H / p.packed_group;
    num_tiles = p.packed_len[layout::block_array_offset(bases, kv, num_kv) + it.r];
    return p.packed_col + layout::col_offset(bases, kv, num_kv) + layout::triangle_tiles(it.r);
  }
  const int32_t* row_ptr = p.plan.row_ptr + layout::row_ptr_offset(bases, it.h, H);
  const int32_t col_begin = row_ptr[it.r];
  num_tiles = row_ptr[it.r + 1] - col_begin;
  return p.plan.col + layout::col_offset(bases, it.h, H) + col_begin;
}

// The producer's source of work items: position blockIdx.x first, then (persistent) the next
// position from the device counter, until the list is exhausted.
class TileScheduler {
 public:
  __device__ __forceinline__ explicit TileScheduler(const attention::Params& p)
      : item_count_(static_cast<uint32_t>(p.num_items)) {}

  // The next item with work (its code, and the item in `it`), or -1 when none is left.
  __device__ __forceinline__ int32_t next(const attention::Params& p, WorkItem& it) {
    int32_t code = -1;
    while (true) {
      // 32-bit: fewer than 2^31 items (checked by the host), and the producer has few registers.
      uint32_t position = item_count_;  // in the work list; item_count_ = nothing left
      if (first_) position = blockIdx.x;
      else if (p.work_counter != nullptr) position = gridDim.x + static_cast<uint32_t>(atomicAdd(p.work_counter, 1));
      first_ = false;
      if (position >= item_count_) break;
      code = p.work_order != nullptr ? p.work_order[position] : static_cast<int32_t>(position);
      it = decode_item(p, code);
      if (it.r >= 0 && it.r >= p.plan.seqs[it.s].first_row) break;
      code = -1;  // a shorter sequence of a varlen batch or a chunk's row without queries: take another
    }
    return code;
  }

 private:
  uint32_t item_count_;
  bool first_ = true;
};

// The two accumulator rows of one consumer thread in an item (tile rows tile_row0 and
// tile_row0 + 8 of wgmma's m64 layout): their queries (sequence-relative) and heads, and the first
// query of the thread's warpgroup.
//
// Packed (GQA packing, src/cuda/hopper/gqa_pack.h): item head h is packed tile h % g of kv head
// h / g (g = p.packed_group): its 128 rows are 128 / g queries of each of the group's g heads (rows
// [i 128 / g, (i + 1) 128 / g) belong to head i of the group).
struct ConsumerRows {
  int query[2], head[2];
  int first_query;
};
template <int kBlock, bool kPacked>
__device__ __forceinline__ ConsumerRows consumer_rows(const attention::Params& p, const WorkItem& it, int consumer,
                                                      int warp, int group) {
  const int tile_row0 = consumer * 64 + warp * 16 + group;
  ConsumerRows rows;
  if constexpr (kPacked) {
    const int rows_per_head = kBlock / p.packed_group;
    const int query0 = it.r * kBlock + (it.h % p.packed_group) * rows_per_head;
    const int head0 = it.h - it.h % p.packed_group;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      rows.query[half] = query0 + (tile_row0 + 8 * half) % rows_per_head;
      rows.head[half] = head0 + (tile_row0 + 8 * half) / rows_per_head;
    }
    rows.first_query = query0;  // every head of the tile starts at query0
  } else {
    rows.first_query = it.r * kBlock + consumer * 64;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      rows.query[half] = it.r * kBlock + tile_row0 + 8 * half;
      rows.head[half] = it.h;
    }
  }
  return rows;
}

#endif  // CRISP_HOPPER_DEVICE_CODE

}  // namespace hopper
}  // namespace cuda_detail
}  // namespace crisp
