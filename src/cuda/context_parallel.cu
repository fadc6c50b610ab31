// src/cuda/context_parallel.cu — crisp::cuda::ContextParallelPrefill and cp_prefill
// (crisp/context_parallel.h): query-sharded prefill of one sequence over the ranks of an NCCL
// communicator. Compiled with the CUDA backend; the NCCL path only when CMake found NCCL
// (CRISP_WITH_NCCL), otherwise every entry point throws crisp::Error "built without NCCL".
//
// One run() on `stream`, no host synchronisation:
//   1. the local Q/K/V slices are copied into this rank's slot of three receive buffers
//      [world][H][max_local][d] (slots padded to the largest rank's token count, as NCCL's
//      all-gather moves equal counts);
//   2. three in-place ncclAllGather calls in one NCCL group;
//   3. the chunks of every rank are copied to their place in full-length [H, n, d] tensors
//      (cp_assembly_segments; one 2-D copy per chunk and tensor);
//   4. plan_async on the full Q/K: the same deterministic planner, inputs and plan as one GPU;
//   5. the row-subset attention launch (cuda_detail::attend_rows_async) for this rank's query
//      blocks, into out_local / lse_local.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/shape_rules.h"
#include "crisp/context_parallel.h"
#include "crisp/cuda.h"
#include "cuda/attention_rows.h"
#include "cuda/cuda_check.h"
#include "plan/partition.h"

#if defined(CRISP_WITH_NCCL)
#include <nccl.h>
#endif

namespace crisp {
namespace cuda {

bool nccl_built() {
#if defined(CRISP_WITH_NCCL)
  return true;
#else
  return false;
#endif
}

#if defined(CRISP_WITH_NCCL)

namespace {

#define CRISP_NCCL_CHECK(expr)                                                                         \
  do {                                                                                                 \
    const ncclResult_t crisp_nccl_status_ = (expr);                                                    \
    if (crisp_nccl_status_ != ncclSuccess)                                                             \
      throw Error(std::string("NCCL ") + #expr, ncclGetErrorString(crisp_nccl_status_), "ncclSuccess"); \
  } while (0)

struct DeviceMemory {
  void* ptr = nullptr;
  DeviceMemory() = default;
  DeviceMemory(std::size_t bytes, const char* what) {
    if (bytes == 0) return;
    const cudaError_t status = cudaMalloc(&ptr, bytes);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      throw Error(what, "cudaMalloc of " + std::to_string(bytes) + " bytes failed (" + cudaGetErrorString(status) + ")",
                  "enough free device memory");
    }
  }
  ~DeviceMemory() {
    if (ptr != nullptr) cudaFree(ptr);
  }
  DeviceMemory(DeviceMemory&& o) noexcept : ptr(std::exchange(o.ptr, nullptr)) {}
  DeviceMemory& operator=(DeviceMemory&& o) noexcept {
    std::swap(ptr, o.ptr);
    return *this;
  }
  unsigned char* bytes() const { return static_cast<unsigned char*>(ptr); }
};

// One gathered tensor: the NCCL receive buffer (every rank's padded slot) and the full sequence.
struct Gathered {
  int64_t heads = 0;
  std::size_t slot_bytes = 0;  // heads * max_local * d * element size
  DeviceMemory receive;        // [world][heads][max_local][d]
  DeviceMemory full;           // [heads][n][d]
};

}  // namespace

struct ContextParallelPrefill::Impl {
  int64_t num_q_heads = 0, num_kv_heads = 0, head_dim = 0, n = 0, max_local = 0;
  DType dtype = DType::bf16;
  std::size_t elem = 2;
  Config config;
  CpShard shard;
  int device = 0;
  ncclComm_t comm = nullptr;
  std::vector<CpAssemblySegment> segments;
  Gathered q, k, v;
  DeviceMemory items;
  int64_t num_items = 0;
  DevicePlan plan;

  TensorView full_view(const Gathered& g) const {
    return TensorView::contiguous(g.full.ptr, dtype, g.heads, n, head_dim, Device::cuda);
  }

