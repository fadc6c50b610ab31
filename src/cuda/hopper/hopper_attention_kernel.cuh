// src/cuda/hopper/hopper_attention_kernel.cuh — the block-sparse causal attention kernel for Hopper
// (sm_90a): TMA loads completed on mbarriers, wgmma tensor-core matmuls, warp specialisation.
// Same work, same math and same outputs as the portable kernel (src/cuda/attention_kernel.cuh):
// a work item is one query block r (B = 128 rows) of one query head of one sequence, computed by
// walking the key blocks listed in the CSR row r of its (sequence, head) plan in ascending order;
// a CTA computes one item or, persistent, several in turn (Scheduling, below).
//
// Roles (384 threads, three warpgroups):
//  - warpgroup 0, the producer: one thread loads the query block once and then, for each listed
//    key block, the K and the V tile (128 keys x d dims each) into a 3-stage shared-memory ring
//    with TMA (cp.async.bulk.tensor, 128-byte swizzle), completing on "full" mbarriers; it waits
//    on the ring slot's "empty" mbarrier before reusing it. The walk over the CSR column list is the
//    only place the sparsity appears: every load is a whole tile at a gathered block address.
//    It keeps 32 registers (setmaxnreg) and gives the rest to the consumers.
//  - warpgroups 1 and 2, the consumers: each owns 64 query rows of the block (wgmma's M = 64) and
//    runs S = Q K^T (wgmma, Q and K from shared memory), the online softmax in registers (base 2,
//    scale folded into one FFMA), P converted to bf16/fp16 in registers and O += P V (wgmma, P from
//    registers, V from shared memory). 232 registers each.
// NOTE (why 2 x 64 rows): with B = 128 a plan row is 128 queries, so two consumer warpgroups
// share one K/V tile stream (each tile is loaded once for 128 rows, the FA3 forward shape
// 128 x 128). Inside each consumer the next tile's S = QK^T is issued before the current tile's
// PV, and the softmax of the next tile runs while PV is on the tensor cores (intra-warpgroup
// overlap). With kPingPong the two consumers also take turns issuing their matmuls (named
// barriers), so one's softmax runs while the other's matmuls use the tensor cores; without it they
// run unsynchronised. The host picks one (CRISP_HOPPER_PINGPONG, hopper_attention.h).
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
// hardware starts CTAs in list order), or persistent CTAs (one per SM) that take the next item
// from a device counter as soon as their producer has issued the loads of the current one: the
// next query block and its first K/V tiles then load while the consumers finish the current row
// and write its output. The host picks one (CRISP_HOPPER_SCHEDULE, hopper_attention.h).
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

