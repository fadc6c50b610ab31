// src/backend.h — the internal interface between the public API (src/api.cpp) and the backends.
//
// The API validates every input once, normalises the Batch (both cu_seqlens lists filled) and
// resolves nothing else; it then dispatches on the device of the views. A backend may assume
// that every precondition listed here holds.
//
// Preconditions shared by every function below (checked in src/api.cpp):
//  - q: [Hq, q_tokens, d], k and v: [Hkv, kv_tokens, d], Hq % Hkv == 0, 1 <= d <= 256;
//  - every view's data is non-null and every view is on the same device;
//  - a normalized Batch (normalize_batch): cu_seqlens_q = {0, ..., q_tokens} and cu_seqlens_k of
//    the same length, both strictly increasing, 1 <= n_q <= n_k per sequence; contiguous K/V:
//    cu_seqlens_k ends at kv_tokens; paged K/V: the table is on the views' device, page_size a
//    multiple of 16 dividing kv_tokens, ceil(n_k / page_size) <= max_pages_per_sequence, and
//    (for a table on the host) every page id used in [0, kv_tokens / page_size);
//  - q, k, v contain only finite values (checked by the API for Device::cpu views only: the API
//    cannot read device memory, so the CUDA backend checks or documents this itself);
//  - config.validate() passed;
//  - for attend: plan matches the shapes (heads, head dim, sequences, block size) and the
//    BlockTable (validate_plan_for), and out [Hq, q_tokens, d] / lse [Hq, q_tokens] have a
//    supported dtype.
#pragma once
#include <memory>
#include <new>
#include <stdexcept>

#include "crisp/config.h"
#include "crisp/crisp.h"
#include "crisp/error.h"
#include "crisp/plan.h"
#include "crisp/tensor.h"
#include "plan/dense_head.h"  // detail::make_dense_head

#include <string>

