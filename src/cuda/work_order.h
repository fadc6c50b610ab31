// src/cuda/work_order.h — the attention work order, built on the device with every plan fill:
// the attention kernels' work items (one CTA job = one query block of one head of one sequence)
// sorted by descending key-block count, so the heaviest rows start first (longest-processing-time
// first: the light rows fill the tail of the launch instead of one heavy row running alone at the
// end). Causal dense plans keep their natural order (the last query blocks are the heaviest);
// sparse plans differ by head and by row (PE heads dense-ish, VS heads a few blocks per row).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/device_plan.h"

namespace crisp {
namespace cuda_detail {

// Work items of a batch plan: H * S * max N (items past a shorter sequence's first block count as
// empty and sort last).
int64_t num_work_items(int64_t num_q_heads, int64_t num_sequences, int64_t max_num_blocks);

// NOTE: the order takes ~16 bytes of device memory per work item plus the sort's scratch, and the
// items are padded to S * max N per head; a varlen batch of very uneven lengths (one long sequence
// among many short ones) has far more padded items than rows. Beyond 4 items per real row the
// order is not built (the kernels keep the item order, heaviest causal rows first), so it never
// costs more than a small multiple of the rows.
constexpr int64_t kMaxWorkItemsPerRow = 4;
bool work_order_worthwhile(int64_t num_items, int64_t num_rows);

// Bytes of cub's temporary storage for sorting `num_items` items (0 when num_items is 0 or too
// large for one sort, in which case no work order is built and the kernels keep the item order).
std::size_t work_order_temp_bytes(int64_t num_items);

// Fills view.work_order from view.row_ptr on `stream` and sets view.work_order_ready (when the
// view has the buffers for it); enqueued after the kernels that wrote the plan.
void build_work_order(DevicePlanView& view, cudaStream_t stream);

}  // namespace cuda_detail
}  // namespace crisp
