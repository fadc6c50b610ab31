// src/cuda/attention_kernel.cuh — the block-sparse causal attention kernel (spec §6), FlashAttention-2
// style, for sm_80 and later (mma.sync tensor cores; no Hopper-only instructions).
//
// One CTA computes one query block r (B rows) of one query head of one sequence. It walks the
// key blocks listed in the CSR row r of its (sequence, head) plan, in ascending order, each as
// B/64 key tiles of 64 rows, and keeps the softmax online in registers:
//  - warps own 32 query rows each at d <= 128 (two 16-row mma tiles; B/32 warps), 16 at d = 256
//    (B/16 warps); the query block stays in shared memory and is re-read per key tile, so K/V
//    fragments serve both row tiles;
//  - K and V tiles stream through a ring of 2L + 1 shared-memory slots by cp.async, L key tiles
//    ahead of the tile being multiplied (K(t+L) is issued at the first barrier of tile t, V(t+L)
//    at the second; L = 2 at d <= 128, 1 at d = 256), so a gathered block that misses L2 has L
//    tile-times to arrive; rows are XOR-swizzled in 16-byte chunks so every ldmatrix phase
//    touches 8 distinct bank groups;
//  - S = Q K^T and O += P V on mma.sync.m16n8k16 (bf16/fp16 inputs, fp32 accumulation); the
//    per-lane ldmatrix offsets are computed once, and each k-step only XORs its chunk bits in;
//  - softmax in base 2 with the scale folded into one FFMA per score; O and the row sums are
//    rescaled only when some row max of the warp grew (rare once the max has settled);
//  - the causal mask and the end-of-sequence mask are applied only to tiles that need them
//    (the diagonal block and a partial last block);
//  - GQA reads kv head h / (Hq/Hkv) in place; variable-length batches through the per-sequence
//    bases of the plan;
//  - queries over a KV prefix (spec §11): the block's query positions start at
//    row_query_begin(r) (mid-block in a chunk's first row; earlier rows of the tile are zero-filled
//    and never written) and position p is q/out/lse row token_offset + p - (n_k - n_q); rows
//    before first_row are empty and never launched. Keys come from kv_offset or, kPaged, from the
//    block table's pages, looked up per key row (src/common/kv_rows.h).
// The grid is 1-D and ordered heaviest-first: CTA j computes the j-th item of the plan's work
// order (rows sorted by their key-block count, src/cuda/work_order.h), so the longest rows start
// first and the short rows fill the tail (without a work order: causal rows from the last query
// block, the heaviest of a causal plan).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/kv_rows.h"
#include "cuda/attention_params.h"
#include "plan/plan_layout.h"
#include "plan/rules.h"

