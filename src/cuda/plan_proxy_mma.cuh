// src/cuda/plan_proxy_mma.cuh — §1 proxy map on tensor cores, for bf16 / fp16 inputs with head dim
// 64, 128 or 256 (contiguous rows). The same results as plan_proxy.cuh up to fp32 rounding (the f32
// FFMA path, still used for f32 / f64 inputs and other shapes), organised for speed:
//
//  - one CTA = (sequence, kv head, row group of up to mma_rows(d) = 512 proxy rows (256 at d = 256),
//    key range). The rows are the proxy rows of the kv head's whole GQA group (row rho =
//    head_in_group * L + i), so at Hq/Hkv <= 4 and L = 128 every key tile is read ONCE per kv head
//    for all its query heads (twice at d = 256);
//  - the queries of the row group stay in shared memory (bf16, XOR-swizzled for ldmatrix); key
//    tiles of 64 stream through a cp.async double buffer; S = Q K^T on mma.sync m16n8k16 with fp32
//    accumulation (products of bf16 / fp16 values are exact in fp32; only the summation order
//    differs from the CPU's f32 dot product);
//  - a warp per 32 rows (two m16 tiles x 64 keys = 64 fp32 accumulators per thread): 16 warps, 8 at
//    d = 256;
//  - key ranges are whole key blocks, so every key block is seen by exactly one CTA.
//
// Pooled rules (noise_floor; the PE and JSD paths need only pooled masses too) take ONE pass over
// K (kFusedPass): per row, online-softmax partials (max, sum) in the log2 domain for the combine
// kernel (exact row maximum and 1 / denominator), and per (row, key block) the slash masses of
// <= 3 distance blocks and the structural mass, relative to the row's running maximum, stored
// with that maximum; the row finalize kernel rescales each record to the true softmax and sums
// rows in a fixed order into pv, ps and C_struct.
// Token-level rules (cumulative, topk: v and u per token) take two: pass 1 writes the partials,
// pass 2 recomputes the scores with the exact row statistics and accumulates per warp and key
// block the same masses (plain stores into a record array), plus v and u; a finalize kernel sums
// the records in a fixed order. Everything but the token-level slash u is therefore
// deterministic: v[j] is summed across the warps of a head in shared memory in a fixed order and
// stored (each key has one owner CTA); u[t] collects diagonals through shared-memory float atomics
// and one double atomic per (CTA, distance), whose order may vary at the last bit.
#pragma once
#include "cuda/attention_kernel.cuh"  // mma.sync / ldmatrix / cp.async helpers, swizzled()
#include "cuda/plan_common.cuh"
#include "cuda/plan_proxy.cuh"

