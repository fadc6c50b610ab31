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
// Masses are summed in fixed point (select_fixed: each value, a probability in [0, 1], rounded
// to a multiple of 2^-44 once, then exact 64-bit integer sums): shared-memory double atomics are
// compare-and-swap loops on sm_80 / sm_90 that retry once per colliding lane, 32-bit integer
// atomics are native, and integer sums do not depend on the order. The walk compares them as
// doubles with the rule's targets like a sorted walk's double sums (the tests use inputs with
// margins; a running sum landing within rounding of the target can differ).
//
// A large selection (above kSelectChunk entries) runs kSelectGridPasses passes as grids of chunks
// (histogram kernel + scan kernel per pass); a grid pass whose prefix holds few entries
// (select_compacts) also lists them, the candidates, so that the passes after it read only
// those; the remaining passes then run in one block per slot (select_rest_kernel), with the
// finish. A slot whose prefix never got few enough (more than the capacity's entries share its top
// 16 bits, or 24 above kSelectLargeSlot) finishes in that one block over all its entries: correct,
// slower.
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
// NOTE: passes run as grids before the one-block rest: after two 8-bit digits a PE map's stop
// bucket holds a few per cent of its entries (the top 4 mantissa bits), so the third grid pass
// lists them and the last five passes read only those (bench/RESULTS.md, session 18). Above
// kSelectLargeSlot entries per slot a fourth grid pass (over the list) narrows the bucket to a
// 2^-12 relative width first, so the one-block rest stays small (select_grid_passes).
constexpr int kSelectGridPasses = 3;
constexpr int64_t kSelectLargeSlot = int64_t(1) << 21;  // N above about 2048 blocks (PE)
// NOTE: candidates one slot may list: kSelectCompactCap, or a sixteenth of the largest slot's
// entries when that is more (a few per cent of a long PE map share the top 16 bits), at most a
// quarter of it (select_candidate_capacity).
constexpr int64_t kSelectCompactCap = 65536;
__host__ __device__ constexpr int select_grid_passes(int64_t max_len) {
  return max_len > kSelectLargeSlot ? kSelectGridPasses + 1 : kSelectGridPasses;
}
__host__ __device__ constexpr int64_t select_candidate_capacity(int64_t max_len) {
  const int64_t wanted = max_len / 16 > kSelectCompactCap ? max_len / 16 : kSelectCompactCap;
  return wanted < max_len / 4 ? wanted : max_len / 4;
}
static_assert(select_candidate_capacity(131072) == 32768 && select_candidate_capacity(525312) == 65536 &&
                  select_candidate_capacity(int64_t(8390656)) == 524416,
              "candidates: a quarter of a short slot, kSelectCompactCap, a sixteenth of a long one");
// Fixed point of the masses: 2^44 per unit. A slot's values sum to at most N (PE: one per row) or
// 1 (token walks), so sums stay below 2^63 for N < 2^19 blocks (N(N+1)/2 doubles would not fit a
// device long before); the rounding, at most 2^-45 per value, is below a double sum's of the same
// values near the targets (~0.5 ulp of N per addition).
constexpr int kSelectFixedBits = 44;
// NOTE: values each thread loads before it bins them: loads in flight, where one at a time left
// the passes latency-bound. Not tuned.
constexpr int kSelectLoadBatch = 4;

struct SelectState {
  // Input, set by the caller's init kernel.
  int64_t base;       // first entry of the slot in `values`
  int64_t len;        // entries
  double scale;       // value = values[base + e] * scale
  select::WalkRule walk;
  int32_t active;     // 0: slot not selected (nothing marked, kept = 0)
  // Progress.
  uint64_t prefix, mask;
  uint64_t mass_before;  // fixed point (select_fixed)
  int64_t count_before;
  int64_t ties;
  int32_t all;        // 1: every entry is kept (the rule never stops inside the slot)
  // Early resolution: once the stop's bucket holds one entry (ties == 1 after a pass), the next
  // histogram pass only finds that entry's bits (single) and the scan takes them as the whole
  // prefix (resolved = 1); the remaining passes skip the slot. The state ends as the full walk
  // would leave it: the later passes would only add empty digits (mass 0.0, count 0).
  uint64_t single;
  int32_t resolved;
  // Compaction: once set (by a grid pass's scan), the slot's entries that match the prefix are the
  // cand_count entry indices of its candidate list, and the passes read only those.
  int32_t compacted;
  unsigned long long cand_count;
  // Result.
  int64_t ties_kept;
  int64_t kept;
};