namespace crisp {
namespace cuda_detail {
namespace attention {

// NOTE: key tile of 64 rows for both block sizes (B = 128 is walked as two tiles): the S
// accumulator of a warp is then (row tiles) x 32 fp32 registers per thread, which with O (d/2 x
// row tiles) still fits the 255-register cap; the FA2 forward kernel uses the same 128 x 64 tiling.
constexpr int kKeyTile = 64;
// NOTE: each warp owns two 16-row mma tiles (32 query rows) at d <= 128: K and V fragments read
// from shared memory are reused for both, halving shared-memory traffic per FLOP against 16 rows
// per warp (the measured gain is in bench/RESULTS.md). At d = 256 the O accumulator of two row
// tiles alone would be 256 fp32 registers per thread (over the 255 cap), so a warp owns one row
// tile (O 128 + S 32 registers) and the CTA has twice the warps.
template <int kDim>
constexpr int row_tiles_per_warp() { return kDim <= 128 ? 2 : 1; }
template <int kDim>
constexpr int rows_per_warp() { return 16 * row_tiles_per_warp<kDim>(); }

template <int kDim, int kBlock>
constexpr int threads_per_cta() { return kBlock / rows_per_warp<kDim>() * 32; }
// NOTE: the ring holds the tile being read plus 2L in flight, L = key_tiles_ahead key tiles of K
// and V. At d <= 128, L = 2 (5 slots of one 64-key tile each): with the query block this is 112 KB
// at d = 128, so two CTAs still fit the 228 KB of a Hopper SM (2 x (112 + 1 KB reserved)), and K
// and V arrive two key tiles ahead rather than one: gathered sparse blocks miss L2 more often than
// dense ones and need the longer lead (bench/RESULTS.md). At d = 256 a key tile is 32 KB: 5 slots
// plus the query block (32 / 64 KB at B = 64 / 128) would exceed the 163 KB an sm_80 CTA may
// have, so L = 1 (3 slots: 96 KB + the query block = 128 / 160 KB, one CTA per SM).
template <int kDim>
constexpr int key_tiles_ahead() { return kDim <= 128 ? 2 : 1; }
template <int kDim>
constexpr int ring_slots() { return 2 * key_tiles_ahead<kDim>() + 1; }
// NOTE: two resident CTAs per SM at d <= 128 (see the kernel); one at d = 256, where the shared
// memory of one CTA leaves no room for a second and 256 threads x 2 CTAs would cap registers at 128.
template <int kDim>
constexpr int min_ctas_per_sm() { return kDim <= 128 ? 2 : 1; }
// Dynamic shared memory: the K/V ring plus the query block.
template <typename T, int kDim, int kBlock>
constexpr int smem_bytes() { return (ring_slots<kDim>() * kKeyTile + kBlock) * kDim * static_cast<int>(sizeof(T)); }

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

// ------------------------------------------------------------------ tile copies
// Byte offset of (row, 16-byte chunk) in a swizzled tile with kRowBytes bytes per row (the
// layout of swizzled<kDim>, in bytes).
template <int kRowBytes>
__device__ __forceinline__ uint32_t swizzled_bytes(int row, int chunk) {
  return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}
__device__ __forceinline__ void cp_async_16_full(uint32_t smem_addr, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr), "l"(gmem));
}
__device__ __forceinline__ void cp_async_16_zfill(uint32_t smem_addr, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes));
}

// Issues the cp.async copies of a kRows x kDim tile whose row i starts at src + i * row_stride
// into the swizzled tile at shared address smem_tile. Rows outside [first_valid, valid_rows) are
// zero-filled and their source is not read (safe_src, any mapped address, stands in for it). Each
// thread copies one fixed 16-byte chunk column of every (kThreads / chunks per row)-th row, so its
// offsets are loop-invariant and the copy unrolls fully; whole tiles (the common case) skip the
// predicates.
template <typename T, int kDim, int kRows, int kThreads>
__device__ __forceinline__ void copy_tile_async(uint32_t smem_tile, const T* src, int64_t row_stride,
                                                int valid_rows, const T* safe_src, int first_valid = 0) {
  constexpr int kChunks = kDim / 8;
  constexpr int kRowsPerPass = kThreads / kChunks;
  constexpr int kPasses = kRows / kRowsPerPass;
  constexpr int kRowBytes = kDim * static_cast<int>(sizeof(T));
  static_assert(kThreads % kChunks == 0 && kRows % kRowsPerPass == 0, "tile copy shape");
  const int row0 = static_cast<int>(threadIdx.x) / kChunks;
  const int chunk = static_cast<int>(threadIdx.x) % kChunks;
  const T* thread_src = src + row0 * row_stride + chunk * 8;
  const int64_t pass_stride = kRowsPerPass * row_stride;
  if (first_valid <= 0 && valid_rows >= kRows) {
#pragma unroll
    for (int i = 0; i < kPasses; ++i)
      cp_async_16_full(smem_tile + swizzled_bytes<kRowBytes>(row0 + i * kRowsPerPass, chunk),
                       thread_src + i * pass_stride);
  } else {
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int row = row0 + i * kRowsPerPass;
      const bool valid = row >= first_valid && row < valid_rows;
      cp_async_16_zfill(smem_tile + swizzled_bytes<kRowBytes>(row, chunk), valid ? thread_src + i * pass_stride : safe_src,
                        valid ? 16 : 0);
    }
  }
}

