// src/cuda/work_order.h — the attention work order, built on the device with every plan fill:
// the attention kernels' work items (one CTA job = one query block of one head of one sequence)
// sorted by descending key-block count, so the heaviest rows start first (longest-processing-time
// first: the light rows fill the tail of the launch instead of one heavy row running alone at the
// end). Causal dense plans keep their natural order (the last query blocks are the heaviest);
// sparse plans differ by head and by row (PE heads dense-ish, VS heads a few blocks per row).
//
// Item codes. The kernels decode a work item code as h = code % H, s = (code / H) % S,
// r = N_s - 1 - code / (H * S): codes range over H * S * max N ("padded" items), and in a varlen
// batch the codes past a shorter sequence's first block are empty, and so are the codes of rows
// before a chunk's first_row (spec §11). The work order lists the real rows first (H * sum of
// (N_s - first_row_s) codes, each exactly once), so a launch that follows it walks no empty item
// however uneven the batch is; without it the kernels walk every padded code in order.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/device_plan.h"

namespace crisp {
namespace cuda_detail {

// Item codes of a batch plan: H * S * max N (codes past a shorter sequence's first block are empty).
int64_t num_padded_items(int64_t num_q_heads, int64_t num_sequences, int64_t max_num_blocks);

// Whether a plan of `num_rows` real rows and `num_padded` item codes gets a work order: codes are
// int32 in the order, and cub sorts with an int count.
bool work_order_supported(int64_t num_rows, int64_t num_padded);

// Rows the work order sorts: every (head, query block) of the grid, H * sum of N (its real rows,
// view.num_work_items of them, come first).
int64_t sorted_rows(const DevicePlanView& view);

// Bytes of cub's temporary storage for sorting the order of `num_rows` rows (0 when num_rows is 0).
std::size_t work_order_temp_bytes(int64_t num_rows);

// Fills view.work_order (sorted_rows(view) entries, the view.num_work_items real rows first) from
// view.row_ptr on `stream` and sets
// view.work_order_ready (when the view has the buffers for it); enqueued after the kernels that
// wrote the plan.
void build_work_order(DevicePlanView& view, cudaStream_t stream);

// Scratch of one sort of the view's sorted_rows(view) rows (sizes as DevicePlanView's sort_* buffers).
struct WorkOrderScratch {
  uint64_t* keys_in;
  uint64_t* keys_out;
  int32_t* items_in;
  void* temp;
  std::size_t temp_bytes;  // at least work_order_temp_bytes(sorted_rows(view))
};

// The work order of a launch that packs GQA groups (src/cuda/hopper/gqa_pack.h): the same real rows
// and item codes as build_work_order, each costed by its group's union row length
// union_len[layout::block_array_offset(b, h / group, H / group) + r]; written to `order`.
void build_union_work_order(const DevicePlanView& view, const int32_t* union_len, int group,
                            const WorkOrderScratch& scratch, int32_t* order, cudaStream_t stream);

}  // namespace cuda_detail
}  // namespace crisp
