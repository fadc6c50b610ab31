// src/cuda/backend_cuda.cu — the CUDA side of the internal backend interface (src/backend.h) that
// this file owns: the backend flag and crisp::attend on Device::cuda views (a host Plan, run by
// uploading it into a DevicePlan). cuda_plan lives with the device planner (src/cuda/plan_*.cu).
#include <cuda_runtime.h>

#include "backend.h"
#include "crisp/cuda.h"
#include "crisp/error.h"
#include "cuda/cuda_check.h"

namespace crisp {
namespace detail {

bool cuda_backend_built() { return true; }

void cuda_attend(const TensorView& q, const TensorView& k, const TensorView& v, const Plan& plan,
                 const BlockTable& block_table, const TensorView& out, const TensorView& lse, const Options& options) {
  // NOTE: a DevicePlan (one cudaMalloc + upload) per call keeps this synchronous entry point
  // simple; callers that run many times keep a crisp::cuda::DevicePlan and call attend_async.
  cuda::DevicePlan device_plan(plan, options.stream);
  cuda::attend_async(q, k, v, device_plan, out, lse, options.stream, options.cuda, block_table);
  CRISP_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(options.stream)));
}

namespace {

class CudaPlannedAttention final : public PlannedAttention {
 public:
  CudaPlannedAttention(const Config& config, const Options& options) : config_(config), options_(options) {}

  void plan(const TensorView& q, const TensorView& k, const Batch& normalized_batch) override {
    // The device buffers are sized for one batch shape (query and key offsets); a new shape needs
    // new ones (the old are freed first: cudaFree synchronises the device, as at any reshape).
    const bool same_shape = !plan_.empty() && plan_.num_q_heads() == q.heads() && plan_.num_kv_heads() == k.heads() &&
                            plan_.head_dim() == q.dim() &&
                            plan_.batch().cu_seqlens_q == normalized_batch.cu_seqlens_q &&
                            plan_.batch().cu_seqlens_k == normalized_batch.cu_seqlens_k;
    if (!same_shape) {
      plan_ = cuda::DevicePlan();
      plan_ = cuda::DevicePlan(q.heads(), k.heads(), q.dim(), normalized_batch, config_);
    }
    batch_ = normalized_batch;
    cuda::plan_async(q, k, config_, plan_, options_.stream, normalized_batch.block_table);
  }
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
           const TensorView& lse) const override {
    cuda::attend_async(q, k, v, plan_, out, lse, options_.stream, options_.cuda, batch_.block_table);
  }
  Plan host_plan() const override { return plan_.to_host(options_.stream); }

 private:
  Config config_;
  Options options_;
  cuda::DevicePlan plan_;
  Batch batch_;  // the planned batch, its block table included (for the runs)
};

}  // namespace

std::unique_ptr<PlannedAttention> make_cuda_planned_attention(const Config& config, const Options& options) {
  return std::make_unique<CudaPlannedAttention>(config, options);
}

}  // namespace detail
}  // namespace crisp