namespace crisp {
namespace cuda_detail {
namespace planner {

// NOTE: 512 proxy rows per CTA = the whole GQA group at Hq/Hkv = 4, L = 128 (K streamed once per
// kv head); 16 warps x 32 rows. The queries take 128 KB of shared memory at d = 128, so one CTA
// runs per SM (launch bounds cap registers at 128 per thread). At d = 256, 512 rows would take
// 256 KB, more than an SM has: 256 rows (128 KB of queries + 64 KB of key stages), 8 warps, and
// the GQA group's rows split over more CTAs (each reads the keys once).
__host__ __device__ constexpr int mma_rows(int64_t head_dim) { return head_dim > 128 ? 256 : 512; }
constexpr int kMmaWarpRows = 32;
__host__ __device__ constexpr int mma_warps(int64_t head_dim) { return mma_rows(head_dim) / kMmaWarpRows; }
// NOTE: 64-key tiles (8 n8 mma tiles per warp): both block sizes (64, 128) are whole tiles.
constexpr int kMmaKeyTile = 64;
// Distance blocks one key block can reach from the L = B proxy rows of one head: the distances span
// L + B - 1 = 2B - 1 values, so at most 3 blocks.
constexpr int kMmaSlashBins = 3;
// Heads of one row group: L >= 64 (L = B for every estimated sequence).
__host__ __device__ constexpr int mma_max_heads(int64_t head_dim) { return mma_rows(head_dim) / 64; }
// Token-level u: a per-head ring of distances; a tile touches L + 63 <= 191 distances, and the
// 64 that no later tile can reach are flushed after each tile, so 256 slots never alias.
constexpr int kMmaRing = 256;

template <typename T, int kDim>
constexpr size_t proxy_mma_smem_bytes() {
  return static_cast<size_t>(mma_rows(kDim) + 2 * kMmaKeyTile) * kDim * sizeof(T);
}

// Shared memory of one proxy_mma_kernel CTA, dynamic and static (the token-level pass's v and u
// buffers), for 2-byte inputs: what the device must allow per block (plan_device.cu checks it).
constexpr size_t proxy_mma_block_smem_bytes(int64_t head_dim, bool token_level) {
  return static_cast<size_t>(mma_rows(head_dim) + 2 * kMmaKeyTile) * static_cast<size_t>(head_dim) * 2 +
         (token_level ? static_cast<size_t>(mma_warps(head_dim) * kMmaKeyTile + mma_max_heads(head_dim) * kMmaRing) *
                            sizeof(float)
                      : 0);
}

// Pass 2 (two-pass path): record of one (warp, key block): slash masses of distance blocks
// c_base + 0..2, and the structural mass, summed over the warp's rows.
// Fused pass (kFusedPass): record of one (proxy row, key block): the same four masses of that row,
// relative to the row's running maximum m at the end of the key block (log2 domain), and m.
struct ProxyMmaRecords {
  float4* data;     // two-pass: [record_base + key block * mma_warps(d) + warp];
                    // fused: [record_base + key block * record_pitch + row of the tile]
  float* row_max;   // fused: m of each record (same index), -inf where the row saw no key
};

// kPass of proxy_mma_kernel: 1 = softmax partials, 2 = masses from the exact row statistics (two
// passes over K, needed for the token-level v and u), 3 = both at once (one pass over K: each
// row's masses are kept relative to its running maximum and rescaled by the finalize kernel).
constexpr int kFusedPass = 3;
// Masses of one (slot, key block) between the fused pass's two finalize kernels: 3 slash bins and
// the structural mass, then (proxy_last_rows) the 3 slash bins of the last rows alone.
constexpr int kFusedBins = 4;
constexpr int kFusedLastBins = kFusedBins;  // first index of the last rows' bins
constexpr int kFusedBinsPitch = kFusedBins + kMmaSlashBins;

// First distance block reached by key block kb from the L proxy rows (t >= n - L - (kb+1) B + 1).
// Positions fit an int on this path (proxy_mma_kernel's pw), so 32-bit arithmetic: a 64-bit
// division per tile costs a call to a division routine.
// With X = n - L + 1 >= 1 and t_lo = X - (kb + 1) B: t_lo / B = X / B - (kb + 1) when t_lo > 0, and
// X / B - (kb + 1) <= 0 otherwise, so the base is max(0, X / B - kb - 1); a kernel walking key
// blocks computes X / B once (mma_slash_blocks) instead of a division per tile.
__device__ __forceinline__ int mma_slash_blocks(int n, int L, int B) { return (n - L + 1) / B; }
__device__ __forceinline__ int mma_slash_base_of(int slash_blocks, int kb) { return max(0, slash_blocks - kb - 1); }
__device__ __forceinline__ int mma_slash_base(int n, int L, int B, int kb) {
  return mma_slash_base_of(mma_slash_blocks(n, L, B), kb);
}

// Pass-2 masses of one tile for one thread: turns acc (raw q.k) into A values in place and adds
// them to the three slash bins and (kEdge) the structural mass; kEdge also applies the causal mask.
// Rows rr = 2 mt + hf sit at positions p = pw_g + 8 rr; keys at j = j0q + 8 nt + e.
template <bool kEdge>
__device__ __forceinline__ void mma_tile_masses(float (&acc)[2][8][4], const float (&row_max)[4],
                                                const float (&row_inv)[4], int pw_g, int j0q, int T1, int T2,
                                                float scale_log2, int64_t w_sink, int64_t w_local, float& ps0,
                                                float& ps1, float& ps2, float& cs) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int rr = 2 * mt + hf;
      const int p = pw_g + 8 * rr;
      const int tb = p - j0q;  // distance of key offset 0
      const int k1 = tb - T1, k2 = tb - T2;  // key offsets <= k1 are in bin >= 1, <= k2 in bin 2
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int koff = 8 * nt + e;
          float a = attention::fast_exp2(acc[mt][nt][2 * hf + e] * scale_log2 - row_max[rr]) * row_inv[rr];
          if (kEdge) {
            if (tb - koff < 0) a = 0.f;  // causal: j <= p (also keeps j < n)
            else if (rules::in_structural_set(j0q + koff, p, w_sink, w_local)) cs += a;
          }
          if (koff <= k2) ps2 += a;
          else if (koff <= k1) ps1 += a;
          else ps0 += a;
          acc[mt][nt][2 * hf + e] = a;
        }
    }
}

// One step of a butterfly reduce-scatter: lanes with `kMask` set keep the upper kHalf values,
// the others the lower kHalf, each adding its partner's copy; the result is in vals[0, kHalf).
template <int kHalf, int kMask>
__device__ __forceinline__ void reduce_scatter_half(float (&vals)[16], int lane) {
  const bool upper = (lane & kMask) != 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float send = upper ? vals[i] : vals[i + kHalf];
    const float keep = upper ? vals[i + kHalf] : vals[i];
    vals[i] = keep + __shfl_xor_sync(0xffffffffu, send, kMask);
  }
}

// The 16-byte chunk `chunk` of proxy row rho of KV head kv's row group (query head kv * group +
// rho / L, at proxy position rho % L) and its byte count for cp.async: rows past the group
// (rho >= group * L) are zero-filled (bytes = 0, any valid address).
template <typename T>
__device__ __forceinline__ const T* proxy_query_chunk(const Strided3<T>& q, const layout::SequenceBases& sb, int kv,
                                                      int group, int L, int rho, int chunk, int& bytes) {
  if (rho >= group * L) {
    bytes = 0;
    return q.data;
  }
  const int64_t h = static_cast<int64_t>(kv) * group + rho / L;
  const int64_t p = rules::proxy_position(sb.n, L, rho % L);
  bytes = 16;
  return q.data + h * q.stride_head + query_row(sb, p) * q.stride_token + chunk * 8;
}

// One proxy row of the fused pass, over this lane's keys: running maximum (log2 domain) and sum,
// and the current key block's masses (3 slash bins, structural) relative to that maximum.
struct FusedRowState {
  float max = -INFINITY, sum = 0.f, bin0 = 0.f, bin1 = 0.f, bin2 = 0.f, cs = 0.f;
};

