// src/cuda/hopper/plan_proxy_wgmma.cuh — the fused proxy pass (plan_proxy_mma.cuh, kFusedPass) on
// Hopper's warpgroup matrix multiply: the same work items, records and softmax partials, so the
// combine and finalize kernels are shared; only how S = Q K^T reaches the registers differs.
//
// Why a second kernel: the mma.sync pass re-reads every query and key fragment from shared memory
// through ldmatrix into registers (about 24 KB per warp per 64-key tile), and at 512 threads under
// a 128-register cap those fragments and the 64 score accumulators spill. wgmma reads both operands
// from shared memory itself (descriptors), so a thread holds only its accumulators.
//
//  - one CTA = one work item (sequence, kv head, row group of mma_rows(d) proxy rows, key range),
//    as in plan_proxy_mma.cuh; one warpgroup per 128 rows (4 at d <= 128, 2 at d = 256), each
//    issuing two m64n64k16 per 16-dim step (rows 0-63 and 64-127 of its 128);
//  - queries and key tiles of 64 are stored in the 128-byte swizzle wgmma reads (64-dim halves of
//    8-row atoms): the queries once by cp.async from every thread (then a proxy fence), the key
//    tiles by TMA from warp 0 (lane b: box b), each stage completing on its mbarrier (contiguous
//    or paged K, boxes inside a page); a named barrier per tile tells warp 0 a stage is free again;
//  - software-pipelined: a warpgroup's two m64 halves are separate wgmma groups, so the tensor
//    cores compute one half (acc1 of tile t, then acc0 of tile t + 1) while the warpgroup updates
//    the other half's rows; the lockstep form (both halves, then all rows) left the tensor cores
//    idle during the updates and the SM idle during the multiplies (bench/RESULTS.md, session 17);
//  - the accumulator of m64nNk16 gives each warp 16 rows in the m16n8 C-fragment layout of
//    mma.sync, so both kernels share the per-row epilogue of plan_proxy_mma.cuh (fused_row_update:
//    online softmax, slash bins, structural mass; fused_row_block_end: one record per row and key
//    block; store_row_partials).
// Built for sm_90a only (CRISP_HOPPER_DEVICE_CODE); the planner launches it where
// hopper::kernel_available() says the binary holds that code.
#pragma once
#include "cuda/attention_kernel.cuh"  // cp.async helpers
#include "cuda/hopper/sm90_primitives.cuh"
#include "cuda/hopper/tile_shape.h"
#include "cuda/hopper/wgmma.cuh"
#include "cuda/plan_common.cuh"
#include "cuda/plan_proxy.cuh"
#include "cuda/plan_proxy_mma.cuh"

