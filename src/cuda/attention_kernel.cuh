// src/cuda/attention_kernel.cuh — the block-sparse causal attention kernel (spec §6), FlashAttention-2
// style, for sm_80 and later (mma.sync tensor cores; no Hopper-only instructions).
//
// One CTA computes one query block r (B rows) of one query head of one sequence. It walks the
// key blocks listed in the CSR row r of its (sequence, head) plan, in ascending order, each as
// B/64 key tiles of 64 rows, and keeps the softmax online in registers:
//  - warps own 32 query rows each (two 16-row mma tiles; B/32 warps); the query block stays in
//    shared memory and is re-read per key tile, so K/V fragments serve both row tiles;
//  - K/V tiles are double-buffered in shared memory by cp.async (the next tile streams in while
//    the current one is multiplied); rows are XOR-swizzled in 16-byte chunks so every ldmatrix
//    phase touches 8 distinct bank groups;
//  - S = Q K^T and O += P V on mma.sync.m16n8k16 (bf16/fp16 inputs, fp32 accumulation);
//  - softmax in base 2 with the scale pre-multiplied by log2(e); the causal mask and the
//    end-of-sequence mask are applied only to tiles that need them (the diagonal block and a
//    partial last block);
//  - GQA reads kv head h / (Hq/Hkv) in place; variable-length batches through the per-sequence
//    bases of the plan.
// The grid is 1-D and ordered heaviest-first: causal rows near the end of a sequence have the
// most key blocks, so those CTAs start first and the short rows fill the tail.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/device_plan.h"
#include "plan/plan_layout.h"

namespace crisp {
namespace cuda_detail {
namespace attention {

// NOTE: key tile of 64 rows for both block sizes (B = 128 is walked as two tiles): the S
// accumulator of a warp is then 2 x 32 fp32 registers per thread, which with O (d/2 x 2) still
// fits the 255-register cap at d = 128; the FA2 forward kernel uses the same 128 x 64 tiling.
constexpr int kKeyTile = 64;
// NOTE: each warp owns two 16-row mma tiles (32 query rows): K and V fragments read from shared
// memory are reused for both, halving shared-memory traffic per FLOP against 16 rows per warp
// (measured on the H200: 16 rows per warp, 8 warps, reached 216 TFLOP/s dense at 128k).
constexpr int kRowTilesPerWarp = 2;
constexpr int kRowsPerWarp = 16 * kRowTilesPerWarp;

template <int kBlock>
constexpr int threads_per_cta() { return kBlock / kRowsPerWarp * 32; }
// Dynamic shared memory: two stages of [K tile | V tile] plus the query block.
template <typename T, int kDim, int kBlock>
constexpr int smem_bytes() { return (4 * kKeyTile + kBlock) * kDim * static_cast<int>(sizeof(T)); }

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
  int32_t max_num_blocks;  // max N over the sequences (grid extent per (sequence, head))
  float scale_log2;        // softmax scale * log2(e)
  float scale;             // softmax scale
  DevicePlanView plan;
};

// ------------------------------------------------------------------ small device helpers
__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async global->shared copy; src_bytes = 0 zero-fills (rows past the sequence end).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem)), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// ldmatrix takes 32-bit shared-window addresses: cheaper in registers than generic pointers.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

template <typename T>
struct Mma;
template <>
struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};
template <>
struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Element offset of (row, 16-byte chunk) in a tile with kDim elements per row, XOR-swizzled:
// the 8 rows read by one ldmatrix phase land in 8 different 16-byte bank groups.
template <int kDim>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * kDim + ((chunk ^ (row & 7)) << 3);
}

// Copies rows [0, rows) of a tile whose row i starts at base + i * row_stride (elements);
// rows >= valid_rows are zero-filled. All threads of the CTA take part.
template <typename T, int kDim, int kThreads>
__device__ __forceinline__ void load_tile(T* smem, const T* base, int64_t row_stride, int rows, int valid_rows) {
  constexpr int kChunks = kDim / 8;
  for (int idx = threadIdx.x; idx < rows * kChunks; idx += kThreads) {
    const int row = idx / kChunks;
    const int chunk = idx % kChunks;
    const bool valid = row < valid_rows;
    const T* src = valid ? base + row * row_stride + chunk * 8 : base;
    cp_async_16(smem + swizzled<kDim>(row, chunk), src, valid ? 16 : 0);
  }
}