// Whether a 64-key tile from j0 needs the general row update for some proxy row (positions
// n - L .. n - 1): a key after a row (causal mask), in the sink, or within w_local of a row.
__device__ __forceinline__ bool fused_tile_is_general(int64_t n, int L, int j0, int64_t w_sink, int64_t w_local) {
  return j0 < w_sink || (n - L) - (j0 + kMmaKeyTile - 1) < (w_local > 0 ? w_local : 0);
}

// The fused pass's update of one row by this lane's 16 raw scores of a 64-key tile (s(nt, e): key
// j0q + 8 nt + e; the row at position p): online softmax, then the tile's masses added to the
// slash bins of distance blocks c_base + 0..2 (key offsets <= tb - T2 in bin 2, <= tb - T1 in
// bin 1) and, kGeneral, the causal mask and the structural mass. The fast form (no key of the
// tile after the row, in the sink or the local window) uses that a 64-key tile meets at most one
// bin boundary of a row (B >= 64): two sums split at that boundary, then added to their bins.
template <bool kGeneral, typename Scores>
__device__ __forceinline__ void fused_row_update(Scores s, int p, int j0q, int T1, int T2, float scale_log2,
                                                 int64_t w_sink, int64_t w_local, FusedRowState& st) {
  const int tb = p - j0q;  // distance of key offset 0
  const int k1 = tb - T1, k2 = tb - T2;
  if (!kGeneral) {
    // A tree, not a chain: 4 dependent steps instead of 16.
    float pair_max[8];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) pair_max[nt] = fmaxf(s(nt, 0), s(nt, 1));
#pragma unroll
    for (int width = 4; width > 0; width >>= 1)
#pragma unroll
      for (int i = 0; i < width; ++i) pair_max[i] = fmaxf(pair_max[i], pair_max[i + width]);
    const float raw_max = pair_max[0];
    const float m = fmaxf(st.max, raw_max * scale_log2);  // scale > 0: max commutes with it
    const float rescale = attention::fast_exp2(st.max - m);
    st.max = m;
    st.sum *= rescale;
    st.bin0 *= rescale;
    st.bin1 *= rescale;
    st.bin2 *= rescale;
    st.cs *= rescale;
    const bool upper = k2 >= 0;  // the tile's keys lie in bins 2 and 1, else in bins 1 and 0
    const int cut = upper ? k2 : k1;
    float far = 0.f, near = 0.f;
    // A lane's keys sit at offsets 0 .. 57 (8 nt + e). Where no lane of the warp has the bin
    // boundary among its keys (about half of the tiles), each lane's keys all lie on one side of
    // it: one sum, without the compare and the second (predicated) add per key.
    if (__all_sync(0xffffffffu, cut < 0 || cut >= 57)) {
      float sums[2] = {0.f, 0.f};  // two chains
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) sums[nt & 1] += attention::fast_exp2(fmaf(s(nt, e), scale_log2, -m));
      const float sum = sums[0] + sums[1];
      if (cut >= 0) far = sum;
      else near = sum;
    } else {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float a = attention::fast_exp2(fmaf(s(nt, e), scale_log2, -m));
          if (8 * nt + e <= cut) far += a;
          else near += a;
        }
    }
    if (upper) {
      st.bin2 += far;
      st.bin1 += near;
    } else {
      st.bin1 += far;
      st.bin0 += near;
    }
    return;
  }
  // The scaled, masked scores in their own registers: the accumulators stay read-only here (the
  // wgmma kernel updates one half's rows while the other half's multiply writes its registers).
  float x[8][2];
  float m = st.max;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      x[nt][e] = j0q + 8 * nt + e > p ? -INFINITY : s(nt, e) * scale_log2;
      m = fmaxf(m, x[nt][e]);
    }
  if (m == -INFINITY) return;  // no key of this row so far
  const float rescale = attention::fast_exp2(st.max - m);
  st.max = m;
  st.sum *= rescale;
  float b0 = st.bin0 * rescale, b1 = st.bin1 * rescale, b2 = st.bin2 * rescale, bc = st.cs * rescale;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int koff = 8 * nt + e;
      const float a = attention::fast_exp2(x[nt][e] - m);  // 0 where masked
      if (koff <= k2) b2 += a;
      else if (koff <= k1) b1 += a;
      else b0 += a;
      if (rules::in_structural_set(j0q + koff, p, w_sink, w_local)) bc += a;
    }
  st.bin0 = b0;
  st.bin1 = b1;
  st.bin2 = b2;
  st.cs = bc;
}

// End of a key block (or of a CTA's keys) for one row: its bins join the running sum; the 4 lanes
// (qd) of the row bring their masses to the largest of their maxima and sum them, lane qd ending
// with component qd of the record (b0, b1, b2, cs), which it stores at `at` when `store` (lane 0
// also the maximum); the bins restart at zero. Rescaling first and then a reduce-scatter takes one
// exponential and 5 shuffles per row, where a pairwise combine took 6 and 15 (the block end was
// about a sixth of the wgmma proxy's instructions).
__device__ __forceinline__ void fused_row_block_end(FusedRowState& st, const ProxyMmaRecords& R, int64_t at,
                                                    bool store) {
  st.sum += (st.bin0 + st.bin1) + st.bin2;
  float mm = fmaxf(st.max, __shfl_xor_sync(0xffffffffu, st.max, 1));
  mm = fmaxf(mm, __shfl_xor_sync(0xffffffffu, mm, 2));
  // A lane without a key so far holds zeros (and max -inf): its factor is 0, also when mm = -inf.
  const float f = st.max == -INFINITY ? 0.f : exp2f(st.max - mm);
  const int qd = threadIdx.x & 3;
  // Lanes with qd bit 1 keep (b2, cs), the others (b0, b1); then qd bit 0 picks one of the pair.
  const bool hi2 = (qd & 2) != 0, hi1 = (qd & 1) != 0;
  float keep0 = (hi2 ? st.bin2 : st.bin0) * f, keep1 = (hi2 ? st.cs : st.bin1) * f;
  const float send0 = (hi2 ? st.bin0 : st.bin2) * f, send1 = (hi2 ? st.bin1 : st.cs) * f;
  keep0 += __shfl_xor_sync(0xffffffffu, send0, 2);
  keep1 += __shfl_xor_sync(0xffffffffu, send1, 2);
  const float send = hi1 ? keep0 : keep1;
  const float mine = (hi1 ? keep1 : keep0) + __shfl_xor_sync(0xffffffffu, send, 1);
  if (store) {
    reinterpret_cast<float*>(R.data + at)[qd] = mine;
    if (qd == 0) R.row_max[at] = mm;
  }
  st.bin0 = st.bin1 = st.bin2 = st.cs = 0.f;
}

