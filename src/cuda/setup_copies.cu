// src/cuda/setup_copies.cu — the pinned staging ring behind cuda_detail::upload_async.
//
// Why by hand: cudaMemcpyAsync from pageable memory may synchronise with the stream (the driver
// stages it itself), and a pinned allocation per table (cudaMallocHost) is itself a synchronising
// call. One pinned buffer per device, used as a ring, costs one allocation per process.
#include "cuda/setup_copies.h"

#include "cuda/staging_ring.h"

#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

namespace crisp {
namespace cuda_detail {
namespace {

// NOTE: 4 MiB of pinned staging per device. A shape's tables are a few KB to ~100 KB (48-byte
// proxy work items, a few hundred per sequence; 64-byte sequence bases), so a lap spans many new
// shapes and a copy is waited for only when its staging comes round again, a lap later.
constexpr std::size_t kStagingBytes = std::size_t{4} << 20;
constexpr std::size_t kStagingAlign = 256;  // NOTE: keeps each copy's source aligned for the DMA engine

struct InFlight : StagingSpan {
  cudaEvent_t done = nullptr;  // recorded on the copy's stream after the copy
};

struct StagingRing {
  char* host = nullptr;
  std::size_t cursor = 0;         // where the next copy's staging starts
  std::deque<InFlight> in_flight;  // oldest first, in ring order from the oldest (staging_ring.h)
  std::vector<cudaEvent_t> spare_events;
};

// Never destroyed: a DevicePlan destroyed at exit after this map would otherwise find it gone.
std::mutex& staging_mutex() {
  static std::mutex m;
  return m;
}
std::map<int, StagingRing>& staging_rings() {
  static auto* rings = new std::map<int, StagingRing>;
  return *rings;
}

void retire(StagingRing& ring) {
  const InFlight oldest = ring.in_flight.front();
  ring.in_flight.pop_front();
  ring.spare_events.push_back(oldest.done);
  CRISP_CUDA_CHECK(cudaEventSynchronize(oldest.done));
}

}  // namespace

void upload_async(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CRISP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone)
    throw Error("stream", "is being captured into a CUDA graph while a new shape's tables are uploaded",
                "a first call of the shape outside the capture (plan_async: call it once before capturing)");
  const std::size_t span = (bytes + kStagingAlign - 1) / kStagingAlign * kStagingAlign;
  if (span > kStagingBytes) {
    CRISP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
    return;
  }
  int device = 0;
  CRISP_CUDA_CHECK(cudaGetDevice(&device));  // events belong to the device of the stream
  std::lock_guard<std::mutex> lock(staging_mutex());
  StagingRing& ring = staging_rings()[device];
  if (ring.host == nullptr) CRISP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&ring.host), kStagingBytes));
  const StagingPlacement placement = place_in_staging(kStagingBytes, ring.cursor, ring.in_flight, span);
  for (std::size_t r = 0; r < placement.retire; ++r) retire(ring);
  const std::size_t begin = placement.begin, end = begin + span;
  cudaEvent_t done = nullptr;
  if (!ring.spare_events.empty()) {
    done = ring.spare_events.back();
    ring.spare_events.pop_back();
  } else {
    CRISP_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  }
  std::memcpy(ring.host + begin, src, bytes);
  const cudaError_t copied = cudaMemcpyAsync(dst, ring.host + begin, bytes, cudaMemcpyHostToDevice, stream);
  const cudaError_t recorded = copied == cudaSuccess ? cudaEventRecord(done, stream) : copied;
  if (recorded != cudaSuccess) {
    // The staging may be read by a copy already enqueued: wait for the stream before it is reused.
    (void)cudaStreamSynchronize(stream);
    ring.spare_events.push_back(done);
    throw_cuda_error(recorded, copied != cudaSuccess ? "cudaMemcpyAsync (staged upload)" : "cudaEventRecord (staged upload)",
                     __FILE__, __LINE__);
  }
  InFlight copy;
  copy.begin = begin;
  copy.end = end;
  copy.done = done;
  ring.in_flight.push_back(copy);
  ring.cursor = end;
}

}  // namespace cuda_detail
}  // namespace crisp
