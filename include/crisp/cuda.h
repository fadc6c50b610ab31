// crisp/cuda.h — the CUDA backend's own entry points: plans that live on the device, planning
// and attention that take a stream and never synchronise the host, so that a whole plan + attend
// can be captured in a CUDA graph.
//
// This header names no CUDA type, so it can be included from plain C++ translation units.
// Every `void* stream` is a `cudaStream_t` (nullptr = the legacy default stream).
//
//   crisp::cuda::DevicePlan dplan(Hq, Hkv, d, batch, cfg);           // cudaMalloc'ed once
//   crisp::cuda::plan_async(q, k, cfg, dplan, stream);                 // plan on the device
//   crisp::cuda::attend_async(q, k, v, dplan, out, lse, stream);       // block-sparse attention
//   crisp::Plan host = dplan.to_host(stream);                          // optional: inspect it
//
// crisp::Attention (crisp/attention.h) does the same behind one object, on either backend.
//
// The host crisp::Plan and the device plan carry the same information, so a plan made by either
// backend can be run and checked on the other (DevicePlan::upload / DevicePlan::to_host).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "crisp/config.h"
#include "crisp/error.h"
#include "crisp/options.h"
#include "crisp/plan.h"
#include "crisp/tensor.h"

namespace crisp {
namespace cuda {

// True when the library was built with the CUDA backend and at least one CUDA device is visible.
// Never throws.
bool available();

// True when the current device can run the Hopper kernel (Kernel::hopper): an sm_90 device and a
// library built with sm_90a code. Throws crisp::Error when the CUDA runtime fails.
bool hopper_kernel_available();

// Whether the CUDA attention kernels are built for this head dim (64, 128 or 256; anything else
// makes attend_async throw). A shape rule: answered in every build, CPU-only ones included, without
// touching a device. Never throws.
bool head_dim_supported(int64_t head_dim);

// Whether Kernel::automatic takes the Hopper kernel, where it can run, for a call of this shape:
// num_q_heads x the keys the batch's queries see (bottom-right causal, summed over sequences) x
// head_dim of at least 2^35; smaller calls take the portable kernel, whose fixed cost per call is
// lower (crisp/options.h); a launch over some of a plan's query blocks counts their share. A shape
// rule answered in every build; never throws (offsets that do not increase count as empty
// sequences).
bool automatic_prefers_hopper(int64_t num_q_heads, const Batch& batch, int64_t head_dim);

// Whether GqaPacking::pack packs a whole-plan launch of this block size and GQA group size
// (Hq / Hkv); elsewhere the heads run separately and the launch
// computes the plan as planned (crisp/options.h).
bool gqa_packing_applies(int block_size, int64_t group_size);

// The plan of a whole batch, kept on the device in buffers of fixed capacity (the causal worst
// case, src/plan/plan_layout.h), so planning never has to read a size back before attention.
//
// A DevicePlan is made for one batch shape: query/key head counts, head dim, the sequence offsets
// (host vectors: sequence lengths are shapes, like tensor shapes) and the block size of the
// Config. The offsets are a crisp::Batch (crisp/tensor.h): cu_seqlens_q, and cu_seqlens_k for
// queries over a KV prefix (chunks, n_q <= n_k, spec §11); a plain cu_seqlens list converts to a
// Batch of whole prompts. The Batch's block table is not part of the shape: paged K/V is passed
// to plan_async (and to attention) with each call. It can then be filled any number of times, by plan_async (on the device) or upload
// (from a host Plan), for inputs of that shape.
//
// Memory: by default the buffers come from one cudaMalloc made in the constructor and released
// by the destructor (cudaFree, which synchronises the device: keep DevicePlans alive across
// iterations rather than making one per call). Callers with their own allocator pass a device
// workspace of at least bytes_required(...) bytes instead; the DevicePlan then allocates nothing
// and never frees it, and the workspace must outlive the DevicePlan. Apart from its buffers the
// DevicePlan holds host-side copies of the shape; constructing one copies the per-sequence bases
// to the device, synchronously (a device synchronisation), or on a stream given to the workspace
// constructor, with no synchronisation: a caller that makes a DevicePlan per shape on memory it
// reuses (an engine's ubatches) then pays no host wait at all. The planner's own workspace
// (plan_async) is kept per DevicePlan and, when the DevicePlan is destroyed, kept for the next one
// (release_cached_workspaces frees those).
//
// Capacity grows as N(N+1)/2 int32 columns per (sequence, head): ~1.07 GB for 32 heads at
// n = 512k, B = 128; bytes_required says exactly.
class DevicePlan {
 public:
  // An empty plan (holds nothing; every other method throws crisp::Error until assigned).
  DevicePlan();
  // Allocates with cudaMalloc. batch.cu_seqlens_q (and batch.cu_seqlens_k when not empty) must be
  // full offsets {0, ...} (at least one sequence, strictly increasing, n_q <= n_k);
  // config.block_size gives B; the softmax scale is config.softmax_scale or 1/sqrt(head_dim) when
  // that is 0. Throws crisp::Error on bad shapes or when the allocation fails.
  DevicePlan(int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, const Batch& batch,
             const Config& config);
  // Same, on a caller-provided device workspace (see above). Throws crisp::Error naming
  // "workspace" when it is null, not 256-byte aligned, or smaller than bytes_required. With a
  // `stream` (a cudaStream_t, not null) the shape's tables are written into the workspace in that
  // stream's order, without synchronising: work enqueued earlier on `stream` that still reads the
  // workspace (a DevicePlan it held before) finishes first, and the DevicePlan must be used on
  // `stream` first (or other streams ordered after it with an event); not while `stream` is being
  // captured into a graph (crisp::Error naming "stream"). Without one (null), the copy is
  // synchronous and ends in a device synchronisation.
  DevicePlan(int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, const Batch& batch,
             const Config& config, void* workspace, std::size_t workspace_bytes, void* stream = nullptr);
  // Allocates for the shape of `plan` (cudaMalloc) and uploads it on `stream`.
  explicit DevicePlan(const Plan& plan, void* stream = nullptr);

