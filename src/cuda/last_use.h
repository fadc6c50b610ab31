// src/cuda/last_use.h — the last use of a piece of device memory on some stream, so that a later
// user on another stream waits for it with an event instead of a synchronisation. The planner's
// workspace (plan_device.cu) and llama.cpp's CUDA hook's plan slots reuse memory across calls that
// may come on different streams.
#pragma once
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"

namespace crisp {
namespace cuda_detail {

class LastUse {
 public:
  LastUse() = default;
  ~LastUse() {
    if (event_ != nullptr) cudaEventDestroy(event_);  // no throw from a destructor
  }
  LastUse(const LastUse&) = delete;
  LastUse& operator=(const LastUse&) = delete;

  // Orders `stream` after the recorded use when that was on another stream (on the same stream
  // the order holds already).
  void wait(cudaStream_t stream) const {
    if (recorded_ && stream != stream_) CRISP_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
  }
  // Marks the end of the work enqueued on `stream` so far as the last use.
  void record(cudaStream_t stream) {
    if (event_ == nullptr) CRISP_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    CRISP_CUDA_CHECK(cudaEventRecord(event_, stream));
    stream_ = stream;
    recorded_ = true;
  }

 private:
  cudaEvent_t event_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool recorded_ = false;
};

}  // namespace cuda_detail
}  // namespace crisp