// The row's softmax partials (running maximum and sum over the CTA's keys), the 4 lanes (qd)
// combined; lane qd = 0 stores them at `at` when `store`.
__device__ __forceinline__ void store_row_partials(float m, float l, float2* partial_stats, int64_t at, bool store) {
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
    const float l2 = __shfl_xor_sync(0xffffffffu, l, off);
    const float mm = fmaxf(m, m2);
    l = (m == -INFINITY ? 0.f : l * exp2f(m - mm)) + (m2 == -INFINITY ? 0.f : l2 * exp2f(m2 - mm));
    m = mm;
  }
  if (store && (threadIdx.x & 3) == 0) partial_stats[at] = make_float2(m, l);
}

// kPass 1: softmax partials; kPass 2: masses (+ v, u when kTokenLevel); kFusedPass: both, the
// masses per row relative to its running maximum.
// NOTE: the fused pass holds 16 more floats per thread (four masses of four rows) than pass 1 and
// spills ~60 bytes under the 128-register cap of 512 threads; it still runs faster than pass 1 +
// pass 2 (bench/RESULTS.md, session 4), so the spill is accepted.
template <typename T, int kDim, int kPass, bool kTokenLevel>
__global__ void __launch_bounds__(mma_warps(kDim) * 32, 1)
    proxy_mma_kernel(Strided3<T> q, Strided3<T> k, ProxyParams P, ProxyMmaRecords R) {
  constexpr int kRows = mma_rows(kDim), kWarps = mma_warps(kDim), kThreads = kWarps * 32;
  constexpr int kMaxHeads = mma_max_heads(kDim);
  extern __shared__ __align__(16) unsigned char proxy_mma_smem[];
  T* Qs = reinterpret_cast<T*>(proxy_mma_smem);
  T* Ks = Qs + kRows * kDim;  // two stages of kMmaKeyTile x kDim
  __shared__ float s_v[kTokenLevel ? kWarps : 1][kTokenLevel ? kMmaKeyTile : 1];
  __shared__ float s_u[kTokenLevel ? kMaxHeads : 1][kTokenLevel ? kMmaRing : 1];
  constexpr int kChunks = kDim / 8;  // 16-byte chunks per row

  const ProxyWorkItem item = P.items[blockIdx.x];
  const layout::SequenceBases sb = P.seqs[item.seq];
  const int B = P.block, H = P.num_q_heads;
  const int64_t n = sb.n;
  // L = rules::proxy_rows(n_q, B) = B: the host takes this path only when every estimated sequence
  // has n_q >= B (a chunk with fewer queries runs plan_proxy.cuh), so the proxy-row stride
  // (proxy_row_stride) is L itself.
  const int L = B;
  const int rows_total = P.group * L;
  const int row0 = item.row_tile * kRows;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;

  // Proxy queries of the row group -> shared memory (rows past the group are zero-filled).
  for (int idx = tid; idx < kRows * kChunks; idx += kThreads) {
    const int row = idx / kChunks, chunk = idx % kChunks;
    int bytes = 0;
    const T* src = proxy_query_chunk(q, sb, item.kv, P.group, L, row0 + row, chunk, bytes);
    attention::cp_async_16(Qs + attention::swizzled<kDim>(row, chunk), src, bytes);
  }
  const int64_t key_stop = min(item.key_end, n);
  const int tiles = static_cast<int>((key_stop - item.key_begin + kMmaKeyTile - 1) / kMmaKeyTile);
  // Key j of the sequence at row kv_rows::key_row(kv_offset, table_row, page_size, j): contiguous K
  // (table_row null) from k_rows = the sequence's first key row; paged K one table read per key row.
  const int32_t* table_row = P.keys.table != nullptr ? P.keys.table + item.seq * P.keys.row_stride : nullptr;
  const T* k_rows = k.data + item.kv * k.stride_head + (table_row != nullptr ? 0 : sb.kv_offset * k.stride_token);
  auto load_keys = [&](int64_t j0, int stage) {
    T* dst = Ks + stage * kMmaKeyTile * kDim;
    for (int idx = tid; idx < kMmaKeyTile * kChunks; idx += kThreads) {
      const int key = idx / kChunks, chunk = idx % kChunks;
      const int64_t j = j0 + key;
      const bool inside = j < n;
      const T* src = inside ? k_rows + kv_rows::key_row(0, table_row, P.keys.page_size, j) * k.stride_token + chunk * 8
                            : k.data;
      attention::cp_async_16(dst + attention::swizzled<kDim>(key, chunk), src, inside ? 16 : 0);
    }
  };
  load_keys(item.key_begin, 0);
  attention::cp_async_commit();

  // This warp's 32 rows lie in one query head (L is a multiple of 32).
  const int wrow0 = row0 + warp * kMmaWarpRows;
  const bool warp_valid = wrow0 < rows_total;
  const int head_local = warp * kMmaWarpRows / L;
  const int i0 = wrow0 % L;
  const int pw = static_cast<int>(n) - L + i0;  // position of the warp's first row
  const int64_t head = static_cast<int64_t>(item.kv) * P.group + (warp_valid ? wrow0 / L : 0);
  const int64_t slot = layout::slot(item.seq, head, H);
  const float scale_log2 = P.scale * 1.4426950408889634f;

  float run_max[4], run_sum[4];  // pass 1 (per lane)
  float row_max[4], row_inv[4];  // pass 2 (the exact row statistics)
#pragma unroll
  for (int rr = 0; rr < 4; ++rr) {
    run_max[rr] = -INFINITY;
    run_sum[rr] = 0.f;
    row_max[rr] = 0.f;
    row_inv[rr] = 0.f;
    if (kPass == 2 && warp_valid) {
      const int i = i0 + g + 8 * rr;
      row_max[rr] = P.ws.row_max[slot * B + i];
      row_inv[rr] = P.ws.row_inv_den[slot * B + i];
    }
  }
  float ps0 = 0.f, ps1 = 0.f, ps2 = 0.f, cs = 0.f;
  FusedRowState rows[4];  // fused pass (per lane)
  if (kTokenLevel)
    for (int idx = tid; idx < kMaxHeads * kMmaRing; idx += kThreads) (&s_u[0][0])[idx] = 0.f;
  const int heads_here = min(kRows, rows_total - row0) / L;
  const int warps_per_head = L / kMmaWarpRows;

  for (int tile = 0; tile < tiles; ++tile) {
    const int64_t j0 = item.key_begin + static_cast<int64_t>(tile) * kMmaKeyTile;
    attention::cp_async_wait<0>();
    __syncthreads();  // tile ready everywhere; the other stage (and the token buffers) are free
    if (tile + 1 < tiles) {
      load_keys(j0 + kMmaKeyTile, (tile + 1) & 1);
      attention::cp_async_commit();
    }
    const int j0i = static_cast<int>(j0);
    if (warp_valid) {
      float acc[2][8][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int x = 0; x < 4; ++x) acc[mt][nt][x] = 0.f;
      const uint32_t q_base = attention::smem_address(Qs);
      const uint32_t k_base = attention::smem_address(Ks + (tile & 1) * kMmaKeyTile * kDim);
#pragma unroll
      for (int ks = 0; ks < kDim / 16; ++ks) {
        uint32_t a[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
          attention::ldmatrix_x4(
              a[mt], q_base + 2u * attention::swizzled<kDim>(warp * kMmaWarpRows + mt * 16 + (lane & 15),
                                                            2 * ks + (lane >> 4)));
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t b[4];
          attention::ldmatrix_x4(b, k_base + 2u * attention::swizzled<kDim>(np * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                                           2 * ks + ((lane >> 3) & 1)));
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            attention::Mma<T>::run(acc[mt][2 * np], a[mt], b[0], b[1]);
            attention::Mma<T>::run(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
          }
        }
      }

      const bool needs_mask = j0i + kMmaKeyTile - 1 > pw;  // some key lies after some row
      if (kPass == 1) {
        // Online softmax per row (this lane's keys): the masked scores and their maximum, then
        // run_sum brought to the new maximum and extended.
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int rr = 2 * mt + hf;
            const int p = pw + g + 8 * rr;
            float m = run_max[rr];
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                float x = acc[mt][nt][2 * hf + e] * scale_log2;
                if (needs_mask && j0i + 2 * qd + 8 * nt + e > p) x = -INFINITY;
                acc[mt][nt][2 * hf + e] = x;
                m = fmaxf(m, x);
              }
            if (m == -INFINITY) continue;  // no key of this row so far
            float sum = run_sum[rr] * attention::fast_exp2(run_max[rr] - m);
            run_max[rr] = m;
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e) sum += attention::fast_exp2(acc[mt][nt][2 * hf + e] - m);
            run_sum[rr] = sum;
          }
      } else if (kPass == kFusedPass) {
        const int kb = j0i / B;
        const int c_base = mma_slash_base(static_cast<int>(n), L, B, kb);
        const int T1 = (c_base + 1) * B, T2 = (c_base + 2) * B;
        const int j0q = j0i + 2 * qd;
        const bool general = fused_tile_is_general(n, L, j0i, P.w_sink, P.w_local);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            auto scores = [&](int nt, int e) -> float& { return acc[mt][nt][2 * hf + e]; };
            const int p = pw + g + 8 * (2 * mt + hf);
            if (general)
              fused_row_update<true>(scores, p, j0q, T1, T2, scale_log2, P.w_sink, P.w_local, rows[2 * mt + hf]);
            else
              fused_row_update<false>(scores, p, j0q, T1, T2, scale_log2, P.w_sink, P.w_local, rows[2 * mt + hf]);
          }
      } else {
        const int kb = j0i / B;
        const int c_base = mma_slash_base(static_cast<int>(n), L, B, kb);
        const int T1 = (c_base + 1) * B, T2 = (c_base + 2) * B;
        const bool fast = !needs_mask && j0 >= P.w_sink && pw - (j0i + kMmaKeyTile - 1) >= P.w_local;
        if (fast)
          mma_tile_masses<false>(acc, row_max, row_inv, pw + g, j0i + 2 * qd, T1, T2, scale_log2, P.w_sink,
                                 P.w_local, ps0, ps1, ps2, cs);
        else
          mma_tile_masses<true>(acc, row_max, row_inv, pw + g, j0i + 2 * qd, T1, T2, scale_log2, P.w_sink,
                                P.w_local, ps0, ps1, ps2, cs);
        if (kTokenLevel) {
          // v: per key, the sum over this warp's 32 rows. Reduce-scatter over the 8 lanes that share
          // a key column (lane bits 2..4): lane (g, qd) ends with keys 8 g + 2 qd + {0, 1}.
          float vals[16];
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              vals[2 * nt + e] = (acc[0][nt][e] + acc[0][nt][2 + e]) + (acc[1][nt][e] + acc[1][nt][2 + e]);
          reduce_scatter_half<8, 16>(vals, lane);  // lane bit 4 (g bit 2)
          reduce_scatter_half<4, 8>(vals, lane);   // lane bit 3
          reduce_scatter_half<2, 4>(vals, lane);   // lane bit 2
          s_v[warp][8 * g + 2 * qd] = vals[0];
          s_v[warp][8 * g + 2 * qd + 1] = vals[1];
          // u: entries with the same rr - nt share a distance t = T0 + 8 (rr - nt) - e.
          const int T0 = pw + g - j0i - 2 * qd;
          float diag[11][2];
#pragma unroll
          for (int dd = 0; dd < 11; ++dd) diag[dd][0] = diag[dd][1] = 0.f;
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf)
#pragma unroll
              for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) diag[2 * mt + hf - nt + 7][e] += acc[mt][nt][2 * hf + e];
