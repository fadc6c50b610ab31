// src/cuda/setup_copies.h — the end of the synchronous set-up copies of a new DevicePlan or
// planner workspace (tables copied with cudaMemcpy, buffers cleared with cudaMemset, into freshly
// allocated device memory that later kernels read on the caller's stream).
#pragma once
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"

namespace crisp {
namespace cuda_detail {

// A cudaMemcpy from pageable host memory may return before its DMA lands, and cudaMemset is
// asynchronous; both are ordered on the legacy default stream, which a cudaStreamNonBlocking
// stream (ggml's, for one) does not wait for. Without this a kernel on such a stream can read the
// memory's previous contents (the tables of an earlier, larger shape the allocator handed out at
// the same address) and index out of bounds. One synchronisation per new shape, where cudaMalloc
// and cudaFree already cost about as much.
inline void finish_setup_copies() { CRISP_CUDA_CHECK(cudaDeviceSynchronize()); }

}  // namespace cuda_detail
}  // namespace crisp
