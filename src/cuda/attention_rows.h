// src/cuda/attention_rows.h — row-subset launches of the block-sparse attention kernel: compute
// only a listed set of (sequence, query block) rows of a plan and write them to chosen output
// tokens. Context parallelism (src/cuda/context_parallel.cu) uses it so that each rank computes
// only its own query blocks, from full-length (gathered) q/k/v, into its local slice of O and LSE.
// The kernel's math is the same as attend_async's: a listed row gives bitwise the same values as
// the same row of a full launch.
#pragma once
#include <cstdint>

#include "crisp/cuda.h"
#include "crisp/tensor.h"

namespace crisp {
namespace cuda_detail {
namespace attention {

// One query block to compute in a row-subset launch.
struct RowItem {
  int32_t sequence;     // sequence of the plan's batch
  int32_t query_block;  // r, relative to the sequence (0 <= r < N of that sequence)
  int64_t out_token;    // token of out/lse where the block's first query row is written
};

}  // namespace attention

// Block-sparse attention of the listed rows only, on `stream` (a cudaStream_t), with no host
// synchronisation. q/k/v are the full [H, tokens, d] views of the plan's shape (as attend_async);
// out [Hq, out_tokens, d] and lse [Hq, out_tokens] receive, for item w and head h, the rows of
// query block items[w].query_block at tokens items[w].out_token + i (i < rows of that block).
// `device_items` points to `num_items` RowItems in device memory; the caller guarantees each
// item is in range (sequence, block, and out_token + rows <= out_tokens): the host cannot read
// them without a synchronisation. Same argument checks and errors as attend_async otherwise.
// num_items = 0 launches nothing.
void attend_rows_async(const TensorView& q, const TensorView& k, const TensorView& v,
                       const cuda::DevicePlan& plan, const TensorView& out, const TensorView& lse,
                       const attention::RowItem* device_items, int64_t num_items, void* stream);

}  // namespace cuda_detail
}  // namespace crisp