// The same copy for paged K/V: tile row i is key key0 + i of the sequence, at pool row
// kv_rows::key_row(0, table_row, page_size, key0 + i) of head_base (rows of row_stride elements).
// Rows >= valid_rows, and rows whose page id lies outside the pool, are zero-filled unread.
template <typename T, int kDim, int kRows, int kThreads>
__device__ __forceinline__ void copy_paged_tile_async(uint32_t smem_tile, const T* head_base, int64_t row_stride,
                                                      const int32_t* table_row, int32_t page_size, int64_t pool_rows,
                                                      int key0, int valid_rows) {
  constexpr int kChunks = kDim / 8;
  constexpr int kRowsPerPass = kThreads / kChunks;
  constexpr int kPasses = kRows / kRowsPerPass;
  constexpr int kRowBytes = kDim * static_cast<int>(sizeof(T));
  const int row0 = static_cast<int>(threadIdx.x) / kChunks;
  const int chunk = static_cast<int>(threadIdx.x) % kChunks;
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int row = row0 + i * kRowsPerPass;
    int64_t pool_row = -1;
    if (row < valid_rows) pool_row = kv_rows::key_row(0, table_row, page_size, key0 + row);
    const bool valid = pool_row >= 0 && pool_row < pool_rows;
    cp_async_16_zfill(smem_tile + swizzled_bytes<kRowBytes>(row, chunk),
                      valid ? head_base + pool_row * row_stride + chunk * 8 : head_base, valid ? 16 : 0);
  }
}

// ------------------------------------------------------------------ work items
// The work item of this CTA (the portable kernel runs one item per CTA; the Hopper kernel's
// persistent CTAs decode their own): query head h, sequence s, query block r (r < 0: a shorter
// sequence of a varlen batch; r < the sequence's first_row: a chunk's row without queries; both
// nothing to do); `listed` is the row item's index in a row-subset launch. Depends only on the
// parameters and blockIdx, so it can be called again.
struct WorkItem {
  int32_t h, s, r;
  int64_t listed;
};
__device__ __forceinline__ WorkItem decode_work_item(const Params& p) {
  const int32_t H = p.num_q_heads;
  const int32_t S = p.plan.num_sequences;
  const int64_t item = p.row_items == nullptr && p.work_order != nullptr ? p.work_order[blockIdx.x]
                                                                         : static_cast<int64_t>(blockIdx.x);
  WorkItem w;
  w.h = static_cast<int32_t>(item % H);
  w.listed = item / H;
  if (p.row_items == nullptr) {
    w.s = static_cast<int32_t>((item / H) % S);
    const int32_t from_end = static_cast<int32_t>(item / (static_cast<int64_t>(H) * S));
    w.r = p.plan.seqs[w.s].num_blocks - 1 - from_end;
  } else {
    const RowItem listed = p.row_items[w.listed];
    w.s = listed.sequence;
    w.r = listed.query_block;
  }
  return w;
}

