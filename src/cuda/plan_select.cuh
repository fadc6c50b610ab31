// src/cuda/plan_select.cuh — ordered selection on the device without a sort: MSB-first radix
// select over the bits of non-negative doubles, segmented by slot.
//
// The spec's orderings are "larger value first, then smaller index" (rules::ranks_before). For
// non-negative doubles the IEEE bit pattern orders like the value, so 8 passes of an 8-bit digit
// histogram (count and mass per digit) find the value x* of the entry where the rule stops, the
// mass G and count C of the entries strictly above it, and the ties T (entries equal to x*).
// The ties are then walked in index order exactly as a sorted walk would. Three stopping rules:
//  - kMassBefore (§4 global coverage): an entry is kept while the running sum BEFORE it is
//    < target (rules::pe_keeps_next);
//  - kMassInclusive (§3 cumulative count): an entry counts while the running sum INCLUDING it is
//    <= target (rules::cumulative_within);
//  - kCount (§3 topk): the first k entries.
// Result per slot: kept = C + m (m ties, the first m of them in index order), or every entry.
// Sums are double; they add the same numbers as a sorted walk in another order (the tests use
// inputs with margins; a running sum landing within rounding of the target can differ).
#pragma once
#include "cuda/plan_common.cuh"

namespace crisp {
namespace cuda_detail {
namespace planner {

enum SelectMode : int32_t { kMassBefore = 0, kMassInclusive = 1, kCount = 2 };

// NOTE: 8-bit digits: 256-bin shared histograms of (count, mass), 8 passes over a double key.
constexpr int kSelectDigitBits = 8;
constexpr int kSelectBins = 1 << kSelectDigitBits;
constexpr int kSelectPasses = 64 / kSelectDigitBits;
constexpr int kSelectThreads = 256;
// NOTE: entries per histogram block: enough work per block to amortise the 256-bin flush.
constexpr int64_t kSelectChunk = 8192;

struct SelectState {
  // Input, set by the caller's init kernel.
  int64_t base;       // first entry of the slot in `values`
  int64_t len;        // entries
  double scale;       // value = values[base + e] * scale
  double target;      // mass modes
  int64_t k;          // kCount
  int32_t mode;
  int32_t active;     // 0: slot not selected (nothing marked, kept = 0)
  // Progress.
  uint64_t prefix, mask;
  double mass_before;
  int64_t count_before;
  int64_t ties;
  int32_t all;        // 1: every entry is kept (the rule never stops inside the slot)
  // Result.
  int64_t ties_kept;
  int64_t kept;
};

__device__ __forceinline__ double select_value(const double* values, const SelectState& st, int64_t e) {
  return values[st.base + e] * st.scale;
}
__device__ __forceinline__ uint64_t key_bits(double v) { return static_cast<uint64_t>(__double_as_longlong(v)); }

__global__ void __launch_bounds__(kSelectThreads)
select_histogram_kernel(const double* values, const SelectState* states, unsigned long long* hist_count,
                        double* hist_mass, int shift) {
  const int64_t slot = blockIdx.y;
  const SelectState& st = states[slot];
  if (!st.active || st.all) return;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kSelectChunk;
  if (begin >= st.len) return;
  const int64_t end = min(begin + kSelectChunk, st.len);
  __shared__ unsigned int s_count[kSelectBins];
  __shared__ double s_mass[kSelectBins];
  for (int b = threadIdx.x; b < kSelectBins; b += blockDim.x) {
    s_count[b] = 0;
    s_mass[b] = 0.0;
  }
  __syncthreads();
  const uint64_t prefix = st.prefix, mask = st.mask;
  for (int64_t e = begin + threadIdx.x; e < end; e += blockDim.x) {
    const double v = select_value(values, st, e);
    const uint64_t bits = key_bits(v);
    if ((bits & mask) != prefix) continue;
    const int digit = static_cast<int>((bits >> shift) & (kSelectBins - 1));
    atomicAdd(&s_count[digit], 1u);
    if (st.mode != kCount) atomicAdd(&s_mass[digit], v);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < kSelectBins; b += blockDim.x) {
    if (s_count[b] == 0) continue;
    atomicAdd(&hist_count[slot * kSelectBins + b], static_cast<unsigned long long>(s_count[b]));
    if (st.mode != kCount) atomicAdd(&hist_mass[slot * kSelectBins + b], s_mass[b]);
  }
}

// Does the stopping point lie in a digit whose entries start after mass G / count C?
__device__ __forceinline__ bool select_crosses(const SelectState& st, double G, double mass, int64_t C,
                                               int64_t count) {
  switch (st.mode) {
    case kMassBefore: return G < st.target && G + mass >= st.target;
    case kMassInclusive: return G <= st.target && G + mass > st.target;
    default: return C < st.k && C + count >= st.k;
  }
}

// One thread per slot: walks the digits from the largest, narrows the prefix, clears the bins.
__global__ void select_scan_kernel(SelectState* states, unsigned long long* hist_count, double* hist_mass,
                                   int shift, int num_slots) {
  const int slot = blockIdx.x * blockDim.x + threadIdx.x;
  if (slot >= num_slots) return;
  SelectState& st = states[slot];
  unsigned long long* cnt = hist_count + static_cast<int64_t>(slot) * kSelectBins;
  double* mass = hist_mass + static_cast<int64_t>(slot) * kSelectBins;
  if (st.active && !st.all) {
    double G = st.mass_before;
    int64_t C = st.count_before;
    int found = -1, last_nonempty = -1;
    double G_last = G;
    int64_t C_last = C;
    for (int digit = kSelectBins - 1; digit >= 0; --digit) {
      const int64_t c = static_cast<int64_t>(cnt[digit]);
      if (c == 0) continue;
      if (select_crosses(st, G, mass[digit], C, c)) {
        found = digit;
        break;
      }
      last_nonempty = digit;
      G_last = G;
      C_last = C;
      G += mass[digit];
      C += c;
    }
    if (found < 0 && st.mask == 0) {
      st.all = 1;  // the rule never stops: every entry kept
    } else {
      if (found < 0) {
        // Within a bucket that crossed at the previous digit, rounding of the finer sums can
        // leave no finer crossing: the stop then lies in the bucket's last (smallest) digit.
        found = last_nonempty;
        G = G_last;
        C = C_last;
      }
      st.prefix |= static_cast<uint64_t>(found) << shift;
      st.mask |= static_cast<uint64_t>(kSelectBins - 1) << shift;
      st.mass_before = G;
      st.count_before = C;
      st.ties = static_cast<int64_t>(cnt[found]);
    }
  }
  for (int b = 0; b < kSelectBins; ++b) {
    cnt[b] = 0;
    mass[b] = 0.0;
  }
}

// Final tie walk (sequential, as a sorted walk would do it) and the kept count.
__global__ void select_finish_kernel(SelectState* states, int num_slots) {
  const int slot = blockIdx.x * blockDim.x + threadIdx.x;
  if (slot >= num_slots) return;
  SelectState& st = states[slot];
  if (!st.active) {
    st.kept = 0;
    st.ties_kept = 0;
    return;
  }
  if (st.all) {
    st.kept = st.len;
    st.ties_kept = 0;
    return;
  }
  const double x = __longlong_as_double(static_cast<long long>(st.prefix));
  int64_t m = 0;
  double running = st.mass_before;
  if (st.mode == kMassBefore) {
    while (m < st.ties && rules::pe_keeps_next(running, st.target)) {
      running += x;
      ++m;
    }
  } else if (st.mode == kMassInclusive) {
    while (m < st.ties) {
      running += x;
      if (!rules::cumulative_within(running, st.target)) break;
      ++m;
    }
  } else {
    m = st.k - st.count_before;
  }
  st.ties_kept = m;
  st.kept = st.count_before + m;
}

// Marks the kept entries: mark(slot, e, kept) is called for EVERY entry of an active slot
// (kept = true/false), except ties when only some of them are kept (select_mark_ties_kernel).
template <typename Mark>
__global__ void __launch_bounds__(kSelectThreads)
select_mark_kernel(const double* values, const SelectState* states, Mark mark) {
  const int64_t slot = blockIdx.y;
  const SelectState& st = states[slot];
  if (!st.active) return;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kSelectChunk;
  const int64_t end = min(begin + kSelectChunk, st.len);
  const bool all = st.all != 0;
  const uint64_t pivot = st.prefix;
  const bool all_ties = st.ties_kept == st.ties, no_ties = st.ties_kept == 0;
  for (int64_t e = begin + threadIdx.x; e < end; e += blockDim.x) {
    if (all) {
      mark(slot, e, true);
      continue;
    }
    const uint64_t bits = key_bits(select_value(values, st, e));
    if (bits > pivot) mark(slot, e, true);
    else if (bits < pivot) mark(slot, e, false);
    else if (all_ties || no_ties) mark(slot, e, all_ties);
  }
}

// Only when 0 < ties_kept < ties: the first ties_kept ties in index order (one block per slot).
template <typename Mark>
__global__ void __launch_bounds__(1024) select_mark_ties_kernel(const double* values, const SelectState* states,
                                                                Mark mark) {
  const int64_t slot = blockIdx.x;
  const SelectState& st = states[slot];
  if (!st.active || st.all || st.ties_kept == 0 || st.ties_kept == st.ties) return;
  __shared__ int32_t s_warp[32];
  const uint64_t pivot = st.prefix;
  int64_t seen = 0;  // ties before this chunk
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t e0 = 0; e0 < st.len; e0 += blockDim.x) {
    const int64_t e = e0 + threadIdx.x;
    const bool tie = e < st.len && key_bits(select_value(values, st, e)) == pivot;
    const unsigned ballot = __ballot_sync(0xffffffffu, tie);
    const int before_in_warp = __popc(ballot & ((1u << lane) - 1u));
    __syncthreads();
    if (lane == 0) s_warp[warp] = __popc(ballot);
    __syncthreads();
    int before = before_in_warp;
    for (int w = 0; w < warp; ++w) before += s_warp[w];
    int total = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) total += s_warp[w];
    if (tie) mark(slot, e, seen + before < st.ties_kept);
    seen += total;
  }
}

}  // namespace planner
}  // namespace cuda_detail
}  // namespace crisp
