// src/cuda/hopper/hopper_attention.h — host side of the Hopper (sm_90a) attention kernel: which
// kernel attend_async runs, the TMA tensor maps, the launch.
//
// Kernel choice (crisp::CudaOptions, crisp/options.h; the caller resolves the CRISP_KERNEL override):
//   automatic: the Hopper kernel when the device is sm_90, the library carries its sm_90a code,
//        and the call is bf16/fp16 with head dim 64 or 128 and block size 64 or 128; otherwise
//        the portable kernel;
//   portable: always the portable (sm_80-class) kernel;
//   hopper:   the Hopper kernel, and a crisp::Error naming options.cuda.kernel when it cannot run
//        this call.
//
// Settings of the Hopper kernel (crisp::CudaOptions; `automatic` takes the defaults below, the
// measured best on the H200, bench/RESULTS.md):
//   schedule = persistent | grid: persistent CTAs (as many as fit on the SMs: one per SM at block
//        size 128, two or more at 64) taking work items from a device counter, heaviest rows
//        first, or one CTA per work item in that order;
//   ping_pong = on | off: the two consumer warpgroups take turns on the tensor cores (named
//        barriers), or run unsynchronised. Block size 128 only (at 64 a CTA has one consumer
//        warpgroup);
//   gqa_packing = separate | pack: one head per CTA tile, or each GQA group packed into the
//        tile's rows running the union of the group's layouts (spec §10, gqa_pack.h; block size
//        128, group size 2/4/8/16, whole-plan launches, a device with memory pools; elsewhere
//        separate). Denser than the plan wherever the group's layouts differ: crisp::gqa_union
//        gives the plan it computes (and its density).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "crisp/options.h"
#include "crisp/tensor.h"

namespace crisp {
namespace cuda_detail {
namespace attention {
struct Params;
}
namespace hopper {

// NOTE: defaults from the H200 measurements in bench/RESULTS.md (`crisp bench --kernels
// hopper-{persistent,grid}-{pp,nopp}`, Hq 32 / Hkv 8, d 128): ping-pong costs time on dense and
// crisp layouts (two 64-row consumers already overlap their own softmax with PV, so forced turns
// only add waiting); persistent and one-CTA-per-item scheduling are within noise of each other,
// the heaviest-first work order being what gains. Persistent is the default: it also overlaps a
// row's epilogue with the next row's loads.
constexpr Schedule kDefaultSchedule = Schedule::persistent;
constexpr bool kDefaultPingPong = false;
// NOTE: packing is off by default: the tile's M is 128 rows either way, so packing loads as many
// K/V tiles per FLOP as one head per tile does (docs/hopper.md, "GQA packing"), and on crisp plans
// it computes the union of the group's layouts (2.1-2.5x the blocks on the structured workload).
constexpr bool kDefaultGqaPack = false;

// True when the current device is sm_90 and the loaded binary of the Hopper kernel is sm_90a code
// (a build without the 90a architecture carries only a stub).
bool kernel_available();

// The shapes the Hopper kernel is compiled for.
bool shape_supported(DType dtype, int64_t head_dim, int block_size);

// Contiguous K/V, or a paged K/V pool of fewer than 2^31 rows (the kernel's int32 TMA coordinates)
// with a block table of fewer than 2^31 entries (int32 table indices).
bool paged_pool_supported(const attention::Params& params);

// Runs the Hopper kernel for `params` (the portable kernel's parameters, already checked) when
// `options` (checked, the CRISP_KERNEL override resolved) and the call allow it; returns false,
// launching nothing, when the portable kernel should run. `q_tokens` is the token extent of q,
// `k_tokens` that of k/v (the page pool's rows for paged K/V), `num_kv_heads` the kv head count.
// Paged K/V (params.block_table) run here too, any page size (key tiles of gcd(page size, B)-row
// TMA boxes), when the pool has fewer than 2^31 rows and the table fewer than 2^31 entries
// (paged_pool_supported); otherwise the portable kernel (automatic) or a crisp::Error (hopper).
bool launch_if_selected(const attention::Params& params, DType dtype, int64_t head_dim, int block_size,
                        int64_t q_tokens, int64_t k_tokens, int64_t num_kv_heads, int64_t num_ctas,
                        const CudaOptions& options, cudaStream_t stream);

// A 3-D TMA map (dims, tokens, heads) over a [heads, tokens, head_dim] bf16/fp16 tensor with the
// given element strides, boxes of 64 dims x box_tokens tokens x 1 head, 128-byte swizzle, zero fill
// out of bounds. A tensor the driver cannot describe is a crisp::Error naming `name` (q, k or v).
CUtensorMap make_tensor_map(const char* name, const void* base, DType dtype, int64_t head_dim, int64_t heads,
                            int64_t tokens, int64_t stride_head, int64_t stride_token, int box_tokens);
// The attention kernel's contiguous K/V map: 4-D (64 dims, tokens, heads, 64-dim parts of
// head_dim), boxes of 64 dims x box_tokens x 1 head x every part, so one load brings a tile parts
// first (tile_shape.h, TileLayout); otherwise as make_tensor_map.
CUtensorMap make_tile_map(const char* name, const void* base, DType dtype, int64_t head_dim, int64_t heads,
                          int64_t tokens, int64_t stride_head, int64_t stride_token, int box_tokens);
// The paged K/V map: 5-D (64 dims, 8 rows, 64-dim parts, 8-row groups, heads) over a pool of
// `tokens` rows (a multiple of 8), boxes of box_tokens rows with every part, groups first.
CUtensorMap make_paged_tile_map(const char* name, const void* base, DType dtype, int64_t head_dim, int64_t heads,
                                int64_t tokens, int64_t stride_head, int64_t stride_token, int box_tokens);

}  // namespace hopper
}  // namespace cuda_detail
}  // namespace crisp