__device__ __forceinline__ double select_value(const double* values, const SelectState& st, int64_t e) {
  return values[st.base + e] * st.scale;
}
__device__ __forceinline__ uint64_t key_bits(double v) { return static_cast<uint64_t>(__double_as_longlong(v)); }

// Fixed point of a value in [0, 1] (kSelectFixedBits) and back.
__device__ __forceinline__ uint64_t select_fixed(double v) { return __double2ull_rn(v * 0x1p44); }
__device__ __forceinline__ double select_unfixed(uint64_t f) { return static_cast<double>(f) * 0x1p-44; }
static_assert(kSelectFixedBits == 44, "select_fixed scales by 2^44");

// Per-warp shared histograms of one pass (kSelectThreads threads): per digit a count and a 64-bit
// fixed-point mass kept as two 32-bit words (add carries from the low word into the high).
constexpr int kSelectWarps = kSelectThreads / 32;
// NOTE: candidates a warp gathers before it reserves room for them in the slot's list with one
// global atomic: an atomic per warp instruction on one counter per slot serialised the compacting
// pass (bench/RESULTS.md, session 18).
constexpr int kSelectAppendBuffer = 64;
struct SelectHistogram {
  unsigned int count[kSelectWarps][kSelectBins];
  unsigned int mass_lo[kSelectWarps][kSelectBins];
  unsigned int mass_hi[kSelectWarps][kSelectBins];
  uint32_t appended[kSelectWarps][kSelectAppendBuffer];  // a warp's candidates not yet listed
  __device__ __forceinline__ void clear() {
    for (int i = threadIdx.x; i < kSelectWarps * kSelectBins; i += blockDim.x) {
      (&count[0][0])[i] = 0;
      (&mass_lo[0][0])[i] = 0;
      (&mass_hi[0][0])[i] = 0;
    }
  }
  // Adds `n` entries of total fixed-point mass f to digit b of warp w's histogram. Native 32-bit
  // atomics: the add that wraps the low word adds the carry to the high word.
  __device__ __forceinline__ void add(int w, int b, unsigned int n, uint64_t f, bool with_mass) {
    atomicAdd(&count[w][b], n);
    if (!with_mass) return;
    const unsigned int lo = static_cast<unsigned int>(f), hi = static_cast<unsigned int>(f >> 32);
    const unsigned int before = atomicAdd(&mass_lo[w][b], lo);
    const unsigned int carry = before + lo < before ? 1u : 0u;
    if (hi + carry != 0) atomicAdd(&mass_hi[w][b], hi + carry);
  }
  // Digit b's totals over the warps.
  __device__ __forceinline__ void total(int b, unsigned int& c, uint64_t& m) const {
    c = 0;
    m = 0;
    for (int w = 0; w < kSelectWarps; ++w) {
      c += count[w][b];
      m += (static_cast<uint64_t>(mass_hi[w][b]) << 32) + mass_lo[w][b];
    }
  }
};

// Does the slot still need passes (active, the stop not found yet)?
__device__ __forceinline__ bool select_needs_pass(const SelectState& st) {
  return st.active && !st.all && !st.resolved;
}
// Is the stop one entry whose bits the pass only has to find (early resolution)?
__device__ __forceinline__ bool select_single_pending(const SelectState& st) { return st.mask != 0 && st.ties == 1; }
// Does this grid pass list the entries of the current prefix (at most `capacity` of them)? Read
// from the state before the pass: the histogram blocks and the scan of the pass agree.
__device__ __forceinline__ bool select_compacts(const SelectState& st, int64_t capacity) {
  return select_needs_pass(st) && !st.compacted && st.mask != 0 && st.ties > 1 && st.ties <= capacity;
}

