// src/cuda/device_plan.h — raw device view of a batch plan, passed by value to the planning and
// attention kernels. Buffers are fixed-capacity (see src/plan/plan_layout.h) so that plan +
// attend need no host round-trip and can be captured in a CUDA graph.
#pragma once
#include <cstddef>
#include <cstdint>

#include "plan/plan_layout.h"

namespace crisp {
namespace cuda_detail {

struct DevicePlanView {
  int32_t num_sequences = 0;
  int32_t num_heads = 0;     // query heads
  int32_t block_size = 128;
  int32_t max_num_blocks = 0;  // max N over the sequences
  int64_t causal_blocks = 0;   // sum over the sequences of N (N + 1) / 2: one head's column capacity
  const layout::SequenceBases* seqs = nullptr;  // device [num_sequences]

  // Per slot (s * num_heads + h):
  int32_t* route = nullptr;     // rules::RouteCode
  float* c_struct = nullptr;    // NaN when not computed
  float* jsd = nullptr;         // NaN when not computed
  int32_t* nnz = nullptr;       // computed key blocks of the slot

  // Per slot, [N] entries at layout::block_array_offset (1 = kept):
  int8_t* vertical_flags = nullptr;
  int8_t* slash_flags = nullptr;

  // Per slot CSR: row_ptr [N+1] at layout::row_ptr_offset (values relative to the slot's column
  // start), col at layout::col_offset with capacity N(N+1)/2.
  int32_t* row_ptr = nullptr;
  int32_t* col = nullptr;

  // Attention work order (GPU-built metadata, src/cuda/work_order.cu): the item codes of the
  // plan's real rows, code = h + H * (s + S * from_end) with query block r = N_s - 1 - from_end,
  // sorted by descending key-block count of their CSR row (ties in ascending code), so the rows
  // with the most work start first. The sort runs over every row of the grid (H * total_blocks
  // entries); rows before a sequence's first_row hold no query and sort last, so the first
  // num_work_items = H * sum of (N_s - first_row_s) entries are every real row once (no padded
  // code of a shorter sequence, no empty row of a chunk). Rebuilt by every fill of the plan
  // (plan_async, upload); work_order_ready is false until the first fill.
  int32_t* work_order = nullptr;
  int64_t num_work_items = 0;
  int64_t total_blocks = 0;  // sum of N over the sequences (rows before first_row included)
  // Host-side shape of the keys: sum of n_k (the rows k/v hold when contiguous) and the largest n_k.
  int64_t key_tokens = 0;
  int64_t max_keys = 0;
  bool work_order_ready = false;  // host-side state (the kernels read only work_order)
  // Scratch of the sort that builds it (keys in/out, the unsorted items, cub's temporary storage).
  uint64_t* sort_keys_in = nullptr;
  uint64_t* sort_keys_out = nullptr;
  int32_t* sort_items_in = nullptr;
  void* sort_temp = nullptr;
  std::size_t sort_temp_bytes = 0;
};

}  // namespace cuda_detail
}  // namespace crisp
