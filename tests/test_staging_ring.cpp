// tests/test_staging_ring.cpp — the placement rule of the CUDA backend's pinned staging ring
// (src/cuda/staging_ring.h, used by cuda_detail::upload_async): random sequences of copies, some
// finishing on their own, checked after every placement: the new staging overlaps no copy still
// in flight, only copies the rule must wait for are waited for, and the copies in flight stay in
// ring order. The GPU side (real copies through the ring) is GpuPlan.StagedUploadsLandInStreamOrder.
#include <gtest/gtest.h>

#include <cstddef>
#include <deque>
#include <random>
#include <string>

#include "cuda/staging_ring.h"

namespace {

using crisp::cuda_detail::place_in_staging;
using crisp::cuda_detail::StagingPlacement;
using crisp::cuda_detail::StagingSpan;

bool overlaps(const StagingSpan& a, std::size_t begin, std::size_t end) { return a.begin < end && begin < a.end; }

// In ring order from the oldest: begins increase, with at most one drop back (the wrap).
bool in_ring_order(const std::deque<StagingSpan>& in_flight) {
  int drops = 0;
  for (std::size_t i = 1; i < in_flight.size(); ++i)
    if (in_flight[i].begin < in_flight[i - 1].begin) ++drops;
  return drops <= 1;
}

TEST(StagingRing, NewStagingNeverOverlapsACopyInFlight) {
  // NOTE: capacities and spans in 256-byte units as upload_async aligns them; 20000 copies per
  // capacity, spans from one unit to the whole ring.
  for (const std::size_t capacity : {std::size_t{4096}, std::size_t{65536}, std::size_t{1} << 22}) {
    std::mt19937_64 rng(capacity);
    std::deque<StagingSpan> in_flight;
    std::size_t cursor = 0, waited = 0, wraps = 0;
    for (int copy = 0; copy < 20000; ++copy) {
      SCOPED_TRACE("capacity " + std::to_string(capacity) + ", copy " + std::to_string(copy));
      // Mostly small copies, now and then a large one (up to the whole ring).
      const std::size_t units = capacity / 256;
      const std::size_t span = 256 * (rng() % 8 == 0 ? 1 + rng() % units : 1 + rng() % std::max<std::size_t>(1, units / 16));
      // Copies finish in order on one stream; here the oldest few finished on their own.
      const std::size_t finished = in_flight.empty() ? 0 : rng() % (in_flight.size() + 1) / 2;
      for (std::size_t f = 0; f < finished; ++f) in_flight.pop_front();
      const bool wrap = cursor + span > capacity;
      const StagingPlacement p = place_in_staging(capacity, cursor, in_flight, span);
      ASSERT_LE(p.retire, in_flight.size());
      ASSERT_EQ(p.begin, wrap ? 0u : cursor);
      ASSERT_LE(p.begin + span, capacity);
      const std::size_t end = p.begin + span;
      for (std::size_t r = 0; r < p.retire; ++r) {
        // Only what the rule must wait for: a copy the new staging overlaps, or (at a wrap) one in
        // the skipped tail.
        const StagingSpan& gone = in_flight.front();
        ASSERT_TRUE(overlaps(gone, p.begin, end) || (wrap && gone.begin >= cursor))
            << "waited for [" << gone.begin << ", " << gone.end << ") placing [" << p.begin << ", " << end << ")";
        in_flight.pop_front();
        ++waited;
      }
      for (const StagingSpan& left : in_flight)
        ASSERT_FALSE(overlaps(left, p.begin, end))
            << "[" << left.begin << ", " << left.end << ") still in flight under [" << p.begin << ", " << end << ")";
      in_flight.push_back(StagingSpan{p.begin, end});
      ASSERT_TRUE(in_ring_order(in_flight));
      cursor = end;
      wraps += wrap;
    }
    EXPECT_GT(wraps, 10u) << "the sequence must wrap the ring many times to test anything";
    EXPECT_GT(waited, 0u);
  }
}

TEST(StagingRing, WrapWaitsOnlyForTheSkippedTailAndTheOverlap) {
  // Ring of 10 units: copies at [0,3) [3,6) [6,9) in flight, cursor 9; a 2-unit copy wraps to 0:
  // the tail holds nothing of an older lap, so it waits for [0,3) only (it overlaps [0,2)).
  std::deque<StagingSpan> in_flight{{0, 3}, {3, 6}, {6, 9}};
  StagingPlacement p = place_in_staging(std::size_t{10}, std::size_t{9}, in_flight, std::size_t{2});
  EXPECT_EQ(p.begin, 0u);
  EXPECT_EQ(p.retire, 1u);
  // The next lap: cursor 2, [3,6) and [6,9) of the old lap, then [0,2); a 4-unit copy at 2 overlaps
  // [3,6) (starts inside [2,6)) but not [6,9).
  in_flight = {{3, 6}, {6, 9}, {0, 2}};
  p = place_in_staging(std::size_t{10}, std::size_t{2}, in_flight, std::size_t{4});
  EXPECT_EQ(p.begin, 2u);
  EXPECT_EQ(p.retire, 1u);
  // A wrap with the old lap's tail still in flight: [8,10) skipped and waited for, then [0,2).
  in_flight = {{8, 10}, {0, 2}, {2, 5}};
  p = place_in_staging(std::size_t{10}, std::size_t{5}, in_flight, std::size_t{6});
  EXPECT_EQ(p.begin, 0u);
  EXPECT_EQ(p.retire, 3u);  // [8,10) skipped tail; [0,2) and [2,5) overlap [0,6)
}

}  // namespace
