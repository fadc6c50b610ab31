// src/plan/proxy.h — the rules of the §1 proxy map and of §2's JSD estimate, written once
// (docs/spec.md §1, §2; explained in docs/algorithm.md, "Step 1" and "Step 2").
//
// Small host/device functions over one score of proxy row i (position p) against key j: where
// its mass goes (vertical block, slash distance-block, structural set), how a row's running
// softmax statistics absorb it, how masses kept relative to a running maximum are brought to the
// row's true softmax, and the per-block terms of the JS distance. The CPU planner
// (src/cpu/cpu_plan.cpp) and the two CUDA proxy paths (src/cuda/plan_proxy.cuh, fp32 FFMA;
// src/cuda/plan_proxy_mma.cuh, tensor cores) only decide how they stream K and parallelise.
// The exponential is a parameter (std::exp, expf, exp2f, a fast exp2): each backend keeps its
// own domain (natural or log2) and precision.
#pragma once
#include <cmath>
#include <cstdint>

#include "plan/rules.h"

namespace crisp {
namespace proxy {

// ---------------------------------------------------------------- where a score's mass goes
// Causal: key j counts for the row at position p iff j <= p.
template <typename I>
CRISP_HD bool in_row(I j, I p) { return j <= p; }
// The slash distance t = p - j of key j from the row at position p.
template <typename I>
CRISP_HD I slash_distance(I p, I j) { return p - j; }
// Distance-block c of distance t (ps[c] pools u[t] over [cB, cB + B)).
template <typename I>
CRISP_HD I distance_block(I t, int32_t block) { return t / block; }
// Vertical block b of key j (pv[b] pools v[j] over block b).
template <typename I>
CRISP_HD I vertical_block(I j, int32_t block) { return j / block; }
// The first distance-block any distance >= t_min can fall in (distances are never negative).
template <typename Out = int64_t>
CRISP_HD Out first_distance_block(int64_t t_min, int32_t block) {
  return t_min > 0 ? static_cast<Out>(t_min / block) : Out(0);
}
// The first distance-block key block kb reaches from the L proxy rows of a sequence of n tokens:
// its smallest distance is that of row n - L to key (kb + 1) B - 1.
template <typename Out = int64_t>
CRISP_HD Out first_distance_block_of_key_block(int64_t n, int64_t L, int32_t block, int64_t kb) {
  return first_distance_block<Out>(n - L - (kb + 1) * block + 1, block);
}
// Structural-set membership (C_struct, §2) is rules::in_structural_set.

// The proxy's masses are means over its L rows: a sum over the rows times 1 / L.
CRISP_HD double rows_inverse(int64_t L) { return 1.0 / static_cast<double>(L); }
// proxy_last_rows (Config; 0 = off): proxy row i of L is one of the last R rows, pooled on their own
// as well (the queries nearest the answer: docs/algorithm.md, "Short prompts").
CRISP_HD bool in_last_rows(int64_t i, int64_t L, int64_t R) { return R > 0 && i >= L - R; }
CRISP_HD double last_rows_inverse(int64_t L, int64_t R) { return 1.0 / static_cast<double>(R < L ? R : L); }
// A block's pooled mass with proxy_last_rows: the larger of all rows' and the last rows' pooled mass
// (the VS rules' pv / ps; the slash and vertical sides alike).
CRISP_HD double with_last_rows(double all_rows, double last_rows) { return all_rows > last_rows ? all_rows : last_rows; }

// ---------------------------------------------------------------- row softmax statistics
// A row's online softmax keeps (run_max, run_sum), run_sum relative to run_max. One score x
// (already scaled, in the backend's exp domain) joins them.
template <typename Exp>
CRISP_HD void online_add(float& run_max, float& run_sum, float x, Exp exp) {
  if (x > run_max) {
    run_sum = run_sum * exp(run_max - x) + 1.f;
    run_max = x;
  } else {
    run_sum += exp(x - run_max);
  }
}
// A block of scores raises the running maximum to new_max (>= run_max): returns the factor that
// brings what was kept relative to the old maximum into the new frame.
template <typename Exp>
CRISP_HD float raise_max(float& run_max, float new_max, Exp exp) {
  const float factor = exp(run_max - new_max);
  run_max = new_max;
  return factor;
}
// The factor that brings a partial kept relative to m into the frame of max_all >= m; an empty
// partial (m = -inf, no key seen) contributes nothing.
template <typename Exp>
CRISP_HD float rescale_factor(float m, float max_all, Exp exp) { return m == -INFINITY ? 0.f : exp(m - max_all); }
// A partial sum kept relative to m, brought to the frame of max_all (0 for an empty partial), in
// Out arithmetic.
template <typename Out = float, typename Exp>
CRISP_HD Out rescaled(float sum, float m, float max_all, Exp exp) {
  return m == -INFINITY ? Out(0) : static_cast<Out>(sum) * static_cast<Out>(exp(m - max_all));
}
// Merges the partial statistics (m2, l2) of the same row into (m, l).
template <typename Exp>
CRISP_HD void merge_row_stats(float& m, float& l, float m2, float l2, Exp exp) {
  const float max_all = fmaxf(m, m2);
  l = rescaled(l, m, max_all, exp) + rescaled(l2, m2, max_all, exp);
  m = max_all;
}
// The softmax share of a value e = exp(x - row_max): e / den, as e times the row's 1 / den.
template <typename Out, typename E, typename Inv>
CRISP_HD Out softmax_share(E e, Inv row_inv) { return static_cast<Out>(e) * static_cast<Out>(row_inv); }
// The final rescale: a mass (or a score) kept relative to m, as a share of the row's softmax
// with maximum row_max and 1 / denominator row_inv.
template <typename Out, typename Inv, typename Exp>
CRISP_HD Out row_share(float m, float row_max, Inv row_inv, Exp exp) {
  return softmax_share<Out>(exp(m - row_max), row_inv);
}

// ---------------------------------------------------------------- §2 jsd
// ā = softmax_c(s q̄ . k̄_c), q̄ the mean of the L proxy queries (summed in double).
template <typename T>
CRISP_HD T mean_query_component(double sum, int64_t L) { return static_cast<T>(sum / static_cast<double>(L)); }
// ā_c from e_c = exp(logit_c - max logit) and the double sum of the e_c.
template <typename E>
CRISP_HD double abar_share(E e, double denominator) { return static_cast<double>(e) / denominator; }
// One block's terms of KL(ā || m) and KL(pv || m), m = (ā + pv) / 2; rules::js_distance takes the sums.
CRISP_HD void add_js_terms(double abar, double pv, double& kl_abar, double& kl_pv) {
  const double mid = 0.5 * (abar + pv);
  kl_abar += rules::kl_term(abar, mid);
  kl_pv += rules::kl_term(pv, mid);
}

}  // namespace proxy
}  // namespace crisp