// The entries a pass walks: the slot's candidates once compacted, else all of them; item i is
// entry(i), of value value(i).
struct SelectItems {
  const double* values;
  const SelectState* st;
  const uint32_t* list;  // null: entries 0 .. count-1
  int64_t count;
  __device__ __forceinline__ int64_t entry(int64_t i) const { return list != nullptr ? list[i] : i; }
  __device__ __forceinline__ double value(int64_t e) const { return select_value(values, *st, e); }
};
__device__ __forceinline__ SelectItems select_items(const double* values, const SelectState& st,
                                                    const uint32_t* candidates) {
  return st.compacted ? SelectItems{values, &st, candidates, static_cast<int64_t>(st.cand_count)}
                      : SelectItems{values, &st, nullptr, st.len};
}
// The candidates' values copied to shared memory (select_rest_kernel): item i is value i.
struct StagedItems {
  const double* staged;
  int64_t count;
  __device__ __forceinline__ int64_t entry(int64_t i) const { return i; }
  __device__ __forceinline__ double value(int64_t e) const { return staged[e]; }
};

// The scan's barrier: the first kSelectBins threads of the block (all of it but in
// select_rest_kernel, whose other threads skip the scan).
__device__ __forceinline__ void select_scan_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kSelectBins) : "memory"); }

// The stop is one entry (st.ties == 1 after a pass): its bits into st.single, from its only thread.
template <typename Items>
__device__ __forceinline__ void select_find_single(SelectState& st, const Items& items, int64_t begin, int64_t end) {
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const uint64_t bits = key_bits(items.value(items.entry(i)));
    if ((bits & st.mask) == st.prefix) st.single = bits;
  }
}

// Moves a warp's `fill` gathered candidates to the slot's list (counter: its length). All 32 lanes.
__device__ __forceinline__ void warp_list_appended(uint32_t* gathered, int fill, unsigned long long* counter,
                                                   uint32_t* list) {
  const unsigned full = 0xffffffffu;
  __syncwarp();
  if (fill == 0) return;
  const int lane = threadIdx.x & 31;
  unsigned long long base = 0;
  if (lane == 0) base = atomicAdd(counter, static_cast<unsigned long long>(fill));
  base = __shfl_sync(full, base, 0);
  for (int i = lane; i < fill; i += 32) list[base + i] = gathered[i];
  __syncwarp();
}
// Gathers the entries of the lanes that keep one (fill: how many the warp holds, the same in every
// lane), listing them when the buffer would overflow. All 32 lanes.
__device__ __forceinline__ void warp_append(bool keep, int64_t entry, uint32_t* gathered, int& fill,
                                            unsigned long long* counter, uint32_t* list) {
  const unsigned ballot = __ballot_sync(0xffffffffu, keep);
  if (ballot == 0) return;
  const int n = __popc(ballot);
  if (fill + n > kSelectAppendBuffer) {
    warp_list_appended(gathered, fill, counter, list);
    fill = 0;
  }
  const int lane = threadIdx.x & 31;
  if (keep) gathered[fill + __popc(ballot & ((1u << lane) - 1u))] = static_cast<uint32_t>(entry);
  fill += n;
}

