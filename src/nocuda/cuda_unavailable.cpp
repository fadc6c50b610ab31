// src/nocuda/cuda_unavailable.cpp — the CUDA entry points of a library built with CRISP_CUDA=OFF
// (or without a CUDA compiler): calls with Device::cuda views fail with a clear crisp::Error.
#include "backend.h"
#include "crisp/cuda.h"

namespace crisp {
namespace detail {

namespace {
[[noreturn]] void throw_unavailable(const char* argument) {
  throw Error(argument, "the CUDA backend is not built into this library",
              "tensors on Device::cpu, or a build with CRISP_CUDA=ON");
}
}  // namespace

bool cuda_backend_built() { return false; }

Plan cuda_plan(const TensorView&, const TensorView&, const Config&, const Batch&, const Options&) {
  throw_unavailable("q");
}

void cuda_attend(const TensorView&, const TensorView&, const TensorView&, const Plan&, const BlockTable&,
                 const TensorView&, const TensorView&, const Options&) {
  throw_unavailable("q");
}

std::unique_ptr<PlannedAttention> make_cuda_planned_attention(const Config&, const Options&) {
  throw_unavailable("q");
}

}  // namespace detail
namespace cuda {

// crisp/cuda.h: no CUDA backend, so no device to use (a caller may ask in any build).
bool available() { return false; }

}  // namespace cuda
}  // namespace crisp
