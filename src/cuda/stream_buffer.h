// src/cuda/stream_buffer.h — one stream-ordered device allocation (cudaMallocAsync) owned by a
// launch: freed on the same stream (cudaFreeAsync, after the work enqueued in between) when the
// owner goes out of scope, also when the launch throws half way. Stream-ordered allocations are
// pooled, and a CUDA graph captures them as memory nodes.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/cuda_check.h"

namespace crisp {
namespace cuda_detail {

class StreamBuffer {
 public:
  // Throws crisp::Error naming the failing call when the allocation (or, with zero_fill, the
  // memset) cannot be enqueued.
  StreamBuffer(std::size_t bytes, cudaStream_t stream, bool zero_fill = false) : stream_(stream) {
    CRISP_CUDA_CHECK(cudaMallocAsync(&data_, bytes, stream_));
    if (zero_fill) {
      const cudaError_t status = cudaMemsetAsync(data_, 0, bytes, stream_);
      if (status != cudaSuccess) {
        (void)cudaFreeAsync(data_, stream_);
        CRISP_CUDA_CHECK(status);
      }
    }
  }
  ~StreamBuffer() {
    if (data_ != nullptr) (void)cudaFreeAsync(data_, stream_);
  }
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  char* data() const { return static_cast<char*>(data_); }

 private:
  cudaStream_t stream_;
  void* data_ = nullptr;
};

}  // namespace cuda_detail
}  // namespace crisp
