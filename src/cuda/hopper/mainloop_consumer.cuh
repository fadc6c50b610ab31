// src/cuda/hopper/mainloop_consumer.cuh — the Hopper kernel's consumer warpgroup mainloop for one
// work item: S = Q K^T (wgmma, Q and K from shared memory), the online softmax in registers, P
// converted to bf16/fp16 in registers and O += P V (wgmma, P from registers, V from shared memory).
// Each consumer owns 64 query rows of the block (wgmma's M = 64).
//
// Inside a consumer the next tile's S = QK^T is issued before the current tile's PV, and the
// softmax of the next tile runs while PV is on the tensor cores (intra-warpgroup overlap). With
// kPingPong (two consumers) they also take turns issuing their matmuls (named barriers), so one's
// softmax runs while the other's matmuls use the tensor cores, as FlashAttention-3 schedules them;
// without it they run unsynchronised.
//
// Masking: only a tile with keys past a row's query (the diagonal block), past the end of the
// sequence (partial last block) or, with a sliding window, before a row's window (the row's first
// one or two listed blocks) is masked; every other listed block is entirely allowed.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/attention_kernel.cuh"  // Mma<T>::pack
#include "cuda/hopper/shared_storage.cuh"
#include "cuda/hopper/sm90_primitives.cuh"
#include "cuda/hopper/softmax.cuh"
#include "cuda/hopper/tile_scheduler.cuh"
#include "cuda/hopper/tile_shape.h"
#include "cuda/hopper/wgmma.cuh"

namespace crisp {
namespace cuda_detail {
namespace hopper {

#if defined(CRISP_HOPPER_DEVICE_CODE)

// The wgmma shapes of one element type: S = Q K^T (both from shared memory) and O += P V (P from
// registers), for 128- and 64-wide tiles (and, for PV, 256-wide: head dim 256).
template <typename T>
struct Ops {
  static_assert(std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value, "bf16 or fp16");
  static constexpr bool kBf16 = std::is_same<T, __nv_bfloat16>::value;
  static __device__ __forceinline__ void qk(float (&d)[64], uint64_t a, uint64_t b, int scale_d) {
    if constexpr (kBf16) wgmma_m64n128k16_ss_bf16(d, a, b, scale_d);
    else wgmma_m64n128k16_ss_f16(d, a, b, scale_d);
  }
  static __device__ __forceinline__ void qk(float (&d)[32], uint64_t a, uint64_t b, int scale_d) {
    if constexpr (kBf16) wgmma_m64n64k16_ss_bf16(d, a, b, scale_d);
    else wgmma_m64n64k16_ss_f16(d, a, b, scale_d);
  }
  static __device__ __forceinline__ void pv(float (&d)[128], const uint32_t (&a)[4], uint64_t b) {
    if constexpr (kBf16) wgmma_m64n256k16_rs_bf16(d, a, b);
    else wgmma_m64n256k16_rs_f16(d, a, b);
  }
  static __device__ __forceinline__ void pv(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    if constexpr (kBf16) wgmma_m64n128k16_rs_bf16(d, a, b);
    else wgmma_m64n128k16_rs_f16(d, a, b);
  }
  static __device__ __forceinline__ void pv(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
    if constexpr (kBf16) wgmma_m64n64k16_rs_bf16(d, a, b);
    else wgmma_m64n64k16_rs_f16(d, a, b);
  }
};

// kWindow: the launch has a sliding window (§12); its kernels alone carry the window's edge masks.
template <typename T, int kDim, int kBlock, bool kPingPong, bool kWindow = false>
class ConsumerMainloop {
 public:
  using Shape = TileShape<kDim, kBlock>;
  using Softmax = OnlineSoftmax<kBlock>;
  static constexpr int kStages = Shape::kStages;
  static constexpr int kOutRegs = kDim / 2;  // O accumulators per thread (64 rows x kDim per warpgroup)
  static constexpr int kHalves = kDim / kHalfCols;  // 64-dim halves of a tile row
  static_assert(!kPingPong || Shape::kConsumers == 2, "ping-pong takes two consumer warpgroups");