  ~DevicePlan();
  DevicePlan(DevicePlan&&) noexcept;
  DevicePlan& operator=(DevicePlan&&) noexcept;
  DevicePlan(const DevicePlan&) = delete;
  DevicePlan& operator=(const DevicePlan&) = delete;

  // Device bytes needed for a batch shape (every buffer, 256-byte aligned each), on the current
  // CUDA device: the scratch of the sort that orders the attention work (heaviest rows first) is
  // sized by cub for that device's architecture, so this needs a visible device.
  static std::size_t bytes_required(int64_t num_q_heads, const Batch& batch, int block_size);
  static std::size_t bytes_required(int64_t num_q_heads, const SeqLens& cu_seqlens, int block_size);

  // Copies the device plan back (enqueued on `stream`, then synchronises that stream) and builds
  // the host Plan: routes, statistics, vertical/slash lists from the flags (empty for dense
  // heads), the CSR rows (rows before a chunk's first_row empty) and the density over the rows
  // that hold queries (rules::density_of_rows).
  Plan to_host(void* stream = nullptr) const;

  // Host Plan -> device buffers (enqueued on `stream`; host staging is released before return, so
  // `plan` may be destroyed right after). The plan must match this DevicePlan's shape (heads, head
  // dim, sequences, block size); its config and softmax scale are adopted. Throws crisp::Error
  // naming "plan" otherwise, or when the plan is not well formed.
  void upload(const Plan& plan, void* stream = nullptr);

  // Records the config (and the softmax scale it resolves to) that the next fill was made with;
  // plan_async calls this. Throws crisp::Error naming "config.block_size" if its block size
  // differs from this DevicePlan's.
  void set_config(const Config& config);
  // Records the page size of the paged K/V the next fill is made over (0: contiguous K/V);
  // plan_async and upload call this. attend_async refuses a plan made over pages without a block
  // table (a pool read as contiguous K/V gives other keys), as crisp::attend does. Throws
  // crisp::Error naming "page_size" when it is negative.
  void set_page_size(int64_t page_size);
  int64_t page_size() const;  // of the last fill (0: contiguous K/V)