#pragma unroll
          for (int dd = 0; dd < 11; ++dd)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int t = T0 + 8 * (dd - 7) - e;
              if (t >= 0 && diag[dd][e] != 0.f) atomicAdd(&s_u[head_local][t & (kMmaRing - 1)], diag[dd][e]);
            }
        }
      }
    }

    if (kPass == kFusedPass && warp_valid && (((j0 + kMmaKeyTile) % B) == 0 || tile + 1 == tiles)) {
      // End of a key block (or of this CTA's keys): one record per row.
      const int64_t kb = j0 / B;
#pragma unroll
      for (int rr = 0; rr < 4; ++rr)
        fused_row_block_end(rows[rr], R, item.record_base + kb * item.record_pitch + warp * kMmaWarpRows + 8 * rr + g,
                            true);
    }

    if (kPass == 2) {
      // End of a key block (or of this CTA's keys): one record per warp.
      const bool block_end = ((j0 + kMmaKeyTile) % B) == 0 || tile + 1 == tiles;
      if (block_end && warp_valid) {
        warp_sum4(ps0, ps1, ps2, cs);
        if (lane == 0) R.data[item.record_base + (j0 / B) * kWarps + warp] = make_float4(ps0, ps1, ps2, cs);
        ps0 = ps1 = ps2 = cs = 0.f;
      }
      if (kTokenLevel) {
        __syncthreads();  // s_v and s_u of this tile complete
        // v: each (head, key) has this CTA as its only owner -> a plain store, warps in fixed order.
        // u: the 64 distances no later tile reaches, t in [n - 1 - j0 - 63, n - 1 - j0].
        for (int idx = tid; idx < heads_here * kMmaKeyTile; idx += kThreads) {
          const int hl = idx / kMmaKeyTile, key = idx % kMmaKeyTile;
          const int64_t h = static_cast<int64_t>(item.kv) * P.group + row0 / L + hl;
          const int64_t token_base = sb.kv_offset * H + h * n;
          const int64_t j = j0 + key;
          float sum = 0.f;
          for (int w = 0; w < warps_per_head; ++w) sum += s_v[hl * warps_per_head + w][key];
          if (j < n) P.ws.v_sum[token_base + j] = static_cast<double>(sum);
          const int64_t t = n - 1 - j0 - (kMmaKeyTile - 1) + key;
          float& cell = s_u[hl][t & (kMmaRing - 1)];
          const float value = cell;
          cell = 0.f;
          if (t >= 0 && value != 0.f) atomicAdd(&P.ws.u_sum[token_base + t], static_cast<double>(value));
        }
      }
    }
  }

  if (kPass == 1 || kPass == kFusedPass) {
    if (!warp_valid) return;
    // The softmax partials of each row, the 4 lanes (qd) that share it combined.
#pragma unroll
    for (int rr = 0; rr < 4; ++rr)
      store_row_partials(kPass == 1 ? run_max[rr] : rows[rr].max, kPass == 1 ? run_sum[rr] : rows[rr].sum,
                         P.ws.partial_stats, static_cast<int64_t>(blockIdx.x) * kRows + warp * kMmaWarpRows + 8 * rr + g,
                         true);
  } else if (kTokenLevel && tiles > 0) {
    // The distances still held: [n - L - j_last - 63, n - j_last - 65] (L - 1 of them).
    const int64_t j_last = item.key_begin + static_cast<int64_t>(tiles - 1) * kMmaKeyTile;
    const int64_t t_lo = n - L - j_last - (kMmaKeyTile - 1);
    for (int idx = tid; idx < heads_here * (L - 1); idx += kThreads) {
      const int hl = idx / (L - 1), off = idx % (L - 1);
      const int64_t h = static_cast<int64_t>(item.kv) * P.group + row0 / L + hl;
      const int64_t t = t_lo + off;
      const float value = s_u[hl][t & (kMmaRing - 1)];
      if (t >= 0 && value != 0.f) atomicAdd(&P.ws.u_sum[sb.kv_offset * H + h * n + t], static_cast<double>(value));
    }
  }
}

