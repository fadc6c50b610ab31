// src/cuda/plan_select.cuh — ordered selection on the device without a sort: MSB-first radix
// select over the bits of non-negative doubles, segmented by slot.
//
// The device's ordered walk primitive for the walks of src/plan/select.h: the stopping rule of a
// digit bucket and of its ties is select::walk_stops_within / walk_ties_kept.
// The spec's orderings are "larger value first, then smaller index" (rules::ranks_before). For
// non-negative doubles the IEEE bit pattern orders like the value, so 8 passes of an 8-bit digit
// histogram (count and mass per digit) find the value x* of the entry where the rule stops, the
// mass G and count C of the entries strictly above it, and the ties T (entries equal to x*).
// The ties are then walked in index order exactly as a sorted walk would.
// Result per slot: kept = C + m (m ties, the first m of them in index order), or every entry.
// Sums are double; they add the same numbers as a sorted walk in another order (the tests use
// inputs with margins; a running sum landing within rounding of the target can differ).
#pragma once
#include "cuda/plan_common.cuh"
#include "plan/select.h"

namespace crisp {
namespace cuda_detail {
namespace planner {

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
  select::WalkRule walk;
  int32_t active;     // 0: slot not selected (nothing marked, kept = 0)
  // Progress.
  uint64_t prefix, mask;
  double mass_before;
  int64_t count_before;
  int64_t ties;
  int32_t all;        // 1: every entry is kept (the rule never stops inside the slot)
  // Early resolution: once the stop's bucket holds one entry (ties == 1 after a pass), the next
  // histogram pass only finds that entry's bits (single) and the scan takes them as the whole
  // prefix (resolved = 1); the remaining passes skip the slot. The state ends as the full walk
  // would leave it: the later passes would only add empty digits (mass 0.0, count 0).
  uint64_t single;
  int32_t resolved;
  // Result.
  int64_t ties_kept;
  int64_t kept;
};

__device__ __forceinline__ double select_value(const double* values, const SelectState& st, int64_t e) {
  return values[st.base + e] * st.scale;
}
__device__ __forceinline__ uint64_t key_bits(double v) { return static_cast<uint64_t>(__double_as_longlong(v)); }

// Per-warp shared histograms of one pass (kSelectThreads threads).
constexpr int kSelectWarps = kSelectThreads / 32;
struct SelectHistogram {
  unsigned int count[kSelectWarps][kSelectBins];
  double mass[kSelectWarps][kSelectBins];
  // Digit b's totals over the warps (a fixed order).
  __device__ __forceinline__ void total(int b, unsigned int& c, double& m) const {
    c = 0;
    m = 0.0;
    for (int w = 0; w < kSelectWarps; ++w) {
      c += count[w][b];
      m += mass[w][b];
    }
  }
};

// The stop is one entry (st.ties == 1 after a pass): its bits into st.single, from its only thread.
__device__ __forceinline__ void select_find_single(const double* values, SelectState& st, int64_t begin, int64_t end) {
  for (int64_t e = begin + threadIdx.x; e < end; e += blockDim.x) {
    const uint64_t bits = key_bits(select_value(values, st, e));
    if ((bits & st.mask) == st.prefix) st.single = bits;
  }
}

// One pass's histogram of the entries [begin, end) of an active, unresolved slot whose prefix
// still has more than one entry. Called by every thread of the block; ends with __syncthreads.
__device__ __forceinline__ void select_block_histogram(const double* values, const SelectState& st, int64_t begin,
                                                       int64_t end, int shift, SelectHistogram& h) {
  // One histogram per warp: the digits below the top one spread over many bins, where 256 threads
  // sharing one histogram serialise on its shared-memory atomics (the double adds are CAS loops);
  // a warp's own copy sees 32 (bench/RESULTS.md, session 4, has the selection's timings).
  auto& s_count = h.count;
  auto& s_mass = h.mass;
  constexpr int kWarps = kSelectWarps;
  for (int i = threadIdx.x; i < kWarps * kSelectBins; i += blockDim.x) {
    (&s_count[0][0])[i] = 0;
    (&s_mass[0][0])[i] = 0.0;
  }
  __syncthreads();
  unsigned int* warp_count = s_count[threadIdx.x / 32];
  double* warp_mass = s_mass[threadIdx.x / 32];
  const uint64_t prefix = st.prefix, mask = st.mask;
  // Runs of one digit are summed in registers first: the high digits of probabilities cluster in
  // a few bins (one exponent range), where one shared atomic per entry would serialise.
  int run_digit = -1;
  unsigned int run_count = 0;
  double run_mass = 0.0;
  for (int64_t e = begin + threadIdx.x; e < end; e += blockDim.x) {
    const double v = select_value(values, st, e);
    const uint64_t bits = key_bits(v);
    if ((bits & mask) != prefix) continue;
    const int digit = static_cast<int>((bits >> shift) & (kSelectBins - 1));
    if (digit != run_digit) {
      if (run_count != 0) {
        atomicAdd(&warp_count[run_digit], run_count);
        if (st.walk.mode != select::kCount) atomicAdd(&warp_mass[run_digit], run_mass);
      }
      run_digit = digit;
      run_count = 0;
      run_mass = 0.0;
    }
    ++run_count;
    run_mass += v;
  }
  if (run_count != 0) {
    atomicAdd(&warp_count[run_digit], run_count);
    if (st.walk.mode != select::kCount) atomicAdd(&warp_mass[run_digit], run_mass);
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kSelectThreads)
select_histogram_kernel(const double* values, SelectState* states, unsigned long long* hist_count,
                        double* hist_mass, int shift) {
  const int64_t slot = blockIdx.y;
  SelectState& st = states[slot];
  if (!st.active || st.all || st.resolved) return;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kSelectChunk;
  if (begin >= st.len) return;
  const int64_t end = min(begin + kSelectChunk, st.len);
  if (st.mask != 0 && st.ties == 1) {  // no histogram; the scan resolves
    select_find_single(values, st, begin, end);
    return;
  }
  __shared__ SelectHistogram h;
  select_block_histogram(values, st, begin, end, shift, h);
  for (int b = threadIdx.x; b < kSelectBins; b += blockDim.x) {
    unsigned int count = 0;
    double mass = 0.0;
    h.total(b, count, mass);
    if (count == 0) continue;
    atomicAdd(&hist_count[slot * kSelectBins + b], static_cast<unsigned long long>(count));
    if (st.walk.mode != select::kCount) atomicAdd(&hist_mass[slot * kSelectBins + b], mass);
  }
}

// Thread `rank` holds digit kSelectBins - 1 - rank (the walk goes from the largest digit down);
// exclusive prefix sums over the ranks give the mass G and count C above every digit at once, and
// the first digit where the rule stops is the smallest rank that crosses. Same decisions as a
// sequential walk from the top digit; the prefix sums add the same doubles in a tree order.
// The scan of one pass for one slot, by a block of kSelectBins threads: thread `rank` brings the
// count c and mass m of digit kSelectBins - 1 - rank. Returns early only uniformly over the block
// before its last __syncthreads; the thread that finds the stop updates st after it.
__device__ __forceinline__ void select_scan_block(SelectState& st, int64_t c, double m, int shift) {
  __shared__ double s_warp_mass[kSelectBins / 32];
  __shared__ long long s_warp_count[kSelectBins / 32];
  __shared__ int s_found, s_last;
  const int rank = threadIdx.x, digit = kSelectBins - 1 - rank;
  const int lane = rank & 31, warp = rank >> 5;
  if (!st.active || st.all || st.resolved) return;  // uniform over the block
  if (st.mask != 0 && st.ties == 1) {  // the histogram pass found the one entry (early resolution)
    __syncthreads();  // every thread has read the state before rank 0 changes it
    if (rank == 0) {
      st.prefix = st.single;
      st.mask = ~0ull;
      st.resolved = 1;
    }
    return;
  }
  // Inclusive warp scans, then the totals of the warps before.
  double incl_m = m;
  long long incl_c = c;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const double om = __shfl_up_sync(0xffffffffu, incl_m, off);
    const long long oc = __shfl_up_sync(0xffffffffu, incl_c, off);
    if (lane >= off) {
      incl_m += om;
      incl_c += oc;
    }
  }
  if (lane == 31) {
    s_warp_mass[warp] = incl_m;
    s_warp_count[warp] = incl_c;
  }
  if (rank == 0) {
    s_found = kSelectBins;
    s_last = -1;
  }
  __syncthreads();
  double excl_m = __shfl_up_sync(0xffffffffu, incl_m, 1);
  long long excl_c = __shfl_up_sync(0xffffffffu, incl_c, 1);
  if (lane == 0) {
    excl_m = 0.0;
    excl_c = 0;
  }
  double before_m = 0.0;
  long long before_c = 0;
  for (int w = 0; w < warp; ++w) {
    before_m += s_warp_mass[w];
    before_c += s_warp_count[w];
  }
  const double G = st.mass_before + (before_m + excl_m);
  const int64_t C = st.count_before + static_cast<int64_t>(before_c + excl_c);
  if (c != 0) {
    if (select::walk_stops_within(st.walk, G, m, C, c)) atomicMin(&s_found, rank);
    atomicMax(&s_last, rank);
  }
  __syncthreads();
  int chosen = s_found;
  if (chosen == kSelectBins) {
    if (st.mask == 0) {
      if (rank == 0) st.all = 1;  // the rule never stops: every entry kept
      return;
    }
    // Within a bucket that crossed at the previous digit, rounding of the finer sums can leave
    // no finer crossing: the stop then lies in the bucket's last (smallest) digit.
    chosen = s_last;
  }
  if (rank != chosen) return;
  st.prefix |= static_cast<uint64_t>(digit) << shift;
  st.mask |= static_cast<uint64_t>(kSelectBins - 1) << shift;
  st.mass_before = G;
  st.count_before = C;
  st.ties = c;
}

// One block of kSelectBins threads per slot: the scan of the pass's global histogram, which it
// clears.
__global__ void __launch_bounds__(kSelectBins) select_scan_kernel(SelectState* states, unsigned long long* hist_count,
                                                                  double* hist_mass, int shift, int num_slots) {
  const int slot = blockIdx.x;
  if (slot >= num_slots) return;
  const int digit = kSelectBins - 1 - static_cast<int>(threadIdx.x);
  unsigned long long* cnt = hist_count + static_cast<int64_t>(slot) * kSelectBins;
  double* mass = hist_mass + static_cast<int64_t>(slot) * kSelectBins;
  const int64_t c = static_cast<int64_t>(cnt[digit]);
  const double m = mass[digit];
  cnt[digit] = 0;
  mass[digit] = 0.0;
  select_scan_block(states[slot], c, m, shift);
}

// Final tie walk (sequential, as a sorted walk would do it) and the kept count.
__device__ __forceinline__ void select_finish(SelectState& st) {
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
  const int64_t m = select::walk_ties_kept(st.walk, st.mass_before, st.count_before, x, st.ties);
  st.ties_kept = m;
  st.kept = st.count_before + m;
}

__global__ void select_finish_kernel(SelectState* states, int num_slots) {
  const int slot = blockIdx.x * blockDim.x + threadIdx.x;
  if (slot < num_slots) select_finish(states[slot]);
}

// Marks the kept entries: mark(slot, e, kept) is called for EVERY entry of an active slot
// (kept = true/false), except ties when only some of them are kept (select_mark_ties_kernel).
template <typename Mark>
__device__ __forceinline__ void select_mark_range(const double* values, const SelectState& st, int64_t slot,
                                                  int64_t begin, int64_t end, const Mark& mark) {
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

template <typename Mark>
__global__ void __launch_bounds__(kSelectThreads)
select_mark_kernel(const double* values, const SelectState* states, Mark mark) {
  const int64_t slot = blockIdx.y;
  const SelectState& st = states[slot];
  if (!st.active) return;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kSelectChunk;
  select_mark_range(values, st, slot, begin, min(begin + kSelectChunk, st.len), mark);
}

// Only when 0 < ties_kept < ties: the first ties_kept ties in index order (one block per slot).
// Any block size that is a multiple of 32 (up to 1024); returns uniformly over the block.
template <typename Mark>
__device__ __forceinline__ void select_mark_ties(const double* values, const SelectState& st, int64_t slot,
                                                 const Mark& mark) {
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

template <typename Mark>
__global__ void __launch_bounds__(1024) select_mark_ties_kernel(const double* values, const SelectState* states,
                                                                Mark mark) {
  const int64_t slot = blockIdx.x;
  select_mark_ties(values, states[slot], slot, mark);
}

// The whole selection of slots of at most kSelectChunk entries in ONE launch, a block of
// kSelectThreads (= kSelectBins) threads per slot: the passes, the finish and (kMark) the marks, as
// the kernels above do them for a one-chunk slot (the same sums in the same order, so the same
// result), without their 8 x 2 + 3 launches. A plan of a short sequence or chunk (llama.cpp's
// ubatches: N(N+1)/2 <= 8192 PE entries below N = 128 blocks) is launch-bound there.
static_assert(kSelectThreads == kSelectBins, "the one-block select scans with its histogram threads");
template <bool kMark, typename Mark>
__global__ void __launch_bounds__(kSelectThreads)
select_one_block_kernel(const double* values, SelectState* states, Mark mark) {
  __shared__ SelectHistogram h;
  const int64_t slot = blockIdx.x;
  SelectState& st = states[slot];
  const int rank = threadIdx.x, digit = kSelectBins - 1 - rank;
  for (int pass = 0; pass < kSelectPasses; ++pass) {
    const int shift = 64 - kSelectDigitBits * (pass + 1);
    __syncthreads();  // the previous pass's update of st is seen by every thread
    if (!st.active || st.all || st.resolved) break;  // uniform: read after the barrier
    if (st.mask != 0 && st.ties == 1) {
      select_find_single(values, st, 0, st.len);
      select_scan_block(st, 0, 0.0, shift);  // resolves (its single-entry branch)
      continue;
    }
    select_block_histogram(values, st, 0, st.len, shift, h);
    unsigned int c = 0;
    double m = 0.0;
    h.total(digit, c, m);
    select_scan_block(st, static_cast<int64_t>(c), m, shift);
  }
  __syncthreads();
  if (rank == 0) select_finish(st);
  __syncthreads();
  if (!kMark || !st.active) return;
  select_mark_range(values, st, slot, 0, st.len, mark);
  select_mark_ties(values, st, slot, mark);
}

}  // namespace planner
}  // namespace cuda_detail
}  // namespace crisp
