// src/cuda/hopper/hopper_attention.cu — host side of the Hopper attention kernel: kernel choice
// (crisp::CudaOptions), TMA tensor maps through the driver entry point (no libcuda link), launch.
#include "cuda/hopper/hopper_attention.h"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <climits>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "common/shape_rules.h"
#include "crisp/error.h"
#include "cuda/attention_params.h"
#include "cuda/cuda_check.h"
#include "cuda/hopper/gqa_pack.h"
#include "cuda/hopper/hopper_attention_kernel.cuh"
#include "cuda/stream_buffer.h"

namespace crisp {
namespace cuda_detail {
namespace hopper {

namespace {

// NOTE: producer warps that issue paged K/V's page boxes in the default B = 128 kernel (TMA takes a
// warp's boxes one lane at a time; mainloop_producer.cuh): 2 = K on one warp, V on another; 4 = two
// each. 2 and 4 measured alike at pages of 16 and 32, both faster than 1 (bench/RESULTS.md, session
// 21), so 2, the simpler. The ping-pong and GQA-packed kernels, off by default, keep one loader warp.
constexpr int kPagedLoaderWarps = 2;

// The settings of `options` with `automatic` replaced by the kernel's defaults.
bool persistent_schedule(const CudaOptions& options) {
  return (options.schedule == Schedule::automatic ? kDefaultSchedule : options.schedule) == Schedule::persistent;
}
bool ping_pong(const CudaOptions& options) {
  return options.ping_pong == PingPong::automatic ? kDefaultPingPong : options.ping_pong == PingPong::on;
}
bool gqa_pack(const CudaOptions& options) {
  return options.gqa_packing == GqaPacking::automatic ? kDefaultGqaPack : options.gqa_packing == GqaPacking::pack;
}

}  // namespace

bool shape_supported(DType dtype, int64_t head_dim, int block_size) {
  return (dtype == DType::bf16 || dtype == DType::f16) && shape_rules::cuda_head_dim_supported(head_dim) &&
         shape_rules::valid_block_size(block_size);
}

namespace {

// What the launch needs to know of a device, looked up once per device (cudaGetDevice is the only
// runtime call of a launch's host path besides the launch itself).
struct DeviceTraits {
  bool hopper_kernel = false;  // sm_90 with sm_90a code for this kernel in the binary
  int multiprocessors = 0;     // persistent CTAs: as many per SM as fit (the occupancy API)
  bool memory_pools = false;   // cudaMallocAsync: the persistent work counter, GQA packing
};

DeviceTraits look_up_traits(int device) {
  DeviceTraits t;
  int major = 0, minor = 0, pools = 0;
  CRISP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CRISP_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  CRISP_CUDA_CHECK(cudaDeviceGetAttribute(&t.multiprocessors, cudaDevAttrMultiProcessorCount, device));
  // Stream-ordered allocation (cudaMallocAsync) needs memory pools; without them the launch falls
  // back to one CTA per item.
  CRISP_CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device));
  t.memory_pools = pools != 0;
  if (major != 9 || minor != 0) return t;
  // The binary the runtime picked for this device must be sm_90a machine code compiled from
  // sm_90a PTX: a build without 90a has only the sm_80 stub (or PTX of it, JIT-compiled).
  cudaFuncAttributes attributes{};
  const auto kernel = hopper_attention_kernel<__nv_bfloat16, 128, 128, kDefaultPingPong>;
  if (cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return t;
  }
  t.hopper_kernel = attributes.binaryVersion >= 90 && attributes.ptxVersion >= 90;
  return t;
}

// The current device's traits, from a per-device cache (devices past kMaxDevices are looked up
// every time).
constexpr int kMaxDevices = 64;
DeviceTraits current_device_traits() {
  static DeviceTraits cache[kMaxDevices];
  static bool cached[kMaxDevices] = {};
  static std::mutex mutex;
  int device = 0;
  CRISP_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) return look_up_traits(device);
  std::lock_guard<std::mutex> lock(mutex);
  if (!cached[device]) {
    cache[device] = look_up_traits(device);
    cached[device] = true;
  }
  return cache[device];
}

PFN_cuTensorMapEncodeTiled_v12000 encode_function() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    CRISP_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &status));
    if (status != cudaDriverEntryPointSuccess || ptr == nullptr)
      throw Error("options.cuda.kernel", "the driver has no cuTensorMapEncodeTiled", "a CUDA 12+ driver for the Hopper kernel");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

// Sets the kernel's shared-memory size and returns how many of its CTAs fit on one SM (the
// persistent launch's CTAs per SM: as many as fit, at least one).
template <typename T, int kDim, int kBlock, bool kPingPong, bool kPacked, int kLoaderWarps, bool kWindow>
int prepare_kernel() {
  using Shape = TileShape<kDim, kBlock>;
  auto kernel = hopper_attention_kernel<T, kDim, kBlock, kPingPong, kPacked, kLoaderWarps, kWindow>;
  CRISP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape::kSmemBytes));
  int resident = 0;
  CRISP_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, Shape::kThreads, Shape::kSmemBytes));
  return resident < 1 ? 1 : resident;
}

