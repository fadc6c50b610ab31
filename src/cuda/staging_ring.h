// src/cuda/staging_ring.h — where the next copy goes in the pinned staging ring of
// cuda_detail::upload_async (src/cuda/setup_copies.cu), and which copies still in flight must
// finish first. Plain host code, apart from the CUDA calls, so the CPU tests check it
// (tests/test_staging_ring.cpp).
#pragma once
#include <cstddef>
#include <deque>

namespace crisp {
namespace cuda_detail {

// The staging bytes [begin, end) of one copy in flight.
struct StagingSpan {
  std::size_t begin = 0, end = 0;
};

struct StagingPlacement {
  std::size_t begin = 0;   // where the new copy's staging starts; the new cursor is begin + span
  std::size_t retire = 0;  // how many of the oldest copies in flight to wait for (and drop) first
};

// A ring of `capacity` bytes, filled from `cursor`; `in_flight` holds the copies not yet retired,
// oldest first. They lie in ring order from the oldest: the previous lap's at or after the cursor,
// then this lap's before it. A new copy of `span` bytes (span <= capacity) goes at the cursor, or
// at 0 when it does not fit before the end (a wrap: the previous lap's tail is skipped, so its
// copies are retired); then the oldest copies left that start inside the new staging are
// retired. Every copy not retired lies outside [begin, begin + span).
template <typename InFlight>
StagingPlacement place_in_staging(std::size_t capacity, std::size_t cursor, const std::deque<InFlight>& in_flight,
                                  std::size_t span) {
  StagingPlacement p;
  std::size_t i = 0;
  if (cursor + span > capacity) {
    while (i < in_flight.size() && in_flight[i].begin >= cursor) ++i;
    cursor = 0;
  }
  p.begin = cursor;
  const std::size_t end = cursor + span;
  while (i < in_flight.size() && in_flight[i].begin >= p.begin && in_flight[i].begin < end) ++i;
  p.retire = i;
  return p;
}

}  // namespace cuda_detail
}  // namespace crisp