  void check_local(const char* name, const TensorView& t, int64_t heads) const {
    if (t.device != Device::cuda)
      throw Error(name, std::string("is on ") + to_string(t.device), "a view on Device::cuda");
    if (t.data == nullptr) throw Error(name, "has a null data pointer", "device memory");
    if (t.dtype != dtype)
      throw Error(name, std::string("has dtype ") + to_string(t.dtype),
                  std::string(to_string(dtype)) + " (the dtype given to ContextParallelPrefill)");
    if (t.rank != 3 || t.shape[0] != heads || t.shape[1] != shard.local_tokens || t.shape[2] != head_dim)
      throw Error(name, "has shape [" + std::to_string(t.shape[0]) + ", " + std::to_string(t.shape[1]) + ", " +
                            std::to_string(t.rank == 3 ? t.shape[2] : 0) + "] (rank " + std::to_string(t.rank) + ")",
                  "[" + std::to_string(heads) + ", " + std::to_string(shard.local_tokens) + ", " +
                      std::to_string(head_dim) + "] (this rank's local tokens)");
    if (t.stride[2] != 1 || t.stride[1] != head_dim || t.stride[0] < shard.local_tokens * head_dim)
      throw Error(name, "is not row-packed (strides " + std::to_string(t.stride[0]) + ", " +
                            std::to_string(t.stride[1]) + ", " + std::to_string(t.stride[2]) + ")",
                  "token stride = head dim and last-dimension stride 1");
  }

  void check_output(const TensorView& out, const TensorView& lse) const {
    const int64_t lt = shard.local_tokens;
    if (out.device != Device::cuda || out.data == nullptr || out.rank != 3 || out.dtype != dtype ||
        out.shape[0] != num_q_heads || out.shape[1] != lt || out.shape[2] != head_dim || out.stride[2] != 1)
      throw Error("out_local", "is not a " + std::string(to_string(dtype)) + " device view of shape [" +
                                   std::to_string(num_q_heads) + ", " + std::to_string(lt) + ", " +
                                   std::to_string(head_dim) + "] with a contiguous last dimension",
                  "this rank's output slice");
    const bool aligned = reinterpret_cast<std::uintptr_t>(out.data) % 16 == 0 &&
                         (out.stride[0] * static_cast<int64_t>(elem)) % 16 == 0 &&
                         (out.stride[1] * static_cast<int64_t>(elem)) % 16 == 0;
    if (!aligned) throw Error("out_local", "rows are not 16-byte aligned", "16-byte aligned base and strides");
    if (lse.device != Device::cuda || lse.data == nullptr || lse.rank != 2 || lse.dtype != DType::f32 ||
        lse.shape[0] != num_q_heads || lse.shape[1] != lt)
      throw Error("lse_local", "is not an f32 device view of shape [" + std::to_string(num_q_heads) + ", " +
                                   std::to_string(lt) + "]",
                  "this rank's LSE slice");
  }

  // Step 1: this rank's slice into its slot of the receive buffer.
  void stage_local(const Gathered& g, const TensorView& local, cudaStream_t stream) const {
    const std::size_t row_bytes = static_cast<std::size_t>(head_dim) * elem;
    CRISP_CUDA_CHECK(cudaMemcpy2DAsync(g.receive.bytes() + static_cast<std::size_t>(shard.rank) * g.slot_bytes,
                                       static_cast<std::size_t>(max_local) * row_bytes, local.data,
                                       static_cast<std::size_t>(local.stride[0]) * elem,
                                       static_cast<std::size_t>(shard.local_tokens) * row_bytes,
                                       static_cast<std::size_t>(g.heads), cudaMemcpyDeviceToDevice, stream));
  }

  // Step 3: every rank's chunks to their place in the full tensor.
  void assemble(const Gathered& g, cudaStream_t stream) const {
    const std::size_t row_bytes = static_cast<std::size_t>(head_dim) * elem;
    for (const CpAssemblySegment& s : segments) {
      CRISP_CUDA_CHECK(cudaMemcpy2DAsync(
          g.full.bytes() + static_cast<std::size_t>(s.token) * row_bytes, static_cast<std::size_t>(n) * row_bytes,
          g.receive.bytes() + static_cast<std::size_t>(s.rank) * g.slot_bytes +
              static_cast<std::size_t>(s.local_token) * row_bytes,
          static_cast<std::size_t>(max_local) * row_bytes, static_cast<std::size_t>(s.tokens) * row_bytes,
          static_cast<std::size_t>(g.heads), cudaMemcpyDeviceToDevice, stream));
    }
  }
};

ContextParallelPrefill::ContextParallelPrefill(int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, int64_t n,
                                               DType dtype, const Config& config, CpPartition partition, int rank,
                                               int world, void* nccl_comm)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (nccl_comm == nullptr) throw Error("nccl_comm", "is null", "an ncclComm_t of `world` ranks");
  if (num_q_heads < 1 || num_kv_heads < 1 || num_q_heads % num_kv_heads != 0)
    throw Error("num_kv_heads", std::to_string(num_q_heads) + " query / " + std::to_string(num_kv_heads) + " kv heads",
                "positive head counts with num_q_heads a multiple of num_kv_heads");
  if (!shape_rules::cuda_head_dim_supported(head_dim))
    throw Error("head_dim", "is " + std::to_string(head_dim), shape_rules::kCudaHeadDimExpected);
  if (dtype != DType::bf16 && dtype != DType::f16)
    throw Error("dtype", std::string("is ") + to_string(dtype), "bf16 or f16 on the CUDA backend");
  config.validate();
  m.shard = cp_shard(n, config.block_size, partition, rank, world);

