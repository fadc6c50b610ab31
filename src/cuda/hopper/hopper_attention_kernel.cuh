// src/cuda/hopper/hopper_attention_kernel.cuh — the block-sparse causal attention kernel for Hopper
// (sm_90a): TMA loads completed on mbarriers, wgmma tensor-core matmuls, warp specialisation.
// Same work, same math and same outputs as the portable kernel (src/cuda/attention_kernel.cuh):
// a work item is one query block r (B = 128 or 64 rows) of one query head of one sequence, computed
// by walking the key blocks listed in the CSR row r of its (sequence, head) plan in ascending order;
// a CTA computes one item or, persistent, several in turn (Scheduling, below).
//
// Roles (B = 128: 384 threads, three warpgroups; B = 64: 160 threads, a warpgroup and a warp):
//  - the producer (warpgroup 0 at B = 128, warp 4 at B = 64): one thread loads the query block
//    once and then, for each listed key block, the K and the V tile (B keys x d dims each) into a
//    2- or 3-stage shared-memory ring with TMA (cp.async.bulk.tensor, 128-byte swizzle),
//    completing on "full" mbarriers; it waits on the ring slot's "empty" mbarrier before reusing
//    it. The walk over the CSR column list is the only place the sparsity appears: every load is a
//    whole tile at a gathered block address.
//    At B = 128 it keeps 32 registers (setmaxnreg) and gives the rest to the consumers.
//  - the consumer warpgroups (1 and 2 at B = 128, 0 at B = 64): each owns 64 query rows of
//    the block (wgmma's M = 64) and runs S = Q K^T (wgmma, Q and K from shared memory), the online
//    softmax in registers (base 2, scale folded into one FFMA), P converted to bf16/fp16 in
//    registers and O += P V (wgmma, P from registers, V from shared memory). 232 (B = 128) or 200
//    (B = 64) registers each (TileShape).
// Inside each consumer the next tile's S = QK^T is issued before the current tile's PV, and the
// softmax of the next tile runs while PV is on the tensor cores (intra-warpgroup overlap). With
// kPingPong (B = 128 only) the two consumers also take turns issuing their matmuls (named
// barriers), so one's softmax runs while the other's matmuls use the tensor cores; without it they
// run unsynchronised. The host picks one (CRISP_HOPPER_PINGPONG, hopper_attention.h). At B = 64
// two CTAs share an SM and their consumers interleave on the tensor cores without any barrier.
//
// Masking: only a tile with keys past a row's query (the diagonal block) or past the end of the
// sequence (partial last block) is masked; every other listed block is entirely allowed.
// LSE is the natural log (row max * scale + ln(row sum)), as in the portable kernel.
// Varlen batches: TMA addresses tokens of the whole batch; rows of a tile past the sequence end
// read the next sequence's tokens (or zeros past the tensor end) and are masked (keys) or not
// written (queries). Unlike the portable kernel, which zero-fills those rows, a non-finite value in
// the next sequence's V rows would reach O as 0 * inf = NaN (finite inputs give exact zeros).
//
// Scheduling: the producer takes work items (query block, head, sequence) from the plan's work
// order, heaviest rows first (src/cuda/work_order.h), and hands each to the consumers through a
// shared-memory slot published with the query block's barrier. Either one CTA per work item (the
// hardware starts CTAs in list order), or persistent CTAs (as many as fit on the SMs: one per SM
// at B = 128, at least two at B = 64) that take the next item from a device counter as soon as
// their producer has issued the loads of the current one: the next query block and its first K/V
// tiles then load while the consumers finish the current row and write its output. The host picks
// one (CRISP_HOPPER_SCHEDULE, hopper_attention.h).
#pragma once
#include <cuda.h>  // CUtensorMap (a type only; nothing is linked from the driver library)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention_kernel.cuh"
#include "cuda/hopper/wgmma.cuh"