// ------------------------------------------------------------------ the kernel
// NOTE: two resident CTAs per SM on Hopper (2 x 96 KB of shared memory at d = 128 fit its
// 228 KB): while one CTA waits at a barrier or on its copies, the other keeps the tensor cores
// busy. No spills on sm_90a; the sm_80 build of the d = 128 variants spills 12 bytes (it hits the
// 255-register ceiling of the ISA, whatever the launch bounds).
template <typename T, int kDim, int kBlock>
__global__ void __launch_bounds__(threads_per_cta<kBlock>(), 2)
    block_sparse_attention_kernel(const Params p) {
  constexpr int kThreads = threads_per_cta<kBlock>();
  constexpr int kSubTiles = kBlock / kKeyTile;  // key tiles per key block
  constexpr int kTileElems = kKeyTile * kDim;
  constexpr int kDimChunks = kDim / 16;  // k-steps of QK^T; also pairs of n8 groups of PV
  constexpr int kKeyGroups = kKeyTile / 8;
  constexpr int R = kRowTilesPerWarp;
  static_assert(kDim == 64 || kDim == 128, "head dim 64 or 128");
  static_assert(kBlock == 64 || kBlock == 128, "block size 64 or 128");

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  auto k_stage = [&](int s) { return smem + s * 2 * kTileElems; };
  auto v_stage = [&](int s) { return smem + s * 2 * kTileElems + kTileElems; };
  T* const q_smem = smem + 4 * kTileElems;
  const uint32_t smem_u32 = smem_address(smem);
  constexpr uint32_t kElemBytes = sizeof(T);
  // 32-bit shared addresses for ldmatrix.
  auto k_addr = [&](int s, int row, int chunk) {
    return smem_u32 + (s * 2 * kTileElems + swizzled<kDim>(row, chunk)) * kElemBytes;
  };
  auto v_addr = [&](int s, int row, int chunk) {
    return smem_u32 + (s * 2 * kTileElems + kTileElems + swizzled<kDim>(row, chunk)) * kElemBytes;
  };
  auto q_addr = [&](int row, int chunk) { return smem_u32 + (4 * kTileElems + swizzled<kDim>(row, chunk)) * kElemBytes; };

  // ---- work item: heads fastest, then sequences, then query blocks from the last (heaviest) one
  const int32_t H = p.num_q_heads;
  const int32_t S = p.plan.num_sequences;
  const int64_t item = blockIdx.x;
  const int32_t h = static_cast<int32_t>(item % H);
  const int32_t s = static_cast<int32_t>((item / H) % S);
  const int32_t from_end = static_cast<int32_t>(item / (static_cast<int64_t>(H) * S));
  const layout::SequenceBases bases = p.plan.seqs[s];
  const int32_t r = bases.num_blocks - 1 - from_end;
  if (r < 0) return;  // a shorter sequence of a varlen batch

  const int32_t n = static_cast<int32_t>(bases.n);
  const int32_t kv_head = h / p.q_per_kv;
  const int32_t* row_ptr = p.plan.row_ptr + layout::row_ptr_offset(bases, h, H);
  const int32_t* cols = p.plan.col + layout::col_offset(bases, h, H);
  const int32_t col_begin = row_ptr[r];
  const int32_t num_tiles = (row_ptr[r + 1] - col_begin) * kSubTiles;

  const T* q_base = static_cast<const T*>(p.q) + h * p.q_stride_head + bases.token_offset * p.q_stride_token;
  const T* k_base = static_cast<const T*>(p.k) + kv_head * p.k_stride_head + bases.token_offset * p.k_stride_token;
  const T* v_base = static_cast<const T*>(p.v) + kv_head * p.v_stride_head + bases.token_offset * p.v_stride_token;

  const int q_row0 = r * kBlock;  // first query of the block, relative to the sequence
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group = lane / 4;      // mma row within an 8-row half
  const int quad_lane = lane % 4;  // mma column pair
  const int warp_row0 = q_row0 + warp * kRowsPerWarp;

  // First key of tile t (relative to the sequence).
  auto tile_key0 = [&](int t) { return cols[col_begin + t / kSubTiles] * kBlock + (t % kSubTiles) * kKeyTile; };
  auto load_k = [&](int t, int stage) {
    const int key0 = tile_key0(t);
    load_tile<T, kDim, kThreads>(k_stage(stage), k_base + key0 * p.k_stride_token, p.k_stride_token, kKeyTile,
                                 n - key0);
  };
  auto load_v = [&](int t, int stage) {
    const int key0 = tile_key0(t);
    load_tile<T, kDim, kThreads>(v_stage(stage), v_base + key0 * p.v_stride_token, p.v_stride_token, kKeyTile,
                                 n - key0);
  };

  // ---- prologue: the query block and the first K/V tile (every row has its diagonal block, so
  // num_tiles >= 1). Groups in flight: Q, K(0), V(0).
  load_tile<T, kDim, kThreads>(q_smem, q_base + q_row0 * p.q_stride_token, p.q_stride_token, kBlock, n - q_row0);
  cp_async_commit();
  load_k(0, 0);
  cp_async_commit();
  load_v(0, 0);
  cp_async_commit();

  float o_acc[R][kDim / 8][4];
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < kDim / 8; ++j) o_acc[i][j][0] = o_acc[i][j][1] = o_acc[i][j][2] = o_acc[i][j][3] = 0.f;
  // Running max in raw score units (before scaling) and partial row sums of this thread's
  // columns; index 2*i + half: row tile i, rows `group` (half 0) and `group + 8` (half 1).
  float row_max[2 * R], row_sum[2 * R];
