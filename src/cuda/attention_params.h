// src/cuda/attention_params.h — the launch parameters both attention kernels take: the portable
// kernel (src/cuda/attention_kernel.cuh) and the Hopper kernel (src/cuda/hopper/); the same work
// items, row subsets and work orders for both. Plain data, no device code.
#pragma once
#include <cstdint>

#include "cuda/attention_rows.h"
#include "cuda/device_plan.h"

namespace crisp {
namespace cuda_detail {
namespace attention {

// Plain-data parameters of one launch (passed by value).
struct Params {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  int64_t q_stride_head, q_stride_token;
  int64_t k_stride_head, k_stride_token;
  int64_t v_stride_head, v_stride_token;
  int64_t o_stride_head, o_stride_token;
  int64_t lse_stride_head, lse_stride_token;
  int32_t num_q_heads;
  int32_t q_per_kv;        // Hq / Hkv
  float scale_log2;        // softmax scale * log2(e)
  float scale;             // softmax scale
  int32_t window;          // §12 sliding window in tokens (0 = none): query p sees keys (p - window, p]
  DevicePlanView plan;
  // Keys (spec §11): key position j of sequence s is row kv_rows::key_row(seqs[s].kv_offset,
  // table row s or null, page_size, j) of k/v (src/common/kv_rows.h). block_table null: contiguous
  // K/V; else paged, [S, table_stride] page ids of a pool of num_pages pages (k/v rows
  // num_pages * page_size). The portable kernel reads a page id out of that range as zero keys.
  const int32_t* block_table;
  int64_t table_stride;
  int32_t page_size;
  int32_t page_shift;  // kv_rows::page_shift(page_size): log2 for a power of two, else -1
  int64_t pool_rows;  // num_pages * page_size
  // Optional row subset (context parallelism): when non-null the work items are num_q_heads x
  // (listed rows), and work item w computes row_items[w / num_q_heads] for head w % num_q_heads,
  // writing its rows to out/lse token row_items[...].out_token + i; when null, every query block of
  // every sequence (from its first_row) is computed and written at its own query row (the default).
  const RowItem* row_items;
  // Optional work order (every-row launches only): when non-null, the j-th work item taken is
  // item work_order[j] (DevicePlanView::work_order: the real rows, heaviest first) instead of item j.
  const int32_t* work_order;
  // Work items the launch walks: H x the listed rows (row subset), the work order's length (every
  // real row once), or H * S * max N item codes (no work order; codes of a shorter sequence past
  // its first block are empty). Fewer than 2^31 (checked by the host).
  int32_t num_items;
  // Hopper kernel's persistent scheduler only: a device counter, zero at launch, from which CTAs
  // take their next work item (after their first, blockIdx.x). Null: one work item per CTA.
  int32_t* work_counter;
  // Hopper kernel with GQA packing only (src/cuda/hopper/gqa_pack.h; null otherwise): item head h
  // of (sequence, query block r) is then packed tile h % packed_group of kv head h / packed_group
  // (128 / packed_group queries x packed_group heads), whose key blocks are the group's union row r:
  // packed_len[layout::block_array_offset(b, kv, Hkv) + r] entries at packed_col +
  // layout::col_offset(b, kv, Hkv) + r (r + 1) / 2.
  const int32_t* packed_col;
  const int32_t* packed_len;
  int32_t packed_group;
};

}  // namespace attention
}  // namespace cuda_detail
}  // namespace crisp
