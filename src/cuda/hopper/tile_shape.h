// src/cuda/hopper/tile_shape.h — what follows from the Hopper kernel's tile shape: thread roles,
// shared-memory layout and ring depth, register split. Host and device code (the launch reads the
// thread count and shared-memory size from here).
#pragma once

#include <cstdint>

namespace crisp {
namespace cuda_detail {
namespace hopper {

// NOTE: 64 columns (128 bytes) per TMA box: the 128-byte swizzle mode takes boxes of at most 128
// bytes in the inner dimension, so a 128-dim tile is two halves (dims 0-63, 64-127), a 256-dim
// tile four such boxes and a 64-dim tile one.
constexpr int kHalfCols = 64;
// The most shared memory one SM holds on Hopper, and what the system reserves per CTA.
constexpr int kSmemPerSm = 228 * 1024;
constexpr int kSmemReservedPerCta = 1024;

// Everything that follows from the tile shape: the plan's block size kBlock (query and key tiles
// are blocks of the plan: 128 or 64 tokens) and the head dim kDim (64, 128 or 256).
// NOTE (kBlock = 128): two consumer warpgroups of 64 query rows share one K/V tile stream (each
// tile is loaded once for 128 rows, the FA3 forward shape 128 x 128), plus a producer warpgroup:
// one 384-thread CTA per SM, registers moved from the producer to the consumers with setmaxnreg.
// NOTE (kBlock = 64): a plan row is 64 queries, one consumer warpgroup plus one producer warp:
// at least two 160-thread CTAs share an SM, so two consumers still alternate on the tensor cores,
// each on its own row and K/V stream (S is 64 x 64, wgmma m64n64k16). No setmaxnreg: the launch
// bounds allow every thread 200 registers (d = 128 uses 149). (With a whole producer warpgroup,
// 256 threads, two CTAs leave 128 registers per thread, and the d = 128 consumer spilled 56 bytes.)
// NOTE (kDim = 256): one CTA per SM at both block sizes. A 256-dim tile is 32 KB (B = 64) or 64 KB
// (B = 128), so two CTAs cannot share an SM's shared memory, and O alone is 64 x 256 fp32 per
// consumer warpgroup, 128 registers per thread. B = 64: Q 32 KB + three stages of K and V = 224 KB,
// up to 255 registers per thread (160 threads, no setmaxnreg). B = 128: Q 64 KB + one stage of K and
// V (64 KB each) = 192 KB (two stages would need 320 KB), the same 232-register consumers as d = 128,
// and each consumer waits for PV(j-1) before it issues S(j) (kOverlapPv false): S (64), P (32) and
// O (128) live at once would not fit 232, and with one stage a paged tile's loads wait for the slot's
// V, which the overlapped order releases only after the next S. (ptxas: 8 bytes spilled, 92 in the
// GQA-packed variant, which is off by default.)
template <int kDim, int kBlock>
struct TileShape {
  static_assert(kDim == 64 || kDim == 128 || kDim == 256, "head dim 64, 128 or 256");
  static_assert(kBlock == 64 || kBlock == 128, "block size 64 or 128");
  static constexpr int kConsumers = kBlock / 64;  // consumer warpgroups, 64 query rows each
  static constexpr bool kSplitRegisters = kBlock == 128;  // setmaxnreg from a producer warpgroup
  static constexpr int kProducerThreads = kSplitRegisters ? 128 : 32;
  static constexpr int kThreads = 128 * kConsumers + kProducerThreads;
  // CTAs per SM the launch bounds and the shared-memory budget are made for (the occupancy API may
  // fit more: d = 64, B = 64 takes 118 registers and 57 KB, three per SM).
  static constexpr int kCtasPerSm = kDim == 256 ? 1 : 128 / kBlock;
  static constexpr int kHalfBytes = kBlock * kHalfCols * 2;       // one TMA box
  static constexpr int kTileBytes = kDim / kHalfCols * kHalfBytes;  // 32 KB at d = 128, B = 128
  // NOTE: ring stages of K and V: three where they fit beside the query tile in this CTA's share of
  // the SM, else two (d = 128, B = 64: 3 stages would need 115,872 bytes per CTA against the
  // 115,712 each of two CTAs may take, 160 bytes over: the 1024-byte alignment slack). Three let
  // the producer run two tiles ahead, which matters when gathered sparse blocks come from HBM; at
  // B = 128 on the H200 two and three measured within run-to-run noise (bench/RESULTS.md).
  static constexpr int bytes_for(int stages) {
    // query tile, K and V rings, barriers (q full, K/V full and empty per stage, q empty), the
    // item slot, the loader warps' item ring (full and empty barriers per entry, the two entries;
    // after everything else, so the other kernels' offsets do not move), the item's first two key
    // blocks (a sliding window's edge tiles), and 1024 bytes
    // to align the base (the 128-byte swizzle pattern repeats every 8 rows of 128 bytes; TMA and
    // wgmma both derive it from the shared-memory address).
    return kTileBytes * (1 + 2 * stages) + 8 * (2 + 4 * stages) + 8 + 8 * 4 + 8 + 8 + 1024;
  }
  static constexpr int kBudget = kSmemPerSm / kCtasPerSm - kSmemReservedPerCta;
  static constexpr int kStages = bytes_for(3) <= kBudget ? 3 : bytes_for(2) <= kBudget ? 2 : 1;
  // S(j) issued before PV(j-1), so the softmax of one tile overlaps the previous tile's PV (see the
  // kDim = 256 note for where it is off).
  static constexpr bool kOverlapPv = !(kDim == 256 && kBlock == 128);
  static_assert(kStages > 1 || !kOverlapPv, "one stage needs the serial order (paged loads wait for V)");
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kTileBytes;
  static constexpr int kVOffset = kKOffset + kStages * kTileBytes;
  static constexpr int kBarrierOffset = kVOffset + kStages * kTileBytes;
  static constexpr int kNumBarriers = 2 + 4 * kStages;
  // After the barriers: the work item the producer hands to the consumers, then the loader warps'
  // item ring: its 4 mbarriers and two entries (int32 each; the host launches fewer than 2^31 items).
  static constexpr int kItemSlotOffset = kBarrierOffset + 8 * kNumBarriers;
  static constexpr int kItemRingBarrierOffset = kItemSlotOffset + 8;
  static constexpr int kItemRingOffset = kItemRingBarrierOffset + 8 * 4;
  // The item's first two listed key blocks (int32 each), for a sliding window's edge (§12).
  static constexpr int kWindowColsOffset = kItemRingOffset + 8;
  static constexpr int kSmemBytes = kWindowColsOffset + 8 + 1024;
  static_assert(kSmemBytes == bytes_for(kStages), "shared-memory layout");
  static_assert(kSmemBytes <= kBudget && kSmemBytes <= 227 * 1024, "shared memory of one CTA on Hopper");
  // NOTE: register split (B = 128): the launch gives every thread 65536 / 384 = 168 registers
  // (rounded down to a multiple of 8), and setmaxnreg only moves registers inside that allocation:
  // setmaxnreg.inc waits until other warpgroups of the CTA have released enough, so a split above
  // the launch total would wait forever. 40 for the producer warpgroup (its scheduling loop spills
  // at 24; the paged K/V loads, a warp looking up page ids a tile ahead, spilled 48-72 bytes at 32,
  // and at d = 256 four TMA boxes per tile spilled 140-190 bytes at 32), the rest to the consumers:
  // 128 x 40 + 2 x 128 x 232 = 64512, the whole launch allocation (48 would cut them to 224, and
  // they spilled).
  // (capped at 255, the most one thread may have: d = 256, B = 64 runs 160 threads alone on an SM)
  static constexpr int kLaunchRegisters =
      65536 / (kThreads * kCtasPerSm) / 8 * 8 < 255 ? 65536 / (kThreads * kCtasPerSm) / 8 * 8 : 255;
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters =
      kSplitRegisters ? (kThreads * kLaunchRegisters - 128 * kProducerRegisters) / (128 * kConsumers) / 8 * 8
                      : kLaunchRegisters;
  static_assert(kConsumerRegisters <= 255 && kConsumerRegisters >= 200,
                "consumer registers (S, P and O in registers)");
  static_assert(!kSplitRegisters || 128 * kProducerRegisters + kConsumers * 128 * kConsumerRegisters <=
                                        kThreads * kLaunchRegisters,
                "setmaxnreg.inc would wait forever for registers the CTA was not launched with");
};
static_assert(TileShape<128, 128>::kStages == 3 && TileShape<128, 128>::kConsumerRegisters == 232, "B = 128 shape");
static_assert(TileShape<128, 64>::kStages == 2 && TileShape<64, 64>::kStages == 3 &&
                  TileShape<128, 64>::kConsumerRegisters == 200,
              "B = 64 shapes");
static_assert(TileShape<256, 64>::kStages == 3 && TileShape<256, 64>::kCtasPerSm == 1 &&
                  TileShape<256, 64>::kConsumerRegisters == 255 && TileShape<256, 64>::kOverlapPv,
              "d = 256, B = 64 shape");
static_assert(TileShape<256, 128>::kStages == 1 && TileShape<256, 128>::kConsumerRegisters == 232 &&
                  !TileShape<256, 128>::kOverlapPv,
              "d = 256, B = 128 shape");
// Named hardware barriers of the ping-pong schedule (barrier 0 is __syncthreads): consumer c waits
// on kPingPongBarrier + c before issuing its matmuls, and the other consumer arrives on it after
// issuing its own; each involves the 256 consumer threads. Only with two consumers (B = 128).
constexpr int kPingPongBarrier = 1;
// Named barrier 3: every consumer thread, after zeroing the V rows past the sequence end
// (ConsumerMainloop), before the PV that reads them.
constexpr int kTailBarrier = 3;

// The rows of one K/V TMA box for paged K/V: gcd(page_size, B), a power of two >= 16 (page sizes
// are multiples of 16, B a power of two), so a box never crosses a page and starts a swizzle atom.
__host__ __device__ constexpr int paged_box_rows(int page_size, int block) {
  return (page_size & -page_size) < block ? (page_size & -page_size) : block;
}
static_assert(paged_box_rows(16, 128) == 16 && paged_box_rows(64, 64) == 64 && paged_box_rows(256, 128) == 128 &&
                  paged_box_rows(48, 128) == 16 && paged_box_rows(80, 64) == 16 && paged_box_rows(96, 64) == 32,
              "a box divides both the page and the tile");
// Paged K/V whose pages hold whole key tiles (the page size a multiple of B: tiles start at multiples
// of B, so none crosses a page) load each tile as contiguous K/V do, one 4-D box parts first from
// its page's pool row (make_tile_map over the pool); smaller pages use the groups-first boxes.
__host__ __device__ constexpr bool whole_tile_pages(int page_size, int block) { return page_size % block == 0; }
// Whether a launch's K/V tiles come as groups-first page boxes (make_paged_tile_map) rather than one
// parts-first box each (make_tile_map): paged K/V, unless the kernel has loader warps and the pages
// hold whole tiles. The host's map and the kernel's loads and descriptors all follow it.
__host__ __device__ constexpr bool kv_page_boxes(bool paged, bool loader_warps, int page_size, int block) {
  return paged && !(loader_warps && whole_tile_pages(page_size, block));
}

// A K/V tile's shared-memory layout, as the consumers' wgmma descriptors read it: 8-row groups of
// 128-byte rows in the 128-byte swizzle (one 1024-byte atom per group and 64-dim part), `group`
// bytes from one group of a part to the next (the stride offset along the keys), `part` bytes from
// one 64-dim part of a row to the next.
//  - parts first (contiguous K/V): all B rows of part 0, then of part 1, ... (group 1024, part
//    B x 128): one 4-D TMA box of the whole tile;
//  - groups first (paged K/V): the parts of rows 0-7, then of rows 8-15, ... (group d / 64 x 1024,
//    part 1024): a box of R rows (paged_box_rows, a multiple of 16) is then R x d x 2 contiguous
//    bytes, one 5-D TMA box at any page size, where parts first would take d / 64 boxes of R < B
//    rows (TMA's cost is per box: bench/RESULTS.md, session 20).
// Both keep every part's 8-row groups at one stride, which S = QK^T (K-major, all B keys in one
// wgmma) and PV (V MN-major, 16 keys a k-step) need.
struct TileLayout {
  uint32_t group;  // bytes between consecutive 8-row groups of one part
  uint32_t part;   // bytes between consecutive 64-dim parts of one row
};
__host__ __device__ constexpr TileLayout tile_layout(bool groups_first, int block, int parts) {
  return groups_first ? TileLayout{1024u * static_cast<uint32_t>(parts), 1024u}
                      : TileLayout{1024u, 128u * static_cast<uint32_t>(block)};
}
// Byte offset of row `row` of part 0.
__host__ __device__ constexpr uint32_t tile_row_bytes(TileLayout layout, int row) {
  return (static_cast<uint32_t>(row) >> 3) * layout.group + (static_cast<uint32_t>(row) & 7u) * 128u;
}
static_assert(tile_row_bytes(tile_layout(false, 128, 2), 100) == 100 * 128 && tile_layout(false, 128, 2).part == 16384 &&
                  tile_row_bytes(tile_layout(true, 128, 2), 16) == 4096 &&
                  tile_row_bytes(tile_layout(true, 128, 4), 21) == 2 * 4096 + 5 * 128 &&
                  tile_row_bytes(tile_layout(true, 64, 1), 21) == 21 * 128,
              "K/V tile rows: parts first or groups first (one part: the same layout)");

}  // namespace hopper
}  // namespace cuda_detail
}  // namespace crisp
