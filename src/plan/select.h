// src/plan/select.h — the selection pipeline of the planner, written once for the CPU and CUDA
// backends: short-sequence and routing decisions, the per-side VS pipeline (anchor -> VS rule ->
// min_budget -> max_budget), the ordered walks of §3 cumulative / topk and §4 global coverage, and
// layout membership. The rules themselves are in src/plan/rules.h; this file only combines them.
//
// The per-side pipeline runs over a primitives policy `Side` that owns one side (verticals with
// pv, or slashes with ps) of one head. The CPU backend's policy is serial loops over vectors
// (src/cpu/cpu_plan.cpp); the CUDA backend's is one thread block cooperating over shared memory
// (src/cuda/plan_kernels.cuh). A policy supplies:
//   int32_t num_blocks() const;               N
//   double mass(int32_t b) const;             pooled mass of block b (pv or ps)
//   double sum_mass(int32_t first, int32_t last);  sum over [first, last] (a reduction)
//   void keep_where(pred);                    flags[b] |= pred(b) for every b (a parallel mark)
//   void add_in_rank_order(int32_t target);   flags unflagged blocks in rank order until target
//   void trim_in_rank_order(int32_t limit);   keeps block 0 and the first limit-1 flagged others
//   int64_t walk_tokens(const TokenWalk&, bool mark_blocks);  the ordered walk over token masses
//                                              (v or u): kept count; marks their blocks if asked
// Rank order is rules::ranks_before on the pooled mass. A new VS rule is one function below and
// one case of apply_vs_rule; a new PE rule is a walk like pe_walk or a predicate like pe_floor_keeps.
#pragma once
#include <cstdint>

#include "plan/plan_params.h"
#include "plan/rules.h"