namespace crisp {
namespace cuda_detail {
namespace planner {

// NOTE: three key stages: the software pipeline below keeps two tiles in the tensor cores' use
// while the third loads (225 KB at d = 256, inside sm_90's 227 KB).
constexpr int kWgmmaKeyStages = 3;

// Dynamic shared memory of proxy_wgmma_kernel: the queries, kWgmmaKeyStages key tiles, and room to
// align the base to the 1024-byte swizzle atom.
template <int kDim>
constexpr size_t proxy_wgmma_smem_bytes() {
  return static_cast<size_t>(mma_rows(kDim) + kWgmmaKeyStages * kMmaKeyTile) * kDim * 2 + 1024;
}

template <typename T, int kDim>
__global__ void __launch_bounds__(mma_warps(kDim) * 32, 1)
    proxy_wgmma_kernel(Strided3<T> q, const __grid_constant__ CUtensorMap k_map, ProxyParams P, ProxyMmaRecords R) {
#if defined(CRISP_HOPPER_DEVICE_CODE)
  using hopper::smem_descriptor;
  constexpr int kRows = mma_rows(kDim);
  constexpr int kChunks = kDim / 8;                    // 16-byte chunks per row
  constexpr int kQHalfBytes = kRows * 128;             // one 64-dim half of the query rows
  constexpr int kKHalfBytes = kMmaKeyTile * 128;       // one 64-dim half of a key tile
  constexpr int kKTileBytes = (kDim / 64) * kKHalfBytes;
  static_assert(kDim % 64 == 0, "64-dim halves");
  extern __shared__ unsigned char proxy_wgmma_smem[];
  const uint32_t smem_base = (hopper::smem_u32(proxy_wgmma_smem) + 1023u) & ~1023u;
  const uint32_t q_smem = smem_base;
  const uint32_t k_smem = smem_base + kRows * kDim * 2;  // kWgmmaKeyStages stages of kKTileBytes
  // Byte offset of 16-byte chunk c of row `row` in a tile of 64-dim halves of `half_bytes`, with
  // the 128-byte swizzle (chunk index XOR row mod 8 inside each 8-row, 1024-byte atom).
  auto swizzle128 = [](int row, int c, int half_bytes) {
    return static_cast<uint32_t>((c >> 3) * half_bytes + row * 128 + (((c & 7) ^ (row & 7)) << 4));
  };

  const ProxyWorkItem item = P.items[blockIdx.x];
  const layout::SequenceBases sb = P.seqs[item.seq];
  const int B = P.block;
  const int64_t n = sb.n;
  const int L = B;  // as in proxy_mma_kernel: this path runs only where every n_q >= B
  const int rows_total = P.group * L;
  const int row0 = item.row_tile * kRows;
  const int rows_here = min(kRows, rows_total - row0);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
  const int wg = warp >> 2, warp_in_wg = warp & 3;
  // Warpgroups without rows (a row group shorter than kRows) leave at once and the others load and
  // synchronise among themselves (named barrier 1): a wgmma under a per-warpgroup branch would be
  // serialised by ptxas (C7518), and an idle warpgroup's multiplies would take tensor-core time.
  const int active_threads = (rows_here + 127) / 128 * 128;
  if (tid >= active_threads) return;
  auto sync_active = [&] { hopper::named_barrier_sync(1, active_threads); };

  for (int idx = tid; idx < kRows * kChunks; idx += active_threads) {
    const int row = idx / kChunks, chunk = idx % kChunks;
    int bytes = 0;
    const T* src = proxy_query_chunk(q, sb, item.kv, P.group, L, row0 + row, chunk, bytes);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(q_smem + swizzle128(row, chunk, kQHalfBytes)),
                 "l"(src), "r"(bytes));
  }
  const int64_t key_stop = min(item.key_end, n);
  const int tiles = static_cast<int>((key_stop - item.key_begin + kMmaKeyTile - 1) / kMmaKeyTile);
  // Key tiles arrive by TMA (k_map: boxes of 64 dims x box_rows keys, the 128-byte swizzle wgmma
  // reads), issued by warp 0 (lane b: box b) and completing on the stage's mbarrier: no per-thread
  // copies or address arithmetic per tile. Paged K: a box lies inside one page (box_rows divides
  // the page size and the tile); the lanes read their boxes' page ids together, one table latency
  // per tile on warp 0's path instead of one per box (every warp waits for warp 0 at the next
  // tile's barrier; reading them a tile ahead measured no faster and spilled more: bench/RESULTS.md,
  // session 28).
  // Boxes past the sequence are not loaded (the block table is not read there): those keys are
  // masked by the causal test of the general update, whatever the stage holds.
  const int32_t* table_row = P.keys.table != nullptr ? P.keys.table + item.seq * P.keys.row_stride : nullptr;
  const int box_rows =
      table_row != nullptr ? hopper::paged_box_rows(static_cast<int>(P.keys.page_size), kMmaKeyTile) : kMmaKeyTile;
  static_assert(kMmaKeyTile / 16 <= 32, "a lane per box");
  // Warp 0, every lane: the page id of box `lane` of the tile at j0 (0 where there is none or K is
  // contiguous; such an id is never used).
  auto page_of_box = [&](int64_t j0) -> int32_t {
    const int64_t j = j0 + static_cast<int64_t>(lane) * box_rows;
    return table_row != nullptr && lane * box_rows < kMmaKeyTile && j < n ? table_row[j / P.keys.page_size] : 0;
  };
  __shared__ __align__(8) uint64_t key_full[kWgmmaKeyStages];
  const uint32_t full_bar = hopper::smem_u32(key_full);
  // Warp 0, every lane (`page`: its page_of_box(j0)): lane 0 counts the tile's bytes, then lane b
  // issues box b. A box may complete before the count is set: the transaction count may go below
  // zero inside a phase, which cannot complete before lane 0's arrival.
  auto load_keys = [&](int64_t j0, int stage, int32_t page) {
    const uint32_t dst = k_smem + stage * kKTileBytes, bar = full_bar + stage * 8;
    const int rows = static_cast<int>(min(static_cast<int64_t>(kMmaKeyTile), n - j0));  // j0 < n
    const int boxes = (rows + box_rows - 1) / box_rows;
    if (lane == 0) hopper::mbar_expect_tx(bar, static_cast<uint32_t>(boxes * box_rows * kDim * 2));
    if (lane < boxes) {
      const int64_t j = j0 + static_cast<int64_t>(lane) * box_rows;
      const int64_t row = table_row != nullptr ? kv_rows::paged_row(page, P.keys.page_size, j) : sb.kv_offset + j;
#pragma unroll
      for (int h = 0; h < kDim / 64; ++h)
        hopper::tma_load(dst + h * kKHalfBytes + lane * box_rows * 128, &k_map, h * 64, static_cast<int>(row), item.kv,
                         bar);
    }
  };
  // Prologue: the queries (cp.async, every thread) and key tiles 0 and 1 (stages 0 and 1 of three).
  if (warp == 0) {
    if (lane == 0) {
#pragma unroll
      for (int st = 0; st < kWgmmaKeyStages; ++st) hopper::mbar_init(full_bar + st * 8, 1);
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncwarp();  // the barriers are initialised before any lane's box can complete on them
    if (tiles > 0) load_keys(item.key_begin, 0, page_of_box(item.key_begin));
    if (tiles > 1) load_keys(item.key_begin + kMmaKeyTile, 1, page_of_box(item.key_begin + kMmaKeyTile));
  }
  attention::cp_async_commit();
  // The k-th use of a stage (tile = 3 k + stage) waits for phase parity k & 1.
  auto wait_keys = [&](int tile) {
    hopper::mbar_wait(full_bar + (tile % kWgmmaKeyStages) * 8, static_cast<uint32_t>((tile / kWgmmaKeyStages) & 1));
  };

  // This thread's four rows rr = 2 mt + hf: row 64 mt + 16 warp_in_wg + 8 hf + g of its warpgroup's
  // 128 (mt: the first or second m64 of the warpgroup, accumulated in acc0 or acc1).
  int row_in_tile[4], pos[4];
#pragma unroll
  for (int rr = 0; rr < 4; ++rr) {
    row_in_tile[rr] = wg * 128 + (rr >> 1) * 64 + warp_in_wg * 16 + (rr & 1) * 8 + g;
    pos[rr] = static_cast<int>(n) - L + (row0 + row_in_tile[rr]) % L;
  }
  const float scale_log2 = P.scale * 1.4426950408889634f;
  // Descriptors (128-byte swizzle, K-major: 8-row groups 1024 bytes apart, leading offset unused),
  // built once: a stage or a 16-dim step only moves the start address (desc_advance).
  const uint64_t q_desc0 = smem_descriptor(q_smem + (wg * 128) * 128, 16, 1024);
  const uint64_t q_desc1 = smem_descriptor(q_smem + (wg * 128 + 64) * 128, 16, 1024);
  const uint64_t k_desc_stage0 = smem_descriptor(k_smem, 16, 1024);

  FusedRowState rows[4];
  float acc0[32], acc1[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc0[i] = acc1[i] = 0.f;

  // S = Q K^T of one m64 half of the warpgroup's rows against the key tile in `stage`, issued
  // and committed as one wgmma group (not waited for).
  auto issue_scores = [&](float (&acc)[32], uint64_t q_desc, int stage) {
    const uint64_t k_desc = hopper::desc_advance(k_desc_stage0, stage * (kKTileBytes >> 4));
    hopper::fence_registers(acc);
    hopper::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kDim / 16; ++kk) {
      // A 16-dim step advances 32 bytes inside the 128-byte row; every 4 steps, the next half.
      const uint32_t q_step = static_cast<uint32_t>(((kk / 4) * kQHalfBytes + (kk % 4) * 32) >> 4);
      const uint32_t k_step = static_cast<uint32_t>(((kk / 4) * kKHalfBytes + (kk % 4) * 32) >> 4);
      if constexpr (std::is_same<T, __nv_bfloat16>::value)
        hopper::wgmma_m64n64k16_ss_bf16(acc, hopper::desc_advance(q_desc, q_step), hopper::desc_advance(k_desc, k_step),
                                        kk > 0);
      else
        hopper::wgmma_m64n64k16_ss_f16(acc, hopper::desc_advance(q_desc, q_step), hopper::desc_advance(k_desc, k_step),
                                       kk > 0);
    }
    hopper::wgmma_commit();
  };
  // What the rows' update needs of a tile, computed once for both halves.
  struct TileInfo {
    int kb, T1, T2, j0q;
    bool general, ends_block;
  };
  // The tile's key block from its index: key_begin is a multiple of B and B / kMmaKeyTile a power
  // of two (B is 64 or 128, shape_rules::valid_block_size), so no division per tile.
  const int block_shift = __ffs(B / kMmaKeyTile) - 1;
  const int first_block = static_cast<int>(item.key_begin / B);
  const int slash_blocks = mma_slash_blocks(static_cast<int>(n), L, B);
  auto tile_info = [&](int j0i, int tile) {
    TileInfo t;
    t.kb = first_block + (tile >> block_shift);
    const int c_base = mma_slash_base_of(slash_blocks, t.kb);
    t.T1 = (c_base + 1) * B;
    t.T2 = (c_base + 2) * B;
    t.j0q = j0i + 2 * qd;
    t.general = fused_tile_is_general(n, L, j0i, P.w_sink, P.w_local);
    t.ends_block = ((tile + 1) & ((1 << block_shift) - 1)) == 0 || tile + 1 == tiles;  // or this CTA's keys end
    return t;
  };
  // The online softmax and masses of the two rows of one m64 half (plan_proxy_mma.cuh's
  // fused_row_update, each row with its own position), then the key block's records if the tile
  // ends one. One branch for both rows, so their independent chains interleave.
  auto update_half = [&](float (&acc)[32], int mt, const TileInfo& t) {
    if (t.general) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        fused_row_update<true>([&](int nt, int e) -> float& { return acc[4 * nt + 2 * hf + e]; }, pos[2 * mt + hf],
                               t.j0q, t.T1, t.T2, scale_log2, P.w_sink, P.w_local, rows[2 * mt + hf]);
    } else {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        fused_row_update<false>([&](int nt, int e) -> float& { return acc[4 * nt + 2 * hf + e]; }, pos[2 * mt + hf],
                                t.j0q, t.T1, t.T2, scale_log2, P.w_sink, P.w_local, rows[2 * mt + hf]);
    }
    if (t.ends_block) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int rr = 2 * mt + hf;
        const int64_t at = item.record_base + static_cast<int64_t>(t.kb) * item.record_pitch + row_in_tile[rr];
        fused_row_block_end(rows[rr], R, at, row_in_tile[rr] < rows_here);
      }
    }
  };