template <typename T, int kDim, int kBlock, bool kPingPong, bool kPacked, int kLoaderWarps, bool kWindow>
void launch_kernel(const CUtensorMap& map_q, const CUtensorMap& map_k, const CUtensorMap& map_v,
                   const attention::Params& params, int64_t grid, cudaStream_t stream) {
  using Shape = TileShape<kDim, kBlock>;
  auto kernel = hopper_attention_kernel<T, kDim, kBlock, kPingPong, kPacked, kLoaderWarps, kWindow>;
  kernel<<<static_cast<unsigned>(grid), Shape::kThreads, Shape::kSmemBytes, stream>>>(map_q, map_k, map_v, params);
  CRISP_CUDA_CHECK_LAUNCH("hopper_attention_kernel");
}

// Launches one instantiation: persistent CTAs (as many as fit on the SMs) taking items from a
// work counter, or one CTA per item.
template <typename T, int kDim, int kBlock, bool kPingPong, bool kPacked = false, int kLoaderWarps = 1,
          bool kWindow = false>
void launch_scheduled(const CUtensorMap& map_q, const CUtensorMap& map_k, const CUtensorMap& map_v,
                      const attention::Params& params, int64_t num_ctas, bool persistent_allowed,
                      cudaStream_t stream) {
  const int ctas_per_sm = prepare_kernel<T, kDim, kBlock, kPingPong, kPacked, kLoaderWarps, kWindow>();
  attention::Params run = params;
  run.work_counter = nullptr;
  int64_t grid = num_ctas;
  // The counter hands out the items past the first wave; fewer items than resident CTAs need no
  // counter.
  const DeviceTraits device = current_device_traits();
  const int64_t resident = static_cast<int64_t>(device.multiprocessors) * ctas_per_sm;
  const bool persistent = persistent_allowed && num_ctas > resident && device.memory_pools;
  // The work counter: a stream-ordered allocation (pooled, capturable in a CUDA graph as a memory
  // node), zeroed on the stream and freed on it after the kernel (or when the launch throws).
  // Every launch has its own, so launches on different streams sharing one plan never share one.
  std::unique_ptr<StreamBuffer> counter;
  if (persistent) {
    grid = resident;
    counter = std::make_unique<StreamBuffer>(sizeof(int32_t), stream, /*zero_fill=*/true);
    run.work_counter = reinterpret_cast<int32_t*>(counter->data());
  }
  launch_kernel<T, kDim, kBlock, kPingPong, kPacked, kLoaderWarps, kWindow>(map_q, map_k, map_v, run, grid, stream);
}