  // Descriptors. Q and K are K-major (dims contiguous): the 128-byte swizzle atom is 8 rows x 128
  // bytes, the leading offset is unused and a 16-dim k-step advances 32 bytes inside the atom. Q's
  // 8-row groups are 1024 bytes apart and its second 64 dims the next half; K's follow its layout
  // (kv_: 1024 and a half apart, or groups first).
  // `kv_groups_first`: the K/V tiles' layout (paged K/V: groups first; tile_shape.h, TileLayout).
  __device__ __forceinline__ ConsumerMainloop(const SharedStorage<kDim, kBlock>& storage, int consumer, int lane,
                                              bool kv_groups_first)
      : storage_(storage),
        consumer_(consumer),
        lane_(lane),
        kv_(tile_layout(kv_groups_first, kBlock, kHalves)),
        q_desc_(smem_descriptor(storage.q() + consumer * 64 * 128, 16, 1024)) {}

  // Waits for the producer's next item and returns its code (-1: no more).
  __device__ __forceinline__ int32_t wait_item() const {
    mbar_wait(storage_.bar_q(), items_done_ & 1);
    return storage_.read_item();
  }

  // Ping-pong turns: consumer c waits for its turn before issuing a round of matmuls and hands the
  // turn to the other after issuing; consumer 0 goes first. Both consumers walk the same items and
  // tiles, so they issue the same number of rounds and the turns strictly alternate.
  __device__ __forceinline__ void first_turn() const {
    if (consumer_ == 1) end_turn();  // consumer 0's first turn
  }
  // Consumer 1 handed consumer 0 one more turn than consumer 0 took (its first arrival came before
  // any round): take it, so the named barrier ends the kernel balanced.
  __device__ __forceinline__ void last_turn() const {
    if (consumer_ == 0) begin_turn();
  }

  // O (zeroed here) and the softmax of one item, over the key blocks row_cols[0 .. num_tiles - 1]
  // (ascending; the last is the diagonal block).
  __device__ __forceinline__ void mma(const attention::Params& p, const int32_t* row_cols, int32_t num_tiles,
                                      const ConsumerRows& rows, int32_t n, float (&o_acc)[kOutRegs],
                                      Softmax& softmax) {
#pragma unroll
    for (int i = 0; i < kOutRegs; ++i) o_acc[i] = 0.f;
    softmax.reset();
    // Only the row's last tile can need a mask: the columns ascend, the last is the diagonal block
    // r (every row lists it), so every earlier key precedes every query of the block and lies
    // inside the sequence. Its column is read once per item, not once per tile: a global load in
    // the softmax's path stalls the consumers, on an L2 miss for a microsecond.
    // kWindow (a sliding window, §12) also masks the row's first tiles where they cross the
    // window's edge: the listed blocks ascend and none lies wholly before the window, so only the
    // first two can (docs/hopper.md); their key blocks come with the item through shared memory.
    const int last_key0 = row_cols[num_tiles - 1] * kBlock;
    const int quad_lane = lane_ % 4;
    auto scores_to_probabilities = [&](int j, float (&correction)[2]) {
      if (j == num_tiles - 1 && (last_key0 + kBlock - 1 > rows.first_query || last_key0 + kBlock > n)) {
        if constexpr (kWindow) mask_scores_window<kBlock>(s_acc_, last_key0, rows.query, n, p.window, quad_lane);
        else mask_scores<kBlock>(s_acc_, last_key0, rows.query, n, quad_lane);
      } else if constexpr (kWindow) {
        if (j < 2) {
          const int key0 = __shfl_sync(0xffffffffu, lane_ == 0 ? storage_.read_window_col(j) : 0, 0) * kBlock;
          const int last_query = rows.query[0] > rows.query[1] ? rows.query[0] : rows.query[1];
          if (rules::tile_needs_window_mask(key0, last_query, p.window))
            mask_scores_window<kBlock>(s_acc_, key0, rows.query, n, p.window, quad_lane);
        }
      }
      softmax.update(s_acc_, p.scale_log2, correction);
    };

    // ---- tile 0
    begin_turn();
    issue_qk(tiles_done_);
    end_turn();
    wgmma_wait<0>();
    fence_registers(s_acc_);
    release(storage_.bar_k_empty(tiles_done_ % kStages));
    {
      float correction[2];
      scores_to_probabilities(0, correction);  // O is zero: no rescale
      convert_p();
    }
    // ---- tiles 1 .. num_tiles-1: S(j) is issued before PV(j-1); the softmax of tile j runs while
    // PV(j-1) is on the tensor cores. Without kOverlapPv (TileShape), PV(j-1) completes first.
    for (int j = 1; j < num_tiles; ++j) {
      const uint32_t t = tiles_done_ + j;
      if constexpr (!Shape::kOverlapPv) {
        begin_turn();
        issue_pv(o_acc, t - 1);
        end_turn();
        wgmma_wait<0>();
        fence_registers(o_acc);
        release(storage_.bar_v_empty((t - 1) % kStages));
        // S of the previous tile is spent (turned into P, which PV has read). The wgmma operands
        // are read-write ("+f"), so without a new definition S would stay live across PV beside P
        // and O (224 registers); zeros end its live range at convert_p.
#pragma unroll
        for (int i = 0; i < kScoreRegs; ++i) s_acc_[i] = 0.f;
        begin_turn();
        issue_qk(t);
        end_turn();
        wgmma_wait<0>();
        fence_registers(s_acc_);
        release(storage_.bar_k_empty(t % kStages));
        float correction[2];
        scores_to_probabilities(j, correction);
        rescale_o(o_acc, correction);
        convert_p();
        continue;
      }
      begin_turn();
      issue_qk(t);
      issue_pv(o_acc, t - 1);
      end_turn();
      wgmma_wait<1>();  // S(j) done (groups complete in order)
      fence_registers(s_acc_);
      release(storage_.bar_k_empty(t % kStages));
      float correction[2];
      scores_to_probabilities(j, correction);
      wgmma_wait<0>();  // PV(j-1) done: O and the P registers are free again
      fence_registers(o_acc);
      release(storage_.bar_v_empty((t - 1) % kStages));
      rescale_o(o_acc, correction);
      convert_p();
    }
    // Every S = QK^T of the item is done: the producer may load the next item's query block.
    release(storage_.bar_q_empty());
    const uint32_t last = tiles_done_ + num_tiles - 1;
    if (last_key0 + kBlock > n) zero_value_rows_past_end(last, n - last_key0);
    begin_turn();
    issue_pv(o_acc, last);
    end_turn();
    wgmma_wait<0>();
    fence_registers(o_acc);
    release(storage_.bar_v_empty(last % kStages));
    tiles_done_ += num_tiles;
    ++items_done_;
  }