// pv, ps and C_struct (all "times L", as plan_proxy.cuh) from the pass-2 records, in a fixed
// order. One block per slot.
struct ProxyFinalizeParams {
  const layout::SequenceBases* seqs;
  const ProxyWorkItem* items;
  const int64_t* item_base;  // [seq]
  const int32_t* splits;     // [seq]
  const int8_t* estimated;   // [seq]
  const float4* records;
  const float* record_max;  // fused records only
  double* bin_sums;         // fused only: [block array][kFusedBinsPitch] scratch, the masses of each key block
  int32_t num_q_heads, group, block;
  int32_t rows_per_item;    // mma_rows(d): proxy rows of one work item (a record pitch's unit)
  int32_t last_rows;        // proxy_last_rows (fused only; 0 = off): bins of the last rows, pv/ps_last_sum
  Workspace ws;
};

// The slash masses ps[c] from per-key-block bin masses (key block kb's bins are distance blocks
// mma_slash_base(kb) + 0..2), in a fixed order; `bin_mass(kb, bin)` returns the mass.
template <typename BinMass>
__device__ __forceinline__ double slash_mass(int64_t n, int L, int B, int N, int64_t c, BinMass bin_mass) {
  // Key blocks whose distances reach slash block c lie within 3 below kb_hi.
  const int64_t kb_hi = min((n - 1 - c * B) / B, static_cast<int64_t>(N - 1));
  double ps = 0.0;
  for (int64_t kb = max(kb_hi - 3, static_cast<int64_t>(0)); kb <= kb_hi; ++kb) {
    const int bin = static_cast<int>(c - mma_slash_base(static_cast<int>(n), L, B, static_cast<int>(kb)));
    if (bin < 0 || bin >= kMmaSlashBins) continue;
    ps += bin_mass(kb, bin);
  }
  return ps;
}