  ncclComm_t comm = static_cast<ncclComm_t>(nccl_comm);
  int comm_ranks = 0, comm_rank = 0, comm_device = 0;
  CRISP_NCCL_CHECK(ncclCommCount(comm, &comm_ranks));
  CRISP_NCCL_CHECK(ncclCommUserRank(comm, &comm_rank));
  CRISP_NCCL_CHECK(ncclCommCuDevice(comm, &comm_device));
  if (comm_ranks != world || comm_rank != rank)
    throw Error("nccl_comm", "has " + std::to_string(comm_ranks) + " ranks, this one " + std::to_string(comm_rank),
                std::to_string(world) + " ranks (world), this one " + std::to_string(rank) + " (rank)");
  CRISP_CUDA_CHECK(cudaGetDevice(&m.device));
  if (comm_device != m.device)
    throw Error("nccl_comm", "belongs to CUDA device " + std::to_string(comm_device),
                "the current device of the calling thread (" + std::to_string(m.device) + ")");

  m.num_q_heads = num_q_heads;
  m.num_kv_heads = num_kv_heads;
  m.head_dim = head_dim;
  m.n = n;
  m.dtype = dtype;
  m.elem = dtype_size(dtype);
  m.config = config;
  m.comm = comm;
  m.max_local = cp_max_local_tokens(n, config.block_size, partition, world);
  m.segments = cp_assembly_segments(n, config.block_size, partition, world);

  const auto allocate = [&](Gathered& g, int64_t heads, const char* what) {
    g.heads = heads;
    g.slot_bytes = static_cast<std::size_t>(heads) * static_cast<std::size_t>(m.max_local) *
                   static_cast<std::size_t>(head_dim) * m.elem;
    g.receive = DeviceMemory(g.slot_bytes * static_cast<std::size_t>(world), what);
    // The padding rows of short slots travel but are never read; zero them once so every byte
    // that moves is initialised.
    CRISP_CUDA_CHECK(cudaMemset(g.receive.ptr, 0, g.slot_bytes * static_cast<std::size_t>(world)));
    g.full = DeviceMemory(static_cast<std::size_t>(heads) * static_cast<std::size_t>(n) *
                              static_cast<std::size_t>(head_dim) * m.elem,
                          what);
  };
  allocate(m.q, num_q_heads, "gathered q");
  allocate(m.k, num_kv_heads, "gathered k");
  allocate(m.v, num_kv_heads, "gathered v");

  // This rank's query blocks as row items, heaviest (latest) block first, as the full launch
  // orders its grid: rows near the end of the sequence have the most key blocks.
  std::vector<cuda_detail::attention::RowItem> items;
  const int32_t code = partition == CpPartition::zigzag ? partition::kZigzag : partition::kContiguous;
  for (const int32_t r : m.shard.query_blocks())
    items.push_back({0, r, partition::block_local_token(code, world, r, m.shard.num_blocks, config.block_size, n)});
  std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.query_block > b.query_block; });
  m.num_items = static_cast<int64_t>(items.size());
  m.items = DeviceMemory(items.size() * sizeof(items[0]), "row items");
  CRISP_CUDA_CHECK(cudaMemcpy(m.items.ptr, items.data(), items.size() * sizeof(items[0]), cudaMemcpyHostToDevice));

  m.plan = DevicePlan(num_q_heads, num_kv_heads, head_dim, {0, n}, config);
}