namespace crisp {
namespace detail {

// ---------------------------------------------------------------- options (src/options.cpp)
// Throws crisp::Error naming the first bad field ("options.num_threads", "options.cuda.kernel").
void check_options(const Options& options);
void check_cuda_options(const CudaOptions& cuda);
// Throws crisp::Error naming "q" when options.backend names a backend other than q's device.
void check_backend(const Options& options, const TensorView& q);
// `cuda` checked, with Kernel::automatic replaced by the CRISP_KERNEL environment variable when it
// is set: the one place that variable is read. Throws crisp::Error naming "CRISP_KERNEL" for a
// value other than auto, portable or hopper.
CudaOptions resolve_kernel_override(const CudaOptions& cuda);
// The planner's per-stage timing (CRISP_PLAN_TIMING=1: one line of CUDA-event times on stderr per
// plan_async, after a stream synchronisation). A profiling switch that never changes a result; read
// here, beside CRISP_KERNEL, so that src/options.cpp is the one file that reads the environment.
// CRISP_PLAN_TIMING=host instead: one line per plan_async of the host's own time in its parts (the
// checks, the planner workspace — marked when it was made for a new shape —, the kernels' launches,
// the work order), without synchronising: where a caller's host waits inside plan_async.
enum class PlanTiming { off, stages, host };
PlanTiming plan_timing_requested();

// ---------------------------------------------------------------- validation (src/api.cpp)
// Returns {0, tokens} for an empty list; otherwise checks cu_seqlens against `tokens` and
// returns it unchanged. Throws crisp::Error naming `name` ("cu_seqlens", "batch.cu_seqlens_q").
SeqLens normalize_seqlens(const SeqLens& cu_seqlens, int64_t tokens, const char* name = "cu_seqlens");
// The offset rules of every cu_seqlens list (at least two entries, from 0, strictly increasing),
// errors naming `name`; normalize_seqlens adds the token count of the tensors.
void check_offsets(const SeqLens& cu_seqlens, const char* name);
// Both lists of a normalized batch name the same sequences, each with n_q <= n_k (spec §11).
void check_queries_within_keys(const Batch& normalized_batch);
// Checks q and k (and v when non-null) for a consistent attention problem: rank, dtype, device,
// head counts, head dim, non-null data (token counts: normalize_batch). Throws crisp::Error naming
// the argument.
void validate_qkv(const TensorView& q, const TensorView& k, const TensorView* v);
// Checks the Batch against q / k (and v) and returns it with both lists filled: an empty
// cu_seqlens_q is {0, q_tokens}, an empty cu_seqlens_k is cu_seqlens_q. Checks the block table
// (and its page ids when it lives on the host). Throws crisp::Error naming "batch.<field>".
Batch normalize_batch(const Batch& batch, const TensorView& q, const TensorView& k, const TensorView* v);
// A table whose page size is 0 ("no table") with data or a row stride set: refused, naming
// `name`.page_size (its pool would be read as contiguous K/V).
void check_table_is_set_or_empty(const BlockTable& table, const char* name);
// Paged K/V: checks the table (page size, data, device, row stride against the longest sequence of
// cu_k) against the pool k, and its page ids when it lives on the host. Throws crisp::Error naming
// "batch.block_table.<field>" or "k".
void check_block_table(const BlockTable& table, const SeqLens& cu_k, const TensorView& q, const TensorView& k);
// Checks out [Hq, q_tokens, d] (f32/f16/bf16/f64) and lse [Hq, q_tokens] (f32/f64) against q.
// Refuses a view whose farthest element lies 2^62 bytes or more from its data pointer (element
// offsets would overflow int64 somewhere), naming `name`. check_view of every entry point calls it.
void check_view_reach(const TensorView& t, const std::string& name);
void validate_outputs(const TensorView& q, const TensorView& out, const TensorView& lse);
// The outputs' memory (every entry point that writes them, the CUDA attend_async included; the
// views' reach checked first): no zero stride over an extent > 1, out sharing no byte with k or v
// and none with q unless it is q itself (same pointer, dtype, strides), lse none with q, k, v or
// out. Overlaps are judged where both views are dense.
void check_output_memory(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                         const TensorView& lse);
// Checks that the plan fits q/k and the block table (heads, head dim, block size, sequences
// covering every query row and, with contiguous K/V, every key row) and is well-formed CSR
// (bounds included), so a backend may index with it freely.
void validate_plan_for(const TensorView& q, const TensorView& k, const Plan& plan, const BlockTable& block_table);
// The value checks of every entry point (the free functions and crisp::Attention), on CPU views
// (device views: the CUDA backend's responsibility): NaN/Inf, naming the tensor and the first bad
// element; values beyond float32 in f32 precision; q/k magnitudes whose dot products overflow and
// v magnitudes whose output sums overflow; a softmax scale (resolved: > 0) beyond float32 where
// the kernel scales in float32; results beyond the range of `out`'s and `lse`'s dtypes. `v`, `out`
// and `lse` may be null (planning only). With paged K/V (block_table non-empty, already checked
// against k; cu_k the batch's key offsets), only the pool rows the batch reads are its input: a
// cache's other pages may hold anything.
void check_input_values(const TensorView& q, const TensorView& k, const TensorView* v, const Options& options,
                        double softmax_scale, const BlockTable& block_table = {}, const SeqLens& cu_k = {},
                        const TensorView* out = nullptr, const TensorView* lse = nullptr);

// The sequences of a plan (offsets, lengths, blocks; no heads) for a normalized batch.
// Refuses a sequence whose rows' causal blocks overflow the CSR's int32 (a whole prompt of more
// than shape_rules::kMaxPromptBlocks blocks), naming `keys_argument` (what gave the key counts).
std::vector<SequencePlan> sequence_shapes(const Batch& normalized_batch, int block_size, const char* keys_argument = "k");

// ---------------------------------------------------------------- plan once, run many times
// The backend half of a crisp::Attention (src/attention.cpp validates and dispatches). plan() has
// the preconditions of cpu_plan; run() those of cpu_attend except that the plan is its own.
class PlannedAttention {
 public:
  virtual ~PlannedAttention() = default;
  // Keeps normalized_batch (its block table included) for the runs.
  virtual void plan(const TensorView& q, const TensorView& k, const Batch& normalized_batch) = 0;
  virtual void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                   const TensorView& lse) const = 0;
  virtual Plan host_plan() const = 0;
};

// ---------------------------------------------------------------- CPU backend (src/cpu/)
// The plan of every (sequence, query head): §1–§5 and §7 of the spec.
Plan cpu_plan(const TensorView& q, const TensorView& k, const Config& config, const Batch& normalized_batch,
              const Options& options);
// Block-sparse causal attention following `plan` (§6, §11): K/V rows through the block table when
// it is not empty. Writes every element of out and lse.
void cpu_attend(const TensorView& q, const TensorView& k, const TensorView& v, const Plan& plan,
                const BlockTable& block_table, const TensorView& out, const TensorView& lse, const Options& options);
// One scan of a CPU view: the flat (h, t, x) index of its first NaN/Inf (-1: none) and its
// largest |value| (meaningful when there is none). Used by the API to reject non-finite inputs
// and inputs whose scores would overflow.
struct CpuValueScan {
  int64_t first_nonfinite = -1;
  double max_abs = 0.0;
};
CpuValueScan cpu_scan_values(const TensorView& view, int num_threads = 0);

// ---------------------------------------------------------------- CUDA backend (src/cuda/)
// Built without CUDA, src/nocuda/cuda_unavailable.cpp provides these: cuda_backend_built()
// returns false and the others throw crisp::Error.
bool cuda_backend_built();
// Same contract as cpu_plan, views on Device::cuda. options.stream is the cudaStream_t.
Plan cuda_plan(const TensorView& q, const TensorView& k, const Config& config, const Batch& normalized_batch,
               const Options& options);
// Same contract as cpu_attend, views on Device::cuda.
void cuda_attend(const TensorView& q, const TensorView& k, const TensorView& v, const Plan& plan,
                 const BlockTable& block_table, const TensorView& out, const TensorView& lse, const Options& options);
// A crisp::Attention's CUDA half: a DevicePlan kept while the batch shape stays the same,
// plan_async / attend_async on options.stream with options.cuda.
std::unique_ptr<PlannedAttention> make_cuda_planned_attention(const Config& config, const Options& options);

// Runs `work` (a call's planning or attention) with its allocation failures as crisp::Errors: a
// call whose working memory does not fit (the CPU backend packs the K/V a batch reads, and keeps
// per-head statistics) reads as every other refused input, not as std::bad_alloc.
template <typename Work>
auto within_memory(Work&& work) -> decltype(work()) {
  try {
    return work();
  } catch (const std::bad_alloc&) {
    throw Error("q", "out of memory: the call's working memory (its heads, tokens and keys) does not fit",
                "fewer heads, tokens or keys per call");
  } catch (const std::length_error&) {
    throw Error("q", "the call's working memory (its heads, tokens and keys) exceeds what a vector can hold",
                "fewer heads, tokens or keys per call");
  }
}

}  // namespace detail
}  // namespace crisp
