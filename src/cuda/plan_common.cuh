// src/cuda/plan_common.cuh — shared pieces of the device planner (src/cuda/plan_device.cu):
// element loads for every input dtype, block reductions, and the planner's workspace layout.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/kv_rows.h"
#include "plan/plan_layout.h"
#include "plan/proxy.h"
#include "plan/rules.h"

namespace crisp {
namespace cuda_detail {
namespace planner {

// ---------------------------------------------------------------- element loads
template <typename T>
__device__ __forceinline__ float to_float(const T& x);
template <>
__device__ __forceinline__ float to_float<float>(const float& x) { return x; }
template <>
__device__ __forceinline__ float to_float<double>(const double& x) { return static_cast<float>(x); }
template <>
__device__ __forceinline__ float to_float<__half>(const __half& x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(const __nv_bfloat16& x) { return __bfloat162float(x); }

// A strided [heads, tokens, dim] device tensor (strides in elements).
template <typename T>
struct Strided3 {
  const T* data;
  int64_t stride_head, stride_token, stride_dim;
  __device__ __forceinline__ float at(int64_t h, int64_t t, int64_t x) const {
    return to_float(data[h * stride_head + t * stride_token + x * stride_dim]);
  }
};

// ---------------------------------------------------------------- rows of a sequence (spec §11)
// Where the planner reads K: contiguous rows (table null) or the page pool through a block table.
struct KeyTable {
  const int32_t* table = nullptr;  // device [sequences][row_stride] page ids; null: contiguous K
  int64_t row_stride = 0;          // max_pages_per_sequence
  int64_t page_size = 0;
  // The row of k holding key position j of sequence s (kv_rows::key_row, the one rule).
  __device__ __forceinline__ int64_t row(const layout::SequenceBases& sb, int64_t s, int64_t j) const {
    return kv_rows::key_row(sb.kv_offset, table != nullptr ? table + s * row_stride : nullptr, page_size, j);
  }
  // End of the run of consecutive rows that starts at position j (< end): its page's end, or end.
  __device__ __forceinline__ int64_t run_end(int64_t j, int64_t end) const {
    if (table == nullptr) return end;
    const int64_t page_end = (j / page_size + 1) * page_size;
    return page_end < end ? page_end : end;
  }
};

// The row of q holding the query at position p (>= n - n_q) of a sequence.
__device__ __forceinline__ int64_t query_row(const layout::SequenceBases& sb, int64_t p) {
  return sb.token_offset + p - rules::first_query_position(sb.n, sb.n_q);
}

// The positions of one sequence as rows of a view, for block means: row(t), and the end of the
// run of consecutive rows from t (so a mean reads a page, or the whole block, as one strided run).
struct SequenceKeys {
  KeyTable keys;
  layout::SequenceBases sb;
  int64_t s;
  __device__ __forceinline__ int64_t row(int64_t t) const { return keys.row(sb, s, t); }
  __device__ __forceinline__ int64_t run_end(int64_t t, int64_t end) const { return keys.run_end(t, end); }
};
struct SequenceQueries {
  layout::SequenceBases sb;
  __device__ __forceinline__ int64_t row(int64_t t) const { return query_row(sb, t); }
  __device__ __forceinline__ int64_t run_end(int64_t, int64_t end) const { return end; }
};

// §1 proxy rows of a sequence: L = min(B, n_q). The rows of one query head occupy
// proxy_row_stride(L) = L rounded up to 64 consecutive proxy-row slots (the rows >= L of a chunk
// with n_q < B are padding and never scored), so a tile of rows never splits a head's rows
// unevenly: 8 consecutive rows (one thread of plan_proxy.cuh) lie in one head, and a 128-row tile
// holds at most two heads. For every whole prompt that is estimated L = B and the stride is L.
// NOTE: 64 = the smaller block size, so the stride of a whole prompt is always L itself.
constexpr int64_t kProxyHeadRowAlign = 64;
CRISP_HD int64_t proxy_row_stride(int64_t L) {
  return (L + kProxyHeadRowAlign - 1) / kProxyHeadRowAlign * kProxyHeadRowAlign;
}

// ---------------------------------------------------------------- reductions
// Block-wide reductions for blockDim.x a multiple of 32 (<= 1024). `scratch` holds 32 entries.
// Every thread gets the result. The caller syncs before reusing scratch.
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T value, T* scratch, Op op) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int off = 16; off > 0; off >>= 1) value = op(value, __shfl_xor_sync(0xffffffffu, value, off));
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  T total = scratch[0];
  for (int w = 1; w < warps; ++w) total = op(total, scratch[w]);
  return total;
}
// Butterfly sums of four values over the 32 lanes of a warp (every lane gets the totals; fixed order).
template <typename T>
__device__ __forceinline__ void warp_sum4(T& a, T& b, T& c, T& d) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, off);
    b += __shfl_xor_sync(0xffffffffu, b, off);
    c += __shfl_xor_sync(0xffffffffu, c, off);
    d += __shfl_xor_sync(0xffffffffu, d, off);
  }
}