// NOTE: tiles are the plan's 128-token blocks (query and key); head dim 64 or 128. Other shapes
// use the portable kernel.
constexpr int kTileRows = 128;
// NOTE: 64 columns (128 bytes) per TMA box: the 128-byte swizzle mode takes boxes of at most 128
// bytes in the inner dimension, so a 128-dim tile is two 16 KB halves (dims 0-63, 64-127) and a
// 64-dim tile one.
constexpr int kHalfCols = 64;
constexpr int kHalfBytes = kTileRows * kHalfCols * 2;
template <int kDim>
constexpr int tile_bytes() { return kDim / kHalfCols * kHalfBytes; }  // 32 KB at d = 128
// NOTE: ring stages of K and V (each stage 64 KB at d = 128) plus the query block (32 KB): 2 stages
// = 160 KB, 3 stages = 224 KB (the most a CTA may take on Hopper is 227 KB); at d = 64 half of
// that. One CTA per SM either way (the 384 threads need 168 registers each at launch).
// Three stages let the producer run two tiles ahead, which matters when gathered sparse blocks
// come from HBM; on the H200 the two measured within run-to-run noise of each other (dense 32k
// 648 vs 595, 128k 591 vs 594, random 10% at 128k 500 vs 493 TFLOP/s; bench/RESULTS.md).
constexpr int kDefaultStages = 3;
constexpr int kConsumers = 2;  // consumer warpgroups, 64 query rows each
constexpr int kThreads = 128 * (1 + kConsumers);
constexpr int kQOffset = 0;
template <int kDim>
constexpr int k_offset() { return tile_bytes<kDim>(); }
template <int kDim, int kStages>
constexpr int v_offset() { return k_offset<kDim>() + kStages * tile_bytes<kDim>(); }
template <int kDim, int kStages>
constexpr int barrier_offset() { return v_offset<kDim, kStages>() + kStages * tile_bytes<kDim>(); }
// Barriers: q full, K full [kStages], V full [kStages], K empty [kStages], V empty [kStages], q empty.
template <int kStages>
constexpr int num_barriers() { return 2 + 4 * kStages; }
// After the barriers: the work item the producer hands to the consumers (int32; the host launches
// fewer than 2^31 items).
template <int kDim, int kStages>
constexpr int item_slot_offset() { return barrier_offset<kDim, kStages>() + 8 * num_barriers<kStages>(); }
// + 1024 bytes so the base can be aligned to 1024 (the 128-byte swizzle pattern repeats every
// 8 rows of 128 bytes and TMA and wgmma both derive it from the shared-memory address).
template <int kDim, int kStages>
constexpr int smem_bytes() { return item_slot_offset<kDim, kStages>() + 8 + 1024; }
static_assert(smem_bytes<128, kDefaultStages>() <= 227 * 1024, "shared memory of one CTA on Hopper");
// NOTE: register split of one 384-thread CTA: the launch gives every thread 168 registers
// (65536 / 384, rounded down to a multiple of 8), and setmaxnreg only moves registers inside that
// allocation: setmaxnreg.inc waits until other warpgroups of the CTA have released enough, so a
// split above the launch total would wait forever. 32 for the producer warpgroup (its scheduling
// loop spills at 24) and 232 for each consumer: 128 x 32 + 256 x 232 = 63488 <= 384 x 168 = 64512.
constexpr int kProducerRegisters = 32;
constexpr int kConsumerRegisters = 232;
constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
static_assert(128 * kProducerRegisters + kConsumers * 128 * kConsumerRegisters <= kThreads * kLaunchRegisters,
              "setmaxnreg.inc would wait forever for registers the CTA was not launched with");
