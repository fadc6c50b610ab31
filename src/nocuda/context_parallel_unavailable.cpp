// src/nocuda/context_parallel_unavailable.cpp — crisp/context_parallel.h's CUDA entry points in a
// build without the CUDA backend: nccl_built() is false and everything else throws crisp::Error.
// (The partitioning helpers of the header live in src/plan/partition.cpp and work everywhere.)
#include "crisp/context_parallel.h"

namespace crisp {
namespace cuda {

namespace {
[[noreturn]] void unavailable() {
  throw Error("crisp::cuda::ContextParallelPrefill", "the library was built without the CUDA backend and NCCL",
              "a build with CRISP_CUDA and NCCL");
}
}  // namespace

// Never constructed (the constructor throws); DevicePlan has no definition in this build.
struct ContextParallelPrefill::Impl {};

bool nccl_built() { return false; }

ContextParallelPrefill::ContextParallelPrefill(int64_t, int64_t, int64_t, int64_t, DType, const Config&, CpPartition,
                                               int, int, void*) {
  unavailable();
}
ContextParallelPrefill::~ContextParallelPrefill() = default;
ContextParallelPrefill::ContextParallelPrefill(ContextParallelPrefill&&) noexcept = default;
ContextParallelPrefill& ContextParallelPrefill::operator=(ContextParallelPrefill&&) noexcept = default;
void ContextParallelPrefill::run(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                                 const TensorView&, void*) {
  unavailable();
}
const CpShard& ContextParallelPrefill::shard() const { unavailable(); }
const DevicePlan& ContextParallelPrefill::plan() const { unavailable(); }
TensorView ContextParallelPrefill::gathered_q() const { unavailable(); }
TensorView ContextParallelPrefill::gathered_k() const { unavailable(); }
TensorView ContextParallelPrefill::gathered_v() const { unavailable(); }

void cp_prefill(const TensorView&, const TensorView&, const TensorView&, const Config&, CpPartition, int, int, void*,
                int64_t, const TensorView&, const TensorView&, void*) {
  unavailable();
}

}  // namespace cuda
}  // namespace crisp