// ------------------------------------------------------------------ the kernel
// NOTE: two resident CTAs per SM on Hopper at d <= 128 (2 x 112 KB of shared memory at d = 128 fit
// its 228 KB): while one CTA waits at a barrier or on its copies, the other keeps the tensor cores
// busy. The register budget (255 at 2 x 128 threads) holds O (128 fp32), S (64 fp32) and the
// fragments at d = 128; at d = 256 (one row tile per warp, one CTA) O (128 fp32) and S (32 fp32).
// kPaged: K/V rows through the block table (Params::block_table), else contiguous from kv_offset.
template <typename T, int kDim, int kBlock, bool kPaged>
__global__ void __launch_bounds__(threads_per_cta<kDim, kBlock>(), min_ctas_per_sm<kDim>())
    block_sparse_attention_kernel(const Params p) {
  constexpr int kThreads = threads_per_cta<kDim, kBlock>();
  constexpr int kRowsPerWarp = rows_per_warp<kDim>();
  constexpr int kRingSlots = ring_slots<kDim>();
  constexpr int kLead = key_tiles_ahead<kDim>();  // key tiles of K and V copied ahead
  constexpr int kInFlight = 2 * kLead - 1;  // copy groups that may stay pending at each wait
  constexpr int kSubTiles = kBlock / kKeyTile;  // key tiles per key block
  constexpr int kRowBytes = kDim * static_cast<int>(sizeof(T));
  constexpr int kTileBytes = kKeyTile * kRowBytes;
  constexpr int kDimChunks = kDim / 16;  // k-steps of QK^T; also pairs of n8 groups of PV
  constexpr int kKeyGroups = kKeyTile / 8;
  constexpr int kKeySteps = kKeyTile / 16;  // k-steps of PV
  constexpr int R = row_tiles_per_warp<kDim>();
  static_assert(kDim == 64 || kDim == 128 || kDim == 256, "head dim 64, 128 or 256");
  static_assert(kBlock == 64 || kBlock == 128, "block size 64 or 128");

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t ring = smem_address(smem_raw);  // kRingSlots K/V tiles
  const uint32_t q_smem = ring + kRingSlots * kTileBytes;
  auto slot_address = [&](int slot) { return ring + static_cast<uint32_t>(slot * kTileBytes); };

  // ---- work item: heads fastest, then sequences, then query blocks from the last (heaviest) one
  // (or, for a row-subset launch, heads fastest, then the listed items in their order); taken in
  // the plan's work order (heaviest rows first) when it has one.
  const WorkItem work = decode_work_item(p);
  if (work.r < 0) return;  // a shorter sequence of a varlen batch
  const int32_t h = work.h, r = work.r;
  const layout::SequenceBases bases = p.plan.seqs[work.s];
  if (r < bases.first_row) return;  // a chunk's row without queries: empty, nothing to write
  const int32_t H = p.num_q_heads;

  const int32_t n = static_cast<int32_t>(bases.n);
  const int32_t kv_head = h / p.q_per_kv;
  const int32_t* row_ptr = p.plan.row_ptr + layout::row_ptr_offset(bases, h, H);
  const int32_t col_begin = row_ptr[r];
  const int32_t num_row_blocks = row_ptr[r + 1] - col_begin;
  const int32_t num_tiles = num_row_blocks * kSubTiles;
  const int32_t* row_cols = p.plan.col + layout::col_offset(bases, h, H) + col_begin;

  // Query position `pos` (spec §11: the queries are the last n_q of the n positions, from
  // queries_from on) is q row token_offset + pos - queries_from; rows of the block before
  // queries_from are zero-filled (and never written).
  const int queries_from = static_cast<int>(rules::first_query_position(n, bases.n_q));
  const T* q_head = static_cast<const T*>(p.q) + h * p.q_stride_head;
  const int64_t q_shift = bases.token_offset - queries_from;
  // K and V rows of the sequence: one offset in tokens, or the sequence's row of the block table
  // (the bases are rebuilt from it at each copy; two 64-bit pointers live across the loop made it
  // spill at d = 128).
  const int64_t token0 = kPaged ? 0 : bases.kv_offset;
  const int32_t* table_row = kPaged ? p.block_table + work.s * p.table_stride : nullptr;
  auto k_base = [&]() { return static_cast<const T*>(p.k) + kv_head * p.k_stride_head + token0 * p.k_stride_token; };
  auto v_base = [&]() { return static_cast<const T*>(p.v) + kv_head * p.v_stride_head + token0 * p.v_stride_token; };

  const int q_row0 = r * kBlock;  // first position of the block (its first query may come later)
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group = lane / 4;      // mma row within an 8-row half
  const int quad_lane = lane % 4;  // mma column pair
  const int warp_row0 = q_row0 + warp * kRowsPerWarp;

  // ---- producer side: first key of the next tile to copy. The column of the block after the
  // current one is loaded a whole block ahead, so no copy waits on a dependent global load.
  int issue_col = row_cols[0];
  int ahead_col = num_row_blocks > 1 ? row_cols[1] : 0;
  auto take_key0 = [&](int tile) {  // called for tiles 0, 1, 2, ... in order
    const int sub = tile % kSubTiles;
    if (sub == 0 && tile > 0) {
      const int block = tile / kSubTiles;
      issue_col = ahead_col;
      if (block + 1 < num_row_blocks) ahead_col = row_cols[block + 1];
    }
    return issue_col * kBlock + sub * kKeyTile;
  };
  // One key tile (keys key0 ..) of K or V (head rows at `base`, `stride` elements apart) into `slot`.
  auto copy_keys = [&](const T* base, int64_t stride, int key0, int slot) {
    if constexpr (kPaged)
      copy_paged_tile_async<T, kDim, kKeyTile, kThreads>(slot_address(slot), base, stride, table_row, p.page_size,
                                                         p.pool_rows, key0, n - key0);
    else
      copy_tile_async<T, kDim, kKeyTile, kThreads>(slot_address(slot), base + key0 * stride, stride, n - key0, base);
  };
  auto copy_k = [&](int key0, int slot) { copy_keys(k_base(), p.k_stride_token, key0, slot); };
  auto copy_v = [&](int key0, int slot) { copy_keys(v_base(), p.v_stride_token, key0, slot); };

  // ---- prologue: the query block with K(0) (one group), then V(0), and K(j), V(j) for j < kLead
  // (every row has its diagonal block, so num_tiles >= 1; missing tiles commit empty groups so the
  // counts stay uniform). Tile t's K sits in slot (2t) % kRingSlots and its V in the next slot.
  // Rows of the tile before the block's first query are zero-filled, unread (in a packed batch they
  // would be another sequence's queries).
  copy_tile_async<T, kDim, kBlock, kThreads>(q_smem, q_head + (q_shift + q_row0) * p.q_stride_token,
                                             p.q_stride_token, n - q_row0, q_head, queries_from - q_row0);
  int key0_queue[kLead];  // first keys of tiles t .. t + kLead - 1
  key0_queue[0] = take_key0(0);
  copy_k(key0_queue[0], 0);
  cp_async_commit();
  copy_v(key0_queue[0], 1);
  cp_async_commit();
#pragma unroll
  for (int j = 1; j < kLead; ++j) {
    key0_queue[j] = 0;
    if (num_tiles > j) {
      key0_queue[j] = take_key0(j);
      copy_k(key0_queue[j], 2 * j);
    }
    cp_async_commit();
    if (num_tiles > j) copy_v(key0_queue[j], 2 * j + 1);
    cp_async_commit();
  }

  // Per-lane ldmatrix offsets inside a tile; k-step kk of Q and K (and d-pair dp of V) flips the
  // chunk bits by XOR with kk << 5 (chunk 2 kk + hi, swizzled by row & 7 = lane & 7).
  const int lane7 = lane & 7;
  const uint32_t q_lane = static_cast<uint32_t>((warp * kRowsPerWarp + (lane & 15)) * kRowBytes +
                                                (((lane >> 4) ^ lane7) << 4));
  const uint32_t k_lane = static_cast<uint32_t>((lane7 + ((lane >> 4) << 3)) * kRowBytes +
                                                ((((lane >> 3) & 1) ^ lane7) << 4));
  const uint32_t v_lane = static_cast<uint32_t>((lane7 + (((lane >> 3) & 1) << 3)) * kRowBytes +
                                                (((lane >> 4) ^ lane7) << 4));

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

  int k_slot = 0;  // (2t) % kRingSlots
  for (int t = 0; t < num_tiles; ++t) {
    const int v_slot = k_slot + 1 == kRingSlots ? 0 : k_slot + 1;
    const bool issue = t + kLead < num_tiles;
    int key0_ahead = 0;  // tile t + kLead
    // Groups committed so far end with V(t+kLead-1); the kInFlight newest may stay in flight.
    cp_async_wait<kInFlight>();  // K(t) (and at t = 0 the query block) landed
    __syncthreads();
    // Every warp is past PV(t-1), so V(t-1)'s slot, (2t - 1) % kRingSlots = (2(t + kLead)) %
    // kRingSlots, takes K(t+kLead).
    if (issue) {
      key0_ahead = take_key0(t + kLead);
      copy_k(key0_ahead, k_slot == 0 ? kRingSlots - 1 : k_slot - 1);
    }
    cp_async_commit();

    const int key0 = key0_queue[0];
    // A warp whose rows all precede the tile (upper part of the diagonal block), or whose rows' windows
    // all begin after it (§12), skips it.
    const bool warp_active = key0 <= warp_row0 + kRowsPerWarp - 1 &&
                             !rules::outside_window(key0 + kKeyTile - 1, warp_row0, p.window);
    uint32_t p_frag[R][kKeySteps][4];  // P in bf16/fp16, already in the A-fragment layout of PV
    if (warp_active) {
      // ---- S = Q K^T: each K fragment feeds both row tiles
      float s_acc[R][kKeyGroups][4];
#pragma unroll
      for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < kKeyGroups; ++j) s_acc[i][j][0] = s_acc[i][j][1] = s_acc[i][j][2] = s_acc[i][j][3] = 0.f;
      const uint32_t k_tile = slot_address(k_slot);
#pragma unroll
      for (int kk = 0; kk < kDimChunks; ++kk) {
        uint32_t a[R][4];
        const uint32_t q_kk = q_smem + (q_lane ^ (kk << 5));
#pragma unroll
        for (int i = 0; i < R; ++i) ldmatrix_x4(a[i], q_kk + i * 16 * kRowBytes);
        const uint32_t k_kk = k_tile + (k_lane ^ (kk << 5));
#pragma unroll
        for (int jj = 0; jj < kKeyGroups / 2; ++jj) {
          uint32_t b[4];
          ldmatrix_x4(b, k_kk + jj * 16 * kRowBytes);
#pragma unroll
          for (int i = 0; i < R; ++i) {
            Mma<T>::run(s_acc[i][2 * jj], a[i], b[0], b[1]);
            Mma<T>::run(s_acc[i][2 * jj + 1], a[i], b[2], b[3]);
          }
        }
      }
      // ---- masks: causal (diagonal block), the end of the sequence (partial last block) and the
      // window's edge (§12: the row's first listed blocks)
      const bool needs_mask = key0 + kKeyTile - 1 > warp_row0 || key0 + kKeyTile > n ||
                              rules::tile_needs_window_mask(key0, warp_row0 + kRowsPerWarp - 1, p.window);
      if (needs_mask) {
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
          for (int j = 0; j < kKeyGroups; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = key0 + j * 8 + quad_lane * 2 + (e & 1);
              const int query = warp_row0 + i * 16 + group + (e >= 2 ? 8 : 0);
              if (!rules::key_visible(key, query, p.window) || key >= n) s_acc[i][j][e] = -INFINITY;
            }
      }
      // ---- online softmax (base 2); each row is spread over the 4 threads of a quad
      float new_max[2 * R];
      bool grew = false;
#pragma unroll
      for (int i = 0; i < R; ++i)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int x = 2 * i + half;
          float m = row_max[x];
#pragma unroll
          for (int j = 0; j < kKeyGroups; ++j) m = fmaxf(m, fmaxf(s_acc[i][j][2 * half], s_acc[i][j][2 * half + 1]));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
          new_max[x] = m;
          grew |= m > row_max[x];
        }
      // O and the row sums need rescaling only when a row max grew; skipping the 2 x d/2
      // multiplies per row otherwise is exact (the correction would be 1).
      if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int x = 2 * i + half;
            // From -inf (no allowed key yet) the correction is exp2(-inf) = 0; an unchanged max
            // (-inf included) keeps 1.
            const float correction =
                new_max[x] > row_max[x] ? fast_exp2((row_max[x] - new_max[x]) * p.scale_log2) : 1.f;
            row_sum[x] *= correction;
#pragma unroll
            for (int j = 0; j < kDim / 8; ++j) {
              o_acc[i][j][2 * half] *= correction;
              o_acc[i][j][2 * half + 1] *= correction;
            }
          }
      }
