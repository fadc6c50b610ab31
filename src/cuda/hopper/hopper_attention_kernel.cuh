// src/cuda/hopper/hopper_attention_kernel.cuh — the block-sparse causal attention kernel for Hopper
// (sm_90a): TMA loads completed on mbarriers, wgmma tensor-core matmuls, warp specialisation.
// Same work, same math and same outputs as the portable kernel (src/cuda/attention_kernel.cuh):
// a work item is one query block r (B = 128 or 64 rows) of one query head of one sequence, computed
// by walking the key blocks listed in the CSR row r of its (sequence, head) plan in ascending order;
// a CTA computes one item or, persistent, several in turn.
//
// The kernel is the outline; its parts, in the manner of FlashAttention-3, are
//  - tile_shape.h: threads, shared-memory layout, ring depth and register split of a tile shape;
//  - shared_storage.cuh: shared-memory addresses and the pipeline's mbarriers;
//  - tile_scheduler.cuh: the work order (which item a CTA takes next) and item decoding;
//  - mainloop_producer.cuh: TMA loads of the query block and the K/V ring;
//  - mainloop_consumer.cuh: S = QK^T, softmax, O += PV on wgmma, ping-pong turns;
//  - softmax.cuh: the masked online softmax in registers;
//  - epilogue.cuh: normalise, write O and LSE.
//
// Roles (B = 128: 384 threads, three warpgroups; B = 64: 160 threads, a warpgroup and a warp):
//  - the producer (warpgroup 0 at B = 128, warp 4 at B = 64): one thread loads (with paged K/V its
//    warp looks up the page ids); at B = 128 the warpgroup keeps 40 registers (setmaxnreg) and
//    gives the rest to the consumers;
//  - the consumer warpgroups (1 and 2 at B = 128, 0 at B = 64), 64 query rows each: 232 (B = 128)
//    or 200 (B = 64) registers each (TileShape). At B = 64 two CTAs share an SM and their
//    consumers interleave on the tensor cores without any barrier.
//
// Varlen batches: TMA addresses tokens of the whole batch; rows of a tile past the sequence end
// read the next sequence's tokens (or zeros past the tensor end) and are masked (keys) or not
// written (queries); the consumers zero such V rows in shared memory before their PV, so a
// non-finite value there never reaches O. Paged K/V: each key tile is gathered from the page pool
// in boxes of gcd(page size, B) rows (mainloop_producer.cuh); rows past the sequence end inside its
// last page are zeroed the same way.
// Queries over a KV prefix (spec §11): the query tile of row r starts at position rB, q row
// token_offset + rB - (n_k - n_q); in a chunk's first row its rows before the first query are the
// previous sequence's (or zeros at negative coordinates) and are never written. K/V tiles start at
// the sequence's kv_offset.
//
// Scheduling: the producer takes work items from the plan's work order, heaviest rows first
// (src/cuda/work_order.h), and hands each to the consumers through a shared-memory slot published
// with the query block's barrier. Either one CTA per work item (the hardware starts CTAs in list
// order), or persistent CTAs (as many as fit on the SMs: one per SM at B = 128, at least two at
// B = 64) that take the next item from a device counter as soon as their producer has issued the
// loads of the current one: the next query block and its first K/V tiles then load while the
// consumers finish the current row and write its output. The host picks one
// (crisp::Schedule, hopper_attention.h).
#pragma once
#include <cuda.h>  // CUtensorMap (a type only; nothing is linked from the driver library)
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention_params.h"
#include "cuda/hopper/epilogue.cuh"
#include "cuda/hopper/mainloop_consumer.cuh"
#include "cuda/hopper/mainloop_producer.cuh"
#include "cuda/hopper/shared_storage.cuh"
#include "cuda/hopper/softmax.cuh"
#include "cuda/hopper/tile_scheduler.cuh"
#include "cuda/hopper/tile_shape.h"
#include "cuda/hopper/wgmma.cuh"