void ContextParallelPrefill::run(const TensorView& q_local, const TensorView& k_local, const TensorView& v_local,
                                 const TensorView& out_local, const TensorView& lse_local, void* stream_ptr) {
  Impl& m = *impl_;
  int device = 0;
  CRISP_CUDA_CHECK(cudaGetDevice(&device));
  if (device != m.device)
    throw Error("device", "the current CUDA device is " + std::to_string(device),
                "device " + std::to_string(m.device) + " (the one ContextParallelPrefill was made on)");
  m.check_local("q_local", q_local, m.num_q_heads);
  m.check_local("k_local", k_local, m.num_kv_heads);
  m.check_local("v_local", v_local, m.num_kv_heads);
  // The attention launch checks out_local / lse_local again, but only after the collectives are
  // enqueued: check everything here first, so a bad view fails before any work is enqueued.
  m.check_output(out_local, lse_local);

  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  m.stage_local(m.q, q_local, stream);
  m.stage_local(m.k, k_local, stream);
  m.stage_local(m.v, v_local, stream);
  CRISP_NCCL_CHECK(ncclGroupStart());
  for (Gathered* g : {&m.q, &m.k, &m.v}) {
    // In place: this rank's send buffer is its own slot of the receive buffer.
    const ncclResult_t status =
        ncclAllGather(g->receive.bytes() + static_cast<std::size_t>(m.shard.rank) * g->slot_bytes, g->receive.ptr,
                      g->slot_bytes, ncclChar, m.comm, stream);
    if (status != ncclSuccess) {
      (void)ncclGroupEnd();
      throw Error("NCCL ncclAllGather", ncclGetErrorString(status), "ncclSuccess");
    }
  }
  CRISP_NCCL_CHECK(ncclGroupEnd());
  m.assemble(m.q, stream);
  m.assemble(m.k, stream);
  m.assemble(m.v, stream);

  const TensorView q = m.full_view(m.q), k = m.full_view(m.k), v = m.full_view(m.v);
  plan_async(q, k, m.config, m.plan, stream_ptr);
  cuda_detail::attend_rows_async(q, k, v, m.plan, out_local, lse_local,
                                 static_cast<const cuda_detail::attention::RowItem*>(m.items.ptr), m.num_items,
                                 stream_ptr);
}

TensorView ContextParallelPrefill::gathered_q() const { return impl_->full_view(impl_->q); }
TensorView ContextParallelPrefill::gathered_k() const { return impl_->full_view(impl_->k); }
TensorView ContextParallelPrefill::gathered_v() const { return impl_->full_view(impl_->v); }

#else  // !CRISP_WITH_NCCL

struct ContextParallelPrefill::Impl {
  CpShard shard;
  DevicePlan plan;
};

ContextParallelPrefill::ContextParallelPrefill(int64_t, int64_t, int64_t, int64_t, DType, const Config&, CpPartition,
                                               int, int, void*) {
  throw Error("crisp::cuda::ContextParallelPrefill", "the library was built without NCCL",
              "a build with NCCL found (CMake option CRISP_NCCL, NCCL_ROOT)");
}

void ContextParallelPrefill::run(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                                 const TensorView&, void*) {
  throw Error("crisp::cuda::ContextParallelPrefill", "the library was built without NCCL",
              "a build with NCCL found (CMake option CRISP_NCCL, NCCL_ROOT)");
}

TensorView ContextParallelPrefill::gathered_q() const { return {}; }
TensorView ContextParallelPrefill::gathered_k() const { return {}; }
TensorView ContextParallelPrefill::gathered_v() const { return {}; }

#endif  // CRISP_WITH_NCCL

ContextParallelPrefill::~ContextParallelPrefill() = default;
ContextParallelPrefill::ContextParallelPrefill(ContextParallelPrefill&&) noexcept = default;
ContextParallelPrefill& ContextParallelPrefill::operator=(ContextParallelPrefill&&) noexcept = default;

const CpShard& ContextParallelPrefill::shard() const {
  if (!impl_) throw Error("ContextParallelPrefill", "is empty (moved from)", "a constructed object");
  return impl_->shard;
}

const DevicePlan& ContextParallelPrefill::plan() const {
  if (!impl_) throw Error("ContextParallelPrefill", "is empty (moved from)", "a constructed object");
  return impl_->plan;
}

void cp_prefill(const TensorView& q_local, const TensorView& k_local, const TensorView& v_local, const Config& config,
                CpPartition partition, int rank, int world, void* nccl_comm, int64_t n, const TensorView& out_local,
                const TensorView& lse_local, void* stream) {
  ContextParallelPrefill cp(q_local.shape[0], k_local.shape[0], q_local.rank == 3 ? q_local.shape[2] : 0, n,
                            q_local.dtype, config, partition, rank, world, nccl_comm);
  cp.run(q_local, k_local, v_local, out_local, lse_local, stream);
  // The buffers are freed on return: wait for the work that reads them.
  CRISP_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

}  // namespace cuda
}  // namespace crisp
