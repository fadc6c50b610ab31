// src/cuda/hopper/gqa_pack.h — GQA packing for the Hopper kernel (spec §10), chosen with
// crisp::GqaPacking::pack (crisp/options.h, hopper_attention.h).
//
// The g = Hq / Hkv query heads of a group share their K/V tiles. Packed, a CTA tile of 128 rows is
// 128 / g queries of each of the g heads (instead of 128 queries of one head), so each K/V tile it
// loads serves the whole group; it must then walk the union of the g heads' CSR rows: a superset
// of every head's layout, never less accurate, often denser (crisp::gqa_union gives that plan and
// its density). Item codes stay those of the plan (h + H (s + S from_end)): item head h is packed
// tile h % g of kv head h / g, so a launch has as many items as unpacked.
//
// A launch that packs builds, on its stream and with no host synchronisation:
//  - the union row of every (sequence, kv head, query block): one warp per row sets the columns of
//    the g rows in a shared-memory bitmap and writes its set bits in ascending order;
//  - a work order of the packed items by descending union row length (work_order.h).
// Both live in one stream-ordered allocation freed on the stream after the launch.
//
// Where it applies: block size 128, g in {2, 4, 8, 16} (so 128 / g queries per head is a multiple
// of 8 rows, the 128-byte swizzle atom each head's TMA box lands on), every row of the plan (not a
// context-parallel row subset). Elsewhere the launch runs unpacked.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/device_plan.h"
#include "cuda/stream_buffer.h"

namespace crisp {
namespace cuda_detail {
namespace hopper {

// Whether a launch of this shape can pack its GQA groups (see above).
bool gqa_pack_applies(int block_size, int64_t group, bool row_subset, int64_t num_work_items);

// The union layout and the packed work order of one launch, built on `stream` by the constructor
// and freed on `stream` by the destructor (after the kernels enqueued in between).
class PackedGqaLayout {
 public:
  PackedGqaLayout(const DevicePlanView& view, int group, cudaStream_t stream);
  PackedGqaLayout(const PackedGqaLayout&) = delete;
  PackedGqaLayout& operator=(const PackedGqaLayout&) = delete;

  // Union rows: packed_len[layout::block_array_offset(b, kv, Hkv) + r] columns at
  // packed_col + layout::col_offset(b, kv, Hkv) + r (r + 1) / 2.
  const int32_t* col() const { return col_; }
  const int32_t* len() const { return len_; }
  const int32_t* order() const { return order_; }  // view.num_work_items item codes
  std::size_t col_entries() const { return col_entries_; }
  std::size_t len_entries() const { return len_entries_; }

 private:
  std::size_t col_entries_ = 0, len_entries_ = 0;
  StreamBuffer storage_;  // every buffer below; freed on the stream (also when the constructor throws)
  int32_t* col_ = nullptr;
  int32_t* len_ = nullptr;
  int32_t* order_ = nullptr;
};

}  // namespace hopper
}  // namespace cuda_detail
}  // namespace crisp