__global__ void __launch_bounds__(256) proxy_mma_finalize_kernel(ProxyFinalizeParams P) {
  __shared__ double d_scratch[32];
  const int64_t slot = blockIdx.x;
  const int H = P.num_q_heads;
  const int64_t s = slot / H, h = slot % H;
  if (!P.estimated[s]) return;
  const layout::SequenceBases sb = P.seqs[s];
  const int B = P.block, N = sb.num_blocks;
  const int64_t n = sb.n;
  const int L = B;  // rules::proxy_rows(n_q, B) on this path (see proxy_mma_kernel)
  const int64_t kv = h / P.group, rho0 = (h % P.group) * L;
  const int64_t rows = P.rows_per_item, warps = rows / kMmaWarpRows;  // two-pass records per key block: warps
  const int64_t row_groups = (static_cast<int64_t>(P.group) * L + rows - 1) / rows;
  const int64_t group_item = P.item_base[s] + (kv * row_groups + rho0 / rows) * P.splits[s];
  const float4* rec = P.records + P.items[group_item].record_base;
  const int w0 = static_cast<int>(rho0 % rows) / kMmaWarpRows, wn = L / kMmaWarpRows;
  const int64_t base = layout::block_array_offset(sb, h, H);
  double cs_local = 0.0;
  for (int b = threadIdx.x; b < N; b += blockDim.x) {
    double pv = 0.0;
    for (int w = 0; w < wn; ++w) {
      const float4 r = rec[static_cast<int64_t>(b) * warps + w0 + w];
      pv += static_cast<double>(r.x) + static_cast<double>(r.y) + static_cast<double>(r.z);
      cs_local += static_cast<double>(r.w);
    }
    P.ws.pv_sum[base + b] = pv;
    P.ws.ps_sum[base + b] = slash_mass(n, L, B, N, b, [&](int64_t kb, int bin) {
      double mass = 0.0;
      for (int w = 0; w < wn; ++w) {
        const float4 r = rec[kb * warps + w0 + w];
        mass += static_cast<double>(bin == 0 ? r.x : bin == 1 ? r.y : r.z);
      }
      return mass;
    });
  }
  const double cs = block_reduce(cs_local, d_scratch, SumOp());
  if (threadIdx.x == 0) P.ws.cs_sum[slot] = cs;
}

// The same from the fused pass's per-row records, in two kernels. Record (row i, key block b)
// holds masses relative to m; the row's share of the true softmax is exp2(m - row_max_i) / den_i
// (row statistics from proxy_combine_kernel). proxy_mma_rows_kernel: a warp per (slot, key
// block) sums the L rows (lanes over rows, a butterfly in fixed order) and stores pv and the
// block's bin masses (3 slash bins and the structural mass). proxy_mma_bins_kernel: one block per
// slot builds ps from the bins like proxy_mma_finalize_kernel and sums C_struct in a fixed order.
// NOTE: 8 warps per block, a key block per warp: at 128k (32 heads, N = 1024) 4096 blocks, every SM
// busy (one block per slot left 32 SMs working, 6x slower).
constexpr int kRowsFinalizeWarps = 8;
// NOTE: rows whose records a lane loads at once in proxy_mma_rows_kernel: 4 covers L = B = 128
// (the records are read once, so loads in flight are what the kernel waits on).
constexpr int kRowsLoadBatch = 4;

