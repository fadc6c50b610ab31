// src/cuda/hopper/epilogue.cuh — the Hopper consumer's epilogue for one work item: full row sums,
// normalise O, write O (input dtype) and LSE (natural log) of the thread's two rows. Rows past the
// sequence end, and rows before its first query (a chunk's first row, spec §11), are not written.
#pragma once
#include <cstdint>

#include "cuda/attention_kernel.cuh"  // Mma<T>::pack
#include "cuda/attention_params.h"
#include "cuda/hopper/softmax.cuh"
#include "cuda/hopper/tile_scheduler.cuh"
#include "plan/rules.h"

namespace crisp {
namespace cuda_detail {
namespace hopper {

#if defined(CRISP_HOPPER_DEVICE_CODE)

template <typename T, int kDim, int kBlock>
__device__ __forceinline__ void store_output(const attention::Params& p, int32_t code, const WorkItem& it,
                                             const layout::SequenceBases& bases, const ConsumerRows& rows,
                                             const float (&o_acc)[kDim / 2], const OnlineSoftmax<kBlock>& softmax,
                                             int quad_lane) {
  const int32_t n = static_cast<int32_t>(bases.n);
  const int32_t first_position = static_cast<int32_t>(rules::first_query_position(bases.n, bases.n_q));
  // The out/lse row of position 0: from the sequence's query rows (every-row launch), or from the
  // listed row's output token, where the block's first query goes (row-subset launch).
  const int64_t out_shift =
      p.row_items == nullptr
          ? bases.token_offset - first_position
          : p.row_items[code / p.num_q_heads].out_token - rules::row_query_begin(it.r, kBlock, bases.n, bases.n_q);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    T* out_base = static_cast<T*>(p.out) + rows.head[half] * p.o_stride_head;
    float* lse_base = p.lse + rows.head[half] * p.lse_stride_head;
    const float sum = softmax.total_sum(half);
    const int query = rows.query[half];
    if (query >= n || query < first_position) continue;
    // Every row lists its diagonal block, whose first key precedes every query of the block, so sum > 0.
    const float inv = 1.f / sum;
    T* out_row = out_base + (out_shift + query) * p.o_stride_token;
#pragma unroll
    for (int g = 0; g < kDim / 8; ++g) {
      const uint32_t packed =
          attention::Mma<T>::pack(o_acc[g * 4 + 2 * half] * inv, o_acc[g * 4 + 2 * half + 1] * inv);
      *reinterpret_cast<uint32_t*>(out_row + g * 8 + quad_lane * 2) = packed;
    }
    if (quad_lane == 0) lse_base[(out_shift + query) * p.lse_stride_token] = softmax.lse(half, sum, p.scale);
  }
}

#endif  // CRISP_HOPPER_DEVICE_CODE

}  // namespace hopper
}  // namespace cuda_detail
}  // namespace crisp
