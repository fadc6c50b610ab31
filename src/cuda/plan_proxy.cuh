// src/cuda/plan_proxy.cuh — §1 proxy map on the device, streamed: the attention of the last
// L = min(B, n) queries of every query head, never materialised.
//
// One work item = (sequence, kv head, tile of kProxyTileRows proxy rows, range of keys). The
// rows of a tile are the proxy rows of the kv head's whole GQA group (row rho = head_in_group * R
// + i, R = proxy_row_stride(L), rows i >= L padding), so K is streamed once per row tile for every
// query head of the group. Queries are read at their rows of q (query_row), keys through the
// block table when K is paged (KeyTable), so chunks and paged K/V take the same kernels.
//
// Two passes over the same work items:
//  - pass 1: per row, online softmax statistics (max, sum) of s q.k over its key range; a combine
//    kernel turns the per-item partials into the exact row maximum and the denominator;
//  - pass 2: recomputes the scores, A = exp(s q.k - max) / denominator, and accumulates per
//    query head the block-pooled vertical pv[b] and slash ps[c] masses, the structural mass
//    (C_struct) and, when a token-level rule needs them, v[j] and u[t] — all in double.
// Scores are float32 FFMA dot products (the CPU Precision::f32 path's arithmetic). This path serves
// f32 / f64 inputs and shapes the tensor-core path (plan_proxy_mma.cuh: bf16 / fp16, d = 64 / 128 / 256)
// does not take.
#pragma once
#include "cuda/plan_common.cuh"
#include "plan/proxy.h"