struct FusedRecordView {
  int64_t first;  // record of (row 0 of the slot's head, key block 0)
  int64_t pitch;  // records per key block
  int L;
};

__device__ __forceinline__ bool fused_slot_records(const ProxyFinalizeParams& P, int64_t slot, layout::SequenceBases& sb,
                                                   FusedRecordView& view) {
  const int H = P.num_q_heads;
  const int64_t s = slot / H, h = slot % H;
  if (!P.estimated[s]) return false;
  sb = P.seqs[s];
  const int L = P.block;  // rules::proxy_rows(n_q, B) on this path (see proxy_mma_kernel)
  const int64_t kv = h / P.group, rho0 = (h % P.group) * L;
  const int64_t rows = P.rows_per_item;
  const int64_t row_groups = (static_cast<int64_t>(P.group) * L + rows - 1) / rows;
  const int64_t group_item = P.item_base[s] + (kv * row_groups + rho0 / rows) * P.splits[s];
  view.first = P.items[group_item].record_base + rho0 % rows;
  view.pitch = P.items[group_item].record_pitch;
  view.L = L;
  return true;
}

__global__ void __launch_bounds__(kRowsFinalizeWarps * 32) proxy_mma_rows_kernel(ProxyFinalizeParams P) {
  const int64_t slot = blockIdx.y;
  layout::SequenceBases sb;
  FusedRecordView rv;
  if (!fused_slot_records(P, slot, sb, rv)) return;
  const int b = blockIdx.x * kRowsFinalizeWarps + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (b >= sb.num_blocks) return;  // warp-uniform
  const int B = P.block;
  double m0 = 0.0, m1 = 0.0, m2 = 0.0, mc = 0.0;
  double l0 = 0.0, l1 = 0.0, l2 = 0.0, unused = 0.0;  // the last proxy_last_rows rows alone
  // The loads of kRowsLoadBatch rows per lane are issued before any is used (the kernel streams
  // the records once: with one row in flight per lane it waited on memory); same sums, same order.
  for (int i0 = lane; i0 < rv.L; i0 += 32 * kRowsLoadBatch) {
    float m[kRowsLoadBatch];
    float4 r[kRowsLoadBatch];
#pragma unroll
    for (int j = 0; j < kRowsLoadBatch; ++j) {
      const int i = i0 + 32 * j;
      const int64_t at = rv.first + static_cast<int64_t>(b) * rv.pitch + i;
      m[j] = i < rv.L ? P.record_max[at] : -INFINITY;
      r[j] = i < rv.L ? P.records[at] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < kRowsLoadBatch; ++j) {
      const int i = i0 + 32 * j;
      if (m[j] == -INFINITY) continue;  // the row saw no key of this block (or no row)
      const double w =
          static_cast<double>(exp2f(m[j] - P.ws.row_max[slot * B + i])) * P.ws.row_inv_den[slot * B + i];
      m0 += w * r[j].x;
      m1 += w * r[j].y;
      m2 += w * r[j].z;
      mc += w * r[j].w;
      if (proxy::in_last_rows(i, rv.L, P.last_rows)) {
        l0 += w * r[j].x;
        l1 += w * r[j].y;
        l2 += w * r[j].z;
      }
    }
  }
  warp_sum4(m0, m1, m2, mc);
  if (P.last_rows > 0) warp_sum4(l0, l1, l2, unused);  // warp-uniform
  if (lane == 0) {
    const int64_t at = layout::block_array_offset(sb, slot % P.num_q_heads, P.num_q_heads) + b;
    P.ws.pv_sum[at] = m0 + m1 + m2;
    double* bins = P.bin_sums + at * kFusedBinsPitch;
    bins[0] = m0;
    bins[1] = m1;
    bins[2] = m2;
    bins[3] = mc;
    if (P.last_rows > 0) {
      P.ws.pv_last_sum[at] = l0 + l1 + l2;
      bins[kFusedLastBins + 0] = l0;
      bins[kFusedLastBins + 1] = l1;
      bins[kFusedLastBins + 2] = l2;
    }
  }
}

__global__ void __launch_bounds__(256) proxy_mma_bins_kernel(ProxyFinalizeParams P) {
  __shared__ double d_scratch[32];
  const int64_t slot = blockIdx.x;
  layout::SequenceBases sb;
  FusedRecordView rv;
  if (!fused_slot_records(P, slot, sb, rv)) return;
  const int B = P.block, N = sb.num_blocks;
  const int64_t base = layout::block_array_offset(sb, slot % P.num_q_heads, P.num_q_heads);
  double cs_local = 0.0;
  for (int b = threadIdx.x; b < N; b += blockDim.x) {
    cs_local += P.bin_sums[(base + b) * kFusedBinsPitch + 3];
    P.ws.ps_sum[base + b] = slash_mass(sb.n, rv.L, B, N, b, [&](int64_t kb, int bin) {
      return P.bin_sums[(base + kb) * kFusedBinsPitch + bin];
    });
    if (P.last_rows > 0)
      P.ws.ps_last_sum[base + b] = slash_mass(sb.n, rv.L, B, N, b, [&](int64_t kb, int bin) {
        return P.bin_sums[(base + kb) * kFusedBinsPitch + kFusedLastBins + bin];
      });
  }
  const double cs = block_reduce(cs_local, d_scratch, SumOp());
  if (threadIdx.x == 0) P.ws.cs_sum[slot] = cs;
}

}  // namespace planner
}  // namespace cuda_detail
}  // namespace crisp