 private:
  static constexpr int kScoreRegs = Softmax::kScoreRegs;

  // Offsets are added to the start-address field (bytes >> 4). A 16-dim k-step advances 32 bytes
  // inside a 64-dim part; Q's parts are kHalfBytes apart, K's kv_.part (its 8-row groups
  // kv_.group apart: the stride offset).
  static __device__ __forceinline__ uint64_t dim_step(int kk) {
    return static_cast<uint64_t>(((kk / 4) * Shape::kHalfBytes + (kk % 4) * 32) >> 4);
  }
  __device__ __forceinline__ uint32_t k_dim_step(int kk) const { return ((kk / 4) * kv_.part + (kk % 4) * 32) >> 4; }
  __device__ __forceinline__ uint64_t k_desc(int stage) const {
    return smem_descriptor(storage_.k(stage), 16, kv_.group);
  }
  // V is MN-major for PV (dims contiguous, keys the reduction dimension): a 16-key k-step is two
  // 8-key groups (kv_.group apart) and 128 dims are two 64-dim parts (kv_.part apart; at d = 64
  // the single part leaves the leading offset unused). For MN-major operands the leading offset is
  // the stride between 64-element atoms along N (the dims) and the stride offset the one between
  // 8-row groups along K (the keys). (Checked on the H200: the swapped reading gives a relative
  // error of ~1.)
  __device__ __forceinline__ uint64_t v_desc(int stage) const {
    return smem_descriptor(storage_.v(stage), kv_.part, kv_.group);
  }