namespace crisp {
namespace cuda_detail {
namespace planner {

// NOTE: 128 proxy rows x 64 keys per tile, 256 threads with 8 x 4 scores each: the classic SGEMM
// register blocking; 64 keys always lie inside one key block (B = 64 or 128).
constexpr int kProxyTileRows = 128;
constexpr int kProxyTileKeys = 64;
constexpr int kProxyThreads = 256;
constexpr int kProxyRowsPerThread = 8;
constexpr int kProxyKeysPerThread = 4;
// NOTE: +4 floats of padding per shared row keeps float4 alignment and spreads the transposed
// stores over more banks.
constexpr int kProxyQStride = kProxyTileRows + 4;
constexpr int kProxyKStride = kProxyTileKeys + 4;
// The slash bins one key tile can touch per head: distances span L + 63 <= 191 -> <= 4 blocks.
constexpr int kProxySlashBins = 4;
constexpr int kProxyMaxHeadsPerTile = 2;  // L = 64 puts two heads in a 128-row tile
constexpr int kProxyDistanceSpan = kProxyTileRows + kProxyTileKeys;  // u bins per head

struct ProxyWorkItem {
  int32_t seq;
  int32_t kv;
  int32_t row_tile;
  int32_t split;
  int64_t key_begin;  // multiple of kProxyTileKeys (tensor-core path: of the block size)
  int64_t key_end;
  int64_t record_base;  // tensor-core path (plan_proxy_mma.cuh): first record of (seq, kv, row tile)
  int32_t record_pitch; // tensor-core path: records per key block = the row tile's rows (<= mma_rows(d))
};

struct ProxyParams {
  const layout::SequenceBases* seqs;
  const ProxyWorkItem* items;
  int32_t num_q_heads;  // H
  int32_t group;        // H / Hkv
  int32_t head_dim;
  int32_t block;        // B
  int32_t last_rows;    // proxy_last_rows (0 = off): pass 2 also sums the last rows into ws.p*_last_sum
  float scale;
  int64_t w_sink, w_local;
  KeyTable keys;
  Workspace ws;
};

inline size_t proxy_smem_bytes(int head_dim) {
  return static_cast<size_t>(head_dim) * (kProxyQStride + kProxyKStride) * sizeof(float);
}

// NOTE: a bound of the proxy kernels' static shared memory (ptxas, sm_90a: 176 bytes, 2224 for the
// token-level pass 2), added to the dynamic bytes where the planner checks that a block fits.
constexpr size_t kProxyStaticSmemBound = 4096;
inline size_t proxy_block_smem_bound(int head_dim) { return proxy_smem_bytes(head_dim) + kProxyStaticSmemBound; }

// Scores of the tile: acc[r][c] = q_row . k_key (raw dot products, float).
__device__ __forceinline__ void proxy_tile_scores(const float* Qs, const float* Ks, int d, int ty, int tx,
                                                  float (&acc)[kProxyRowsPerThread][kProxyKeysPerThread]) {
#pragma unroll
  for (int r = 0; r < kProxyRowsPerThread; ++r)
#pragma unroll
    for (int c = 0; c < kProxyKeysPerThread; ++c) acc[r][c] = 0.f;
#pragma unroll 4
  for (int x = 0; x < d; ++x) {
    const float4 a0 = *reinterpret_cast<const float4*>(Qs + x * kProxyQStride + ty * kProxyRowsPerThread);
    const float4 a1 = *reinterpret_cast<const float4*>(Qs + x * kProxyQStride + ty * kProxyRowsPerThread + 4);
    const float4 b = *reinterpret_cast<const float4*>(Ks + x * kProxyKStride + tx * kProxyKeysPerThread);
    const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    const float bb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int r = 0; r < kProxyRowsPerThread; ++r)
#pragma unroll
      for (int c = 0; c < kProxyKeysPerThread; ++c) acc[r][c] = fmaf(a[r], bb[c], acc[r][c]);
  }
}

// Calls score(r, c, p, j) for each of this thread's scores acc[r][c] that is causal: rows at
// positions p0 + r for r < rows (the rest are padding), keys jt + c (j <= p also keeps j < n).
template <typename Score>
__device__ __forceinline__ void for_each_causal_score(int64_t p0, int64_t jt, int rows, Score score) {
#pragma unroll
  for (int r = 0; r < kProxyRowsPerThread; ++r) {
    if (r >= rows) continue;
    const int64_t p = p0 + r;
#pragma unroll
    for (int c = 0; c < kProxyKeysPerThread; ++c) {
      const int64_t j = jt + c;
      if (!proxy::in_row(j, p)) continue;
      score(r, c, p, j);
    }
  }
}

// kPass 1: softmax statistics; kPass 2: masses. kTokenLevel: also v[j] and u[t].
template <typename T, int kPass, bool kTokenLevel>
__global__ void __launch_bounds__(kProxyThreads) proxy_kernel(Strided3<T> q, Strided3<T> k, ProxyParams P) {
  extern __shared__ float4 proxy_smem4[];
  float* Qs = reinterpret_cast<float*>(proxy_smem4);
  float* Ks = Qs + P.head_dim * kProxyQStride;
  __shared__ double s_pv[kProxyMaxHeadsPerTile], s_cs[kProxyMaxHeadsPerTile];
  __shared__ double s_ps[kProxyMaxHeadsPerTile][kProxySlashBins];
  // The same sums over the last proxy_last_rows rows alone (P.last_rows > 0).
  __shared__ double s_pv_last[kProxyMaxHeadsPerTile], s_ps_last[kProxyMaxHeadsPerTile][kProxySlashBins];
  __shared__ float s_v[kTokenLevel ? kProxyMaxHeadsPerTile : 1][kTokenLevel ? kProxyTileKeys : 1];
  __shared__ float s_u[kTokenLevel ? kProxyMaxHeadsPerTile : 1][kTokenLevel ? kProxyDistanceSpan : 1];

  const ProxyWorkItem item = P.items[blockIdx.x];
  const layout::SequenceBases sb = P.seqs[item.seq];
  const int B = P.block, d = P.head_dim, H = P.num_q_heads;
  const int64_t n = sb.n;
  const int64_t L = rules::proxy_rows(sb.n_q, B);
  const int64_t R = proxy_row_stride(L);
  const int64_t rows_total = P.group * R;
  const int64_t row0 = static_cast<int64_t>(item.row_tile) * kProxyTileRows;
  const int first_head_in_group = static_cast<int>(row0 / R);
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;

  // Proxy queries of the tile, transposed: Qs[x][row].
  for (int idx = tid; idx < kProxyTileRows * d; idx += kProxyThreads) {
    const int row = idx / d, x = idx % d;
    const int64_t rho = row0 + row;
    float value = 0.f;
    if (rho < rows_total && rho % R < L) {
      const int64_t h = static_cast<int64_t>(item.kv) * P.group + rho / R;
      value = q.at(h, query_row(sb, rules::proxy_position(n, L, rho % R)), x);
    }
    Qs[x * kProxyQStride + row] = value;
  }

  // This thread's rows: all in one query head (8 divides R); my_rows of them real (< L).
  const int64_t my_row0 = row0 + ty * kProxyRowsPerThread;
  const bool rows_valid = my_row0 < rows_total && my_row0 % R < L;
  const int head_local = rows_valid ? static_cast<int>(my_row0 / R) - first_head_in_group : 0;
  const int64_t my_head = static_cast<int64_t>(item.kv) * P.group + (rows_valid ? my_row0 / R : 0);
  const int64_t my_slot = layout::slot(item.seq, my_head, H);
  const int64_t my_i0 = rows_valid ? my_row0 % R : 0;  // proxy index of the first row
  const int my_rows = rows_valid ? static_cast<int>(min(static_cast<int64_t>(kProxyRowsPerThread), L - my_i0)) : 0;
  const int64_t p0 = rules::proxy_position(n, L, my_i0);

  float run_max[kProxyRowsPerThread], run_sum[kProxyRowsPerThread];
  float row_max[kProxyRowsPerThread], row_inv[kProxyRowsPerThread];
#pragma unroll
  for (int r = 0; r < kProxyRowsPerThread; ++r) {
    run_max[r] = -INFINITY;
    run_sum[r] = 0.f;
    row_max[r] = 0.f;
    row_inv[r] = 0.f;
    if (kPass == 2 && r < my_rows) {
      row_max[r] = P.ws.row_max[my_slot * B + my_i0 + r];
      row_inv[r] = P.ws.row_inv_den[my_slot * B + my_i0 + r];
    }
  }
  if (kPass == 2 && tid < kProxyMaxHeadsPerTile * (2 + kProxySlashBins)) {
    if (tid < kProxyMaxHeadsPerTile) {
      s_pv[tid] = 0.0;
      s_pv_last[tid] = 0.0;
    } else if (tid < 2 * kProxyMaxHeadsPerTile) {
      s_cs[tid - kProxyMaxHeadsPerTile] = 0.0;
    } else {
      (&s_ps[0][0])[tid - 2 * kProxyMaxHeadsPerTile] = 0.0;
      (&s_ps_last[0][0])[tid - 2 * kProxyMaxHeadsPerTile] = 0.0;
    }
  }
  // Which of this thread's rows are among the last proxy_last_rows (a bit per row).
  unsigned last_row_bits = 0;
  if (kPass == 2 && P.last_rows > 0)
#pragma unroll
    for (int r = 0; r < kProxyRowsPerThread; ++r)
      if (r < my_rows && proxy::in_last_rows(my_i0 + r, L, P.last_rows)) last_row_bits |= 1u << r;
  if (kTokenLevel) {
    for (int idx = tid; idx < kProxyMaxHeadsPerTile * kProxyTileKeys; idx += kProxyThreads) (&s_v[0][0])[idx] = 0.f;
    for (int idx = tid; idx < kProxyMaxHeadsPerTile * kProxyDistanceSpan; idx += kProxyThreads) (&s_u[0][0])[idx] = 0.f;
  }

  const int load_key = tid % kProxyTileKeys, load_x0 = tid / kProxyTileKeys;
  for (int64_t j0 = item.key_begin; j0 < item.key_end; j0 += kProxyTileKeys) {
    __syncthreads();  // previous tile's Ks and accumulators are consumed
    {
      const int64_t j = j0 + load_key;
      const int64_t key_row = j < n ? P.keys.row(sb, item.seq, j) : 0;
      for (int x = load_x0; x < d; x += kProxyThreads / kProxyTileKeys)
        Ks[x * kProxyKStride + load_key] = j < n ? k.at(item.kv, key_row, x) : 0.f;
    }
    __syncthreads();
    float acc[kProxyRowsPerThread][kProxyKeysPerThread];
    proxy_tile_scores(Qs, Ks, d, ty, tx, acc);
    const int64_t jt = j0 + tx * kProxyKeysPerThread;  // this thread's first key

    if (kPass == 1) {
      if (rows_valid)
        for_each_causal_score(p0, jt, my_rows, [&](int r, int c, int64_t, int64_t) {
          proxy::online_add(run_max[r], run_sum[r], P.scale * acc[r][c], ExpE());
        });
    } else {
      // Distance bins of this tile: t = p - j >= t_tile_min.
      const int64_t t_tile_min = (n - L) - (j0 + kProxyTileKeys - 1);
      const int64_t c_tile_lo = proxy::first_distance_block(t_tile_min, B);
      float pv_acc = 0.f, cs_acc = 0.f, ps_acc[2] = {0.f, 0.f};
      float pv_last_acc = 0.f, ps_last_acc[2] = {0.f, 0.f};
      float v_acc[kProxyKeysPerThread] = {0.f, 0.f, 0.f, 0.f};
      const int64_t t_thread_min = p0 - (jt + kProxyKeysPerThread - 1);
      const int64_t c_thread_lo = proxy::first_distance_block(t_thread_min, B);
      if (rows_valid) {
        for_each_causal_score(p0, jt, my_rows, [&](int r, int c, int64_t p, int64_t j) {
          const float a = proxy::row_share<float>(P.scale * acc[r][c], row_max[r], row_inv[r], ExpE());
          const int64_t t = proxy::slash_distance(p, j);
          pv_acc += a;
          if (rules::in_structural_set(j, p, P.w_sink, P.w_local)) cs_acc += a;
          const int near_bin = proxy::distance_block(t, B) == c_thread_lo ? 0 : 1;
          ps_acc[near_bin] += a;
          if ((last_row_bits >> r) & 1u) {
            pv_last_acc += a;
            ps_last_acc[near_bin] += a;
          }
          if (kTokenLevel) {
            v_acc[c] += a;
            atomicAdd(&s_u[head_local][t - t_tile_min], a);
          }
        });
        atomicAdd(&s_pv[head_local], static_cast<double>(pv_acc));
        if (cs_acc != 0.f) atomicAdd(&s_cs[head_local], static_cast<double>(cs_acc));
        const int bin = static_cast<int>(c_thread_lo - c_tile_lo);
        if (ps_acc[0] != 0.f) atomicAdd(&s_ps[head_local][bin], static_cast<double>(ps_acc[0]));
        if (ps_acc[1] != 0.f) atomicAdd(&s_ps[head_local][bin + 1], static_cast<double>(ps_acc[1]));
        if (last_row_bits != 0) {
          if (pv_last_acc != 0.f) atomicAdd(&s_pv_last[head_local], static_cast<double>(pv_last_acc));
          if (ps_last_acc[0] != 0.f) atomicAdd(&s_ps_last[head_local][bin], static_cast<double>(ps_last_acc[0]));
          if (ps_last_acc[1] != 0.f) atomicAdd(&s_ps_last[head_local][bin + 1], static_cast<double>(ps_last_acc[1]));
        }
        if (kTokenLevel) {
#pragma unroll
          for (int c = 0; c < kProxyKeysPerThread; ++c)
            if (v_acc[c] != 0.f) atomicAdd(&s_v[head_local][tx * kProxyKeysPerThread + c], v_acc[c]);
        }
      }
      __syncthreads();
      // Flush the tile's sums to the per-head accumulators (one atomic per bin).
      const int heads_here = static_cast<int>(
          (min(row0 + kProxyTileRows, rows_total) - 1) / R - first_head_in_group + 1);
      const int32_t key_block = static_cast<int32_t>(j0 / B);
      if (tid < heads_here * (2 + kProxySlashBins)) {
        const int hl = tid / (2 + kProxySlashBins), what = tid % (2 + kProxySlashBins);
        const int64_t h = static_cast<int64_t>(item.kv) * P.group + first_head_in_group + hl;
        const int64_t slot = layout::slot(item.seq, h, H);
        const int64_t base = layout::block_array_offset(sb, h, H);
        if (what == 0) {
          if (s_pv[hl] != 0.0) atomicAdd(&P.ws.pv_sum[base + key_block], s_pv[hl]);
          s_pv[hl] = 0.0;
        } else if (what == 1) {
          if (s_cs[hl] != 0.0) atomicAdd(&P.ws.cs_sum[slot], s_cs[hl]);
          s_cs[hl] = 0.0;
        } else {
          const int bin = what - 2;
          const int64_t c = c_tile_lo + bin;
          if (s_ps[hl][bin] != 0.0 && c < sb.num_blocks) atomicAdd(&P.ws.ps_sum[base + c], s_ps[hl][bin]);
          s_ps[hl][bin] = 0.0;
        }
        if (P.last_rows > 0) {  // the last rows' sums, by the same threads
          if (what == 0) {
            if (s_pv_last[hl] != 0.0) atomicAdd(&P.ws.pv_last_sum[base + key_block], s_pv_last[hl]);
            s_pv_last[hl] = 0.0;
          } else if (what >= 2) {
            const int bin = what - 2;
            const int64_t c = c_tile_lo + bin;
            if (s_ps_last[hl][bin] != 0.0 && c < sb.num_blocks) atomicAdd(&P.ws.ps_last_sum[base + c], s_ps_last[hl][bin]);
            s_ps_last[hl][bin] = 0.0;
          }
        }
      }
      if (kTokenLevel) {
        for (int idx = tid; idx < heads_here * kProxyTileKeys; idx += kProxyThreads) {
          const int hl = idx / kProxyTileKeys, key = idx % kProxyTileKeys;
          const int64_t h = static_cast<int64_t>(item.kv) * P.group + first_head_in_group + hl;
          const int64_t j = j0 + key;
          if (s_v[hl][key] != 0.f && j < n)
            atomicAdd(&P.ws.v_sum[sb.kv_offset * H + h * n + j], static_cast<double>(s_v[hl][key]));
          s_v[hl][key] = 0.f;
        }
        for (int idx = tid; idx < heads_here * kProxyDistanceSpan; idx += kProxyThreads) {
          const int hl = idx / kProxyDistanceSpan, off = idx % kProxyDistanceSpan;
          const int64_t h = static_cast<int64_t>(item.kv) * P.group + first_head_in_group + hl;
          const int64_t t = t_tile_min + off;
          if (s_u[hl][off] != 0.f && t >= 0 && t < n)
            atomicAdd(&P.ws.u_sum[sb.kv_offset * H + h * n + t], static_cast<double>(s_u[hl][off]));
          s_u[hl][off] = 0.f;
        }
      }
    }
  }

  if (kPass == 1) {
    // Combine the 16 threads (tx) that share these rows: one half-warp.
#pragma unroll
    for (int r = 0; r < kProxyRowsPerThread; ++r) {
      float m = run_max[r], l = run_sum[r];
      for (int off = 8; off > 0; off >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
        const float l2 = __shfl_xor_sync(0xffffffffu, l, off);
        proxy::merge_row_stats(m, l, m2, l2, ExpE());
      }
      if (tx == 0) P.ws.partial_stats[static_cast<int64_t>(blockIdx.x) * kProxyTileRows + ty * kProxyRowsPerThread + r] =
          make_float2(m, l);
    }
  }
}

// Row statistics from the per-item partials: exact maximum, denominator in double.
// One thread per (sequence item group, proxy row). items_of_tile(s, kv, row_tile) are contiguous:
// item_base[s] + (kv * row_tiles[s] + row_tile) * splits[s] + split. kRowsPerItem: rows of one
// work item (kProxyTileRows here, mma_rows(d) on the tensor-core path); kLog2: the partials are in
// the log2 domain (max of s q.k log2(e), sums of exp2), as the tensor-core path keeps them.
struct ProxyCombineParams {
  const layout::SequenceBases* seqs;
  const int64_t* item_base;   // [seq]
  const int32_t* splits;      // [seq] (0 for sequences that are not estimated)
  int32_t num_sequences;
  int32_t num_q_heads, num_kv_heads, group, block;
  Workspace ws;
};

template <int kRowsPerItem, bool kLog2>
__global__ void proxy_combine_kernel(ProxyCombineParams P) {
  // grid: (ceil(group * B / 256), num_kv_heads, num_sequences)
  const int s = blockIdx.z, kv = blockIdx.y;
  const int splits = P.splits[s];
  if (splits == 0) return;
  const layout::SequenceBases sb = P.seqs[s];
  const int64_t L = rules::proxy_rows(sb.n_q, P.block), R = proxy_row_stride(L);
  const int64_t rho = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (rho >= P.group * R || rho % R >= L) return;  // past the group, or a padding row
  const int64_t row_tiles = (P.group * R + kRowsPerItem - 1) / kRowsPerItem;
  const int64_t tile = rho / kRowsPerItem, in_tile = rho % kRowsPerItem;
  const int64_t first_item = P.item_base[s] + (kv * row_tiles + tile) * splits;
  float m = -INFINITY;
  for (int sp = 0; sp < splits; ++sp) m = fmaxf(m, P.ws.partial_stats[(first_item + sp) * kRowsPerItem + in_tile].x);
  double den = 0.0;
  for (int sp = 0; sp < splits; ++sp) {
    const float2 st = P.ws.partial_stats[(first_item + sp) * kRowsPerItem + in_tile];
    den += proxy::rescaled<double>(st.y, st.x, m, ExpOf<kLog2>());
  }
  const int64_t h = static_cast<int64_t>(kv) * P.group + rho / R;
  const int64_t slot = layout::slot(s, h, P.num_q_heads);
  P.ws.row_max[slot * P.block + rho % R] = m;
  P.ws.row_inv_den[slot * P.block + rho % R] = static_cast<float>(1.0 / den);
}

}  // namespace planner
}  // namespace cuda_detail
}  // namespace crisp
