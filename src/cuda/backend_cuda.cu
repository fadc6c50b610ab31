// src/cuda/backend_cuda.cu — the CUDA side of the internal backend interface (src/backend.h) that
// this file owns: the backend flag and crisp::attend on Device::cuda views (a host Plan, run by
// uploading it into a DevicePlan). cuda_plan lives with the device planner (src/cuda/plan_*.cu).
#include <cuda_runtime.h>

#include "backend.h"
#include "crisp/cuda.h"
#include "cuda/cuda_check.h"

namespace crisp {
namespace detail {

bool cuda_backend_built() { return true; }

void cuda_attend(const TensorView& q, const TensorView& k, const TensorView& v, const Plan& plan,
                 const TensorView& out, const TensorView& lse, const Options& options) {
  // NOTE: a DevicePlan (one cudaMalloc + upload) per call keeps this synchronous entry point
  // simple; callers that run many times keep a crisp::cuda::DevicePlan and call attend_async.
  cuda::DevicePlan device_plan(plan, options.stream);
  cuda::attend_async(q, k, v, device_plan, out, lse, options.stream);
  CRISP_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(options.stream)));
}

}  // namespace detail
}  // namespace crisp