  bool empty() const;
  int64_t num_q_heads() const;
  int64_t num_kv_heads() const;
  int64_t head_dim() const;
  int block_size() const;
  int64_t num_sequences() const;
  int64_t total_tokens() const;     // query rows (of q, out and lse)
  int64_t total_keys() const;       // keys of every sequence (rows of k and v unless paged)
  const SeqLens& cu_seqlens() const;  // the query offsets (batch().cu_seqlens_q)
  const Batch& batch() const;       // the shape, both lists filled (no block table)
  const Config& config() const;
  double softmax_scale() const;  // resolved (never 0)
  std::size_t bytes() const;     // device bytes in use (== bytes_required for this shape)
  bool owns_memory() const;      // true when the constructor cudaMalloc'ed the buffers

  // The library's internal device view (a `const crisp::cuda_detail::DevicePlanView*`, see
  // src/cuda/device_plan.h). Opaque here to keep CUDA-side types out of the public API.
  const void* raw_view() const;

  struct Impl;  // defined in src/cuda/device_plan.cu

 private:
  std::unique_ptr<Impl> impl_;
};

// Builds the plan of q/k (views on Device::cuda, [Hq, q_tokens, d] / [Hkv, kv_tokens, d], the
// shape the DevicePlan was made for) entirely on the device, on `stream`, with no host
// synchronisation. Same rules and results as crisp::plan on the CPU. Paged K/V: k is the page pool
// and `block_table` (on Device::cuda, page_size a multiple of 16, rows covering every sequence's
// keys) maps positions to its rows (crisp/tensor.h); page ids are not range-checked here (the
// table is device memory; a table of the wrong shape throws crisp::Error naming
// "batch.block_table.<field>", as crisp::plan does). An empty table: k holds the keys
// contiguously (kv_tokens = total_keys()).
void plan_async(const TensorView& q, const TensorView& k, const Config& config, DevicePlan& plan,
                void* stream = nullptr, const BlockTable& block_table = {});

// Frees the planner workspaces kept for reuse after their DevicePlans were destroyed (at most two
// per device, sized for the largest shape planned; cudaFree, which synchronises the device). Like
// torch.cuda.empty_cache: for a caller done with long prompts that wants the memory back.
void release_cached_workspaces();

// Block-sparse causal attention (spec §6) following the device plan, on `stream`, with no host
// synchronisation. A plan of chunks (queries over a KV prefix, spec §11) computes only its query
// rows: rows before a sequence's first_row are neither launched nor written.
//   q: [Hq, tokens, d] (the plan's query rows), k, v: [Hkv, key tokens, d] (every sequence's keys
//   in order), or with a non-empty `block_table` the page pool [Hkv, num_pages * page_size, d]
//   (page ids on the device, in [0, num_pages): an id outside reads as zero keys):
//   f16 or bf16 (all three the same), d = 64, 128 or 256 (head_dim_supported);
//   out: [Hq, tokens, d], the input dtype; lse: [Hq, tokens] f32 (natural log).
//   Paged K/V run on either kernel (docs/hopper.md); a pool of 2^31 rows or more only on the
//   portable one.
//   All on Device::cuda; the last dimension of q/k/v/out must be contiguous (stride 1), and every
//   row start must be 16-byte aligned (base pointers and the head/token strides).
// Every element of out and lse is written. Throws crisp::Error naming the offending argument for
// an unsupported dtype, head dim, layout or a shape that does not match the plan.
// `options` picks the kernel and its schedule (crisp/options.h; CRISP_KERNEL may stand in for
// Kernel::automatic).
// Graph capture: the Hopper kernel's persistent launch (the default on sm_90 when there are more
// work items than SMs) allocates a 4-byte work counter with cudaMallocAsync and frees it after the
// kernel, so a captured graph holds memory allocation/free nodes, with the restrictions CUDA
// places on graphs with memory nodes; Schedule::grid captures kernel nodes only.
// GqaPacking::pack also allocates, per launch, its union layout and work order the same way:
// about 4 bytes per causal block per kv head (1.1 GB at 1M tokens, B = 128, 8 kv heads). It
// computes crisp::gqa_union(plan), not the plan: that plan's density() is the density of such a
// run.
void attend_async(const TensorView& q, const TensorView& k, const TensorView& v,
                  const DevicePlan& plan, const TensorView& out, const TensorView& lse,
                  void* stream = nullptr, const CudaOptions& options = {}, const BlockTable& block_table = {});

}  // namespace cuda
}  // namespace crisp