// The exponentials the proxy paths hand to src/plan/proxy.h: natural (fp32 path) or base 2 (the
// tensor-core path keeps its scores in the log2 domain).
template <bool kLog2>
struct ExpOf {
  __device__ __forceinline__ float operator()(float x) const { return kLog2 ? exp2f(x) : expf(x); }
};
using ExpE = ExpOf<false>;
using Exp2 = ExpOf<true>;

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a > b ? a : b; }
};

// ---------------------------------------------------------------- workspace view
// Temporary device buffers of one planning call (see PlanWorkspace in plan_device.cu for sizes).
// Per-slot arrays use the layouts of src/plan/plan_layout.h:
//  - [slot][N]-sized arrays at layout::block_array_offset,
//  - [slot][N(N+1)/2] causal-entry arrays at layout::col_offset,
//  - [slot][n] token arrays at kv_offset * H + h * n (n = n_k: one entry per key position),
//  - [slot][B] proxy-row arrays at slot * B.
struct Workspace {
  // §1 proxy statistics.
  float2* partial_stats = nullptr;  // [work item][kProxyTileRows] (running max, running sum), pass 1
  float* row_max = nullptr;         // [slot][B] exact row maximum of s q.k
  float* row_inv_den = nullptr;     // [slot][B] 1 / softmax denominator
  double* pv_sum = nullptr;         // [block array] sum over proxy rows of A (times L)
  double* ps_sum = nullptr;         // [block array]
  double* cs_sum = nullptr;         // [slot] sum over rows of the structural mass (times L)
  double* v_sum = nullptr;          // [token array] token-level v (times L), cumulative/topk only
  double* u_sum = nullptr;          // [token array] token-level u (times L)
  double* pv_last_sum = nullptr;    // [block array] the same over the last proxy_last_rows rows only
  double* ps_last_sum = nullptr;    // [block array] (times min(R, L)); null when proxy_last_rows = 0
  // §2 jsd / §4 PE.
  float* key_means = nullptr;       // [(block_base * Hkv + kv * N + c)][d]
  float* query_means = nullptr;     // [block array][d] (PE heads)
  double* pe_prob = nullptr;        // [causal entries] P[r, c] at r(r+1)/2 + c
  int8_t* pe_keep = nullptr;        // [causal entries] 1 = kept by global coverage
  // §3 topk: blocks of the selected tokens (before routing is applied).
  int8_t* topk_vertical = nullptr;  // [block array]
  int8_t* topk_slash = nullptr;     // [block array]
  // §5 layout: the count pass's membership bits for the fill pass, a byte per lane and step of
  // 32 x 4 key blocks (plan_kernels.cuh, layout_steps_before): [slot][step][lane].
  uint8_t* layout_bits = nullptr;
  int64_t layout_steps_per_slot = 0;
};

// A block's pooled proxy mass (pv or ps, as the VS rules and the JSD read it) from the sums of the
// proxy: the mean over the L rows, or with proxy_last_rows the larger of that and the last rows'
// mean times `last_scale` (proxy::with_last_rows, select::last_rows_mass_scale: the CPU planner's
// rule). `last_sum` is null when the option is off.
__device__ __forceinline__ double pooled_block_mass(const double* all_sum, const double* last_sum, int64_t at,
                                                    int64_t L, int64_t last_rows, double last_scale) {
  const double all = all_sum[at] * proxy::rows_inverse(L);
  if (last_sum == nullptr || last_rows <= 0) return all;
  return proxy::with_last_rows(all, last_sum[at] * proxy::last_rows_inverse(L, last_rows) * last_scale);
}

}  // namespace planner
}  // namespace cuda_detail
}  // namespace crisp