namespace crisp {
namespace select {

// ---------------------------------------------------------------- decisions per head
// Does a sequence of n tokens get estimated (not the dense preset, not §7 short)?
CRISP_HD bool estimates(const PlanParams& p, int64_t n) {
  return !p.dense && !rules::is_short_sequence(n, p.block_size, p.min_budget, p.dense_below);
}

// §2 routing decision (a rules::RouteCode). jsd is only read by the jsd routing.
CRISP_HD int32_t decide_route(const PlanParams& p, double c_struct, double jsd, int64_t n) {
  return rules::route_head(rules::code_of(p.routing), c_struct, jsd, n, p.w_sink, p.w_local, p.tau_proxy, p.rho,
                           p.tau);
}
CRISP_HD bool needs_jsd(const PlanParams& p) { return p.routing == Routing::jsd; }

// ---------------------------------------------------------------- ordered walks
// A walk over entries in rank order (larger value first, then smaller index) that keeps a prefix.
// The three stopping rules of the spec:
//  - mass_before (§4 global coverage): an entry is kept while the running sum BEFORE it is below
//    the target (rules::pe_keeps_next);
//  - mass_inclusive (§3 cumulative count): an entry is kept while the running sum INCLUDING it is
//    within the target (rules::cumulative_within);
//  - count (§3 topk): the first k entries.
enum WalkMode : int32_t { kMassBefore = 0, kMassInclusive = 1, kCount = 2 };
struct WalkRule {
  int32_t mode;
  double target;  // mass modes
  int64_t k;      // count mode
};

// Is the next entry (value x) kept, after mass_before / count_before of kept entries?
CRISP_HD bool walk_keeps(const WalkRule& w, double mass_before, int64_t count_before, double x) {
  switch (w.mode) {
    case kMassBefore: return rules::pe_keeps_next(mass_before, w.target);
    case kMassInclusive: return rules::cumulative_within(mass_before + x, w.target);
    default: return count_before < w.k;
  }
}
// Does the walk stop inside a run of `count` entries of total `mass` that starts after G / C?
// (The device's radix select asks this of a whole digit bucket.)
CRISP_HD bool walk_stops_within(const WalkRule& w, double G, double mass, int64_t C, int64_t count) {
  switch (w.mode) {
    case kMassBefore: return rules::pe_keeps_next(G, w.target) && !rules::pe_keeps_next(G + mass, w.target);
    case kMassInclusive: return rules::cumulative_within(G, w.target) && !rules::cumulative_within(G + mass, w.target);
    default: return C < w.k && C + count >= w.k;
  }
}
// How many of `ties` equal entries (value x), walked after G / C, are kept.
CRISP_HD int64_t walk_ties_kept(const WalkRule& w, double G, int64_t C, double x, int64_t ties) {
  if (w.mode == kCount) {
    const int64_t left = w.k - C;
    return left < ties ? left : ties;
  }
  int64_t m = 0;
  double running = G;
  while (m < ties && walk_keeps(w, running, C + m, x)) {
    running += x;
    ++m;
  }
  return m;
}

// A walk over the token masses [first, n) of one side (v or u).
struct TokenWalk {
  WalkRule rule;
  int64_t first;  // tokens before `first` are not walked (topk's forced tokens)
};

// §3 cumulative: count(x, gamma) walks every token within gamma.
CRISP_HD TokenWalk cumulative_walk(const PlanParams& p) { return TokenWalk{WalkRule{kMassInclusive, p.gamma, 0}, 0}; }

// §3 topk: the forced tokens, then the top tokens until the side's budget.
CRISP_HD int64_t topk_forced_tokens(bool vertical, int64_t n) {
  const int64_t forced = vertical ? rules::kTopkForcedVerticalTokens : rules::kTopkForcedSlashTokens;
  return forced < n ? forced : n;
}
CRISP_HD TokenWalk topk_walk(const PlanParams& p, bool vertical, int64_t n) {
  const int64_t first = topk_forced_tokens(vertical, n);
  int64_t extra = (vertical ? p.vertical_tokens : p.slash_tokens) - first;
  if (extra < 0) extra = 0;
  if (extra > n - first) extra = n - first;
  return TokenWalk{WalkRule{kCount, 0.0, extra}, first};
}

// The token walk of the configured VS rule (only cumulative and topk walk tokens).
CRISP_HD bool walks_tokens(const PlanParams& p) { return p.vs_rule == VsRule::cumulative || p.vs_rule == VsRule::topk; }
CRISP_HD TokenWalk token_walk(const PlanParams& p, bool vertical, int64_t n) {
  return p.vs_rule == VsRule::cumulative ? cumulative_walk(p) : topk_walk(p, vertical, n);
}

// §4 PE rules over the N(N+1)/2 entries of the block-causal softmax P: global coverage is an
// ordered walk (pe_walk); the floor is a predicate of each entry alone (pe_floor_keeps), a
// parallel mark with no walk.
CRISP_HD bool pe_walks(const PlanParams& p) { return p.pe_rule == PeRule::coverage; }
CRISP_HD WalkRule pe_walk(const PlanParams& p, int32_t N) {
  return WalkRule{kMassBefore, rules::pe_coverage_target(p.pe_gamma, N), 0};
}
CRISP_HD bool pe_floor_keeps(const PlanParams& p, int32_t r, double prob) {
  return rules::pe_floor_keeps(prob, r, p.pe_alpha);
}

// ---------------------------------------------------------------- §3 VS rules, one side
// The held floor's block count of one side (uniform_floor_blocks, or the slash side's own).
CRISP_HD int64_t side_floor_blocks(const PlanParams& p, bool vertical) {
  return rules::side_floor_blocks(vertical, p.uniform_floor_blocks, p.uniform_floor_slash_blocks);
}
// The factor on the last proxy rows' pooled mass of one side before it joins all rows' (see
// rules::last_rows_mass_scale; 1 unless uniform_floor_last_rows holds a floor above N blocks).
CRISP_HD double last_rows_mass_scale(const PlanParams& p, bool vertical, int32_t N) {
  return rules::last_rows_mass_scale(p.uniform_floor_last_rows, N, side_floor_blocks(p, vertical));
}
// noise_floor: blocks >= 1 strictly above the floor of p.vs_floor (alpha times the mean of
// entries 1 .. N-2, uniform_alpha / max(N, the side's held floor blocks), or the larger of the two).
template <typename Side>
CRISP_HD void noise_floor_rule(const PlanParams& p, bool vertical, Side& side) {
  const int32_t N = side.num_blocks();
  const int32_t floor = rules::code_of(p.vs_floor);
  double floor_mean = 0.0;
  if (rules::floor_uses_mean(floor)) {  // one branch for all threads of a device side (a reduction)
    const int32_t first = rules::noise_floor_first(N), last = rules::noise_floor_last(N);
    floor_mean = side.sum_mass(first, last) / static_cast<double>(last - first + 1);
  }
  const int64_t floor_blocks = rules::threshold_floor_blocks(p.uniform_floor_last_rows, side_floor_blocks(p, vertical));
  const double threshold =
      rules::noise_floor_threshold(floor, floor_mean, p.alpha, p.uniform_alpha, floor_blocks, N);
  side.keep_where([&](int32_t b) { return b >= 1 && rules::noise_floor_keeps(side.mass(b), threshold); });
}

// cumulative: count(x, gamma) tokens (the walk's kept count plus one) as a block budget, filled
// in rank order.
template <typename Side>
CRISP_HD void cumulative_rule(const PlanParams& p, int64_t n, bool vertical, int32_t min_blocks, Side& side) {
  const int64_t count = side.walk_tokens(token_walk(p, vertical, n), false) + 1;
  side.add_in_rank_order(rules::cumulative_blocks(count, p.block_size, min_blocks, side.num_blocks()));
}

// topk: the blocks of the forced tokens and of the walked top tokens.
template <typename Side>
CRISP_HD void topk_rule(const PlanParams& p, int64_t n, bool vertical, Side& side) {
  const int64_t forced = topk_forced_tokens(vertical, n);
  const int32_t B = p.block_size;
  side.keep_where([&](int32_t b) { return forced > 0 && b <= (forced - 1) / B; });
  side.walk_tokens(token_walk(p, vertical, n), true);
}

template <typename Side>
CRISP_HD void apply_vs_rule(const PlanParams& p, int64_t n, bool vertical, int32_t min_blocks, Side& side) {
  switch (p.vs_rule) {
    case VsRule::noise_floor: noise_floor_rule(p, vertical, side); break;
    case VsRule::cumulative: cumulative_rule(p, n, vertical, min_blocks, side); break;
    case VsRule::topk: topk_rule(p, n, vertical, side); break;
  }
}

// One side of one head of route `route` (VS or PE; dense heads select nothing): the anchor, the
// VS rule (VS heads), then the budget clamps. min_budget applies to every VS rule and to PE heads
// (§4: "union with the min_budget verticals/slashes"); max_budget clamps the VS rules' selection
// only (§3), a PE head keeping exactly {0} plus its min_budget blocks.
template <typename Side>
CRISP_HD void select_side(const PlanParams& p, int32_t route, int64_t n, bool vertical, Side& side) {
  const int32_t N = side.num_blocks();
  side.keep_where([](int32_t b) { return b == 0; });  // the anchor
  const int32_t min_blocks = rules::min_budget_blocks(p.min_budget, p.block_size, N);
  const int32_t max_blocks = rules::max_budget_blocks(p.max_budget, p.block_size, N);
  if (route == rules::kRouteVs) apply_vs_rule(p, n, vertical, min_blocks, side);
  side.add_in_rank_order(min_blocks);
  if (route == rules::kRouteVs) side.trim_in_rank_order(max_blocks);
}

// ---------------------------------------------------------------- §5 layout
// Is key block kb (<= r) in row r of a head of route `route`? Dense heads hold every block. With a
// window (§12) no row holds a block before its first_kb (rules::window_first_block; 0 without one):
// the selection is made as without a window, and what lies wholly outside it is dropped.
template <typename Flags, typename PeRow>
CRISP_HD bool layout_keeps(const PlanParams& p, int32_t route, int32_t r, int32_t kb, int32_t first_kb,
                           const Flags& vertical_flags, const Flags& slash_flags, const PeRow& pe_row) {
  return kb >= first_kb && (route == rules::kRouteDense || rules::layout_has_block(r, kb, vertical_flags, slash_flags,
                                                                                    pe_row, rules::code_of(p.cover)));
}
// The first key block row r of a sequence of n_k keys and n_q queries may list.
CRISP_HD int32_t first_listed_block(const PlanParams& p, int32_t r, int64_t n_k, int64_t n_q) {
  return rules::window_first_block(r, p.block_size, n_k, n_q, p.window);
}

}  // namespace select
}  // namespace crisp