namespace crisp {
namespace cuda_detail {
namespace hopper {

// q/k/v arrive as TMA tensor maps (q 3-D: dims, tokens, heads; k and v make_tile_map's 4-D or,
// paged, make_paged_tile_map's 5-D); out/lse and the plan through the attention parameters shared
// with the portable kernel (the same work items, row subsets included).
//
// kPingPong: the two consumer warpgroups take turns on the tensor cores (B = 128 only); the host
// picks it (crisp::PingPong, hopper_attention.h).
// kPacked (GQA packing, src/cuda/hopper/gqa_pack.h): an item's 128 rows are 128 / g queries of each
// of the g query heads of one kv head, its key blocks the group's union row; map_q then has boxes
// of 128 / g tokens.
// kLoaderWarps (paged K/V only; mainloop_producer.cuh): producer warps that issue the K and V page
// boxes; 1 is the one warp of every other launch.
// kWindow: a sliding window (§12, Params::window > 0): the consumers also mask the window's edge in
// a row's first two tiles. Only windowed launches take these kernels (one loader warp, no ping-pong,
// no packing), so the others carry none of the edge's code or registers.
template <typename T, int kDim, int kBlock, bool kPingPong, bool kPacked = false, int kLoaderWarps = 1,
          bool kWindow = false>
__global__ void __launch_bounds__(TileShape<kDim, kBlock>::kThreads, TileShape<kDim, kBlock>::kCtasPerSm)
    hopper_attention_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                            const __grid_constant__ CUtensorMap map_v, const attention::Params p) {
#if defined(CRISP_HOPPER_DEVICE_CODE)
  using Shape = TileShape<kDim, kBlock>;
  static_assert(!kPacked || kBlock == 128, "GQA packing at block size 128");
  extern __shared__ unsigned char smem_raw[];
  const SharedStorage<kDim, kBlock> storage(smem_raw);
  if (threadIdx.x == 0) storage.template init_barriers<kLoaderWarps - 1>();
  __syncthreads();

  // B = 128: warpgroup 0 produces, warpgroups 1 and 2 consume; B = 64: warpgroup 0 consumes and
  // warp 4 produces (wgmma takes a warpgroup of four warps starting at a multiple of four).
  const int thread = static_cast<int>(threadIdx.x);
  const int producer_thread0 = Shape::kSplitRegisters ? 0 : 128 * Shape::kConsumers;
  if (thread >= producer_thread0 && thread < producer_thread0 + Shape::kProducerThreads) {
    // ================================================================ producer
    if constexpr (Shape::kSplitRegisters)
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Shape::kProducerRegisters));
    using Producer = ProducerMainloop<kDim, kBlock, kPacked, kLoaderWarps, kWindow>;
    if (!Producer::loading_thread(p, thread - producer_thread0)) return;
    Producer producer(storage);
    if constexpr (kLoaderWarps > 1) {
      const int loader_warp = (thread - producer_thread0) / 32;
      if (loader_warp > 0) {
        producer.stream_tiles(map_k, map_v, p, loader_warp);
        return;
      }
    }
    TileScheduler scheduler(p);
    while (true) {
      producer.wait_query_free();
      WorkItem it{};
      const int32_t code = producer.take_item(scheduler, p, it);
      if (!producer.publish(code)) break;
      producer.load(map_q, map_k, map_v, p, it);
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
  using Mainloop = ConsumerMainloop<T, kDim, kBlock, kPingPong, kWindow>;
  Mainloop mainloop(storage, consumer, lane,
                    /*kv_groups_first=*/kv_page_boxes(p.block_table != nullptr, kLoaderWarps > 1, p.page_size, kBlock));
  float o_acc[Mainloop::kOutRegs];
  OnlineSoftmax<kBlock> softmax;
  mainloop.first_turn();
  while (true) {
    const int32_t code = mainloop.wait_item();
    if (code < 0) break;
    const WorkItem it = decode_item(p, code);
    const layout::SequenceBases bases = p.plan.seqs[it.s];
    int32_t num_tiles;
    const int32_t* row_cols = row_columns<kPacked>(p, it, bases, num_tiles);
    const ConsumerRows rows = consumer_rows<kBlock, kPacked>(p, it, consumer, warp, group);
    mainloop.mma(p, row_cols, num_tiles, rows, static_cast<int32_t>(bases.n), o_acc, softmax);
    store_output<T, kDim, kBlock>(p, code, it, bases, rows, o_acc, softmax, quad_lane);
  }
  mainloop.last_turn();
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