template <typename T, int kDim, int kBlock>
void launch(const attention::Params& params, int64_t q_tokens, int64_t k_tokens, int64_t num_kv_heads,
            int64_t num_ctas, DType dtype, const CudaOptions& options, cudaStream_t stream) {
  const int64_t group = params.num_q_heads / num_kv_heads;
  // Each setting is used where it applies: packing at B = 128 for whole-plan launches on a device
  // with memory pools (its union layout and work order are stream-ordered allocations), ping-pong
  // with two consumer warpgroups (B = 128).
  const bool persistent = persistent_schedule(options);
  // A sliding window (§12) takes the window's kernels: one loader warp, no ping-pong, no packing
  // (one instantiation per shape; a band of a few blocks per row gains little from the others).
  const bool windowed = params.window > 0;
  const bool packed = !windowed && kBlock == 128 && gqa_pack(options) && current_device_traits().memory_pools &&
                      gqa_pack_applies(kBlock, group, params.row_items != nullptr, params.plan.num_work_items);
  // A packed query tile is 128 / g tokens of each of the g heads of a group: one box per head.
  const CUtensorMap map_q = make_tensor_map("q", params.q, dtype, kDim, params.num_q_heads, q_tokens,
                                            params.q_stride_head, params.q_stride_token,
                                            packed ? static_cast<int>(kBlock / group) : kBlock);
  // A K/V tile is one box with contiguous K/V and with pages of whole tiles (parts first), B / box
  // rows boxes with smaller pages, each inside one page (paged_box_rows; groups first): tile_shape.h,
  // TileLayout.
  const bool paged = params.block_table != nullptr;
  const bool loader_warps = !windowed && kBlock == 128 && paged && !packed && !ping_pong(options);  // the launch below
  const bool boxed = kv_page_boxes(paged, loader_warps, params.page_size, kBlock);
  const auto kv_map = boxed ? make_paged_tile_map : make_tile_map;
  const int key_box = boxed ? paged_box_rows(params.page_size, kBlock) : kBlock;
  const CUtensorMap map_k = kv_map("k", params.k, dtype, kDim, num_kv_heads, k_tokens, params.k_stride_head,
                                   params.k_stride_token, key_box);
  const CUtensorMap map_v = kv_map("v", params.v, dtype, kDim, num_kv_heads, k_tokens, params.v_stride_head,
                                   params.v_stride_token, key_box);
  if (windowed) {
    launch_scheduled<T, kDim, kBlock, false, false, 1, true>(map_q, map_k, map_v, params, num_ctas, persistent, stream);
    return;
  }
  if constexpr (kBlock == 128) {
    if (packed) {  // the union rows and their work order, built on the stream, freed after the kernel
      PackedGqaLayout layout(params.plan, static_cast<int>(group), stream);
      attention::Params run = params;
      run.packed_col = layout.col();
      run.packed_len = layout.len();
      run.packed_group = static_cast<int32_t>(group);
      run.work_order = layout.order();
      run.num_items = static_cast<int32_t>(params.plan.num_work_items);
      launch_scheduled<T, kDim, kBlock, false, true>(map_q, map_k, map_v, run, run.num_items, persistent, stream);
      return;
    }
    if (ping_pong(options)) {
      launch_scheduled<T, kDim, kBlock, true>(map_q, map_k, map_v, params, num_ctas, persistent, stream);
      return;
    }
    if (loader_warps) {  // the default kernel with its page boxes spread over several producer warps
      launch_scheduled<T, kDim, kBlock, false, false, kPagedLoaderWarps>(map_q, map_k, map_v, params, num_ctas,
                                                                         persistent, stream);
      return;
    }
  }
  launch_scheduled<T, kDim, kBlock, false>(map_q, map_k, map_v, params, num_ctas, persistent, stream);
}

template <typename T>
void launch_for_shape(const attention::Params& params, int64_t head_dim, int block_size, int64_t q_tokens,
                      int64_t k_tokens, int64_t num_kv_heads, int64_t num_ctas, DType dtype,
                      const CudaOptions& options, cudaStream_t stream) {
  if (head_dim == 256) {
    if (block_size == 128)
      launch<T, 256, 128>(params, q_tokens, k_tokens, num_kv_heads, num_ctas, dtype, options, stream);
    else launch<T, 256, 64>(params, q_tokens, k_tokens, num_kv_heads, num_ctas, dtype, options, stream);
  } else if (head_dim == 128) {
    if (block_size == 128)
      launch<T, 128, 128>(params, q_tokens, k_tokens, num_kv_heads, num_ctas, dtype, options, stream);
    else launch<T, 128, 64>(params, q_tokens, k_tokens, num_kv_heads, num_ctas, dtype, options, stream);
  } else {
    if (block_size == 128) launch<T, 64, 128>(params, q_tokens, k_tokens, num_kv_heads, num_ctas, dtype, options, stream);
    else launch<T, 64, 64>(params, q_tokens, k_tokens, num_kv_heads, num_ctas, dtype, options, stream);
  }
}

}  // namespace

bool kernel_available() { return current_device_traits().hopper_kernel; }

bool paged_pool_supported(const attention::Params& params) {
  return params.block_table == nullptr ||
         (params.pool_rows <= INT32_MAX && params.plan.num_sequences * params.table_stride <= INT32_MAX);
}

namespace {
// One tiled map of `rank` dimensions (dimension 0 the 64 dims of a box, 128-byte swizzle, zero fill
// out of bounds); a tensor the driver cannot describe is a crisp::Error naming `name`.
CUtensorMap encode_tiled(const char* name, const void* base, DType dtype, cuuint32_t rank, const cuuint64_t* dims,
                         const cuuint64_t* strides, const cuuint32_t* box) {
  CUtensorMap map;
  std::memset(&map, 0, sizeof map);
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  const CUresult result = encode_function()(
      &map, dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, rank,
      const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS)
    throw Error(name, "cannot be described as a TMA tensor map (cuTensorMapEncodeTiled error " +
                         std::to_string(static_cast<int>(result)) + ")",
                "16-byte aligned rows with head/token strides below 2^40 bytes");
  return map;
}
}  // namespace

CUtensorMap make_tensor_map(const char* name, const void* base, DType dtype, int64_t head_dim, int64_t heads,
                            int64_t tokens, int64_t stride_head, int64_t stride_token, int box_tokens) {
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(tokens),
                              static_cast<cuuint64_t>(heads)};
  // Byte strides of dimensions 1 and 2 (multiples of 16: checked by the caller, as for cp.async).
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(stride_token) * 2, static_cast<cuuint64_t>(stride_head) * 2};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(kHalfCols), static_cast<cuuint32_t>(box_tokens), 1};
  return encode_tiled(name, base, dtype, 3, dims, strides, box);
}