// One pass's histogram of the items [begin, end) of an active, unresolved slot whose prefix
// still has more than one entry; with `append`, the items that match the prefix are also listed
// there. Called by every thread of the block (the loop is block-uniform: warp intrinsics inside);
// ends with __syncthreads.
template <typename Items>
__device__ __forceinline__ void select_block_histogram(const SelectState& st, const Items& items, int64_t begin,
                                                       int64_t end,
                                                       int shift, SelectHistogram& h,
                                                       unsigned long long* append_counter = nullptr,
                                                       uint32_t* append = nullptr) {
  // One histogram per warp: the digits below the top one spread over many bins, where 256 threads
  // sharing one histogram serialise on its shared-memory atomics; a warp's own copy sees 32
  // (bench/RESULTS.md, session 4, has the selection's timings).
  h.clear();
  __syncthreads();
  const int warp = (threadIdx.x / 32) % kSelectWarps;
  const uint64_t prefix = st.prefix, mask = st.mask;
  const bool with_mass = st.walk.mode != select::kCount;
  // Runs of one digit are summed in registers first: the high digits of probabilities cluster in
  // a few bins (one exponent range), where one shared atomic per entry would serialise.
  int run_digit = -1;
  unsigned int run_count = 0;
  uint64_t run_mass = 0;
  int fill = 0;  // candidates the warp has gathered (append)
  const int64_t threads = blockDim.x;
  for (int64_t i0 = begin; i0 < end; i0 += kSelectLoadBatch * threads) {
    double x[kSelectLoadBatch];
    int64_t e[kSelectLoadBatch];
#pragma unroll
    for (int j = 0; j < kSelectLoadBatch; ++j) {
      const int64_t i = i0 + j * threads + threadIdx.x;
      e[j] = i < end ? items.entry(i) : -1;
    }
#pragma unroll
    for (int j = 0; j < kSelectLoadBatch; ++j) x[j] = e[j] >= 0 ? items.value(e[j]) : -1.0;
#pragma unroll
    for (int j = 0; j < kSelectLoadBatch; ++j) {
      const uint64_t bits = key_bits(x[j]);
      const bool match = e[j] >= 0 && (bits & mask) == prefix;
      if (append != nullptr) warp_append(match, e[j], h.appended[warp], fill, append_counter, append);
      if (!match) continue;
      const int digit = static_cast<int>((bits >> shift) & (kSelectBins - 1));
      if (digit != run_digit) {
        if (run_count != 0) h.add(warp, run_digit, run_count, run_mass, with_mass);
        run_digit = digit;
        run_count = 0;
        run_mass = 0;
      }
      ++run_count;
      if (with_mass) run_mass += select_fixed(x[j]);
    }
  }
  if (run_count != 0) h.add(warp, run_digit, run_count, run_mass, with_mass);
  if (append != nullptr) warp_list_appended(h.appended[warp], fill, append_counter, append);
  __syncthreads();
}

// One grid pass: grid (chunks of kSelectChunk items, slots). candidates: `capacity` entry indices
// per slot (select_candidate_capacity); capacity 0: no compaction.
__global__ void __launch_bounds__(kSelectThreads)
select_histogram_kernel(const double* values, SelectState* states, unsigned long long* hist_count,
                        unsigned long long* hist_mass, int shift, uint32_t* candidates, int64_t capacity) {
  const int64_t slot = blockIdx.y;
  SelectState& st = states[slot];
  if (!select_needs_pass(st)) return;
  uint32_t* slot_candidates = candidates + slot * capacity;
  const SelectItems items = select_items(values, st, slot_candidates);
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kSelectChunk;
  if (begin >= items.count) return;
  const int64_t end = min(begin + kSelectChunk, items.count);
  if (select_single_pending(st)) {  // no histogram; the scan resolves
    select_find_single(st, items, begin, end);
    return;
  }
  __shared__ SelectHistogram h;
  if (select_compacts(st, capacity))
    select_block_histogram(st, items, begin, end, shift, h, &st.cand_count, slot_candidates);
  else
    select_block_histogram(st, items, begin, end, shift, h);
  for (int b = threadIdx.x; b < kSelectBins; b += blockDim.x) {
    unsigned int count = 0;
    uint64_t mass = 0;
    h.total(b, count, mass);
    if (count == 0) continue;
    atomicAdd(&hist_count[slot * kSelectBins + b], static_cast<unsigned long long>(count));
    if (st.walk.mode != select::kCount) atomicAdd(&hist_mass[slot * kSelectBins + b], static_cast<unsigned long long>(mass));
  }
}