namespace crisp {
namespace cuda_detail {
namespace hopper {

// NOTE: 64 columns (128 bytes) per TMA box: the 128-byte swizzle mode takes boxes of at most 128
// bytes in the inner dimension, so a 128-dim tile is two halves (dims 0-63, 64-127) and a 64-dim
// tile one.
constexpr int kHalfCols = 64;
// The most shared memory one SM holds on Hopper, and what the system reserves per CTA.
constexpr int kSmemPerSm = 228 * 1024;
constexpr int kSmemReservedPerCta = 1024;

// Everything that follows from the tile shape: the plan's block size kBlock (query and key tiles
// are blocks of the plan: 128 or 64 tokens) and the head dim kDim (64 or 128).
// NOTE (kBlock = 128): two consumer warpgroups of 64 query rows share one K/V tile stream (each
// tile is loaded once for 128 rows, the FA3 forward shape 128 x 128), plus a producer warpgroup:
// one 384-thread CTA per SM, registers moved from the producer to the consumers with setmaxnreg.
// NOTE (kBlock = 64): a plan row is 64 queries, one consumer warpgroup plus one producer warp:
// at least two 160-thread CTAs share an SM, so two consumers still alternate on the tensor cores,
// each on its own row and K/V stream (S is 64 x 64, wgmma m64n64k16). No setmaxnreg: the launch
// bounds allow every thread 200 registers (d = 128 uses 149). (With a whole producer warpgroup,
// 256 threads, two CTAs leave 128 registers per thread, and the d = 128 consumer spilled 56 bytes.)
template <int kDim, int kBlock>
struct TileShape {
  static_assert(kDim == 64 || kDim == 128, "head dim 64 or 128");
  static_assert(kBlock == 64 || kBlock == 128, "block size 64 or 128");
  static constexpr int kConsumers = kBlock / 64;  // consumer warpgroups, 64 query rows each
  static constexpr bool kSplitRegisters = kBlock == 128;  // setmaxnreg from a producer warpgroup
  static constexpr int kProducerThreads = kSplitRegisters ? 128 : 32;
  static constexpr int kThreads = 128 * kConsumers + kProducerThreads;
  // CTAs per SM the launch bounds and the shared-memory budget are made for (the occupancy API may
  // fit more: d = 64, B = 64 takes 118 registers and 57 KB, three per SM).
  static constexpr int kCtasPerSm = 128 / kBlock;
  static constexpr int kHalfBytes = kBlock * kHalfCols * 2;       // one TMA box
  static constexpr int kTileBytes = kDim / kHalfCols * kHalfBytes;  // 32 KB at d = 128, B = 128
  // NOTE: ring stages of K and V: three where they fit beside the query tile in this CTA's share of
  // the SM, else two (d = 128, B = 64: 3 stages would need 115,832 bytes per CTA against the
  // 115,712 each of two CTAs may take, 120 bytes over: the 1024-byte alignment slack). Three let
  // the producer run two tiles ahead, which matters when gathered sparse blocks come from HBM; at
  // B = 128 on the H200 two and three measured within run-to-run noise (dense 32k 648 vs 595,
  // 128k 591 vs 594, random 10% at 128k 500 vs 493 TFLOP/s; bench/RESULTS.md).
  static constexpr int bytes_for(int stages) {
    // query tile, K and V rings, barriers (q full, K/V full and empty per stage, q empty), the
    // item slot, and 1024 bytes to align the base (the 128-byte swizzle pattern repeats every
    // 8 rows of 128 bytes; TMA and wgmma both derive it from the shared-memory address).
    return kTileBytes * (1 + 2 * stages) + 8 * (2 + 4 * stages) + 8 + 1024;
  }
  static constexpr int kBudget = kSmemPerSm / kCtasPerSm - kSmemReservedPerCta;
  static constexpr int kStages = bytes_for(3) <= kBudget ? 3 : 2;
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kTileBytes;
  static constexpr int kVOffset = kKOffset + kStages * kTileBytes;
  static constexpr int kBarrierOffset = kVOffset + kStages * kTileBytes;
  static constexpr int kNumBarriers = 2 + 4 * kStages;
  // After the barriers: the work item the producer hands to the consumers (int32; the host launches
  // fewer than 2^31 items).
  static constexpr int kItemSlotOffset = kBarrierOffset + 8 * kNumBarriers;
  static constexpr int kSmemBytes = kItemSlotOffset + 8 + 1024;
  static_assert(kSmemBytes == bytes_for(kStages), "shared-memory layout");
  static_assert(kSmemBytes <= kBudget && kSmemBytes <= 227 * 1024, "shared memory of one CTA on Hopper");
  // NOTE: register split (B = 128): the launch gives every thread 65536 / 384 = 168 registers
  // (rounded down to a multiple of 8), and setmaxnreg only moves registers inside that allocation:
  // setmaxnreg.inc waits until other warpgroups of the CTA have released enough, so a split above
  // the launch total would wait forever. 32 for the producer warpgroup (its scheduling loop spills
  // at 24), the rest to the consumers: 128 x 32 + 2 x 128 x 232 = 63488 <= 64512.
  static constexpr int kLaunchRegisters = 65536 / (kThreads * kCtasPerSm) / 8 * 8;
  static constexpr int kProducerRegisters = 32;
  static constexpr int kConsumerRegisters =
      kSplitRegisters ? (kThreads * kLaunchRegisters - 128 * kProducerRegisters) / (128 * kConsumers) / 8 * 8
                      : kLaunchRegisters;
  static_assert(kConsumerRegisters <= 256 && kConsumerRegisters >= 200,
                "consumer registers (S, P and O in registers)");
  static_assert(!kSplitRegisters || 128 * kProducerRegisters + kConsumers * 128 * kConsumerRegisters <=
                                        kThreads * kLaunchRegisters,
                "setmaxnreg.inc would wait forever for registers the CTA was not launched with");
};
static_assert(TileShape<128, 128>::kStages == 3 && TileShape<128, 128>::kConsumerRegisters == 232, "B = 128 shape");
static_assert(TileShape<128, 64>::kStages == 2 && TileShape<64, 64>::kStages == 3 &&
                  TileShape<128, 64>::kConsumerRegisters == 200,
              "B = 64 shapes");
// Named hardware barriers of the ping-pong schedule (barrier 0 is __syncthreads): consumer c waits
// on kPingPongBarrier + c before issuing its matmuls, and the other consumer arrives on it after
// issuing its own; each involves the 256 consumer threads. Only with two consumers (B = 128).
constexpr int kPingPongBarrier = 1;

#if defined(CRISP_HOPPER_DEVICE_CODE)

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_LOOP:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_LOOP;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// One 3-D box (64 dims x the map's box tokens x 1 head: B, or 128 / g for a packed query tile)
// into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int dim0, int token, int head,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(dim0), "r"(token), "r"(head), "r"(bar)
      : "memory");
}

// wgmma shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride
// byte offsets (each >> 4).
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(leading_bytes >> 4) << 16) |
         (static_cast<uint64_t>(stride_bytes >> 4) << 32) | (1ull << 62);
}