  attention::cp_async_wait<0>();
  // cp.async wrote the queries through the generic proxy; wgmma reads through the async proxy.
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  sync_active();  // also: the barriers' initialisation is visible to every thread
  if (tiles > 0) {
    wait_keys(0);
    issue_scores(acc0, q_desc0, 0);
    hopper::wgmma_wait<0>();
  }
  // Software pipeline over key tiles: while a warpgroup updates one m64 half's rows, the tensor
  // cores compute its other half (acc1 of this tile, then acc0 of the next). Every group is waited
  // for inside the iteration that issued it: a group pending across the loop's back edge makes
  // ptxas serialise every wgmma (C7514/C7515). Three key stages: the tile after next loads while
  // this tile's second half and the next tile's first are in flight.
  for (int tile = 0; tile < tiles; ++tile) {
    const int64_t j0 = item.key_begin + static_cast<int64_t>(tile) * kMmaKeyTile;
    const TileInfo info = tile_info(static_cast<int>(j0), tile);
    hopper::fence_registers(acc0);
    issue_scores(acc1, q_desc1, tile % kWgmmaKeyStages);
    update_half(acc0, 0, info);
    sync_active();  // every warpgroup is done with tile - 1's stage (its groups were waited for)
    if (warp == 0 && tile + 2 < tiles)
      load_keys(j0 + 2 * kMmaKeyTile, (tile + 2) % kWgmmaKeyStages, page_of_box(j0 + 2 * kMmaKeyTile));
    hopper::wgmma_wait<0>();  // acc1 of this tile
    hopper::fence_registers(acc1);
    if (tile + 1 < tiles) {
      wait_keys(tile + 1);  // loaded one iteration ago
      issue_scores(acc0, q_desc0, (tile + 1) % kWgmmaKeyStages);
    }
    update_half(acc1, 1, info);
    hopper::wgmma_wait<0>();  // acc0 of the next tile
  }

  // The softmax partials of each row for the combine kernel.
#pragma unroll
  for (int rr = 0; rr < 4; ++rr)
    store_row_partials(rows[rr].max, rows[rr].sum, P.ws.partial_stats,
                       static_cast<int64_t>(blockIdx.x) * kRows + row_in_tile[rr], row_in_tile[rr] < rows_here);
#else
  __trap();  // sm_90a code only; the planner checks hopper::kernel_available() first
#endif
}

}  // namespace planner
}  // namespace cuda_detail
}  // namespace crisp
