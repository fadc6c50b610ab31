// src/cuda/plan_kernels.cuh — §2 routing, §3 VS rules, §4 PE path and §5 layout on the device.
// Every decision is the selection pipeline of src/plan/select.h; these kernels arrange the data
// and supply the pipeline's primitives as thread-block cooperative code.
#pragma once
#include "cuda/device_plan.h"
#include "cuda/plan_common.cuh"
#include "cuda/plan_select.cuh"
#include "plan/plan_params.h"
#include "plan/proxy.h"
#include "plan/select.h"

namespace crisp {
namespace cuda_detail {
namespace planner {

// Everything the per-slot kernels read besides the tensors.
struct SlotParams {
  DevicePlanView view;
  Workspace ws;
  const int8_t* estimated;  // [seq] 1 = the proxy was computed (not dense, not short)
  int32_t num_kv_heads, group, head_dim;
  float scale;
  KeyTable keys;  // where K's rows are (contiguous or paged)
  PlanParams plan;
  const SelectState* walk_v;  // the token walks (§3 cumulative / topk) of the VS slots, per slot
  const SelectState* walk_u;
  const SelectState* pe_select;  // §4 global coverage of the PE slots, per slot
};

__device__ __forceinline__ int64_t key_mean_index(const layout::SequenceBases& sb, int64_t kv, int64_t c,
                                                  int64_t num_kv_heads) {
  return sb.block_base * num_kv_heads + kv * sb.num_blocks + c;
}

// ---------------------------------------------------------------- block means (§2 jsd, §4)
// Keys: grid (max N, Hkv, sequences); queries: grid (max N, slots), PE heads only. Every mean is a
// double sum of the block's values times 1 / count, rounded to float once.
//
// kVecDim = 0: any dtype and strides; one thread per dim walks the block's tokens (2-byte loads
// at bf16, a warp reads 64 bytes of 32 rows per instruction), blocks of kMeansScalarThreads.
// kVecDim = 64 / 128 / 256: bf16 / fp16 with contiguous, 16-byte aligned rows (the tensor-core proxy's
// layout): each thread loads 8 dims (16 bytes) of a token, a warp two whole 256-byte rows (more
// bandwidth than the scalar path: bench/RESULTS.md, session 4). The two sum in different orders: a
// double sum of up to B fp16 values is exact in any order, and of bf16 values unless one block's
// column spans more than ~2^38 in magnitude (then the sums may differ in the last double bit,
// which the rounding to float almost always absorbs), so both give the same means.
// NOTE: 128 threads (scalar: one per dim at d = 128); 256 (vector: 16 token lanes x 16 chunks of 8
// dims at d = 128, 32 x 8 at d = 64, 8 x 32 at d = 256).
constexpr int kMeansScalarThreads = 128;
constexpr int kMeansVecThreads = 256;
// NOTE: 16-byte loads a thread has in flight in block_mean's vector path: for keys 8 covers a
// whole block of 128 rows at d = 128 (16 lanes of rows x 8); a PE head's queries (rows Hq x d
// apart) measured slower with 8 than with one (bench/RESULTS.md, session 17), so they keep one.
constexpr int kKeyMeansLoadBatch = 8;
constexpr int kQueryMeansLoadBatch = 1;
constexpr int means_threads(int vec_dim) { return vec_dim == 0 ? kMeansScalarThreads : kMeansVecThreads; }

// The mean of positions [begin, end) of one head (`head` points at the head's row 0); position t
// sits at row rows.row(t) (SequenceQueries, or SequenceKeys through the block table), and the
// rows from t to rows.run_end(t, end) are consecutive (a page; the whole block when contiguous).
template <typename T, int kVecDim, int kLoadBatch, typename Rows>
__device__ __forceinline__ void block_mean(const T* head, const Rows& rows, int64_t stride_token, int64_t stride_dim,
                                           int head_dim, int64_t begin, int64_t end, float* out) {
  const double inv = 1.0 / static_cast<double>(end - begin);
  if constexpr (kVecDim == 0) {
    for (int x = threadIdx.x; x < head_dim; x += blockDim.x) {
      double sum = 0.0;
      for (int64_t t0 = begin; t0 < end;) {
        const int64_t count = rows.run_end(t0, end) - t0;
        const T* run = head + rows.row(t0) * stride_token + x * stride_dim;
#pragma unroll 8  // NOTE: 8 independent loads in flight per thread (the sum chain is not the limit)
        for (int64_t t = 0; t < count; ++t) sum += static_cast<double>(to_float(run[t * stride_token]));
        t0 += count;
      }
      out[x] = static_cast<float>(sum * inv);
    }
  } else {
    constexpr int kChunks = kVecDim / 8, kLanes = kMeansVecThreads / kChunks;
    __shared__ double partial[kLanes][kVecDim];
    const int chunk = threadIdx.x % kChunks, lane = threadIdx.x / kChunks;
    double sum[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    // All loads of a batch are issued before any is summed: one load in flight per thread left
    // the kernels latency-bound (one 16-byte load, then its 8 adds, then the next). Same sums, in
    // the same order.
    for (int64_t t0 = begin + lane; t0 < end; t0 += kLoadBatch * kLanes) {
      uint4 raw[kLoadBatch];
#pragma unroll
      for (int i = 0; i < kLoadBatch; ++i) {
        const int64_t t = t0 + i * kLanes;
        raw[i] = t < end ? *reinterpret_cast<const uint4*>(head + rows.row(t) * stride_token + chunk * 8)
                         : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int i = 0; i < kLoadBatch; ++i) {
        if (t0 + i * kLanes >= end) break;
        const T* v = reinterpret_cast<const T*>(&raw[i]);
#pragma unroll
        for (int e = 0; e < 8; ++e) sum[e] += static_cast<double>(to_float(v[e]));
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) partial[lane][chunk * 8 + e] = sum[e];
    __syncthreads();
    if (threadIdx.x < kVecDim) {
      double total = 0.0;
      for (int l = 0; l < kLanes; ++l) total += partial[l][threadIdx.x];
      out[threadIdx.x] = static_cast<float>(total * inv);
    }
  }
}

template <typename T, int kVecDim>
__global__ void __launch_bounds__(means_threads(kVecDim)) key_means_kernel(Strided3<T> k, SlotParams P) {
  const int s = blockIdx.z, kv = blockIdx.y, c = blockIdx.x;
  if (!P.estimated[s]) return;
  const layout::SequenceBases sb = P.view.seqs[s];
  if (c >= sb.num_blocks) return;
  const int64_t begin = rules::block_begin(c, P.view.block_size), end = rules::block_end(c, P.view.block_size, sb.n);
  block_mean<T, kVecDim, kKeyMeansLoadBatch>(k.data + kv * k.stride_head, SequenceKeys{P.keys, sb, s}, k.stride_token, k.stride_dim,
                         P.head_dim, begin, end,
                         P.ws.key_means + key_mean_index(sb, kv, c, P.num_kv_heads) * P.head_dim);
}

template <typename T, int kVecDim>
__global__ void __launch_bounds__(means_threads(kVecDim)) query_means_kernel(Strided3<T> q, SlotParams P) {
  const int64_t slot = blockIdx.y;
  const int H = P.view.num_heads;
  const int64_t s = slot / H, h = slot % H;
  const int c = blockIdx.x;
  if (P.view.route[slot] != rules::kRoutePe) return;
  const layout::SequenceBases sb = P.view.seqs[s];
  // A chunk (§11) has queries in rows first_row .. N-1 only; its first row may start mid-block.
  if (c >= sb.num_blocks || c < sb.first_row) return;
  const int64_t begin = rules::row_query_begin(c, P.view.block_size, sb.n, sb.n_q);
  const int64_t end = rules::block_end(c, P.view.block_size, sb.n);
  block_mean<T, kVecDim, kQueryMeansLoadBatch>(q.data + h * q.stride_head, SequenceQueries{sb}, q.stride_token, q.stride_dim,
                         P.head_dim, begin, end,
                         P.ws.query_means + (layout::block_array_offset(sb, h, H) + c) * P.head_dim);
}

// ---------------------------------------------------------------- §2 routing
// §2 jsd of one slot (the whole block cooperates): the JS distance between ā, the softmax of the
// mean proxy query against the block-mean keys, and the proxy's pv. route_smem: max(N) floats of
// logits + head_dim floats.
template <typename T>
__device__ double slot_jsd(const Strided3<T>& q, const SlotParams& P, const layout::SequenceBases& sb, int64_t h,
                           float* route_smem) {
  __shared__ double d_scratch[32];
  __shared__ float f_scratch[32];
  const int H = P.view.num_heads;
  const int B = P.view.block_size, N = sb.num_blocks, d = P.head_dim;
  const int64_t n = sb.n, L = rules::proxy_rows(sb.n_q, B);
  float* logits = route_smem;
  float* mean_query = route_smem + N;
  for (int x = threadIdx.x; x < d; x += blockDim.x) {
    double sum = 0.0;
    for (int64_t i = 0; i < L; ++i)
      sum += static_cast<double>(q.at(h, query_row(sb, rules::proxy_position(n, L, i)), x));
    mean_query[x] = proxy::mean_query_component<float>(sum, L);
  }
  __syncthreads();
  const int64_t kv = h / P.group;
  float local_max = -INFINITY;
  for (int c = threadIdx.x; c < N; c += blockDim.x) {
    const float* km = P.ws.key_means + key_mean_index(sb, kv, c, P.num_kv_heads) * d;
    float dot = 0.f;
    for (int x = 0; x < d; ++x) dot = fmaf(mean_query[x], km[x], dot);
    logits[c] = P.scale * dot;
    local_max = fmaxf(local_max, logits[c]);
  }
  const float max_logit = block_reduce(local_max, f_scratch, MaxOp());
  double local_den = 0.0;
  for (int c = threadIdx.x; c < N; c += blockDim.x) local_den += static_cast<double>(expf(logits[c] - max_logit));
  const double den = block_reduce(local_den, d_scratch, SumOp());
  double kl_abar = 0.0, kl_proxy = 0.0;
  const int64_t base = layout::block_array_offset(sb, h, H);
  const double last_scale = select::last_rows_mass_scale(P.plan, true, N);
  for (int c = threadIdx.x; c < N; c += blockDim.x)
    proxy::add_js_terms(proxy::abar_share(expf(logits[c] - max_logit), den),
                        pooled_block_mass(P.ws.pv_sum, P.ws.pv_last_sum, base + c, L, P.plan.proxy_last_rows, last_scale),
                        kl_abar, kl_proxy);
  kl_abar = block_reduce(kl_abar, d_scratch, SumOp());
  kl_proxy = block_reduce(kl_proxy, d_scratch, SumOp());
  return rules::js_distance(kl_abar, kl_proxy);
}

// One block per slot. Dynamic shared memory: that of slot_jsd.
template <typename T>
__global__ void route_kernel(Strided3<T> q, SlotParams P) {
  extern __shared__ float route_smem[];
  const int64_t slot = blockIdx.x;
  const int H = P.view.num_heads;
  const int64_t s = slot / H, h = slot % H;
  const layout::SequenceBases sb = P.view.seqs[s];
  if (!P.estimated[s]) {
    if (threadIdx.x == 0) {
      P.view.route[slot] = rules::kRouteDense;
      P.view.c_struct[slot] = NAN;
      P.view.jsd[slot] = NAN;
    }
    return;
  }
  const int64_t n = sb.n;
  const double c_struct = P.ws.cs_sum[slot] * proxy::rows_inverse(rules::proxy_rows(sb.n_q, P.view.block_size));
  const double jsd = select::needs_jsd(P.plan) ? slot_jsd(q, P, sb, h, route_smem) : NAN;
  if (threadIdx.x == 0) {
    P.view.route[slot] = select::decide_route(P.plan, c_struct, jsd, n);
    P.view.c_struct[slot] = static_cast<float>(c_struct);
    P.view.jsd[slot] = static_cast<float>(jsd);
  }
}

// ---------------------------------------------------------------- §3 VS rules and clamps
// Block-wide count of flags == 1.
__device__ __forceinline__ int count_flags(const int8_t* flags, int N, int* scratch) {
  int local = 0;
  for (int b = threadIdx.x; b < N; b += blockDim.x) local += flags[b] == 1;
  return block_reduce(local, scratch, SumOp());
}

// NOTE: up to this many blocks are picked by repeated block-wide arg-max rounds (one reduction each);
// more by counting each candidate's rank against every block (N steps per thread). PE heads add
// their min_budget blocks here (2 at 256 tokens and B = 128): by rank counting that cost ~40 us
// per side at N = 1024, most of the vs_flags stage at 128k (bench/RESULTS.md, session 17).
constexpr int kArgMaxPickLimit = 32;

// Marks temp[b] = 1 for the `count` candidates (cand(b)) ranked first by rules::ranks_before on
// mass, temp[b] = 0 elsewhere; every thread of the block calls it. The same blocks either way:
// ranks_before is a strict total order on (mass, index).
template <typename Candidate>
__device__ void mark_first_ranked(const double* mass, int8_t* temp, int N, int count, Candidate cand) {
  __shared__ double best_mass[32];
  __shared__ int best_index[32];
  for (int b = threadIdx.x; b < N; b += blockDim.x) temp[b] = 0;
  __syncthreads();
  if (count <= kArgMaxPickLimit) {
    for (int round = 0; round < count; ++round) {
      double bm = 0.0;
      int bi = -1;
      for (int b = threadIdx.x; b < N; b += blockDim.x)
        if (cand(b) && !temp[b] && (bi < 0 || rules::ranks_before(mass[b], b, bm, bi))) {
          bm = mass[b];
          bi = b;
        }
      for (int off = 16; off > 0; off >>= 1) {
        const double om = __shfl_xor_sync(0xffffffffu, bm, off);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
        if (oi >= 0 && (bi < 0 || rules::ranks_before(om, oi, bm, bi))) {
          bm = om;
          bi = oi;
        }
      }
      if ((threadIdx.x & 31) == 0) {
        best_mass[threadIdx.x >> 5] = bm;
        best_index[threadIdx.x >> 5] = bi;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w)
          if (best_index[w] >= 0 && (bi < 0 || rules::ranks_before(best_mass[w], best_index[w], bm, bi))) {
            bm = best_mass[w];
            bi = best_index[w];
          }
        if (bi >= 0) temp[bi] = 1;
      }
      __syncthreads();
    }
    return;
  }
  for (int b = threadIdx.x; b < N; b += blockDim.x) {
    if (!cand(b)) continue;
    int rank = 0;
    for (int o = 0; o < N; ++o) rank += (cand(o) && rules::ranks_before(mass[o], o, mass[b], b)) ? 1 : 0;
    temp[b] = rank < count;
  }
  __syncthreads();
}

// Adds unflagged blocks in tie order (rules::ranks_before on mass) until `target` are flagged.
__device__ void add_until(const double* mass, int8_t* flags, int8_t* temp, int N, int target, int* scratch) {
  const int kept = count_flags(flags, N, scratch);
  if (kept >= target) return;
  mark_first_ranked(mass, temp, N, target - kept, [&](int b) { return !flags[b]; });
  for (int b = threadIdx.x; b < N; b += blockDim.x) flags[b] |= temp[b];
  __syncthreads();
}

// max_budget: keeps block 0 and the first (limit - 1) other flagged blocks in tie order.
__device__ void trim_to(const double* mass, int8_t* flags, int8_t* temp, int N, int limit, int* scratch) {
  const int kept = count_flags(flags, N, scratch);
  if (kept <= limit) return;
  mark_first_ranked(mass, temp, N, limit - 1, [&](int b) { return b >= 1 && flags[b]; });
  for (int b = threadIdx.x; b < N; b += blockDim.x) flags[b] = b == 0 ? 1 : temp[b];
  __syncthreads();
}

// One side (verticals with pv, or slashes with ps) of one slot: the primitives of
// src/plan/select.h, one thread block cooperating over the side's mass and flags in shared memory.
class BlockSide {
 public:
  __device__ BlockSide(double* mass, int8_t* flags, int8_t* temp, int N, int* i_scratch, double* d_scratch,
                       const int8_t* walked_blocks, const SelectState* walk)
      : mass_(mass), flags_(flags), temp_(temp), N_(N), i_scratch_(i_scratch), d_scratch_(d_scratch),
        walked_blocks_(walked_blocks), walk_(walk) {}

  __device__ int32_t num_blocks() const { return N_; }
  __device__ double mass(int32_t b) const { return mass_[b]; }
  __device__ double sum_mass(int32_t first, int32_t last) const {
    double local = 0.0;
    for (int b = first + threadIdx.x; b <= last; b += blockDim.x) local += mass_[b];
    return block_reduce(local, d_scratch_, SumOp());
  }
  template <typename Pred>
  __device__ void keep_where(Pred pred) {
    for (int b = threadIdx.x; b < N_; b += blockDim.x)
      if (pred(b)) flags_[b] = 1;
    __syncthreads();
  }
  __device__ void add_in_rank_order(int32_t target) { add_until(mass_, flags_, temp_, N_, target, i_scratch_); }
  __device__ void trim_in_rank_order(int32_t limit) { trim_to(mass_, flags_, temp_, N_, limit, i_scratch_); }
  // The token walk ran before this kernel, grid-wide (init_token_select_kernel with the same
  // select::token_walk, then run_select): its kept count, and the blocks TopkMark marked.
  __device__ int64_t walk_tokens(const select::TokenWalk& /*walk*/, bool mark_blocks) {
    if (mark_blocks) keep_where([&](int32_t b) { return walked_blocks_[b] != 0; });
    return walk_->kept;
  }

 private:
  double* mass_;
  int8_t* flags_;
  int8_t* temp_;
  int N_;
  int* i_scratch_;
  double* d_scratch_;
  const int8_t* walked_blocks_;  // [N] blocks of the kept tokens (topk)
  const SelectState* walk_;      // this slot's token walk
};

__device__ void vs_side(const SlotParams& P, int64_t slot, const layout::SequenceBases& sb, int64_t h, int32_t route,
                        bool vertical, int8_t* out, double* mass, int8_t* flags, int8_t* temp, int* i_scratch,
                        double* d_scratch) {
  const int N = sb.num_blocks;
  const int64_t n = sb.n;
  const int64_t L = rules::proxy_rows(sb.n_q, P.view.block_size);
  const int64_t base = layout::block_array_offset(sb, h, P.view.num_heads);
  const double* mass_sum = vertical ? P.ws.pv_sum : P.ws.ps_sum;
  const double* last_sum = vertical ? P.ws.pv_last_sum : P.ws.ps_last_sum;
  const double last_scale = select::last_rows_mass_scale(P.plan, vertical, N);
  for (int b = threadIdx.x; b < N; b += blockDim.x) {
    mass[b] = pooled_block_mass(mass_sum, last_sum, base + b, L, P.plan.proxy_last_rows, last_scale);
    flags[b] = 0;
  }
  __syncthreads();
  BlockSide side(mass, flags, temp, N, i_scratch, d_scratch, (vertical ? P.ws.topk_vertical : P.ws.topk_slash) + base,
                 (vertical ? P.walk_v : P.walk_u) + slot);
  select::select_side(P.plan, route, n, vertical, side);
  for (int b = threadIdx.x; b < N; b += blockDim.x) out[base + b] = flags[b];
  __syncthreads();
}

// One block per slot. Dynamic shared memory: max(N) * (8 + 2) bytes.
__global__ void __launch_bounds__(1024) vs_flags_kernel(SlotParams P) {
  extern __shared__ double vs_smem[];
  __shared__ int i_scratch[32];
  __shared__ double d_scratch[32];
  const int64_t slot = blockIdx.x;
  const int H = P.view.num_heads;
  const int64_t s = slot / H, h = slot % H;
  const layout::SequenceBases sb = P.view.seqs[s];
  const int N = sb.num_blocks;
  const int32_t route = P.view.route[slot];
  const int64_t base = layout::block_array_offset(sb, h, H);
  if (route == rules::kRouteDense) {
    for (int b = threadIdx.x; b < N; b += blockDim.x) {
      P.view.vertical_flags[base + b] = 0;
      P.view.slash_flags[base + b] = 0;
    }
    return;
  }
  double* mass = vs_smem;
  int8_t* flags = reinterpret_cast<int8_t*>(mass + N);
  int8_t* temp = flags + N;
  vs_side(P, slot, sb, h, route, true, P.view.vertical_flags, mass, flags, temp, i_scratch, d_scratch);
  vs_side(P, slot, sb, h, route, false, P.view.slash_flags, mass, flags, temp, i_scratch, d_scratch);
}

// The token walks (§3 cumulative / topk, select::token_walk) of one side for the VS slots.
__global__ void init_token_select_kernel(SelectState* states, SlotParams P, bool vertical, int num_slots) {
  const int slot = blockIdx.x * blockDim.x + threadIdx.x;
  if (slot >= num_slots) return;
  const int H = P.view.num_heads;
  const layout::SequenceBases sb = P.view.seqs[slot / H];
  const int64_t h = slot % H, n = sb.n;
  const select::TokenWalk walk = select::token_walk(P.plan, vertical, n);
  SelectState st{};
  st.base = sb.kv_offset * H + h * n + walk.first;
  st.len = n - walk.first;
  st.scale = 1.0 / static_cast<double>(rules::proxy_rows(sb.n_q, P.view.block_size));
  st.walk = walk.rule;
  st.active = P.view.route[slot] == rules::kRouteVs;
  if (walk.rule.mode == select::kCount) {
    if (walk.rule.k == 0) st.active = 0;
    else if (walk.rule.k >= st.len) st.all = 1;
  }
  states[slot] = st;
}

// Marks the blocks of the tokens a topk walk kept.
struct TopkMark {
  int8_t* blocks;
  const layout::SequenceBases* seqs;
  int32_t num_heads, block;
  bool vertical;
  __device__ __forceinline__ void operator()(int64_t slot, int64_t e, bool kept) const {
    if (!kept) return;
    const layout::SequenceBases& sb = seqs[slot / num_heads];
    const int64_t first = select::topk_forced_tokens(vertical, sb.n);
    blocks[layout::block_array_offset(sb, slot % num_heads, num_heads) + (first + e) / block] = 1;
  }
};

// ---------------------------------------------------------------- §4 PE path
// P[r, c] for the PE slots, in two kernels. pe_logit_kernel: one block per (64 x 64 tile of the
// block-causal triangle, slot); the logits s q̄_r·k̄_c are a register-tiled fp32 matmul: each
// thread owns a 4x4 output tile, staged kPeDepth-deep slices of q̄ and k̄ come from shared memory
// as float4 (2 loads per 16 FMAs). Every dot product is one fmaf chain over x = 0 .. d-1 in order
// (zero padding adds an exact +0), and the logit is rounded to float before it is stored in
// pe_prob (as a double, exactly), like the CPU reference's logits. pe_softmax_kernel then turns
// each row into probabilities with one warp per row (see there).
// NOTE: 64x64 output tiles with 256 threads (4x4 per thread) and 32-deep slices: 17 KB of shared
// memory, register-tiled FFMA. One tile per block (not a row of tiles per block): at N = 1024 a
// head has 136 tiles, so the PE heads fill every SM several times over and the slices' L2
// latency is hidden; a row of tiles per block left one 8-warp block per SM (3x slower at 128k).
constexpr int kPeTile = 64;
constexpr int kPeDepth = 32;
constexpr int kPeMicro = 4;                                         // outputs per thread per axis
constexpr int kPeThreadsPerAxis = kPeTile / kPeMicro;               // 16
constexpr int kPeThreads = kPeThreadsPerAxis * kPeThreadsPerAxis;  // 256
// NOTE: +4 floats per slice row: the transposed staging stores hit 8 banks instead of 1, and the
// rows stay 16-byte aligned for the float4 reads.
constexpr int kPeTileStride = kPeTile + 4;

__global__ void __launch_bounds__(kPeThreads) pe_logit_kernel(SlotParams P) {
  __shared__ __align__(16) float q_slice[kPeDepth][kPeTileStride];  // [x][row]
  __shared__ __align__(16) float k_slice[kPeDepth][kPeTileStride];  // [x][column]
  const int64_t slot = blockIdx.y;
  const int H = P.view.num_heads;
  const int64_t s = slot / H, h = slot % H;
  if (P.view.route[slot] != rules::kRoutePe) return;
  const layout::SequenceBases sb = P.view.seqs[s];
  const int d = P.head_dim, N = sb.num_blocks;
  int32_t row_tile, col_tile;
  layout::triangle_tile(blockIdx.x, row_tile, col_tile);
  const int r0 = row_tile * kPeTile, c0 = col_tile * kPeTile;
  if (r0 >= N) return;
  const int last_row = min(r0 + kPeTile - 1, N - 1);  // also the largest c any row of the tile needs
  const int first_row = sb.first_row;                 // rows before it hold no query (§11)
  if (last_row < first_row) return;
  const float* qm = P.ws.query_means + layout::block_array_offset(sb, h, H) * d;  // row r at qm + r d
  const int64_t kv = h / P.group;
  const float* km = P.ws.key_means + key_mean_index(sb, kv, 0, P.num_kv_heads) * d;  // block c at km + c d
  double* head_out = P.ws.pe_prob + layout::col_offset(sb, h, H);  // (r, c) at r (r + 1) / 2 + c
  const int tx = threadIdx.x % kPeThreadsPerAxis, ty = threadIdx.x / kPeThreadsPerAxis;

  float acc[kPeMicro][kPeMicro];
#pragma unroll
  for (int i = 0; i < kPeMicro; ++i)
#pragma unroll
    for (int j = 0; j < kPeMicro; ++j) acc[i][j] = 0.f;
  for (int x0 = 0; x0 < d; x0 += kPeDepth) {
    __syncthreads();  // the previous slice is consumed
    // Coalesced along x in global memory, transposed into [x][row] in shared memory.
    for (int idx = threadIdx.x; idx < kPeTile * kPeDepth; idx += kPeThreads) {
      const int row = idx / kPeDepth, x = idx % kPeDepth;
      const bool in_x = x0 + x < d;
      q_slice[x][row] = in_x && r0 + row < N && r0 + row >= first_row ? qm[static_cast<int64_t>(r0 + row) * d + x0 + x]
                                                                       : 0.f;
      k_slice[x][row] = in_x && c0 + row <= last_row ? km[static_cast<int64_t>(c0 + row) * d + x0 + x] : 0.f;
    }
    __syncthreads();
#pragma unroll 8  // NOTE: keeps the float4 loads of later x in flight without bloating registers
    for (int x = 0; x < kPeDepth; ++x) {
      const float4 a = *reinterpret_cast<const float4*>(&q_slice[x][ty * kPeMicro]);
      const float4 b = *reinterpret_cast<const float4*>(&k_slice[x][tx * kPeMicro]);
      const float qa[kPeMicro] = {a.x, a.y, a.z, a.w};
      const float kb[kPeMicro] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < kPeMicro; ++i)
#pragma unroll
        for (int j = 0; j < kPeMicro; ++j) acc[i][j] = fmaf(qa[i], kb[j], acc[i][j]);
    }
  }
#pragma unroll
  for (int i = 0; i < kPeMicro; ++i) {
    const int r = r0 + ty * kPeMicro + i;
    if (r >= N || r < first_row) continue;
    double* row_out = head_out + static_cast<int64_t>(r) * (r + 1) / 2;
#pragma unroll
    for (int j = 0; j < kPeMicro; ++j) {
      const int c = c0 + tx * kPeMicro + j;
      if (c <= r) row_out[c] = static_cast<double>(P.scale * acc[i][j]);
    }
  }
}

// Row r of P from its logits in pe_prob: the row maximum, exp(logit - max) with a per-lane double
// denominator over c = lane, lane + 32, ... and a butterfly sum, then the division. A separate
// kernel with one warp per row so that enough rows are in flight to hide the L2 latency of the
// three sweeps (inside pe_logit_kernel only 8 warps per 64-row tile would do them).
constexpr int kPeSoftmaxWarps = 8;  // NOTE: 256-thread blocks, 8 rows each
// NOTE: entries a lane loads at once in each sweep of pe_softmax_kernel (loads in flight).
constexpr int kPeSoftmaxBatch = 4;

__global__ void __launch_bounds__(kPeSoftmaxWarps * 32) pe_softmax_kernel(SlotParams P) {
  const int64_t slot = blockIdx.y;
  const int H = P.view.num_heads;
  const int64_t s = slot / H, h = slot % H;
  if (P.view.route[slot] != rules::kRoutePe) return;
  const layout::SequenceBases sb = P.view.seqs[s];
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.x * kPeSoftmaxWarps + (threadIdx.x >> 5);
  if (r >= sb.num_blocks || r < sb.first_row) return;  // warp-uniform
  double* out = P.ws.pe_prob + layout::col_offset(sb, h, H) + static_cast<int64_t>(r) * (r + 1) / 2;
  // Each sweep loads kPeSoftmaxBatch entries per lane before it uses them (the sweeps wait on L2);
  // a lane still visits its entries c = lane, lane + 32, ... in order, so the sums are the same.
  constexpr int kStep = 32 * kPeSoftmaxBatch;
  float row_max = -INFINITY;
  for (int c0 = lane; c0 <= r; c0 += kStep) {
    double v[kPeSoftmaxBatch];
#pragma unroll
    for (int i = 0; i < kPeSoftmaxBatch; ++i) v[i] = c0 + 32 * i <= r ? out[c0 + 32 * i] : -INFINITY;
#pragma unroll
    for (int i = 0; i < kPeSoftmaxBatch; ++i) row_max = fmaxf(row_max, static_cast<float>(v[i]));
  }
  for (int off = 16; off > 0; off >>= 1) row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, off));
  double den = 0.0;
  for (int c0 = lane; c0 <= r; c0 += kStep) {
    double v[kPeSoftmaxBatch];
#pragma unroll
    for (int i = 0; i < kPeSoftmaxBatch; ++i) v[i] = c0 + 32 * i <= r ? out[c0 + 32 * i] : 0.0;
#pragma unroll
    for (int i = 0; i < kPeSoftmaxBatch; ++i) {
      if (c0 + 32 * i > r) break;
      const double e = static_cast<double>(expf(static_cast<float>(v[i]) - row_max));
      den += e;
      out[c0 + 32 * i] = e;
    }
  }
  for (int off = 16; off > 0; off >>= 1) den += __shfl_xor_sync(0xffffffffu, den, off);
  for (int c0 = lane; c0 <= r; c0 += kStep) {
    double v[kPeSoftmaxBatch];
#pragma unroll
    for (int i = 0; i < kPeSoftmaxBatch; ++i) v[i] = c0 + 32 * i <= r ? out[c0 + 32 * i] : 0.0;
#pragma unroll
    for (int i = 0; i < kPeSoftmaxBatch; ++i)
      if (c0 + 32 * i <= r) out[c0 + 32 * i] = v[i] / den;
  }
}

__global__ void init_pe_select_kernel(SelectState* states, SlotParams P, int num_slots) {
  const int slot = blockIdx.x * blockDim.x + threadIdx.x;
  if (slot >= num_slots) return;
  const int H = P.view.num_heads;
  const layout::SequenceBases sb = P.view.seqs[slot / H];
  // The entries of rows first_row .. N-1 (all of them for a whole prompt), in entry order.
  SelectState st{};
  st.base = layout::col_offset(sb, slot % H, H) + rules::causal_blocks(sb.first_row);
  st.len = rules::causal_blocks_of_rows(sb.first_row, sb.num_blocks);
  st.scale = 1.0;
  st.walk = select::pe_walk(P.plan, sb.num_blocks - sb.first_row);
  st.active = P.view.route[slot] == rules::kRoutePe;
  states[slot] = st;
}

struct PeMark {
  int8_t* keep;
  const layout::SequenceBases* seqs;
  int32_t num_heads;
  __device__ __forceinline__ void operator()(int64_t slot, int64_t e, bool kept) const {
    const layout::SequenceBases& sb = seqs[slot / num_heads];
    keep[layout::col_offset(sb, slot % num_heads, num_heads) + rules::causal_blocks(sb.first_row) + e] = kept ? 1 : 0;
  }
};

// §4 row floor (select::pe_floor_keeps): a parallel mark of every entry of the PE slots, one warp
// per row as in pe_softmax_kernel; pe_keep is written in full, as PeMark writes it.
__global__ void __launch_bounds__(kPeSoftmaxWarps * 32) pe_floor_kernel(SlotParams P) {
  const int64_t slot = blockIdx.y;
  const int H = P.view.num_heads;
  if (P.view.route[slot] != rules::kRoutePe) return;
  const layout::SequenceBases sb = P.view.seqs[slot / H];
  const int r = blockIdx.x * kPeSoftmaxWarps + (threadIdx.x >> 5);
  if (r >= sb.num_blocks || r < sb.first_row) return;
  const int64_t row = layout::col_offset(sb, slot % H, H) + static_cast<int64_t>(r) * (r + 1) / 2;
  for (int c = threadIdx.x & 31; c <= r; c += 32)
    P.ws.pe_keep[row + c] = select::pe_floor_keeps(P.plan, r, P.ws.pe_prob[row + c]) ? 1 : 0;
}

// ---------------------------------------------------------------- §5 layout
constexpr int kLayoutWarps = 8;
// NOTE: key blocks per lane per step of layout_kernel: 4 cuts the warp-wide ballot/scan work per
// block fourfold (the kernel was bound by instruction issue, bench/RESULTS.md session 17).
constexpr int kLayoutLaneBlocks = 4;
constexpr int kLayoutStep = 32 * kLayoutLaneBlocks;

// Steps of 32 x kLayoutLaneBlocks key blocks in rows 0 .. r-1 of a slot (row r' has r' / kStep + 1).
__host__ __device__ __forceinline__ int64_t layout_steps_before(int64_t r) {
  const int64_t a = r / kLayoutStep, b = r % kLayoutStep;
  return r + kLayoutStep * a * (a - 1) / 2 + a * b;
}

// The §4 decisions of one row of a PE slot, for rules::layout_has_block (none for other slots).
// Global coverage reads P and the selection's stop: entries above its value are kept, below are
// not, and of the ties (entries equal to it) all, none, or those select_mark_ties_kernel marked in
// pe_keep; the row floor reads pe_keep, which pe_floor_kernel writes in full.
struct PeRowRule {
  enum Mode : int32_t { kNone, kMarks, kAll, kStop };
  int32_t mode = kNone;
  const double* prob = nullptr;  // the row's P (kStop)
  const int8_t* marks = nullptr;  // the row's pe_keep (kMarks; kStop: the marked ties)
  uint64_t stop = 0;              // bits of the stop's value (kStop)
  int32_t ties = 0;               // kStop: 1 every tie kept, 0 none, -1 the marked ones
  __device__ __forceinline__ bool keeps(int32_t c) const {
    switch (mode) {
      case kMarks: return marks[c] != 0;
      case kAll: return true;
      case kStop: {
        const uint64_t bits = key_bits(prob[c]);
        if (bits != stop) return bits > stop;
        return ties < 0 ? marks[c] != 0 : ties != 0;
      }
      default: return false;
    }
  }
};

__device__ __forceinline__ PeRowRule pe_row_rule(const SlotParams& P, int64_t slot, int32_t route, int64_t row_entry) {
  PeRowRule rule;
  if (route != rules::kRoutePe) return rule;
  rule.marks = P.ws.pe_keep + row_entry;
  if (!select::pe_walks(P.plan)) {
    rule.mode = PeRowRule::kMarks;
    return rule;
  }
  const SelectState& st = P.pe_select[slot];
  if (st.all) {
    rule.mode = PeRowRule::kAll;
    return rule;
  }
  rule.mode = PeRowRule::kStop;
  rule.prob = P.ws.pe_prob + row_entry;
  rule.stop = st.prefix;
  rule.ties = st.ties_kept == st.ties ? 1 : st.ties_kept == 0 ? 0 : -1;
  return rule;
}

// A lane's kLayoutLaneBlocks key blocks from `first` on, and the flags rules::layout_has_block
// reads for them, loaded together (a short-circuit test loads one after the other).
struct LaneFlags {
  const int8_t* values;
  int32_t first;
  __device__ __forceinline__ int8_t operator[](int32_t i) const { return values[i - first]; }
};

// kFill = false: row counts into row_ptr[r + 1] and the membership bits into layout_bits;
// kFill = true: columns at row_ptr[r] from layout_bits. grid: (ceil(max N / kLayoutWarps), slots);
// one warp per row.
template <bool kFill>
__global__ void __launch_bounds__(kLayoutWarps * 32) layout_kernel(SlotParams P) {
  const int64_t slot = blockIdx.y;
  const int H = P.view.num_heads;
  const int64_t s = slot / H, h = slot % H;
  const layout::SequenceBases sb = P.view.seqs[s];
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.x * kLayoutWarps + (threadIdx.x >> 5);
  if (r >= sb.num_blocks) return;
  int32_t* row_ptr = P.view.row_ptr + layout::row_ptr_offset(sb, h, H);
  const int last_kb = r < sb.first_row ? -1 : r;  // rows without a query (§11) stay empty
  uint8_t* row_bits = P.ws.layout_bits + (slot * P.ws.layout_steps_per_slot + layout_steps_before(r)) * 32 + lane;
  if (!kFill) {
    const int32_t route = P.view.route[slot];
    const int64_t fo = layout::block_array_offset(sb, h, H);
    const int8_t* vflags = P.view.vertical_flags + fo;
    const int8_t* sflags = P.view.slash_flags + fo;
    const PeRowRule pe =
        pe_row_rule(P, slot, route, layout::col_offset(sb, h, H) + static_cast<int64_t>(r) * (r + 1) / 2);
    const int32_t first_kb = select::first_listed_block(P.plan, r, sb.n, sb.n_q);
    int count = 0;
    for (int kb0 = 0; kb0 <= last_kb; kb0 += kLayoutStep) {
      const int base = kb0 + kLayoutLaneBlocks * lane;
      unsigned bits = 0;
      if (base <= last_kb) {
        // Verticals of base .. base+3, slashes of distances r-base-4 .. r-base (kCoverExact reads
        // c - 1 too), the PE decisions of base .. base+3: loaded, then tested.
        int8_t v[kLayoutLaneBlocks], sl[kLayoutLaneBlocks + 1], pe_kept[kLayoutLaneBlocks];
        const int s_first = r - base - kLayoutLaneBlocks;
#pragma unroll
        for (int i = 0; i < kLayoutLaneBlocks; ++i) {
          const int kb = base + i;
          v[i] = kb <= last_kb ? vflags[kb] : int8_t(0);
          pe_kept[i] = kb <= last_kb && pe.keeps(kb) ? 1 : 0;
        }
#pragma unroll
        for (int i = 0; i <= kLayoutLaneBlocks; ++i) sl[i] = s_first + i >= 0 ? sflags[s_first + i] : int8_t(0);
        const LaneFlags lane_v{v, base}, lane_s{sl, s_first}, lane_pe{pe_kept, base};
#pragma unroll
        for (int i = 0; i < kLayoutLaneBlocks; ++i) {
          const int kb = base + i;
          if (kb <= last_kb && select::layout_keeps(P.plan, route, r, kb, first_kb, lane_v, lane_s, lane_pe))
            bits |= 1u << i;
        }
      }
      row_bits[(kb0 / kLayoutStep) * 32] = static_cast<uint8_t>(bits);
      count += __popc(bits);
    }
    count = __reduce_add_sync(0xffffffffu, count);
    if (lane == 0) row_ptr[r + 1] = count;
    return;
  }
  int32_t* col = P.view.col + layout::col_offset(sb, h, H);
  int32_t written = row_ptr[r];
  for (int kb0 = 0; kb0 <= last_kb; kb0 += kLayoutStep) {
    const int base = kb0 + kLayoutLaneBlocks * lane;
    unsigned bits = row_bits[(kb0 / kLayoutStep) * 32];
    // Inclusive scan of the lanes' counts: this lane's columns go after the lanes before it.
    int upto = __popc(bits);
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int other = __shfl_up_sync(0xffffffffu, upto, off);
      if (lane >= off) upto += other;
    }
    int at = written + upto - __popc(bits);
    while (bits != 0) {
      const int i = __ffs(bits) - 1;
      col[at++] = base + i;
      bits &= bits - 1;
    }
    written += __shfl_sync(0xffffffffu, upto, 31);
  }
}