CUtensorMap make_tile_map(const char* name, const void* base, DType dtype, int64_t head_dim, int64_t heads,
                          int64_t tokens, int64_t stride_head, int64_t stride_token, int box_tokens) {
  // Dimension 3 splits a row's head_dim into 64-dim parts 128 bytes apart; a box holds every part,
  // part after part, each in the 128-byte swizzle as a 3-D box would be.
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(kHalfCols), static_cast<cuuint64_t>(tokens),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(head_dim / kHalfCols)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(stride_token) * 2, static_cast<cuuint64_t>(stride_head) * 2,
                                 static_cast<cuuint64_t>(kHalfCols) * 2};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(kHalfCols), static_cast<cuuint32_t>(box_tokens), 1,
                             static_cast<cuuint32_t>(head_dim / kHalfCols)};
  return encode_tiled(name, base, dtype, 4, dims, strides, box);
}

CUtensorMap make_paged_tile_map(const char* name, const void* base, DType dtype, int64_t head_dim, int64_t heads,
                                int64_t tokens, int64_t stride_head, int64_t stride_token, int box_tokens) {
  // Rows split into 8-row groups and the 64-dim parts between the two, so a box lands groups first:
  // rows 0-7 of every part, then rows 8-15, ... The pool has a multiple of 16 rows (pages of a
  // multiple of 16, checked with the block table), so the groups cover it exactly; a pool that did
  // not would lose its last rows to the bounds check, so it is refused here too.
  if (tokens % 8 != 0 || box_tokens % 8 != 0)
    throw Error(name, "is a page pool of " + std::to_string(tokens) + " rows read in boxes of " +
                          std::to_string(box_tokens),
                "a whole number of pages of a multiple of 16 rows");
  const cuuint64_t dims[5] = {static_cast<cuuint64_t>(kHalfCols), 8, static_cast<cuuint64_t>(head_dim / kHalfCols),
                              static_cast<cuuint64_t>(tokens / 8), static_cast<cuuint64_t>(heads)};
  const cuuint64_t strides[4] = {static_cast<cuuint64_t>(stride_token) * 2, static_cast<cuuint64_t>(kHalfCols) * 2,
                                 static_cast<cuuint64_t>(stride_token) * 2 * 8, static_cast<cuuint64_t>(stride_head) * 2};
  const cuuint32_t box[5] = {static_cast<cuuint32_t>(kHalfCols), 8, static_cast<cuuint32_t>(head_dim / kHalfCols),
                             static_cast<cuuint32_t>(box_tokens / 8), 1};
  return encode_tiled(name, base, dtype, 5, dims, strides, box);
}

bool launch_if_selected(const attention::Params& params, DType dtype, int64_t head_dim, int block_size,
                        int64_t q_tokens, int64_t k_tokens, int64_t num_kv_heads, int64_t num_ctas,
                        const CudaOptions& options, cudaStream_t stream) {
  if (options.kernel == Kernel::portable) return false;
  const bool shape_ok = shape_supported(dtype, head_dim, block_size) && paged_pool_supported(params);
  const bool device_ok = kernel_available();
  if (!shape_ok || !device_ok) {
    if (options.kernel == Kernel::automatic) return false;
    throw Error("options.cuda.kernel",
                !device_ok ? std::string("is hopper but the device is not sm_90 or the build has no sm_90a code")
                           : "is hopper but the call has dtype " +
                                 std::string(dtype == DType::bf16 ? "bf16" : dtype == DType::f16 ? "f16" : "other") +
                                 ", head dim " + std::to_string(head_dim) + ", block size " +
                                 std::to_string(block_size) + ", paged K/V pool of " +
                                 std::to_string(params.block_table != nullptr ? params.pool_rows : 0) +
                                 " rows and a block table of " +
                                 std::to_string(params.block_table != nullptr
                                                    ? params.plan.num_sequences * params.table_stride
                                                    : 0) +
                                 " entries",
                "bf16/f16, head dim 64, 128 or 256, block size 64 or 128, a paged K/V pool below 2^31 rows and block "
                "table below 2^31 entries, on an sm_90 device (or kernel auto, also in CRISP_KERNEL)");
  }
  if (num_ctas == 0) return true;
  if (dtype == DType::bf16)
    launch_for_shape<__nv_bfloat16>(params, head_dim, block_size, q_tokens, k_tokens, num_kv_heads, num_ctas, dtype,
                                    options, stream);
  else
    launch_for_shape<__half>(params, head_dim, block_size, q_tokens, k_tokens, num_kv_heads, num_ctas, dtype, options,
                             stream);
  return true;
}

}  // namespace hopper
}  // namespace cuda_detail
}  // namespace crisp