template <typename T>
struct Ops;
template <>
struct Ops<__nv_bfloat16> {
  static __device__ __forceinline__ void qk(float (&d)[64], uint64_t a, uint64_t b, int scale_d) {
    wgmma_m64n128k16_ss_bf16(d, a, b, scale_d);
  }
  static __device__ __forceinline__ void qk(float (&d)[32], uint64_t a, uint64_t b, int scale_d) {
    wgmma_m64n64k16_ss_bf16(d, a, b, scale_d);
  }
  static __device__ __forceinline__ void pv(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    wgmma_m64n128k16_rs_bf16(d, a, b);
  }
  static __device__ __forceinline__ void pv(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
    wgmma_m64n64k16_rs_bf16(d, a, b);
  }
};
template <>
struct Ops<__half> {
  static __device__ __forceinline__ void qk(float (&d)[64], uint64_t a, uint64_t b, int scale_d) {
    wgmma_m64n128k16_ss_f16(d, a, b, scale_d);
  }
  static __device__ __forceinline__ void qk(float (&d)[32], uint64_t a, uint64_t b, int scale_d) {
    wgmma_m64n64k16_ss_f16(d, a, b, scale_d);
  }
  static __device__ __forceinline__ void pv(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    wgmma_m64n128k16_rs_f16(d, a, b);
  }
  static __device__ __forceinline__ void pv(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
    wgmma_m64n64k16_rs_f16(d, a, b);
  }
};

#endif  // CRISP_HOPPER_DEVICE_CODE