// Inclusive scan of the row counts into row_ptr and nnz; one block per slot.
__global__ void __launch_bounds__(1024) layout_scan_kernel(SlotParams P) {
  __shared__ int32_t s_warp[32];
  const int64_t slot = blockIdx.x;
  const int H = P.view.num_heads;
  const layout::SequenceBases sb = P.view.seqs[slot / H];
  int32_t* row_ptr = P.view.row_ptr + layout::row_ptr_offset(sb, slot % H, H);
  const int N = sb.num_blocks;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  int32_t carry = 0;
  for (int r0 = 0; r0 < N; r0 += blockDim.x) {
    const int r = r0 + threadIdx.x;
    int32_t value = r < N ? row_ptr[r + 1] : 0;
    for (int off = 1; off < 32; off <<= 1) {
      const int32_t other = __shfl_up_sync(0xffffffffu, value, off);
      if (lane >= off) value += other;
    }
    __syncthreads();
    if (lane == 31) s_warp[warp] = value;
    __syncthreads();
    int32_t before = carry;
    for (int w = 0; w < warp; ++w) before += s_warp[w];
    int32_t total = 0;
    for (int w = 0; w < warps; ++w) total += s_warp[w];
    if (r < N) row_ptr[r + 1] = before + value;
    carry += total;
  }
  if (threadIdx.x == 0) {
    row_ptr[0] = 0;
    P.view.nnz[slot] = carry;
  }
}

}  // namespace planner
}  // namespace cuda_detail
}  // namespace crisp
