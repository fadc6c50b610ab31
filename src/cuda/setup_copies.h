// src/cuda/setup_copies.h — how a new DevicePlan or planner workspace gets its shape tables (work
// items, sequence bases) onto the device, into memory that later kernels read on the caller's
// stream: either synchronously, ending in a device synchronisation (constructors that have no
// stream), or in that stream's order through pinned staging, with no synchronisation at all.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

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

// Copies `bytes` of host memory at `src` to `dst` on the device, in `stream`'s order: kernels
// enqueued on `stream` afterwards read the new contents, work enqueued before it (which may
// still read the old contents) finishes first. `src` may be reused as soon as this returns. The
// copy goes through a pinned staging ring per device, so it never synchronises the device; the
// host waits only when the ring comes round to a copy still in flight (a lap of kStagingBytes
// ago). Copies larger than the ring go directly from `src` (cudaMemcpyAsync from pageable memory,
// which may wait for `stream`). Refused (crisp::Error naming "stream") while `stream` is being
// captured into a graph: a replay would read whatever the staging holds by then. The current
// device must be `stream`'s. Thread-safe.
void upload_async(void* dst, const void* src, std::size_t bytes, cudaStream_t stream);

}  // namespace cuda_detail
}  // namespace crisp