// Thread `rank` holds digit kSelectBins - 1 - rank (the walk goes from the largest digit down);
// exclusive prefix sums over the ranks give the mass G and count C above every digit at once, and
// the first digit where the rule stops is the smallest rank that crosses. Same decisions as a
// sequential walk from the top digit; the prefix sums are exact (fixed point).
// The scan of one pass for one slot, by a block of kSelectBins threads: thread `rank` brings the
// count c and mass m of digit kSelectBins - 1 - rank. Returns early only uniformly over the first
// kSelectBins threads before their last barrier; the thread that finds the stop updates st after it.
__device__ __forceinline__ void select_scan_block(SelectState& st, int64_t c, uint64_t m, int shift) {
  __shared__ unsigned long long s_warp_mass[kSelectBins / 32];
  __shared__ long long s_warp_count[kSelectBins / 32];
  __shared__ int s_found, s_last;
  const int rank = threadIdx.x, digit = kSelectBins - 1 - rank;
  const int lane = rank & 31, warp = rank >> 5;
  if (!select_needs_pass(st)) return;  // uniform over the block
  if (select_single_pending(st)) {  // the histogram pass found the one entry (early resolution)
    select_scan_sync();  // every thread has read the state before rank 0 changes it
    if (rank == 0) {
      st.prefix = st.single;
      st.mask = ~0ull;
      st.resolved = 1;
    }
    return;
  }
  // Inclusive warp scans, then the totals of the warps before.
  uint64_t incl_m = m;
  long long incl_c = c;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const uint64_t om = __shfl_up_sync(0xffffffffu, incl_m, off);
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
  select_scan_sync();
  uint64_t excl_m = __shfl_up_sync(0xffffffffu, incl_m, 1);
  long long excl_c = __shfl_up_sync(0xffffffffu, incl_c, 1);
  if (lane == 0) {
    excl_m = 0;
    excl_c = 0;
  }
  uint64_t before_m = 0;
  long long before_c = 0;
  for (int w = 0; w < warp; ++w) {
    before_m += s_warp_mass[w];
    before_c += s_warp_count[w];
  }
  const uint64_t G = st.mass_before + before_m + excl_m;
  const int64_t C = st.count_before + static_cast<int64_t>(before_c + excl_c);
  if (c != 0) {
    if (select::walk_stops_within(st.walk, select_unfixed(G), select_unfixed(m), C, c)) atomicMin(&s_found, rank);
    atomicMax(&s_last, rank);
  }
  select_scan_sync();
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
// clears; a pass that listed the slot's candidates (select_compacts) marks it compacted.
__global__ void __launch_bounds__(kSelectBins) select_scan_kernel(SelectState* states, unsigned long long* hist_count,
                                                                  unsigned long long* hist_mass, int shift, int num_slots,
                                                                  int64_t capacity) {
  const int slot = blockIdx.x;
  if (slot >= num_slots) return;
  SelectState& st = states[slot];
  const int digit = kSelectBins - 1 - static_cast<int>(threadIdx.x);
  unsigned long long* cnt = hist_count + static_cast<int64_t>(slot) * kSelectBins;
  unsigned long long* mass = hist_mass + static_cast<int64_t>(slot) * kSelectBins;
  const int64_t c = static_cast<int64_t>(cnt[digit]);
  const uint64_t m = mass[digit];
  cnt[digit] = 0;
  mass[digit] = 0;
  const bool compacted_now = select_compacts(st, capacity);
  __syncthreads();  // every thread has read the state before thread 0 changes it
  if (compacted_now && threadIdx.x == 0) st.compacted = 1;
  select_scan_block(st, c, m, shift);
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
  const int64_t m = select::walk_ties_kept(st.walk, select_unfixed(st.mass_before), st.count_before, x, st.ties);
  st.ties_kept = m;
  st.kept = st.count_before + m;
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

// Passes first_pass .. kSelectPasses-1 of one slot and its finish, by one block of any multiple
// of kSelectBins threads (its first kSelectBins scan), over `items`.
template <typename Items>
__device__ __forceinline__ void select_passes_in_block(SelectState& st, const Items& items, int first_pass,
                                                       SelectHistogram& h) {
  const int rank = threadIdx.x, digit = kSelectBins - 1 - rank;
  for (int pass = first_pass; pass < kSelectPasses; ++pass) {
    const int shift = 64 - kSelectDigitBits * (pass + 1);
    __syncthreads();  // the previous pass's update of st is seen by every thread
    if (!select_needs_pass(st)) break;  // uniform: read after the barrier
    if (select_single_pending(st)) {
      select_find_single(st, items, 0, items.count);
      __syncthreads();  // st.single is written
      if (rank < kSelectBins) select_scan_block(st, 0, 0, shift);  // resolves (its single-entry branch)
      continue;
    }
    select_block_histogram(st, items, 0, items.count, shift, h);
    if (rank < kSelectBins) {
      unsigned int c = 0;
      uint64_t m = 0;
      h.total(digit, c, m);
      select_scan_block(st, static_cast<int64_t>(c), m, shift);
    }
  }
  __syncthreads();
  if (rank == 0) select_finish(st);
  __syncthreads();
}

// NOTE: the rest's block: 1024 threads (one block per slot, so its loads in flight are the
// limit); the candidates' values are staged in dynamic shared memory up to what the device allows
// beside the histograms (run_select: about 25k doubles on sm_90, 17k on sm_80).
constexpr int kSelectRestThreads = 1024;
static_assert(kSelectRestThreads % kSelectBins == 0, "the rest's block scans with its first kSelectBins threads");

// The passes after the grid passes and the finish, one block per slot (see the top of the file).
// A compacted slot whose candidates fit `staged_capacity` doubles of dynamic shared memory reads
// their values once into it; otherwise the passes read global memory.
__global__ void __launch_bounds__(kSelectRestThreads)
select_rest_kernel(const double* values, SelectState* states, const uint32_t* candidates, int64_t capacity,
                   int64_t staged_capacity, int first_pass) {
  __shared__ SelectHistogram h;
  extern __shared__ double staged[];
  const int64_t slot = blockIdx.x;
  SelectState& st = states[slot];
  const SelectItems items = select_items(values, st, candidates + slot * capacity);
  if (select_needs_pass(st) && st.compacted && items.count <= staged_capacity) {
    for (int64_t i = threadIdx.x; i < items.count; i += blockDim.x) staged[i] = items.value(items.entry(i));
    // The first barrier of the passes makes the copy visible.
    select_passes_in_block(st, StagedItems{staged, items.count}, first_pass, h);
  } else {
    select_passes_in_block(st, items, first_pass, h);
  }
}

// The whole selection of slots of at most kSelectChunk entries in ONE launch, a block of
// kSelectThreads (= kSelectBins) threads per slot: the passes, the finish and (kMark) the marks
// (ties_only: only the ties of a stop that keeps some, as run_select's), as the kernels above do
// them for a one-chunk slot, without their launches. A plan of a short
// sequence or chunk (llama.cpp's ubatches: N(N+1)/2 <= 8192 PE entries below N = 128 blocks) is
// launch-bound there.
static_assert(kSelectThreads == kSelectBins, "the one-block select scans with its histogram threads");
template <bool kMark, typename Mark>
__global__ void __launch_bounds__(kSelectThreads)
select_one_block_kernel(const double* values, SelectState* states, Mark mark, bool ties_only) {
  __shared__ SelectHistogram h;
  const int64_t slot = blockIdx.x;
  SelectState& st = states[slot];
  select_passes_in_block(st, SelectItems{values, &st, nullptr, st.len}, 0, h);
  if (!kMark || !st.active) return;
  if (!ties_only) select_mark_range(values, st, slot, 0, st.len, mark);
  select_mark_ties(values, st, slot, mark);
}

}  // namespace planner
}  // namespace cuda_detail
}  // namespace crisp
