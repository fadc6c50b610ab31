// src/plan/rules.h — every rule of the CRISP spec, written once.
//
// Small, pure functions usable from host and device code, so the CPU and CUDA planners cannot
// drift apart: a backend only decides how it streams the data, never what a rule means. Section
// numbers refer to the algorithm specification (docs/spec.md).
#pragma once
#include <cmath>
#include <cstdint>

#include "crisp/config.h"

#if defined(__CUDACC__)
#define CRISP_HD __host__ __device__ __forceinline__
#else
#define CRISP_HD inline
#endif

namespace crisp {
namespace rules {

// Int32 codes of Config's enums, for device arrays and the rule functions below; derived from
// the enums themselves (crisp/config.h), never numbered a second time.
template <typename Enum>
constexpr int32_t code_of(Enum e) { return static_cast<int32_t>(e); }
enum RouteCode : int32_t {
  kRouteVs = code_of(Route::vs),
  kRoutePe = code_of(Route::pe),
  kRouteDense = code_of(Route::dense),
};
enum RoutingCode : int32_t {
  kRoutingCstruct = code_of(Routing::cstruct),
  kRoutingCstructRel = code_of(Routing::cstruct_rel),
  kRoutingJsd = code_of(Routing::jsd),
  kRoutingNone = code_of(Routing::none),
};
enum VsFloorCode : int32_t {
  kFloorMean = code_of(VsFloor::mean),
  kFloorUniform = code_of(VsFloor::uniform),
  kFloorMax = code_of(VsFloor::max),
};
enum SlashCoverCode : int32_t { kCoverExact = code_of(SlashCover::exact), kCoverSingle = code_of(SlashCover::single) };

// ---------------------------------------------------------------- Notation
// N = ceil(n / B).
CRISP_HD int32_t num_blocks(int64_t n, int32_t block) { return static_cast<int32_t>((n + block - 1) / block); }
// Block b covers [b*B, min((b+1)*B, n)).
CRISP_HD int64_t block_begin(int32_t b, int32_t block) { return static_cast<int64_t>(b) * block; }
CRISP_HD int64_t block_end(int32_t b, int32_t block, int64_t n) {
  const int64_t e = static_cast<int64_t>(b + 1) * block;
  return e < n ? e : n;
}
// §1: L = min(B, n_q) last queries; query i of the proxy sits at p_i = n_k - L + i. For a whole
// prompt n_q = n_k = n; a chunk has only its own n_q queries (§11).
CRISP_HD int64_t proxy_rows(int64_t n_q, int32_t block) { return n_q < block ? n_q : block; }
CRISP_HD int64_t proxy_position(int64_t n_k, int64_t L, int64_t i) { return n_k - L + i; }
// Number of causal blocks: N (N + 1) / 2.
CRISP_HD int64_t causal_blocks(int32_t N) { return static_cast<int64_t>(N) * (N + 1) / 2; }
CRISP_HD double density(int64_t nnz, int32_t N) { return static_cast<double>(nnz) / static_cast<double>(causal_blocks(N)); }

// ---------------------------------------------------------------- §11 queries over a KV prefix
// The queries are the last n_q of n_k positions. Blocks stay numbered by position, so the rows of
// a chunk are rows first_row .. N-1 of the whole prompt's grid.
CRISP_HD int32_t first_query_block(int64_t n_k, int64_t n_q, int32_t block) {
  return static_cast<int32_t>((n_k - n_q) / block);
}
// Position of the first query: the rows of block r hold positions [max(rB, first), min((r+1)B, n_k)).
CRISP_HD int64_t first_query_position(int64_t n_k, int64_t n_q) { return n_k - n_q; }
CRISP_HD int64_t row_query_begin(int32_t r, int32_t block, int64_t n_k, int64_t n_q) {
  const int64_t b = block_begin(r, block), first = first_query_position(n_k, n_q);
  return b > first ? b : first;
}
// Causal blocks of rows first_row .. N-1, and the density over them.
CRISP_HD int64_t causal_blocks_of_rows(int32_t first_row, int32_t N) { return causal_blocks(N) - causal_blocks(first_row); }
CRISP_HD double density_of_rows(int64_t nnz, int32_t first_row, int32_t N) {
  return static_cast<double>(nnz) / static_cast<double>(causal_blocks_of_rows(first_row, N));
}

// ---------------------------------------------------------------- §12 sliding window
// With a window W > 0 query position p sees the keys (p - W, p]: its W most recent positions, itself
// included (llama.cpp's is_masked_swa: masked iff p - j >= W; flash-attn's window_size (W - 1, 0)).
// W = 0: no window, every earlier key. Every backend's plan and kernel tests these, never its own.
// Templates over the position type: the kernels compare 32-bit positions (64-bit ones cost the
// portable kernel registers it does not have), the planners 64-bit ones.
template <typename Pos>
CRISP_HD bool outside_window(Pos key, Pos query, Pos window) { return window > 0 && query - key >= window; }
template <typename Pos>
CRISP_HD bool key_visible(Pos key, Pos query, Pos window) {
  return key <= query && !outside_window(key, query, window);
}
// The first key position query p sees.
template <typename Pos>
CRISP_HD Pos window_first_key(Pos query, Pos window) {
  return window > 0 && query - window + 1 > 0 ? query - window + 1 : Pos(0);
}
// The first key block row r lists: that of its first query's first key. Blocks before it hold no
// key any query of the row sees; the block itself and the next one may be partly visible.
CRISP_HD int32_t window_first_block(int32_t r, int32_t block, int64_t n_k, int64_t n_q, int64_t window) {
  return static_cast<int32_t>(window_first_key(row_query_begin(r, block, n_k, n_q), window) / block);
}
// Does a tile of keys from key0 need the window's mask for a query as late as last_query?
template <typename Pos>
CRISP_HD bool tile_needs_window_mask(Pos key0, Pos last_query, Pos window) {
  return outside_window(key0, last_query, window);
}

// ---------------------------------------------------------------- §7 short sequences
// Dense when there is nothing to select (N <= 2), when FlexPrefill's rule applies
// (n <= min_budget), or below the speed-driven dense_below.
CRISP_HD bool is_short_sequence(int64_t n, int32_t block, int64_t min_budget, int64_t dense_below) {
  return num_blocks(n, block) <= 2 || n <= min_budget || n <= dense_below;
}

// ---------------------------------------------------------------- §2 routing
// Key j lies in S_i (sink or local window of query position p) — each key counted once.
CRISP_HD bool in_structural_set(int64_t j, int64_t p, int64_t w_sink, int64_t w_local) {
  return j < w_sink || (p - j >= 0 && p - j < w_local);
}
// C_rel = C_struct * n / (w_sink + w_local).
CRISP_HD double cstruct_relative(double c_struct, int64_t n, int64_t w_sink, int64_t w_local) {
  return c_struct * static_cast<double>(n) / static_cast<double>(w_sink + w_local);
}
// JS distance from the two KL terms (natural log): sqrt(KL(a||m)/2 + KL(p||m)/2).
// One term of a KL sum, with 0 log 0 = 0.
CRISP_HD double kl_term(double x, double m) { return x > 0.0 ? x * log(x / m) : 0.0; }
// D = sqrt(KL(a||m)/2 + KL(p||m)/2) from the two KL sums (a rounding-negative sum reads as 0).
CRISP_HD double js_distance(double kl_a_m, double kl_p_m) {
  const double half_sum = 0.5 * kl_a_m + 0.5 * kl_p_m;
  return half_sum > 0.0 ? sqrt(half_sum) : 0.0;
}

// The routing decision. c_struct and jsd are only read by the routing that needs them.
CRISP_HD int32_t route_head(int32_t routing, double c_struct, double jsd, int64_t n, int64_t w_sink,
                            int64_t w_local, double tau_proxy, double rho, double tau) {
  switch (routing) {
    case kRoutingCstruct: return c_struct >= tau_proxy ? kRouteVs : kRoutePe;
    case kRoutingCstructRel: return cstruct_relative(c_struct, n, w_sink, w_local) >= rho ? kRouteVs : kRoutePe;
    case kRoutingJsd: return jsd < tau ? kRoutePe : kRouteVs;
    default: return kRouteVs;
  }
}

// ---------------------------------------------------------------- Ordering (§5 "Ties")
// Larger value first, then smaller index: true if (va, ia) comes before (vb, ib).
CRISP_HD bool ranks_before(double va, int64_t ia, double vb, int64_t ib) {
  return va > vb || (va == vb && ia < ib);
}

// ---------------------------------------------------------------- §3 VS rules
// noise_floor: keep block b >= 1 iff its pooled mass is strictly above the floor.
// The mean floor is alpha times the mean of entries 1 .. N-2 (anchors and the far end excluded).
CRISP_HD int32_t noise_floor_first(int32_t /*N*/) { return 1; }
CRISP_HD int32_t noise_floor_last(int32_t N) { return N - 2; }  // inclusive
CRISP_HD bool floor_uses_mean(int32_t floor) { return floor != kFloorUniform; }
// The uniform floor is uniform_alpha / N: the mass of a block under uniform attention (the pooled
// masses sum to 1). It does not move with the sink's share or with a few heavy blocks. Below
// floor_blocks key blocks it stays at uniform_alpha / floor_blocks: the pooled mass of a block that
// only the last few proxy rows need does not grow as N falls, so 1/N would drop it on short prompts.
CRISP_HD double uniform_floor(double uniform_alpha, int32_t N, int64_t floor_blocks) {
  const double level = static_cast<int64_t>(N) > floor_blocks ? static_cast<double>(N) : static_cast<double>(floor_blocks);
  return uniform_alpha / level;
}
// The held floor's block count of one side: the slash side's own count unless it is -1 (follow the
// vertical side's).
CRISP_HD int64_t side_floor_blocks(bool vertical, int64_t uniform_floor_blocks, int64_t uniform_floor_slash_blocks) {
  return vertical || uniform_floor_slash_blocks < 0 ? uniform_floor_blocks : uniform_floor_slash_blocks;
}
// uniform_floor_last_rows: keep iff all rows' mass > u / N or the last rows' mass > u / max(N, F)
// (F the side's held floor blocks). Both backends read one pooled score per block, the larger of
// the two (proxy::with_last_rows), against one threshold; so the last rows' mass is scaled by
// max(N, F) / N and the threshold is the plain u / N: the same set. Without the option the
// scale is 1 and the threshold holds F itself.
CRISP_HD double last_rows_mass_scale(bool last_rows_only, int32_t N, int64_t floor_blocks) {
  return last_rows_only && floor_blocks > static_cast<int64_t>(N) ? static_cast<double>(floor_blocks) / static_cast<double>(N)
                                                                  : 1.0;
}
CRISP_HD int64_t threshold_floor_blocks(bool last_rows_only, int64_t floor_blocks) {
  return last_rows_only ? 0 : floor_blocks;
}
// The floor of vs_floor `floor` (a VsFloorCode); floor_mean is only read when floor_uses_mean.
CRISP_HD double noise_floor_threshold(int32_t floor, double floor_mean, double alpha, double uniform_alpha,
                                      int64_t uniform_floor_blocks, int32_t N) {
  const double mean_floor = alpha * floor_mean;
  const double uniform = uniform_floor(uniform_alpha, N, uniform_floor_blocks);
  switch (floor) {
    case kFloorUniform: return uniform;
    case kFloorMax: return mean_floor > uniform ? mean_floor : uniform;
    default: return mean_floor;
  }
}
CRISP_HD bool noise_floor_keeps(double mass, double threshold) { return mass > threshold; }

// cumulative: count(x, gamma) = (# entries of x sorted descending whose running sum is <= gamma) + 1.
// Callers walk the sorted entries and stop at the first whose running sum exceeds gamma; this is
// the test for one step.
CRISP_HD bool cumulative_within(double running_sum, double gamma) { return running_sum <= gamma; }
// Token count -> block budget: count // B + 1, clamped to [min_blocks, N].
CRISP_HD int32_t cumulative_blocks(int64_t token_count, int32_t block, int32_t min_blocks, int32_t N) {
  int64_t nb = token_count / block + 1;
  if (nb < min_blocks) nb = min_blocks;
  if (nb > N) nb = N;
  return static_cast<int32_t>(nb);
}

// topk (MInference-style): tokens forced into the vertical and slash sets.
// NOTE: MInference's constants: the first 30 keys and the nearest 100 distances are always kept.
constexpr int64_t kTopkForcedVerticalTokens = 30;
constexpr int64_t kTopkForcedSlashTokens = 100;
CRISP_HD bool topk_vertical_forced(int64_t j) { return j < kTopkForcedVerticalTokens; }
CRISP_HD bool topk_slash_forced(int64_t t) { return t < kTopkForcedSlashTokens; }

// Budget clamps in blocks. min: ceil(min_budget / B) blocks of each kind (0 = none).
// max: floor(max_budget / B) blocks, at least 1 so the anchor survives (0 = no maximum).
CRISP_HD int32_t min_budget_blocks(int64_t min_budget, int32_t block, int32_t N) {
  int64_t b = (min_budget + block - 1) / block;
  return static_cast<int32_t>(b < N ? b : N);
}
CRISP_HD int32_t max_budget_blocks(int64_t max_budget, int32_t block, int32_t N) {
  if (max_budget <= 0) return N;
  int64_t b = max_budget / block;
  if (b < 1) b = 1;
  return static_cast<int32_t>(b < N ? b : N);
}

// ---------------------------------------------------------------- §4 PE rule
// Global coverage keeps the sorted entries while the running sum before them is below the
// target; the entry that crosses it is included.
CRISP_HD double pe_coverage_target(double pe_gamma, int32_t N) { return pe_gamma * static_cast<double>(N); }
CRISP_HD bool pe_keeps_next(double running_sum_before, double target) { return running_sum_before < target; }
// The floor keeps entry (r, c <= r) iff P[r, c] is strictly above pe_alpha times the row's uniform
// level 1 / (r + 1) (row r of P sums to 1 over its r + 1 entries).
CRISP_HD double pe_row_floor(double pe_alpha, int32_t r) { return pe_alpha / static_cast<double>(r + 1); }
CRISP_HD bool pe_floor_keeps(double prob, int32_t r, double pe_alpha) { return prob > pe_row_floor(pe_alpha, r); }

// ---------------------------------------------------------------- §5 layout
// Does slash distance-block c reach key block kb from query block r?
CRISP_HD bool slash_reaches(int32_t r, int32_t kb, int32_t c, int32_t cover) {
  return kb == r - c || (cover == kCoverExact && kb == r - c - 1);
}
// Is key block kb <= r covered by the slash set (flags indexed by distance-block)?
template <typename Flags>
CRISP_HD bool covered_by_slash(int32_t r, int32_t kb, const Flags& slash_flags, int32_t cover) {
  const int32_t c = r - kb;  // slash c reaches kb directly
  if (slash_flags[c]) return true;
  return cover == kCoverExact && c >= 1 && slash_flags[c - 1];  // slash c-1 reaches r-(c-1)-1 = kb
}
// Membership of key block kb (<= r) in row r of the layout:
// {0, r} ∪ {verticals} ∪ slash cover ∪ PE entries of the row.
template <typename Flags, typename PeRow>
CRISP_HD bool layout_has_block(int32_t r, int32_t kb, const Flags& vertical_flags, const Flags& slash_flags,
                               const PeRow& pe_row, int32_t cover) {
  return kb == 0 || kb == r || vertical_flags[kb] || covered_by_slash(r, kb, slash_flags, cover) || pe_row[kb];
}

}  // namespace rules
}  // namespace crisp