// q/k/v arrive as TMA tensor maps (3-D: dims, tokens, heads); out/lse and the plan through the
// portable kernel's parameters (the same work items, row subsets included).
//
// kPingPong: the two consumer warpgroups take turns on the tensor cores (named barriers): one
// issues its S = QK^T and PV while the other runs its softmax, as FlashAttention-3 schedules them.
// Without it the two run unsynchronised (each still overlaps its own softmax with its PV).
//
// kPacked (GQA packing, src/cuda/hopper/gqa_pack.h): item head h is packed tile h % g of kv head
// h / g (g = p.packed_group): its 128 rows are 128 / g queries of each of the group's g heads (rows
// [i 128 / g, (i + 1) 128 / g) belong to head i of the group), and its key blocks are the group's
// union row; map_q then has boxes of 128 / g tokens.
template <typename T, int kDim, int kBlock, bool kPingPong, bool kPacked = false>
__global__ void __launch_bounds__(TileShape<kDim, kBlock>::kThreads, TileShape<kDim, kBlock>::kCtasPerSm)
    hopper_attention_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                            const __grid_constant__ CUtensorMap map_v, const attention::Params p) {
#if defined(CRISP_HOPPER_DEVICE_CODE)
  using attention::Mma;  // pack() of two floats into bf16x2 / f16x2
  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem = (smem_u32(smem_raw) + 1023u) & ~1023u;
  using Shape = TileShape<kDim, kBlock>;
  constexpr int kStages = Shape::kStages;
  constexpr int kConsumers = Shape::kConsumers;
  constexpr int kTileBytes = Shape::kTileBytes;
  constexpr int kHalfBytes = Shape::kHalfBytes;
  constexpr int kHalves = kDim / kHalfCols;  // TMA boxes per tile
  static_assert(!kPingPong || kConsumers == 2, "ping-pong takes two consumer warpgroups");
  static_assert(!kPacked || kBlock == 128, "GQA packing at block size 128");
  const uint32_t q_smem = smem + Shape::kQOffset;
  const uint32_t bar_q = smem + Shape::kBarrierOffset;
  auto k_smem = [&](int stage) { return smem + Shape::kKOffset + stage * kTileBytes; };
  auto v_smem = [&](int stage) { return smem + Shape::kVOffset + stage * kTileBytes; };
  auto bar_k_full = [&](int stage) { return bar_q + 8u * (1 + stage); };
  auto bar_v_full = [&](int stage) { return bar_q + 8u * (1 + kStages + stage); };
  auto bar_k_empty = [&](int stage) { return bar_q + 8u * (1 + 2 * kStages + stage); };
  auto bar_v_empty = [&](int stage) { return bar_q + 8u * (1 + 3 * kStages + stage); };

  const int32_t H = p.num_q_heads;
  const int32_t S = p.plan.num_sequences;
  const int64_t num_items = p.num_items;
  // ---- work items: as the portable kernel's CTAs (heads fastest, then sequences, then query
  // blocks from the last, heaviest one; or, for a row-subset launch, the listed items in order),
  // taken in the plan's work order (heaviest rows first) when it has one. CTA b first takes
  // position b of that list; with a work counter (persistent CTAs, grid < item count) it then takes
  // position grid + atomicAdd(counter, 1) each time its consumers are past the last S = QK^T of
  // the current item, so an SM that finishes early takes the next heaviest row (dynamic
  // longest-processing-time-first scheduling).
  struct Item {
    int32_t h, s, r;  // r < 0: a shorter sequence of a varlen batch, nothing to do
  };
  // 32-bit arithmetic: the host launches fewer than 2^31 items, and the producer runs in 32
  // registers (64-bit divisions spill there).
  auto decode = [&](int32_t item_code) {
    const uint32_t item = static_cast<uint32_t>(item_code);
    Item it;
    it.h = static_cast<int32_t>(item % static_cast<uint32_t>(H));
    if (p.row_items == nullptr) {
      const uint32_t rest = item / static_cast<uint32_t>(H);
      it.s = static_cast<int32_t>(rest % static_cast<uint32_t>(S));
      const int32_t from_end = static_cast<int32_t>(rest / static_cast<uint32_t>(S));
      it.r = p.plan.seqs[it.s].num_blocks - 1 - from_end;
    } else {
      const attention::RowItem listed = p.row_items[item / static_cast<uint32_t>(H)];
      it.s = listed.sequence;
      it.r = listed.query_block;
    }
    return it;
  };
  // The CSR row of an item: its column list and length (>= 1: every row lists its diagonal block).
  auto row_of = [&](const Item& it, const layout::SequenceBases& bases, int32_t& num_tiles) -> const int32_t* {
    if constexpr (kPacked) {  // the group's union row
      const int32_t kv = it.h / p.packed_group, num_kv = H / p.packed_group;
      num_tiles = p.packed_len[layout::block_array_offset(bases, kv, num_kv) + it.r];
      return p.packed_col + layout::col_offset(bases, kv, num_kv) + layout::triangle_tiles(it.r);
    }
    const int32_t* row_ptr = p.plan.row_ptr + layout::row_ptr_offset(bases, it.h, H);
    const int32_t col_begin = row_ptr[it.r];
    num_tiles = row_ptr[it.r + 1] - col_begin;
    return p.plan.col + layout::col_offset(bases, it.h, H) + col_begin;
  };
  const uint32_t bar_q_empty = bar_q + 8u * (1 + 4 * kStages);
  // The item the producer hands over: written before the query block's barrier completes, read by
  // the consumers after they waited on it (mbarrier arrive/wait order the accesses), -1 = no more.
  volatile int32_t* item_slot =
      reinterpret_cast<volatile int32_t*>(smem_raw + (smem - smem_u32(smem_raw)) + Shape::kItemSlotOffset);

  if (threadIdx.x == 0) {
    mbar_init(bar_q, 1);
    // NOTE: one arrival per consumer warp (each warp releases a buffer after its own wgmma wait).
    mbar_init(bar_q_empty, kConsumers * 4);
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      mbar_init(bar_k_full(st), 1);
      mbar_init(bar_v_full(st), 1);
      mbar_init(bar_k_empty(st), kConsumers * 4);
      mbar_init(bar_v_empty(st), kConsumers * 4);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  // Ring position: the producer and the consumers walk the same items in the same order, so the
  // running tile count t gives both the slot (t % kStages) and the barrier phase ((t / kStages) & 1).
  // B = 128: warpgroup 0 produces, warpgroups 1 and 2 consume; B = 64: warpgroup 0 consumes and
  // warp 4 produces (wgmma takes a warpgroup of four warps starting at a multiple of four).
  const int thread = static_cast<int>(threadIdx.x);
  const int producer_thread0 = Shape::kSplitRegisters ? 0 : 128 * kConsumers;
  if (thread >= producer_thread0 && thread < producer_thread0 + Shape::kProducerThreads) {
    // ================================================================ producer
    if constexpr (Shape::kSplitRegisters)
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Shape::kProducerRegisters));
    if (thread != producer_thread0) return;
    uint32_t tiles_done = 0, items_done = 0;
    const uint32_t item_count = static_cast<uint32_t>(num_items);
    bool first = true;
    while (true) {
      // The consumers release the query buffer (and the item slot) once the last S = QK^T of the
      // previous item is done; only then is the next item taken, so an item is committed to this
      // CTA as late as possible.
      if (items_done > 0) mbar_wait(bar_q_empty, (items_done - 1) & 1);
      int32_t code = -1;  // the next item, -1 = no more
      Item it{};
      while (true) {
        // 32-bit: fewer than 2^31 items (checked by the host), and the producer has few registers.
        uint32_t position = item_count;  // in the work list; item_count = nothing left
        if (first) position = blockIdx.x;
        else if (p.work_counter != nullptr) position = gridDim.x + static_cast<uint32_t>(atomicAdd(p.work_counter, 1));
        first = false;
        if (position >= item_count) break;
        code = p.work_order != nullptr ? p.work_order[position] : static_cast<int32_t>(position);
        it = decode(code);
        if (it.r >= 0) break;
        code = -1;  // a shorter sequence of a varlen batch: nothing to do, take another
      }
      *item_slot = code;
      if (code < 0) {
        mbar_arrive(bar_q);  // completes the phase without data: the consumers read -1 and stop
        break;
      }
      const layout::SequenceBases bases = p.plan.seqs[it.s];
      int32_t num_tiles;
      const int32_t* row_cols = row_of(it, bases, num_tiles);
      const int32_t token0 = static_cast<int32_t>(bases.token_offset);  // TMA coordinates are int32
      const int32_t kv_head = it.h / p.q_per_kv;
      const int q_token = token0 + it.r * kBlock;
      mbar_expect_tx(bar_q, kTileBytes);
      if constexpr (kPacked) {
        // Head i of the group: 128 / g queries from the tile's offset, at rows i 128 / g (a multiple
        // of 8 rows, so each box starts a 128-byte swizzle atom).
        const int rows_per_head = kBlock / p.packed_group;
        const int first_query = q_token + (it.h % p.packed_group) * rows_per_head;
        for (int i = 0; i < p.packed_group; ++i) {
#pragma unroll
          for (int x = 0; x < kHalves; ++x)
            tma_load(q_smem + x * kHalfBytes + i * rows_per_head * 128, &map_q, x * kHalfCols, first_query,
                     kv_head * p.packed_group + i, bar_q);
        }
      } else {
#pragma unroll
        for (int x = 0; x < kHalves; ++x)
          tma_load(q_smem + x * kHalfBytes, &map_q, x * kHalfCols, q_token, it.h, bar_q);
      }
      for (int j = 0; j < num_tiles; ++j) {
        const uint32_t t = tiles_done + j;
        const int stage = t % kStages;
        const uint32_t reuse_parity = ((t / kStages) - 1) & 1;
        const int key_token = token0 + row_cols[j] * kBlock;
        if (t >= kStages) mbar_wait(bar_k_empty(stage), reuse_parity);
        mbar_expect_tx(bar_k_full(stage), kTileBytes);
#pragma unroll
        for (int x = 0; x < kHalves; ++x)
          tma_load(k_smem(stage) + x * kHalfBytes, &map_k, x * kHalfCols, key_token, kv_head, bar_k_full(stage));
        if (t >= kStages) mbar_wait(bar_v_empty(stage), reuse_parity);
        mbar_expect_tx(bar_v_full(stage), kTileBytes);
#pragma unroll
        for (int x = 0; x < kHalves; ++x)
          tma_load(v_smem(stage) + x * kHalfBytes, &map_v, x * kHalfCols, key_token, kv_head, bar_v_full(stage));
      }
      tiles_done += num_tiles;
      ++items_done;
    }
    return;
  }

  // ================================================================ consumers
  if constexpr (Shape::kSplitRegisters)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Shape::kConsumerRegisters));
  const int consumer = Shape::kSplitRegisters ? threadIdx.x / 128 - 1 : 0;
  const int warp = (threadIdx.x / 32) % 4;
  const int lane = threadIdx.x % 32;
  const int group = lane / 4;      // accumulator row within an 8-row half
  const int quad_lane = lane % 4;  // accumulator column pair
  // Descriptors. Q and K are K-major (dims contiguous): the 128-byte swizzle atom is 8 rows x 128
  // bytes, so the stride between 8-row groups is 1024 bytes and the leading offset is unused; a
  // 16-dim k-step advances 32 bytes inside the atom, the second 64 dims are the next half.
  // V is MN-major for PV (dims contiguous, keys the reduction dimension): a 16-key k-step is two
  // 8-key atoms (1024 bytes apart) and 128 dims are two 64-dim halves (kHalfBytes apart; at d = 64
  // the single half leaves the leading offset unused).
  const uint64_t q_desc = smem_descriptor(q_smem + consumer * 64 * 128, 16, 1024);
  auto k_desc = [&](int stage) { return smem_descriptor(k_smem(stage), 16, 1024); };
  // For MN-major operands the leading offset is the stride between 64-element atoms along N (the
  // dims) and the stride offset the one between 8-row groups along K (the keys). (Checked on the
  // H200: the swapped reading gives a relative error of ~1.)
  auto v_desc = [&](int stage) { return smem_descriptor(v_smem(stage), kHalfBytes, 1024); };
  // Offsets are added to the start-address field (bytes >> 4).
  auto dim_step = [](int kk) { return static_cast<uint64_t>(((kk / 4) * kHalfBytes + (kk % 4) * 32) >> 4); };

  constexpr int kOutRegs = kDim / 2;  // O accumulators per thread (64 rows x kDim per warpgroup)
  float o_acc[kOutRegs];
  constexpr int kScoreRegs = kBlock / 2;  // S accumulators per thread (64 rows x kBlock keys per warpgroup)
  constexpr int kColumnGroups = kBlock / 8;  // 8-key column groups of S (4 accumulators each per thread)
  float s_acc[kScoreRegs];
  uint32_t p_frag[kBlock / 16][4];
  float row_max[2], row_sum[2];  // row_sum: this thread's columns only; the quad is summed at the end

  // S = Q K^T of ring tile t into s_acc (issued, not waited for).
  auto issue_qk = [&](uint32_t t) {
    const int stage = t % kStages;
    mbar_wait(bar_k_full(stage), (t / kStages) & 1);
    fence_registers(s_acc);
    wgmma_fence();
    const uint64_t kd = k_desc(stage);
#pragma unroll
    for (int kk = 0; kk < kDim / 16; ++kk) Ops<T>::qk(s_acc, q_desc + dim_step(kk), kd + dim_step(kk), kk > 0);
    wgmma_commit();
  };
  // O += P V of ring tile t (issued, not waited for).
  auto issue_pv = [&](uint32_t t) {
    const int stage = t % kStages;
    mbar_wait(bar_v_full(stage), (t / kStages) & 1);
    fence_registers(o_acc);
    wgmma_fence();
    const uint64_t vd = v_desc(stage);
#pragma unroll
    for (int kc = 0; kc < kBlock / 16; ++kc) Ops<T>::pv(o_acc, p_frag[kc], vd + ((kc * 16 * 128) >> 4));
    wgmma_commit();
  };
  auto release = [&](uint32_t bar) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
  };
  // P (the exp2 values in s_acc) into the A-fragment layout of PV: k-step kc covers keys
  // 16 kc .. 16 kc + 15, i.e. accumulator column groups 2 kc and 2 kc + 1.
  auto convert_p = [&] {
#pragma unroll
    for (int kc = 0; kc < kBlock / 16; ++kc) {
      p_frag[kc][0] = Mma<T>::pack(s_acc[8 * kc + 0], s_acc[8 * kc + 1]);
      p_frag[kc][1] = Mma<T>::pack(s_acc[8 * kc + 2], s_acc[8 * kc + 3]);
      p_frag[kc][2] = Mma<T>::pack(s_acc[8 * kc + 4], s_acc[8 * kc + 5]);
      p_frag[kc][3] = Mma<T>::pack(s_acc[8 * kc + 6], s_acc[8 * kc + 7]);
    }
  };
  auto rescale_o = [&](const float (&correction)[2]) {
#pragma unroll
    for (int i = 0; i < kOutRegs; ++i) o_acc[i] *= correction[(i & 2) ? 1 : 0];
  };

  // Ping-pong turns: consumer c waits for its turn before issuing a round of matmuls and hands the
  // turn to the other after issuing; consumer 0 goes first. Both consumers walk the same items and
  // tiles, so they issue the same number of rounds and the turns strictly alternate.
  auto begin_turn = [&] {
    if constexpr (kPingPong) named_barrier_sync(kPingPongBarrier + consumer, 2 * 128);
  };
  auto end_turn = [&] {
    if constexpr (kPingPong) named_barrier_arrive(kPingPongBarrier + (1 - consumer), 2 * 128);
  };
  if (consumer == 1) end_turn();  // consumer 0's first turn

  uint32_t tiles_done = 0, items_done = 0;
  while (true) {
    mbar_wait(bar_q, items_done & 1);
    const int32_t code = *item_slot;
    if (code < 0) break;
    const Item it = decode(code);
    const layout::SequenceBases bases = p.plan.seqs[it.s];
    int32_t num_tiles;
    const int32_t* row_cols = row_of(it, bases, num_tiles);
    const int32_t n = static_cast<int32_t>(bases.n);
    // This thread's two accumulator rows (tile rows tile_row0 and tile_row0 + 8): their queries
    // (sequence-relative) and heads; and the first query of this warpgroup's rows.
    const int tile_row0 = consumer * 64 + warp * 16 + group;
    int row_query[2], row_head[2], wg_row0;
    if constexpr (kPacked) {
      const int rows_per_head = kBlock / p.packed_group;
      const int query0 = it.r * kBlock + (it.h % p.packed_group) * rows_per_head;
      const int head0 = it.h - it.h % p.packed_group;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        row_query[half] = query0 + (tile_row0 + 8 * half) % rows_per_head;
        row_head[half] = head0 + (tile_row0 + 8 * half) / rows_per_head;
      }
      wg_row0 = query0;  // every head of the tile starts at query0
    } else {
      wg_row0 = it.r * kBlock + consumer * 64;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        row_query[half] = it.r * kBlock + tile_row0 + 8 * half;
        row_head[half] = it.h;
      }
    }