// Named hardware barriers of the ping-pong schedule (barrier 0 is __syncthreads): consumer c waits
// on kPingPongBarrier + c before issuing its matmuls, and the other consumer arrives on it after
// issuing its own; each involves the 256 consumer threads.
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
// One 3-D box (64 dims x 128 tokens x 1 head) into shared memory, completing on `bar`.
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
template <typename T, int kDim, bool kPingPong, int kStages = kDefaultStages>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_attention_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                            const __grid_constant__ CUtensorMap map_v, const attention::Params p) {
#if defined(CRISP_HOPPER_DEVICE_CODE)
  using attention::Mma;  // pack() of two floats into bf16x2 / f16x2
  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t q_smem = smem + kQOffset;
  static_assert(kDim == 64 || kDim == 128, "head dim 64 or 128");
  constexpr int kTileBytes = tile_bytes<kDim>();
  constexpr int kHalves = kDim / kHalfCols;  // TMA boxes per tile
  const uint32_t bar_q = smem + barrier_offset<kDim, kStages>();
  auto k_smem = [&](int stage) { return smem + k_offset<kDim>() + stage * kTileBytes; };
  auto v_smem = [&](int stage) { return smem + v_offset<kDim, kStages>() + stage * kTileBytes; };
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
  auto row_of = [&](const Item& it, const layout::SequenceBases& bases, int32_t& num_tiles) {
    const int32_t* row_ptr = p.plan.row_ptr + layout::row_ptr_offset(bases, it.h, H);
    const int32_t col_begin = row_ptr[it.r];
    num_tiles = row_ptr[it.r + 1] - col_begin;
    return p.plan.col + layout::col_offset(bases, it.h, H) + col_begin;
  };
  const uint32_t bar_q_empty = bar_q + 8u * (1 + 4 * kStages);
  // The item the producer hands over: written before the query block's barrier completes, read by
  // the consumers after they waited on it (mbarrier arrive/wait order the accesses), -1 = no more.
  volatile int32_t* item_slot =
      reinterpret_cast<volatile int32_t*>(smem_raw + (smem - smem_u32(smem_raw)) + item_slot_offset<kDim, kStages>());

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
  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    // ================================================================ producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    if (threadIdx.x != 0) return;
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
      const int q_token = token0 + it.r * kTileRows;
      mbar_expect_tx(bar_q, kTileBytes);
#pragma unroll
      for (int x = 0; x < kHalves; ++x) tma_load(q_smem + x * kHalfBytes, &map_q, x * kHalfCols, q_token, it.h, bar_q);
      for (int j = 0; j < num_tiles; ++j) {
        const uint32_t t = tiles_done + j;
        const int stage = t % kStages;
        const uint32_t reuse_parity = ((t / kStages) - 1) & 1;
        const int key_token = token0 + row_cols[j] * kTileRows;
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
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
  const int consumer = warpgroup - 1;
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
  // H200 with bench/hopper_dev.cu: the swapped reading gives a relative error of ~1.)
  auto v_desc = [&](int stage) { return smem_descriptor(v_smem(stage), kHalfBytes, 1024); };
  // Offsets are added to the start-address field (bytes >> 4).
  auto dim_step = [](int kk) { return static_cast<uint64_t>(((kk / 4) * kHalfBytes + (kk % 4) * 32) >> 4); };

  constexpr int kOutRegs = kDim / 2;  // O accumulators per thread (64 rows x kDim per warpgroup)
  float o_acc[kOutRegs];
  float s_acc[64];
  uint32_t p_frag[8][4];
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
    for (int kc = 0; kc < kTileRows / 16; ++kc) Ops<T>::pv(o_acc, p_frag[kc], vd + ((kc * 16 * 128) >> 4));
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
    for (int kc = 0; kc < 8; ++kc) {
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
    const int wg_row0 = it.r * kTileRows + consumer * 64;  // first query of this warpgroup (sequence-relative)
    const int thread_row0 = wg_row0 + warp * 16 + group;     // rows thread_row0 and thread_row0 + 8

#pragma unroll
    for (int i = 0; i < kOutRegs; ++i) o_acc[i] = 0.f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;

    // Masks S of tile j (if it needs it) and turns it into exp2 values against the new row max;
    // returns through `correction` the factor for O and the row sums of earlier tiles.
    auto softmax = [&](int j, float (&correction)[2]) {
      const int key0 = row_cols[j] * kTileRows;
      if (key0 + kTileRows - 1 > wg_row0 || key0 + kTileRows > n) {
#pragma unroll
        for (int i = 0; i < 64; ++i) {
          const int key = key0 + (i / 4) * 8 + quad_lane * 2 + (i & 1);
          const int query = thread_row0 + ((i & 2) ? 8 : 0);
          if (key > query || key >= n) s_acc[i] = -INFINITY;
        }
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float m = row_max[half];
#pragma unroll
        for (int g = 0; g < 16; ++g) m = fmaxf(m, fmaxf(s_acc[g * 4 + 2 * half], s_acc[g * 4 + 2 * half + 1]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        // From -inf (no allowed key yet) the correction is exp2(-inf) = 0; an unchanged max keeps 1.
        correction[half] = m > row_max[half] ? attention::fast_exp2((row_max[half] - m) * p.scale_log2) : 1.f;
        row_max[half] = m;
        // A row with no allowed key yet keeps max -inf; subtracting 0 instead gives exp2(-inf) = 0.
        const float neg_max_scaled = m == -INFINITY ? 0.f : -m * p.scale_log2;
        float sum = 0.f;
#pragma unroll
        for (int g = 0; g < 16; ++g) {
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
                                  : p.row_items[code / H].out_token - static_cast<int64_t>(it.r) * kTileRows;
    T* out_base = static_cast<T*>(p.out) + it.h * p.o_stride_head;
    float* lse_base = p.lse + it.h * p.lse_stride_head;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = row_sum[half];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int query = thread_row0 + half * 8;
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