  // S = Q K^T of ring tile t into s_acc_ (issued, not waited for).
  __device__ __forceinline__ void issue_qk(uint32_t t) {
    const int stage = t % kStages;
    mbar_wait(storage_.bar_k_full(stage), (t / kStages) & 1);
    fence_registers(s_acc_);
    wgmma_fence();
    const uint64_t kd = k_desc(stage);
#pragma unroll
    for (int kk = 0; kk < kDim / 16; ++kk)
      Ops<T>::qk(s_acc_, q_desc_ + dim_step(kk), desc_advance(kd, k_dim_step(kk)), kk > 0);
    wgmma_commit();
  }
  // O += P V of ring tile t (issued, not waited for).
  __device__ __forceinline__ void issue_pv(float (&o_acc)[kOutRegs], uint32_t t) {
    const int stage = t % kStages;
    mbar_wait(storage_.bar_v_full(stage), (t / kStages) & 1);
    fence_registers(o_acc);
    wgmma_fence();
    const uint64_t vd = v_desc(stage);
#pragma unroll
    for (int kc = 0; kc < kBlock / 16; ++kc)
      Ops<T>::pv(o_acc, p_frag_[kc], desc_advance(vd, (2 * kc * kv_.group) >> 4));
    wgmma_commit();
  }
  // Zeroes rows `valid` .. kBlock - 1 of ring tile t's V (keys past the sequence end). TMA filled
  // them with whatever follows the sequence: the next sequence's keys, or, for paged K/V, the rest
  // of its last page, which may hold anything (a NaN there would reach O as P * V = 0 * NaN; their
  // scores are masked, so K needs no zeroing). Whole 128-byte rows, so the swizzle does not matter.
  // The consumers (both walk the same tiles) share the stores and then meet on a named barrier, the
  // stores fenced for wgmma's async-proxy reads: neither issues its PV before every row is zero.
  __device__ __forceinline__ void zero_value_rows_past_end(uint32_t t, int valid) const {
    const int stage = t % kStages;
    mbar_wait(storage_.bar_v_full(stage), (t / kStages) & 1);
    constexpr int kChunksPerRow = 128 / 16;
    const int chunks = (kBlock - valid) * kChunksPerRow;
    const uint32_t tile = storage_.v(stage);
    constexpr int kThreads = Shape::kConsumers * 128;
    for (int c = consumer_ * 128 + static_cast<int>(threadIdx.x % 128); c < chunks * kHalves; c += kThreads) {
      const int part = c / chunks, row = valid + (c % chunks) / kChunksPerRow;
      const uint32_t addr = tile + tile_row_bytes(kv_, row) + part * kv_.part + (c % kChunksPerRow) * 16;
      asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    named_barrier_sync(kTailBarrier, kThreads);
  }
  // One arrival per warp, after the warp's own wgmma wait.
  __device__ __forceinline__ void release(uint32_t bar) const {
    __syncwarp();
    if (lane_ == 0) mbar_arrive(bar);
  }
  // P (the exp2 values in s_acc_) into the A-fragment layout of PV: k-step kc covers keys
  // 16 kc .. 16 kc + 15, i.e. accumulator column groups 2 kc and 2 kc + 1.
  __device__ __forceinline__ void convert_p() {
#pragma unroll
    for (int kc = 0; kc < kBlock / 16; ++kc) {
      p_frag_[kc][0] = attention::Mma<T>::pack(s_acc_[8 * kc + 0], s_acc_[8 * kc + 1]);
      p_frag_[kc][1] = attention::Mma<T>::pack(s_acc_[8 * kc + 2], s_acc_[8 * kc + 3]);
      p_frag_[kc][2] = attention::Mma<T>::pack(s_acc_[8 * kc + 4], s_acc_[8 * kc + 5]);
      p_frag_[kc][3] = attention::Mma<T>::pack(s_acc_[8 * kc + 6], s_acc_[8 * kc + 7]);
    }
  }
  static __device__ __forceinline__ void rescale_o(float (&o_acc)[kOutRegs], const float (&correction)[2]) {
#pragma unroll
    for (int i = 0; i < kOutRegs; ++i) o_acc[i] *= correction[(i & 2) ? 1 : 0];
  }
  __device__ __forceinline__ void begin_turn() const {
    if constexpr (kPingPong) named_barrier_sync(kPingPongBarrier + consumer_, 2 * 128);
  }
  __device__ __forceinline__ void end_turn() const {
    if constexpr (kPingPong) named_barrier_arrive(kPingPongBarrier + (1 - consumer_), 2 * 128);
  }

  // A copy, not a reference: the compiler then keeps the addresses in registers from the start, and
  // the loops compile as they did when they were written inside the kernel.
  const SharedStorage<kDim, kBlock> storage_;
  const int consumer_, lane_;
  const TileLayout kv_;  // the K and V tiles' layout
  const uint64_t q_desc_;
  uint32_t tiles_done_ = 0, items_done_ = 0;
  float s_acc_[kScoreRegs];      // S of the current tile, then its exp2 values
  uint32_t p_frag_[kBlock / 16][4];  // P of the previous tile as PV's A fragments
};

#endif  // CRISP_HOPPER_DEVICE_CODE

}  // namespace hopper
}  // namespace cuda_detail
}  // namespace crisp
