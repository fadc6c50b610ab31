// src/backend.h — the internal interface between the public API (src/api.cpp) and the backends.
//
// The API validates every input once, normalises cu_seqlens (an empty list becomes {0, tokens})
// and resolves nothing else; it then dispatches on the device of the views. A backend may assume
// that every precondition listed here holds.
//
// Preconditions shared by every function below (checked in src/api.cpp):
//  - q: [Hq, tokens, d], k and v: [Hkv, tokens, d], Hq % Hkv == 0, 1 <= d <= 256, tokens >= 1;
//  - every view's data is non-null and every view is on the same device;
//  - normalized_cu_seqlens = {0, ..., tokens}, strictly increasing (no empty sequence);
//  - q, k, v contain only finite values (checked by the API for Device::cpu views only: the API
//    cannot read device memory, so the CUDA backend checks or documents this itself);
//  - config.validate() passed;
//  - for attend: plan matches the shapes (heads, head dim, sequences, block size), and out
//    [Hq, tokens, d] / lse [Hq, tokens] have a supported dtype.
#pragma once
#include "crisp/config.h"
#include "crisp/crisp.h"
#include "crisp/plan.h"
#include "crisp/tensor.h"

namespace crisp {
namespace detail {

// ---------------------------------------------------------------- validation (src/api.cpp)
// Returns {0, tokens} for an empty list; otherwise checks cu_seqlens against `tokens` and
// returns it unchanged. Throws crisp::Error naming "cu_seqlens".
SeqLens normalize_seqlens(const SeqLens& cu_seqlens, int64_t tokens);
// Checks q and k (and v when non-null) for a consistent attention problem: rank, dtype, device,
// head counts, head dim, token count, non-null data. Throws crisp::Error naming the argument.
void validate_qkv(const TensorView& q, const TensorView& k, const TensorView* v);
// Checks out [Hq, tokens, d] (f32/f16/bf16/f64) and lse [Hq, tokens] (f32/f64) against q.
void validate_outputs(const TensorView& q, const TensorView& out, const TensorView& lse);
// Checks that the plan fits q/k (heads, head dim, block size, sequences covering every token)
// and is well-formed CSR (bounds included), so a backend may index with it freely.
void validate_plan_for(const TensorView& q, const TensorView& k, const Plan& plan);

// The dense head of a sequence with N blocks: route dense, every causal block, c_struct/jsd NaN,
// density 1 (src/cpu/cpu_plan.cpp; shared by dense_plan, the dense preset and short sequences).
HeadPlan make_dense_head(int32_t num_blocks);

// ---------------------------------------------------------------- CPU backend (src/cpu/)
// The plan of every (sequence, query head): §1–§5 and §7 of the spec.
Plan cpu_plan(const TensorView& q, const TensorView& k, const Config& config,
              const SeqLens& normalized_cu_seqlens, const Options& options);
// Block-sparse causal attention following `plan` (§6). Writes every element of out and lse.
void cpu_attend(const TensorView& q, const TensorView& k, const TensorView& v, const Plan& plan,
                const TensorView& out, const TensorView& lse, const Options& options);
// Scans a CPU view for NaN/Inf; returns the flat (h, t, x) index of the first one or -1.
// Used by the API to reject non-finite inputs.
int64_t cpu_first_nonfinite(const TensorView& view, int num_threads = 0);

// ---------------------------------------------------------------- CUDA backend (src/cuda/)
// Built without CUDA, src/nocuda/cuda_unavailable.cpp provides these: cuda_backend_built()
// returns false and the others throw crisp::Error.
bool cuda_backend_built();
// Same contract as cpu_plan, views on Device::cuda. options.stream is the cudaStream_t.
Plan cuda_plan(const TensorView& q, const TensorView& k, const Config& config,
               const SeqLens& normalized_cu_seqlens, const Options& options);
// Same contract as cpu_attend, views on Device::cuda.
void cuda_attend(const TensorView& q, const TensorView& k, const TensorView& v, const Plan& plan,
                 const TensorView& out, const TensorView& lse, const Options& options);

}  // namespace detail
}  // namespace crisp