#pragma unroll
      for (int i = 0; i < R; ++i)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int x = 2 * i + half;
          row_max[x] = new_max[x];
          // A row with no allowed key yet keeps max -inf; subtracting 0 instead gives exp2(-inf) = 0.
          const float neg_max_scaled = new_max[x] == -INFINITY ? 0.f : -new_max[x] * p.scale_log2;
          float sum = 0.f;
#pragma unroll
          for (int j = 0; j < kKeyGroups; ++j) {
            s_acc[i][j][2 * half] = fast_exp2(fmaf(s_acc[i][j][2 * half], p.scale_log2, neg_max_scaled));
            s_acc[i][j][2 * half + 1] = fast_exp2(fmaf(s_acc[i][j][2 * half + 1], p.scale_log2, neg_max_scaled));
            sum += s_acc[i][j][2 * half] + s_acc[i][j][2 * half + 1];
          }
          row_sum[x] += sum;
        }
      // P's accumulator layout is the A-fragment layout of the PV mma
#pragma unroll
      for (int i = 0; i < R; ++i)
#pragma unroll
        for (int kc = 0; kc < kKeySteps; ++kc) {
          p_frag[i][kc][0] = Mma<T>::pack(s_acc[i][2 * kc][0], s_acc[i][2 * kc][1]);
          p_frag[i][kc][1] = Mma<T>::pack(s_acc[i][2 * kc][2], s_acc[i][2 * kc][3]);
          p_frag[i][kc][2] = Mma<T>::pack(s_acc[i][2 * kc + 1][0], s_acc[i][2 * kc + 1][1]);
          p_frag[i][kc][3] = Mma<T>::pack(s_acc[i][2 * kc + 1][2], s_acc[i][2 * kc + 1][3]);
        }
    }

    // Groups committed so far end with K(t+kLead); the kInFlight newest may stay in flight.
    cp_async_wait<kInFlight>();  // V(t) landed
    __syncthreads();
    // Every warp is past QK(t), so K(t)'s slot takes V(t+kLead).
    if (issue) copy_v(key0_ahead, k_slot);
    cp_async_commit();

    if (warp_active) {
      // ---- O += P V
      const uint32_t v_tile = slot_address(v_slot);
#pragma unroll
      for (int dp = 0; dp < kDimChunks; ++dp) {
        const uint32_t v_dp = v_tile + (v_lane ^ (dp << 5));
#pragma unroll
        for (int kc = 0; kc < kKeySteps; ++kc) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, v_dp + kc * 16 * kRowBytes);
#pragma unroll
          for (int i = 0; i < R; ++i) {
            Mma<T>::run(o_acc[i][2 * dp], p_frag[i][kc], b[0], b[1]);
            Mma<T>::run(o_acc[i][2 * dp + 1], p_frag[i][kc], b[2], b[3]);
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j + 1 < kLead; ++j) key0_queue[j] = key0_queue[j + 1];
    key0_queue[kLead - 1] = key0_ahead;
    k_slot = k_slot + 2 >= kRingSlots ? k_slot + 2 - kRingSlots : k_slot + 2;
  }

  // ---- epilogue: full row sums, normalise, write O (input dtype) and LSE (natural log)
  // Output row of query position `query` is out_shift + query: the sequence's own query row by
  // default, from the listed out_token (the block's first query) for a row-subset launch; rows
  // before the block's first query are not written. The item (head, query block, listed row) and
  // its query offsets are read again rather than kept in registers across the main loop: at d = 128
  // the loop needs all 255 (keeping them live made it spill). The loads go through __ldcg so the
  // compiler cannot reuse (and keep live) the values loaded before the loop.
  const WorkItem done = decode_work_item(p);
  const layout::SequenceBases* done_bases = p.plan.seqs + done.s;
  const int64_t done_n_q = __ldcg(reinterpret_cast<const long long*>(&done_bases->n_q));
  const int first_position = static_cast<int>(rules::first_query_position(n, done_n_q));
  const int first_written = static_cast<int>(rules::row_query_begin(done.r, kBlock, n, done_n_q));
  const int64_t out_shift =
      p.row_items == nullptr ? __ldcg(reinterpret_cast<const long long*>(&done_bases->token_offset)) - first_position
                             : p.row_items[done.listed].out_token - first_written;
  T* out_base = static_cast<T*>(p.out) + done.h * p.o_stride_head;
  float* lse_base = p.lse + done.h * p.lse_stride_head;
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int x = 2 * i + half;
      float sum = row_sum[x];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int query = warp_row0 + i * 16 + group + half * 8;
      if (query >= n || query < first_written) continue;
      // Every row lists its diagonal block, whose first key precedes every query of the block,
      // so sum > 0.
      const float inv = 1.f / sum;
      T* out_row = out_base + (out_shift + query) * p.o_stride_token;
#pragma unroll
      for (int j = 0; j < kDim / 8; ++j) {
        const uint32_t packed = Mma<T>::pack(o_acc[i][j][2 * half] * inv, o_acc[i][j][2 * half + 1] * inv);
        *reinterpret_cast<uint32_t*>(out_row + j * 8 + quad_lane * 2) = packed;
      }
      if (quad_lane == 0) lse_base[(out_shift + query) * p.lse_stride_token] = row_max[x] * p.scale + logf(sum);
    }
  }
}

}  // namespace attention
}  // namespace cuda_detail
}  // namespace crisp
