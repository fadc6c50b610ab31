// src/cuda/hopper/softmax.cuh — the Hopper consumer's online softmax over one S tile in wgmma's
// accumulator layout: each thread holds two rows (an 8-row half each) and, per 8-key column group,
// two adjacent keys of each row; a row is spread over the 4 threads of a quad. Base 2 with the
// softmax scale folded into one FFMA; LSE in the natural log (row max * scale + ln(row sum)), as
// in the portable kernel.
#pragma once
#include <cuda_runtime.h>

#include "cuda/attention_kernel.cuh"  // fast_exp2
#include "cuda/hopper/wgmma.cuh"      // CRISP_HOPPER_DEVICE_CODE
#include "plan/rules.h"

namespace crisp {
namespace cuda_detail {
namespace hopper {

#if defined(CRISP_HOPPER_DEVICE_CODE)

// Masks the scores of keys past a row's query or past the sequence end (n): the tile's keys are
// key0 .. key0 + kBlock - 1, the thread's rows query `row_query`.
template <int kBlock>
__device__ __forceinline__ void mask_scores(float (&s_acc)[kBlock / 2], int key0, const int (&row_query)[2], int n,
                                            int quad_lane) {
#pragma unroll
  for (int i = 0; i < kBlock / 2; ++i) {
    const int key = key0 + (i / 4) * 8 + quad_lane * 2 + (i & 1);
    const int query = row_query[(i & 2) ? 1 : 0];
    if (key > query || key >= n) s_acc[i] = -INFINITY;
  }
}

// The same with a sliding window of `window` tokens (§12: rules::key_visible). Each row's visible
// keys are one range, so each element is compared with the row's two bounds taken relative to the
// thread's first key: immediates against four registers (the d = 256 consumers have few to spare).
template <int kBlock>
__device__ __forceinline__ void mask_scores_window(float (&s_acc)[kBlock / 2], int key0, const int (&row_query)[2],
                                                   int n, int window, int quad_lane) {
  const int thread_key0 = key0 + quad_lane * 2;
  int first[2], last[2];  // of the keys row `half` sees, minus thread_key0
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int query = row_query[half];
    last[half] = (query < n - 1 ? query : n - 1) - thread_key0;
    first[half] = rules::window_first_key(query, window) - thread_key0;
  }
#pragma unroll
  for (int i = 0; i < kBlock / 2; ++i) {
    const int key = (i / 4) * 8 + (i & 1);  // minus thread_key0
    const int half = (i & 2) ? 1 : 0;
    if (key < first[half] || key > last[half]) s_acc[i] = -INFINITY;
  }
}

template <int kBlock>
struct OnlineSoftmax {
  static constexpr int kScoreRegs = kBlock / 2;  // S accumulators per thread (64 rows x kBlock keys per warpgroup)
  static constexpr int kColumnGroups = kBlock / 8;  // 8-key column groups of S (4 accumulators each per thread)

  float row_max[2], row_sum[2];  // row_sum: this thread's columns only; the quad is summed at the end

  __device__ __forceinline__ void reset() {
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;
  }

  // Turns the (masked) scores of a tile into exp2 values against the new row max; returns through
  // `correction` the factor for O and the row sums of earlier tiles.
  __device__ __forceinline__ void update(float (&s_acc)[kScoreRegs], float scale_log2, float (&correction)[2]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float m = row_max[half];
#pragma unroll
      for (int g = 0; g < kColumnGroups; ++g) m = fmaxf(m, fmaxf(s_acc[g * 4 + 2 * half], s_acc[g * 4 + 2 * half + 1]));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      // From -inf (no allowed key yet) the correction is exp2(-inf) = 0; an unchanged max keeps 1.
      correction[half] = m > row_max[half] ? attention::fast_exp2((row_max[half] - m) * scale_log2) : 1.f;
      row_max[half] = m;
      // A row with no allowed key yet keeps max -inf; subtracting 0 instead gives exp2(-inf) = 0.
      const float neg_max_scaled = m == -INFINITY ? 0.f : -m * scale_log2;
      float sum = 0.f;
#pragma unroll
      for (int g = 0; g < kColumnGroups; ++g) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s_acc[g * 4 + 2 * half + e];
          x = attention::fast_exp2(fmaf(x, scale_log2, neg_max_scaled));
          sum += x;
        }
      }
      row_sum[half] = row_sum[half] * correction[half] + sum;
    }
  }

  // The full sum of row `half` (over the quad's columns).
  __device__ __forceinline__ float total_sum(int half) const {
    float sum = row_sum[half];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    return sum;
  }

  // Natural-log LSE of row `half` from its full sum.
  __device__ __forceinline__ float lse(int half, float total, float scale) const {
    return row_max[half] * scale + logf(total);
  }
};

#endif  // CRISP_HOPPER_DEVICE_CODE

}  // namespace hopper
}  // namespace cuda_detail
}  // namespace crisp
