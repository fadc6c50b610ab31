// src/cuda/attention.cu — crisp::cuda::attend_async and the row-subset launch
// (cuda_detail::attend_rows_async): argument checks, the dispatch on (dtype, head dim, block size)
// and the launch of the block-sparse attention kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "common/kv_rows.h"
#include "common/shape_rules.h"
#include "backend.h"
#include "crisp/cuda.h"
#include "cuda/attention_kernel.cuh"
#include "cuda/attention_rows.h"
#include "cuda/cuda_check.h"
#include "cuda/device_plan_internal.h"
#include "cuda/hopper/gqa_pack.h"
#include "cuda/hopper/hopper_attention.h"

namespace crisp {
namespace cuda {

namespace {

namespace att = cuda_detail::attention;

std::string shape_string(const TensorView& t) {
  std::string s = "[" + std::to_string(t.shape[0]) + ", " + std::to_string(t.shape[1]);
  if (t.rank == 3) s += ", " + std::to_string(t.shape[2]);
  return s + "]";
}

void check_view(const char* name, const TensorView& t, int rank, int64_t heads, int64_t tokens, int64_t dim) {
  if (t.device != Device::cuda)
    throw Error(name, std::string("is on ") + to_string(t.device), "a view on Device::cuda");
  if (t.data == nullptr) throw Error(name, "has a null data pointer", "device memory");
  if (t.rank != rank) throw Error(name, "has rank " + std::to_string(t.rank), "rank " + std::to_string(rank));
  const bool shape_ok = t.shape[0] == heads && t.shape[1] == tokens && (rank == 2 || t.shape[2] == dim);
  if (!shape_ok) {
    std::string want = "[" + std::to_string(heads) + ", " + std::to_string(tokens);
    if (rank == 3) want += ", " + std::to_string(dim);
    throw Error(name, "has shape " + shape_string(t), want + "] (the DevicePlan's shape)");
  }
}

// q/k/v/out rows are copied in 16-byte pieces (cp.async) and written 4 bytes at a time.
void check_rows(const char* name, const TensorView& t) {
  if (t.stride[2] != 1)
    throw Error(name, "has last-dimension stride " + std::to_string(t.stride[2]), "1 (contiguous head dim)");
  const std::size_t es = dtype_size(t.dtype);
  const bool aligned = reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0 &&
                       (t.stride[0] * static_cast<int64_t>(es)) % 16 == 0 &&
                       (t.stride[1] * static_cast<int64_t>(es)) % 16 == 0;
  if (!aligned)
    throw Error(name, "rows are not 16-byte aligned",
                "a 16-byte aligned base pointer and head/token strides that are multiples of 16 bytes");
}

template <typename T, int kDim, int kBlock, bool kPaged>
void launch(const att::Params& params, int64_t num_ctas, cudaStream_t stream) {
  constexpr int kThreads = att::threads_per_cta<kDim, kBlock>();
  constexpr int kSmemBytes = att::smem_bytes<T, kDim, kBlock>();
  auto kernel = att::block_sparse_attention_kernel<T, kDim, kBlock, kPaged>;
  CRISP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  kernel<<<static_cast<unsigned>(num_ctas), kThreads, kSmemBytes, stream>>>(params);
  CRISP_CUDA_CHECK_LAUNCH("block_sparse_attention_kernel");
}

template <typename T, bool kPaged>
void dispatch_dim_block(const att::Params& params, int64_t head_dim, int block, int64_t num_ctas,
                        cudaStream_t stream) {
  if (head_dim == 256) {
    if (block == 128) return launch<T, 256, 128, kPaged>(params, num_ctas, stream);
    return launch<T, 256, 64, kPaged>(params, num_ctas, stream);
  }
  if (head_dim == 128) {
    if (block == 128) return launch<T, 128, 128, kPaged>(params, num_ctas, stream);
    return launch<T, 128, 64, kPaged>(params, num_ctas, stream);
  }
  if (block == 128) return launch<T, 64, 128, kPaged>(params, num_ctas, stream);
  return launch<T, 64, 64, kPaged>(params, num_ctas, stream);
}

template <typename T>
void dispatch_paging(const att::Params& params, int64_t head_dim, int block, int64_t num_ctas, cudaStream_t stream) {
  if (params.block_table != nullptr) return dispatch_dim_block<T, true>(params, head_dim, block, num_ctas, stream);
  dispatch_dim_block<T, false>(params, head_dim, block, num_ctas, stream);
}

// The checks and the launch shared by attend_async (every row: items == nullptr, out_tokens ==
// the plan's query tokens) and attend_rows_async (the listed rows into out/lse of out_tokens tokens).
void launch_attention(const TensorView& q, const TensorView& k, const TensorView& v, const DevicePlan& plan,
                      const BlockTable& block_table, const TensorView& out, const TensorView& lse,
                      const att::RowItem* items, int64_t num_items, int64_t out_tokens, void* stream_ptr,
                      const CudaOptions& options) {
  const CudaOptions kernel_options = detail::resolve_kernel_override(options);
  const cuda_detail::DevicePlanView& view = cuda_detail::view_of(plan);
  const int64_t Hq = plan.num_q_heads(), Hkv = plan.num_kv_heads(), d = plan.head_dim();
  const int64_t tokens = plan.total_tokens();  // query rows
  const int block = plan.block_size();
  const bool paged = !block_table.empty();
  detail::check_table_is_set_or_empty(block_table, "block_table");
  if (!paged && plan.page_size() != 0)
    throw Error("block_table", "is empty but the plan was made over paged K/V (pages of " +
                                   std::to_string(plan.page_size()) + ")",
                "the block table of the page pool k and v are (a pool read as contiguous K/V gives other keys)");

  check_view("q", q, 3, Hq, tokens, d);
  // Contiguous K/V hold every sequence's keys in order; paged K/V are a page pool of any size.
  if (paged) {
    if (k.rank == 3) detail::check_block_table(block_table, SeqLens{0, view.max_keys}, q, k);
    check_view("k", k, 3, Hkv, k.shape[1], d);
    check_view("v", v, 3, Hkv, k.shape[1], d);
  } else {
    check_view("k", k, 3, Hkv, view.key_tokens, d);
    check_view("v", v, 3, Hkv, view.key_tokens, d);
  }
  check_view("out", out, 3, Hq, out_tokens, d);
  check_view("lse", lse, 2, Hq, out_tokens, 1);
  for (const auto& [view, name] : {std::pair<const TensorView*, const char*>{&q, "q"}, {&k, "k"}, {&v, "v"},
                                    {&out, "out"}, {&lse, "lse"}})
    detail::check_view_reach(*view, name);
  detail::check_output_memory(q, k, v, out, lse);
  if (q.dtype != DType::bf16 && q.dtype != DType::f16)
    throw Error("q", std::string("has dtype ") + to_string(q.dtype), "bf16 or f16 on the CUDA backend");
  if (k.dtype != q.dtype) throw Error("k", std::string("has dtype ") + to_string(k.dtype), to_string(q.dtype));
  if (v.dtype != q.dtype) throw Error("v", std::string("has dtype ") + to_string(v.dtype), to_string(q.dtype));
  if (out.dtype != q.dtype)
    throw Error("out", std::string("has dtype ") + to_string(out.dtype),
                std::string(to_string(q.dtype)) + " (the input dtype, on the CUDA backend)");
  if (lse.dtype != DType::f32)
    throw Error("lse", std::string("has dtype ") + to_string(lse.dtype), "f32 on the CUDA backend");
  if (!shape_rules::cuda_head_dim_supported(d))
    throw Error("q", "has head dim " + std::to_string(d), shape_rules::kCudaHeadDimExpected);
  if (!shape_rules::valid_block_size(block))
    throw Error("plan", "has block size " + std::to_string(block), shape_rules::kBlockSizeExpected);
  check_rows("q", q);
  check_rows("k", k);
  check_rows("v", v);
  check_rows("out", out);

  att::Params params{};
  params.q = q.data;
  params.k = k.data;
  params.v = v.data;
  params.out = out.data;
  params.lse = static_cast<float*>(lse.data);
  params.q_stride_head = q.stride[0];
  params.q_stride_token = q.stride[1];
  params.k_stride_head = k.stride[0];
  params.k_stride_token = k.stride[1];
  params.v_stride_head = v.stride[0];
  params.v_stride_token = v.stride[1];
  params.o_stride_head = out.stride[0];
  params.o_stride_token = out.stride[1];
  params.lse_stride_head = lse.stride[0];
  params.lse_stride_token = lse.stride[1];
  params.num_q_heads = static_cast<int32_t>(Hq);
  params.q_per_kv = static_cast<int32_t>(Hq / Hkv);
  params.scale = static_cast<float>(plan.softmax_scale());
  params.scale_log2 = static_cast<float>(plan.softmax_scale() * 1.4426950408889634);  // log2(e)
  params.window = static_cast<int32_t>(plan.config().window);  // Config::validate bounds it by 2^31 - 1
  params.plan = view;
  params.block_table = paged ? block_table.data : nullptr;
  params.table_stride = paged ? block_table.max_pages_per_sequence : 0;
  params.page_size = paged ? static_cast<int32_t>(block_table.page_size) : 0;
  params.page_shift = paged ? kv_rows::page_shift(block_table.page_size) : -1;
  params.pool_rows = k.shape[1];
  params.row_items = items;
  const bool ordered = items == nullptr && view.work_order_ready;
  params.work_order = ordered ? view.work_order : nullptr;
  params.work_counter = nullptr;  // set by the Hopper launch when it runs persistent CTAs
  params.packed_col = nullptr;  // set by the Hopper launch when it packs GQA groups
  params.packed_len = nullptr;
  params.packed_group = 0;

  // One CTA (or, persistent, one scheduled job) per work item: the listed rows of every head, the
  // real rows in the plan's work order, or every item code (heaviest causal rows first).
  const int64_t num_ctas = items != nullptr ? Hq * num_items
                           : ordered        ? view.num_work_items
                                            : Hq * plan.num_sequences() * static_cast<int64_t>(view.max_num_blocks);
  if (num_ctas > 0x7fffffffLL)
    throw Error("q", "needs " + std::to_string(num_ctas) + " work items", "fewer than 2^31");
  if (num_ctas == 0) return;
  params.num_items = static_cast<int32_t>(num_ctas);
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  // The sm_90a kernel (TMA + wgmma) when the device, the shape and the kernel options allow it
  // (src/cuda/hopper/hopper_attention.h; chunks and paged K/V included); otherwise the portable
  // kernel below.
  // Kernel::automatic's size rule counts the causal work of the rows this launch computes (a
  // row-subset call: its listed blocks' share), and leaves calls that set a Hopper-only option
  // (schedule, ping-pong, GQA packing, which changes what is computed) to the Hopper kernel.
  const int64_t launched_rows = items != nullptr ? std::min(tokens, num_items * block) : tokens;
  const double launched_share = tokens > 0 ? static_cast<double>(launched_rows) / static_cast<double>(tokens) : 0.0;
  const double causal_work = launched_share * static_cast<double>(Hq) * static_cast<double>(d) *
                             shape_rules::causal_key_pairs(plan.batch().cu_seqlens_q, plan.batch().cu_seqlens_k);
  const bool hopper_settings = kernel_options.schedule != Schedule::automatic ||
                               kernel_options.ping_pong != PingPong::automatic ||
                               kernel_options.gqa_packing != GqaPacking::automatic;
  const bool small_call = kernel_options.kernel == Kernel::automatic && !hopper_settings &&
                          !shape_rules::automatic_prefers_hopper(causal_work);
  if (!small_call && cuda_detail::hopper::launch_if_selected(params, q.dtype, d, block, tokens, k.shape[1], Hkv,
                                                             num_ctas, kernel_options, stream))
    return;
  if (q.dtype == DType::bf16)
    dispatch_paging<__nv_bfloat16>(params, d, block, num_ctas, stream);
  else
    dispatch_paging<__half>(params, d, block, num_ctas, stream);
}

}  // namespace

bool hopper_kernel_available() { return cuda_detail::hopper::kernel_available(); }

bool gqa_packing_applies(int block_size, int64_t group_size) {
  return cuda_detail::hopper::gqa_pack_applies(block_size, group_size, /*row_subset=*/false, /*num_work_items=*/1);
}

void attend_async(const TensorView& q, const TensorView& k, const TensorView& v, const DevicePlan& plan,
                  const TensorView& out, const TensorView& lse, void* stream, const CudaOptions& options,
                  const BlockTable& block_table) {
  launch_attention(q, k, v, plan, block_table, out, lse, nullptr, 0, plan.empty() ? 0 : plan.total_tokens(), stream,
                   options);
}

}  // namespace cuda

namespace cuda_detail {

void attend_rows_async(const TensorView& q, const TensorView& k, const TensorView& v, const cuda::DevicePlan& plan,
                       const TensorView& out, const TensorView& lse, const attention::RowItem* device_items,
                       int64_t num_items, void* stream) {
  if (num_items < 0) throw Error("num_items", "is " + std::to_string(num_items), "0 or more");
  if (num_items > 0 && device_items == nullptr)
    throw Error("device_items", "is null", "a device array of num_items row items");
  // The launch checks Hq * num_items < 2^31 (the work items); this bound keeps that product from
  // overflowing first.
  if (num_items > 0x7fffffffLL) throw Error("num_items", "is " + std::to_string(num_items), "fewer than 2^31");
  if (num_items == 0) return;
  cuda::launch_attention(q, k, v, plan, BlockTable{}, out, lse, device_items, num_items, out.shape[1], stream,
                         CudaOptions{});
}

}  // namespace cuda_detail
}  // namespace crisp