#pragma unroll
  for (int i = 0; i < 2 * R; ++i) {
    row_max[i] = -INFINITY;
    row_sum[i] = 0.f;
  }

  for (int t = 0; t < num_tiles; ++t) {
    const int stage = t & 1;
    const bool prefetch = t + 1 < num_tiles;
    cp_async_wait<1>();  // Q and K(t) landed; V(t) may be in flight
    __syncthreads();
    // Every thread is past iteration t-1 here, so the other stage (read there) can be refilled
    // without a barrier of its own at the end of each iteration.
    if (prefetch) {
      load_k(t + 1, stage ^ 1);
      cp_async_commit();
      load_v(t + 1, stage ^ 1);
      cp_async_commit();
    }

    const int key0 = tile_key0(t);
    // A warp whose rows all precede the tile (upper part of the diagonal block) skips it.
    const bool warp_active = key0 <= warp_row0 + kRowsPerWarp - 1;
    float p_acc[R][kKeyGroups][4];
    if (warp_active) {
      // ---- S = Q K^T: each K fragment feeds both row tiles
#pragma unroll
      for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < kKeyGroups; ++j) p_acc[i][j][0] = p_acc[i][j][1] = p_acc[i][j][2] = p_acc[i][j][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kDimChunks; ++kk) {
        uint32_t a[R][4];
#pragma unroll
        for (int i = 0; i < R; ++i)
          ldmatrix_x4(a[i], q_addr(warp * kRowsPerWarp + i * 16 + (lane & 15), kk * 2 + (lane >> 4)));
#pragma unroll
        for (int jj = 0; jj < kKeyGroups / 2; ++jj) {
          uint32_t b[4];
          const int key_row = jj * 16 + (lane & 7) + ((lane >> 4) << 3);
          ldmatrix_x4(b, k_addr(stage, key_row, kk * 2 + ((lane >> 3) & 1)));
#pragma unroll
          for (int i = 0; i < R; ++i) {
            Mma<T>::run(p_acc[i][2 * jj], a[i], b[0], b[1]);
            Mma<T>::run(p_acc[i][2 * jj + 1], a[i], b[2], b[3]);
          }
        }
      }
      // ---- masks: causal (diagonal block) and the end of the sequence (partial last block)
      const bool needs_mask = key0 + kKeyTile - 1 > warp_row0 || key0 + kKeyTile > n;
      if (needs_mask) {
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
          for (int j = 0; j < kKeyGroups; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = key0 + j * 8 + quad_lane * 2 + (e & 1);
              const int query = warp_row0 + i * 16 + group + (e >= 2 ? 8 : 0);
              if (key > query || key >= n) p_acc[i][j][e] = -INFINITY;
            }
      }
      // ---- online softmax (base 2); each row is spread over the 4 threads of a quad
#pragma unroll
      for (int i = 0; i < R; ++i) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int x = 2 * i + half;
          float tile_max = row_max[x];
#pragma unroll
          for (int j = 0; j < kKeyGroups; ++j)
            tile_max = fmaxf(tile_max, fmaxf(p_acc[i][j][2 * half], p_acc[i][j][2 * half + 1]));
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
          // A row with no allowed key yet keeps max -inf; subtracting 0 instead gives exp2(-inf) = 0.
          const float m = tile_max == -INFINITY ? 0.f : tile_max;
          const float neg_max_scaled = -m * p.scale_log2;
          const float correction =
              fast_exp2(row_max[x] == -INFINITY ? -INFINITY : (row_max[x] - m) * p.scale_log2);
          row_max[x] = tile_max;
          float sum = 0.f;
#pragma unroll
          for (int j = 0; j < kKeyGroups; ++j) {
            p_acc[i][j][2 * half] = fast_exp2(fmaf(p_acc[i][j][2 * half], p.scale_log2, neg_max_scaled));
            p_acc[i][j][2 * half + 1] = fast_exp2(fmaf(p_acc[i][j][2 * half + 1], p.scale_log2, neg_max_scaled));
            sum += p_acc[i][j][2 * half] + p_acc[i][j][2 * half + 1];
          }
          row_sum[x] = row_sum[x] * correction + sum;
#pragma unroll
          for (int j = 0; j < kDim / 8; ++j) {
            o_acc[i][j][2 * half] *= correction;
            o_acc[i][j][2 * half + 1] *= correction;
          }
        }
      }
    }

    if (prefetch) {
      cp_async_wait<2>();  // V(t) landed
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    if (warp_active) {
      // ---- O += P V; P's accumulator layout is the A-fragment layout of the next mma
#pragma unroll
      for (int kc = 0; kc < kKeyTile / 16; ++kc) {
        uint32_t a[R][4];
#pragma unroll
        for (int i = 0; i < R; ++i) {
          a[i][0] = Mma<T>::pack(p_acc[i][2 * kc][0], p_acc[i][2 * kc][1]);
          a[i][1] = Mma<T>::pack(p_acc[i][2 * kc][2], p_acc[i][2 * kc][3]);
          a[i][2] = Mma<T>::pack(p_acc[i][2 * kc + 1][0], p_acc[i][2 * kc + 1][1]);
          a[i][3] = Mma<T>::pack(p_acc[i][2 * kc + 1][2], p_acc[i][2 * kc + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < kDimChunks; ++dp) {
          uint32_t b[4];
          const int key_row = kc * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
          ldmatrix_x4_trans(b, v_addr(stage, key_row, dp * 2 + (lane >> 4)));
#pragma unroll
          for (int i = 0; i < R; ++i) {
            Mma<T>::run(o_acc[i][2 * dp], a[i], b[0], b[1]);
            Mma<T>::run(o_acc[i][2 * dp + 1], a[i], b[2], b[3]);
          }
        }
      }
    }
  }

  // ---- epilogue: full row sums, normalise, write O (input dtype) and LSE (natural log)
  T* out_base = static_cast<T*>(p.out) + h * p.o_stride_head + bases.token_offset * p.o_stride_token;
  float* lse_base = p.lse + h * p.lse_stride_head + bases.token_offset * p.lse_stride_token;
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int x = 2 * i + half;
      float sum = row_sum[x];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int query = warp_row0 + i * 16 + group + half * 8;
      if (query >= n) continue;
      // Every row lists its diagonal block, whose first key precedes every query of the block,
      // so sum > 0.
      const float inv = 1.f / sum;
      T* out_row = out_base + query * p.o_stride_token;
#pragma unroll
      for (int j = 0; j < kDim / 8; ++j) {
        const uint32_t packed = Mma<T>::pack(o_acc[i][j][2 * half] * inv, o_acc[i][j][2 * half + 1] * inv);
        *reinterpret_cast<uint32_t*>(out_row + j * 8 + quad_lane * 2) = packed;
      }
      if (quad_lane == 0) lse_base[query * p.lse_stride_token] = row_max[x] * p.scale + logf(sum);
    }
  }
}

}  // namespace attention
}  // namespace cuda_detail
}  // namespace crisp