#pragma unroll
    for (int i = 0; i < kOutRegs; ++i) o_acc[i] = 0.f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;

    // Only the row's last tile can need a mask: the columns ascend, the last is the diagonal block
    // r (every row lists it), so every earlier key precedes every query of the block and lies
    // inside the sequence. Its column is read once per item, not once per tile: a global load in
    // the softmax's path stalls the consumers, on an L2 miss for a microsecond.
    const int last_key0 = row_cols[num_tiles - 1] * kBlock;
    // Masks S of tile j (if it needs it) and turns it into exp2 values against the new row max;
    // returns through `correction` the factor for O and the row sums of earlier tiles.
    auto softmax = [&](int j, float (&correction)[2]) {
      const int key0 = last_key0;
      if (j == num_tiles - 1 && (key0 + kBlock - 1 > wg_row0 || key0 + kBlock > n)) {
#pragma unroll
        for (int i = 0; i < kScoreRegs; ++i) {
          const int key = key0 + (i / 4) * 8 + quad_lane * 2 + (i & 1);
          const int query = row_query[(i & 2) ? 1 : 0];
          if (key > query || key >= n) s_acc[i] = -INFINITY;
        }
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float m = row_max[half];
#pragma unroll
        for (int g = 0; g < kColumnGroups; ++g)
          m = fmaxf(m, fmaxf(s_acc[g * 4 + 2 * half], s_acc[g * 4 + 2 * half + 1]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        // From -inf (no allowed key yet) the correction is exp2(-inf) = 0; an unchanged max keeps 1.
        correction[half] = m > row_max[half] ? attention::fast_exp2((row_max[half] - m) * p.scale_log2) : 1.f;
        row_max[half] = m;
        // A row with no allowed key yet keeps max -inf; subtracting 0 instead gives exp2(-inf) = 0.
        const float neg_max_scaled = m == -INFINITY ? 0.f : -m * p.scale_log2;
        float sum = 0.f;
#pragma unroll
        for (int g = 0; g < kColumnGroups; ++g) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s_acc[g * 4 + 2 * half + e];
            x = attention::fast_exp2(fmaf(x, p.scale_log2, neg_max_scaled));
            sum += x;
          }
        }
        row_sum[half] = row_sum[half] * correction[half] + sum;
      }
    };

    // ---- tile 0
    begin_turn();
    issue_qk(tiles_done);
    end_turn();
    wgmma_wait<0>();
    fence_registers(s_acc);
    release(bar_k_empty(tiles_done % kStages));
    {
      float correction[2];
      softmax(0, correction);  // O is zero: no rescale
      convert_p();
    }
    // ---- tiles 1 .. num_tiles-1: S(j) is issued before PV(j-1); the softmax of tile j runs while
    // PV(j-1) is on the tensor cores.
    for (int j = 1; j < num_tiles; ++j) {
      const uint32_t t = tiles_done + j;
      begin_turn();
      issue_qk(t);
      issue_pv(t - 1);
      end_turn();
      wgmma_wait<1>();  // S(j) done (groups complete in order)
      fence_registers(s_acc);
      release(bar_k_empty(t % kStages));
      float correction[2];
      softmax(j, correction);
      wgmma_wait<0>();  // PV(j-1) done: O and the P registers are free again
      fence_registers(o_acc);
      release(bar_v_empty((t - 1) % kStages));
      rescale_o(correction);
      convert_p();
    }
    // Every S = QK^T of the item is done: the producer may load the next item's query block.
    release(bar_q_empty);
    const uint32_t last = tiles_done + num_tiles - 1;
    begin_turn();
    issue_pv(last);
    end_turn();
    wgmma_wait<0>();
    fence_registers(o_acc);
    release(bar_v_empty(last % kStages));

    // ---- epilogue: full row sums, normalise, write O (input dtype) and LSE (natural log)
    const int64_t out_shift = p.row_items == nullptr
                                  ? bases.token_offset
                                  : p.row_items[code / H].out_token - static_cast<int64_t>(it.r) * kBlock;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      T* out_base = static_cast<T*>(p.out) + row_head[half] * p.o_stride_head;
      float* lse_base = p.lse + row_head[half] * p.lse_stride_head;
      float sum = row_sum[half];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int query = row_query[half];
      if (query >= n) continue;
      // Every row lists its diagonal block, whose first key precedes every query of the block, so sum > 0.
      const float inv = 1.f / sum;
      T* out_row = out_base + (out_shift + query) * p.o_stride_token;
#pragma unroll
      for (int g = 0; g < kDim / 8; ++g) {
        const uint32_t packed = Mma<T>::pack(o_acc[g * 4 + 2 * half] * inv, o_acc[g * 4 + 2 * half + 1] * inv);
        *reinterpret_cast<uint32_t*>(out_row + g * 8 + quad_lane * 2) = packed;
      }
      if (quad_lane == 0) lse_base[(out_shift + query) * p.lse_stride_token] = row_max[half] * p.scale + logf(sum);
    }
    tiles_done += num_tiles;
    ++items_done;
  }
  // Consumer 1 handed consumer 0 one more turn than consumer 0 took (its first arrival came before
  // any round): take it, so the named barrier ends the kernel balanced.
  if (consumer == 0) begin_turn();
#elif defined(__CUDA_ARCH__)
  // Compiled for an architecture without wgmma/setmaxnreg (the sm_80 pass): the host never
  // launches this (hopper::kernel_available checks the loaded binary); trap rather than return
  // silently if it ever runs.
  __trap();
#endif  // CRISP_HOPPER_DEVICE_CODE
}

}  // namespace hopper
}  // namespace cuda_detail
}  // namespace crisp
