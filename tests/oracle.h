// tests/oracle.h — a second, deliberately naive float64 implementation of the CRISP spec
// (docs/spec.md §1–§7 and §11, with the project's decisions recorded in docs/algorithm.md), written
// straight from the spec text. It shares NOTHING with the library's planner: it does not include
// src/plan/rules.h or any backend, it materialises the proxy map A, sorts with std::sort and builds
// the layout by testing every (r, c) pair. Its only job is to be an independent second opinion that
// the tests compare crisp::plan / crisp::attend with.
//
// §11 (queries over a KV prefix): a sequence holds n_q <= n_k queries, query i at position
// n_k - n_q + i (bottom-right causal). Blocks are numbered by position over the n_k keys; rows
// before first_row = (n_k - n_q) / B hold no query and are empty. A whole prompt is n_q = n_k.
//
// Besides the answer it reports *fragile* decisions: threshold comparisons or sort boundaries whose
// outcome would flip under a relative perturbation `tol` of the compared values. A float32 backend
// may legitimately decide those differently; the tests count and report them instead of silently
// loosening the comparison.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "crisp/config.h"
#include "crisp/tensor.h"

namespace oracle {

using crisp::Config;
using crisp::Route;

// ---------------------------------------------------------------- inputs as float64
// [heads, tokens, dim] row-major, float64.
struct Tensor {
  int64_t heads = 0, tokens = 0, dim = 0;
  std::vector<double> data;
  Tensor() = default;
  Tensor(int64_t h, int64_t t, int64_t d) : heads(h), tokens(t), dim(d), data(static_cast<size_t>(h * t * d), 0.0) {}
  static Tensor from_floats(const std::vector<float>& x, int64_t h, int64_t t, int64_t d) {
    Tensor out(h, t, d);
    for (size_t i = 0; i < x.size(); ++i) out.data[i] = static_cast<double>(x[i]);
    return out;
  }
  const double* row(int64_t h, int64_t t) const { return &data[static_cast<size_t>((h * tokens + t) * dim)]; }
  double* row(int64_t h, int64_t t) { return &data[static_cast<size_t>((h * tokens + t) * dim)]; }
};

inline double dot(const double* a, const double* b, int64_t d) {
  double s = 0.0;
  for (int64_t x = 0; x < d; ++x) s += a[x] * b[x];
  return s;
}

// "larger value first, then smaller index" as a std::sort comparator over indices.
struct TieOrder {
  const std::vector<double>* values;
  bool operator()(int64_t a, int64_t b) const {
    const double va = (*values)[static_cast<size_t>(a)], vb = (*values)[static_cast<size_t>(b)];
    if (va != vb) return va > vb;
    return a < b;
  }
};

inline std::vector<int64_t> tie_sorted(const std::vector<double>& values) {
  std::vector<int64_t> idx(values.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), TieOrder{&values});
  return idx;
}

// Are a and b within a relative tolerance of each other?
inline bool near(double a, double b, double tol) {
  return std::fabs(a - b) <= tol * std::max(std::fabs(a), std::fabs(b));
}

// ---------------------------------------------------------------- §1 proxy map, §2 JSD, §4 P
struct Proxy {
  int64_t n = 0, L = 0, d = 0;  // n: the keys (n_k)
  int64_t n_q = 0;              // §11: the queries, the last n_q of the n positions
  int B = 0, N = 0;
  int first_row = 0;            // §11: (n - n_q) / B, the block of the first query
  double scale = 0.0;
  std::vector<double> A;  // [L, n]; A[i, j] = 0 for j > p_i
  std::vector<double> v, u, pv, ps;
  std::vector<double> abar;  // §2 jsd: block softmax of the mean proxy query
  double jsd = 0.0;
  std::vector<double> P;  // [N, N] block-causal softmax of block means (0 above the diagonal and in rows < first_row)

  int64_t p(int64_t i) const { return n - L + i; }
  double a(int64_t i, int64_t j) const { return A[static_cast<size_t>(i * n + j)]; }
};

inline int num_blocks(int64_t n, int B) { return static_cast<int>((n + B - 1) / B); }

// §2 jsd: the Jensen-Shannon distance between abar and pv (natural log).
inline double js_distance(const std::vector<double>& abar, const std::vector<double>& pv) {
  double kl_a = 0.0, kl_p = 0.0;
  for (size_t c = 0; c < abar.size(); ++c) {
    const double a = abar[c], pvc = pv[c];
    const double m = 0.5 * (a + pvc);
    if (a > 0.0) kl_a += a * std::log(a / m);
    if (pvc > 0.0) kl_p += pvc * std::log(pvc / m);
  }
  return std::sqrt(std::max(0.0, 0.5 * kl_a + 0.5 * kl_p));
}

// k: the n key rows of one kv head for one sequence (key j at k + j*d). q_rows: the query rows of
// one query head, the last n_q of the n positions (position t at q_rows + (t - (n - n_q))*d);
// n_q < 0 means a whole prompt (n_q = n).
inline Proxy make_proxy(const double* q_rows, const double* k, int64_t n, int64_t d, int B, double scale,
                        int64_t n_q = -1) {
  Proxy P;
  P.n = n;
  P.n_q = n_q < 0 ? n : n_q;
  P.d = d;
  P.B = B;
  P.N = num_blocks(n, B);
  P.L = std::min<int64_t>(B, P.n_q);  // §11: only the call's own queries
  P.first_row = static_cast<int>((n - P.n_q) / B);
  P.scale = scale;
  const int64_t L = P.L;
  const int N = P.N;
  const int64_t first_position = n - P.n_q;
  // The query at position t (t >= first_position only).
  const auto q = [&](int64_t t) { return q_rows + (t - first_position) * d; };
  P.A.assign(static_cast<size_t>(L * n), 0.0);
  for (int64_t i = 0; i < L; ++i) {
    const int64_t pi = P.p(i);
    std::vector<double> logit(static_cast<size_t>(pi + 1));
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j <= pi; ++j) {
      logit[static_cast<size_t>(j)] = scale * dot(q(pi), k + j * d, d);
      mx = std::max(mx, logit[static_cast<size_t>(j)]);
    }
    double z = 0.0;
    for (int64_t j = 0; j <= pi; ++j) z += std::exp(logit[static_cast<size_t>(j)] - mx);
    for (int64_t j = 0; j <= pi; ++j) P.A[static_cast<size_t>(i * n + j)] = std::exp(logit[static_cast<size_t>(j)] - mx) / z;
  }
  P.v.assign(static_cast<size_t>(n), 0.0);
  P.u.assign(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < L; ++i) {
    for (int64_t j = 0; j <= P.p(i); ++j) {
      P.v[static_cast<size_t>(j)] += P.a(i, j) / static_cast<double>(L);
      P.u[static_cast<size_t>(P.p(i) - j)] += P.a(i, j) / static_cast<double>(L);
    }
  }
  P.pv.assign(static_cast<size_t>(N), 0.0);
  P.ps.assign(static_cast<size_t>(N), 0.0);
  for (int64_t j = 0; j < n; ++j) {
    P.pv[static_cast<size_t>(j / B)] += P.v[static_cast<size_t>(j)];
    P.ps[static_cast<size_t>(j / B)] += P.u[static_cast<size_t>(j)];  // u[t], t in [cB, cB+B)
  }

  // Block means (true length for the partial last block). §11: query means only for the rows
  // holding queries, the first one over the queries it holds.
  std::vector<double> qbar(static_cast<size_t>(N * d), 0.0), kbar(static_cast<size_t>(N * d), 0.0);
  for (int b = 0; b < N; ++b) {
    const int64_t lo = static_cast<int64_t>(b) * B, hi = std::min<int64_t>(lo + B, n);
    for (int64_t t = lo; t < hi; ++t)
      for (int64_t x = 0; x < d; ++x) kbar[static_cast<size_t>(b * d + x)] += k[t * d + x] / static_cast<double>(hi - lo);
    if (b < P.first_row) continue;
    const int64_t qlo = std::max(lo, first_position);
    for (int64_t t = qlo; t < hi; ++t)
      for (int64_t x = 0; x < d; ++x) qbar[static_cast<size_t>(b * d + x)] += q(t)[x] / static_cast<double>(hi - qlo);
  }

  // §2 jsd: abar = softmax_c(s * mean_i(q_{p_i}) . kbar_c) over all c (no mask).
  std::vector<double> qmean(static_cast<size_t>(d), 0.0);
  for (int64_t i = 0; i < L; ++i)
    for (int64_t x = 0; x < d; ++x) qmean[static_cast<size_t>(x)] += q(P.p(i))[x] / static_cast<double>(L);
  {
    std::vector<double> logit(static_cast<size_t>(N));
    double mx = -std::numeric_limits<double>::infinity();
    for (int c = 0; c < N; ++c) {
      logit[static_cast<size_t>(c)] = scale * dot(qmean.data(), &kbar[static_cast<size_t>(c * d)], d);
      mx = std::max(mx, logit[static_cast<size_t>(c)]);
    }
    double z = 0.0;
    for (int c = 0; c < N; ++c) z += std::exp(logit[static_cast<size_t>(c)] - mx);
    P.abar.resize(static_cast<size_t>(N));
    for (int c = 0; c < N; ++c) P.abar[static_cast<size_t>(c)] = std::exp(logit[static_cast<size_t>(c)] - mx) / z;
    P.jsd = js_distance(P.abar, P.pv);
  }

  // §4: P[r, c] = softmax over c <= r of s * qbar_r . kbar_c, for the rows holding queries.
  P.P.assign(static_cast<size_t>(N * N), 0.0);
  for (int r = P.first_row; r < N; ++r) {
    std::vector<double> logit(static_cast<size_t>(r + 1));
    double mx = -std::numeric_limits<double>::infinity();
    for (int c = 0; c <= r; ++c) {
      logit[static_cast<size_t>(c)] = scale * dot(&qbar[static_cast<size_t>(r * d)], &kbar[static_cast<size_t>(c * d)], d);
      mx = std::max(mx, logit[static_cast<size_t>(c)]);
    }
    double z = 0.0;
    for (int c = 0; c <= r; ++c) z += std::exp(logit[static_cast<size_t>(c)] - mx);
    for (int c = 0; c <= r; ++c) P.P[static_cast<size_t>(r * N + c)] = std::exp(logit[static_cast<size_t>(c)] - mx) / z;
  }
  return P;
}

// §2 C_struct = (1/L) sum_i sum_{j in S_i} A[i, j], S_i = {j < w_sink} ∪ {0 <= p_i - j < w_local}.
inline double c_struct(const Proxy& P, int64_t w_sink, int64_t w_local) {
  double total = 0.0;
  for (int64_t i = 0; i < P.L; ++i) {
    double row = 0.0;
    for (int64_t j = 0; j <= P.p(i); ++j) {
      const bool sink = j < w_sink;
      const bool local = P.p(i) - j < w_local;
      if (sink || local) row += P.a(i, j);
    }
    total += row;
  }
  return total / static_cast<double>(P.L);
}

// §3 cumulative: count(x, gamma) = #(entries of x sorted descending whose running sum <= gamma) + 1.
inline int64_t cumulative_count(const std::vector<double>& x, double gamma) {
  std::vector<double> sorted = x;
  std::sort(sorted.begin(), sorted.end(), [](double a, double b) { return a > b; });
  double run = 0.0;
  int64_t count = 0;
  for (double value : sorted) {
    run += value;
    if (run <= gamma) ++count;
    else break;
  }
  return count + 1;
}

// ---------------------------------------------------------------- result of one head
struct HeadResult {
  Route route = Route::dense;
  double c_struct = std::numeric_limits<double>::quiet_NaN();
  double jsd = std::numeric_limits<double>::quiet_NaN();
  std::vector<int32_t> vertical, slash;
  std::vector<int32_t> row_ptr, col;
  double density = 1.0;
  std::vector<std::string> fragile;  // decisions within `tol` of flipping
};

inline std::vector<int32_t> sorted_set(const std::vector<bool>& flags) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < flags.size(); ++i)
    if (flags[i]) out.push_back(static_cast<int32_t>(i));
  return out;
}

// §11: the causal blocks of rows first_row .. N-1 (the density's denominator).
inline double causal_blocks_from(int N, int first_row) {
  double count = 0.0;
  for (int r = first_row; r < N; ++r) count += r + 1;
  return count;
}

inline void dense_layout(HeadResult& h, int N, int first_row = 0) {
  h.row_ptr.assign(1, 0);
  h.col.clear();
  for (int r = 0; r < N; ++r) {
    if (r >= first_row)
      for (int c = 0; c <= r; ++c) h.col.push_back(c);
    h.row_ptr.push_back(static_cast<int32_t>(h.col.size()));
  }
  h.density = 1.0;
}

// Records a fragile boundary of "keep the first k of this tie-ordered list": the last kept and the
// first dropped entries are nearly equal. Only ranks from `from` on are candidates (earlier ones
// are forced).
inline void note_boundary(std::vector<std::string>& fragile, const std::vector<double>& values,
                          const std::vector<int64_t>& order, size_t kept, double tol, const char* what) {
  if (kept == 0 || kept >= order.size()) return;
  const double last = values[static_cast<size_t>(order[kept - 1])];
  const double next = values[static_cast<size_t>(order[kept])];
  if (near(last, next, tol)) {
    std::ostringstream os;
    os << what << ": kept/dropped boundary " << last << " vs " << next;
    fragile.push_back(os.str());
  }
}

// Post-processing of one kind (vertical or slash) of kept blocks, shared by every VS rule and PE
// (brief): min_budget adds top blocks by mass in tie order until min_blocks are kept (anchors
// counting); max_budget keeps the anchor plus the top max_blocks-1 others by mass in tie order.
inline void apply_min_budget(std::vector<bool>& keep, const std::vector<double>& mass, int min_blocks,
                             double tol, std::vector<std::string>& fragile, const char* what) {
  int kept = static_cast<int>(std::count(keep.begin(), keep.end(), true));
  if (kept >= min_blocks) return;
  const std::vector<int64_t> order = tie_sorted(mass);
  std::vector<int64_t> candidates;  // not yet kept, in tie order
  for (int64_t b : order)
    if (!keep[static_cast<size_t>(b)]) candidates.push_back(b);
  const size_t add = static_cast<size_t>(min_blocks - kept);
  for (size_t i = 0; i < add && i < candidates.size(); ++i) keep[static_cast<size_t>(candidates[i])] = true;
  note_boundary(fragile, mass, candidates, add, tol, what);
}

inline void apply_max_budget(std::vector<bool>& keep, const std::vector<double>& mass, int max_blocks,
                             double tol, std::vector<std::string>& fragile, const char* what) {
  int kept = static_cast<int>(std::count(keep.begin(), keep.end(), true));
  if (kept <= max_blocks) return;
  std::vector<int64_t> others;  // kept non-anchor blocks in tie order
  for (int64_t b : tie_sorted(mass))
    if (b != 0 && keep[static_cast<size_t>(b)]) others.push_back(b);
  std::fill(keep.begin(), keep.end(), false);
  keep[0] = true;
  const size_t room = static_cast<size_t>(max_blocks - 1);
  for (size_t i = 0; i < room && i < others.size(); ++i) keep[static_cast<size_t>(others[i])] = true;
  note_boundary(fragile, mass, others, room, tol, what);
}

// §3 one kind of VS selection (vertical: x = v, pooled = pv, forced first tokens; slash: x = u,
// pooled = ps, forced nearest distances).
// The short-prompt held floor's block count of one side: uniform_floor_blocks, or on the slash side
// uniform_floor_slash_blocks unless it is -1.
inline int64_t held_floor_blocks(const Config& cfg, bool vertical) {
  return !vertical && cfg.uniform_floor_slash_blocks >= 0 ? cfg.uniform_floor_slash_blocks : cfg.uniform_floor_blocks;
}

inline std::vector<bool> vs_select(const Proxy& P, const Config& cfg, bool vertical, int min_blocks, double tol,
                                   std::vector<std::string>& fragile) {
  const int N = P.N;
  const std::vector<double>& x = vertical ? P.v : P.u;
  const std::vector<double>& pooled = vertical ? P.pv : P.ps;
  const char* kind = vertical ? "vertical" : "slash";
  std::vector<bool> keep(static_cast<size_t>(N), false);
  keep[0] = true;  // anchor
  switch (cfg.vs_budget) {
    case crisp::VsRule::noise_floor: {
      // vs_floor: mean = alpha * mean(pooled[1 .. N-2]); uniform = uniform_alpha / N (the mass of
      // a block under uniform attention), or uniform_alpha / uniform_floor_blocks when N is smaller
      // (the slash side: uniform_floor_slash_blocks unless it is -1); max = the larger of the two.
      double mu = 0.0;
      for (int b = 1; b <= N - 2; ++b) mu += pooled[static_cast<size_t>(b)];
      mu /= static_cast<double>(N - 2);
      const double mean_floor = cfg.alpha * mu;
      const int64_t held_blocks = cfg.uniform_floor_last_rows ? 0 : held_floor_blocks(cfg, vertical);
      const double uniform_level = static_cast<double>(std::max<int64_t>(static_cast<int64_t>(N), held_blocks));
      const double uniform_floor = cfg.uniform_alpha / uniform_level;
      double threshold = mean_floor;
      if (cfg.vs_floor == crisp::VsFloor::uniform) threshold = uniform_floor;
      if (cfg.vs_floor == crisp::VsFloor::max) threshold = std::max(mean_floor, uniform_floor);
      for (int b = 1; b < N; ++b) {
        const double m = pooled[static_cast<size_t>(b)];
        if (m > threshold) keep[static_cast<size_t>(b)] = true;
        if (near(m, threshold, tol)) {
          std::ostringstream os;
          os << kind << " noise floor: block " << b << " mass " << m << " vs threshold " << threshold;
          fragile.push_back(os.str());
        }
      }
      break;
    }
    case crisp::VsRule::cumulative: {
      auto blocks_for = [&](int64_t count) {
        int64_t nb = count / P.B + 1;
        nb = std::max<int64_t>(nb, min_blocks);
        nb = std::min<int64_t>(nb, N);
        return static_cast<int>(nb);
      };
      const int budget = blocks_for(cumulative_count(x, cfg.gamma));
      if (blocks_for(cumulative_count(x, cfg.gamma * (1 - tol))) != blocks_for(cumulative_count(x, cfg.gamma * (1 + tol)))) {
        fragile.push_back(std::string(kind) + " cumulative: running sum within tol of gamma changes the budget");
      }
      std::vector<int64_t> others;
      for (int64_t b : tie_sorted(pooled))
        if (b != 0) others.push_back(b);
      const size_t take = static_cast<size_t>(budget - 1);
      for (size_t i = 0; i < take && i < others.size(); ++i) keep[static_cast<size_t>(others[i])] = true;
      note_boundary(fragile, pooled, others, take, tol, kind);
      break;
    }
    case crisp::VsRule::topk: {
      const int64_t forced = std::min<int64_t>(vertical ? 30 : 100, P.n);
      const int64_t budget = std::min<int64_t>(vertical ? cfg.vertical_tokens : cfg.slash_tokens, P.n);
      std::vector<bool> token(static_cast<size_t>(P.n), false);
      for (int64_t t = 0; t < forced; ++t) token[static_cast<size_t>(t)] = true;
      std::vector<int64_t> rest;  // non-forced tokens in tie order
      for (int64_t t : tie_sorted(x))
        if (t >= forced) rest.push_back(t);
      const size_t take = budget > forced ? static_cast<size_t>(budget - forced) : 0;
      for (size_t i = 0; i < take && i < rest.size(); ++i) token[static_cast<size_t>(rest[i])] = true;
      if (take > 0 && take < rest.size()) {
        // Fragile only if nearly tied tokens straddling the boundary sit in blocks whose
        // membership they decide.
        const double edge = x[static_cast<size_t>(rest[take - 1])];
        std::vector<bool> block_has_sure(static_cast<size_t>(N), false);
        std::vector<int> near_blocks;
        for (int64_t t = 0; t < P.n; ++t) {
          const double xt = x[static_cast<size_t>(t)];
          if (t < forced || (token[static_cast<size_t>(t)] && !near(xt, edge, tol))) block_has_sure[static_cast<size_t>(t / P.B)] = true;
        }
        for (size_t i = 0; i < rest.size(); ++i) {
          const double xt = x[static_cast<size_t>(rest[i])];
          if (near(xt, edge, tol) && !block_has_sure[static_cast<size_t>(rest[i] / P.B)]) near_blocks.push_back(static_cast<int>(rest[i] / P.B));
          if (i > take && xt < edge * (1 - 2 * tol)) break;
        }
        std::sort(near_blocks.begin(), near_blocks.end());
        near_blocks.erase(std::unique(near_blocks.begin(), near_blocks.end()), near_blocks.end());
        if (near_blocks.size() > 1) fragile.push_back(std::string(kind) + " topk: near-tied tokens at the boundary in different blocks");
      }
      for (int64_t t = 0; t < P.n; ++t)
        if (token[static_cast<size_t>(t)]) keep[static_cast<size_t>(t / P.B)] = true;
      break;
    }
  }
  return keep;
}

// Layout of one head (§5): {0, r} ∪ {b in V, b <= r} ∪ slash cover ∪ PE entries of row r, for the
// rows r >= first_row (§11: earlier rows hold no query and stay empty).
inline void build_layout(HeadResult& h, int N, const std::vector<bool>& vflag, const std::vector<bool>& sflag,
                         const std::vector<bool>& pe, crisp::SlashCover cover, int first_row = 0) {
  h.row_ptr.assign(1, 0);
  h.col.clear();
  for (int r = 0; r < N; ++r) {
    for (int c = 0; c <= r && r >= first_row; ++c) {
      bool in = (c == 0 || c == r);
      if (vflag[static_cast<size_t>(c)]) in = true;
      for (int s = 0; s < N && !in; ++s) {
        if (!sflag[static_cast<size_t>(s)]) continue;
        if (c == r - s) in = true;                                              // the diagonal's own block
        if (cover == crisp::SlashCover::exact && c == r - s - 1) in = true;     // and the one it crosses into
      }
      if (!pe.empty() && pe[static_cast<size_t>(r * N + c)]) in = true;
      if (in) h.col.push_back(c);
    }
    h.row_ptr.push_back(static_cast<int32_t>(h.col.size()));
  }
  h.density = static_cast<double>(h.col.size()) / causal_blocks_from(N, first_row);
}

// §4 row floor: keep (r, c <= r) iff P[r, c] > pe_alpha / (r + 1), the row's uniform level.
// Result indexed r * N + c; rows r >= first_row only (§11).
inline std::vector<bool> pe_row_floor(const Proxy& P, const Config& cfg, double tol, std::vector<std::string>& fragile) {
  const int N = P.N;
  std::vector<bool> pe(static_cast<size_t>(N * N), false);
  for (int r = P.first_row; r < N; ++r) {
    const double level = cfg.pe_alpha / static_cast<double>(r + 1);
    for (int c = 0; c <= r; ++c) {
      const double prob = P.P[static_cast<size_t>(r * N + c)];
      pe[static_cast<size_t>(r * N + c)] = prob > level;
      // Row 0's entry and every entry of a row of equal logits sit exactly at the level in any
      // precision (exp(0) / (r + 1)); elsewhere a near tie may flip under rounding.
      if (near(prob, level, tol) && prob != level) {
        std::ostringstream os;
        os << "PE floor: entry (" << r << ", " << c << ") P " << prob << " vs level " << level;
        fragile.push_back(os.str());
      }
    }
  }
  return pe;
}

// §4 global coverage: entries (r, c <= r) by P descending, ties by smaller r*N + c; keep while
// the running sum before the entry is < pe_gamma * N (the crossing entry included). §11: only the
// rows r >= first_row have entries, and the target is pe_gamma * (N - first_row).
inline std::vector<bool> pe_global_coverage(const Proxy& P, const Config& cfg, double tol,
                                            std::vector<std::string>& fragile) {
  const int N = P.N;
  std::vector<bool> pe(static_cast<size_t>(N * N), false);
  std::vector<double> flat(static_cast<size_t>(N * N), -1.0);  // -1 marks c > r and empty rows (never chosen)
  for (int r = P.first_row; r < N; ++r)
    for (int c = 0; c <= r; ++c) flat[static_cast<size_t>(r * N + c)] = P.P[static_cast<size_t>(r * N + c)];
  std::vector<int64_t> order = tie_sorted(flat);
  const double target = cfg.pe_gamma * (N - P.first_row);
  double run = 0.0;
  size_t kept = 0;
  for (int64_t e : order) {
    if (flat[static_cast<size_t>(e)] < 0.0) break;
    if (!(run < target)) break;
    pe[static_cast<size_t>(e)] = true;
    run += flat[static_cast<size_t>(e)];
    ++kept;
  }
  // Fragile if the stop is within tol of the target, or the boundary entries nearly tie.
  const double before_last = run - (kept ? flat[static_cast<size_t>(order[kept - 1])] : 0.0);
  if (near(run, target, tol) || (kept && near(before_last, target, tol))) fragile.push_back("PE coverage: running sum at target");
  if (kept < order.size() && flat[static_cast<size_t>(order[kept])] >= 0.0) note_boundary(fragile, flat, order, kept, tol, "PE coverage");
  return pe;
}

// Is a sequence of n tokens planned dense (§7 + brief)?
inline bool is_short(int64_t n, const Config& cfg) {
  return num_blocks(n, cfg.block_size) <= 2 || n <= cfg.min_budget || n <= cfg.dense_below;
}

// proxy_last_rows: pv / ps become the larger of all rows' pooled mass and the last R rows' own (the
// mean of their A over the block), and JSD is taken against that pv. uniform_floor_last_rows: the
// side's held floor F applies to the last rows' score only, keep iff all > u/N or last > u/max(N, F);
// as one score against u/N that is the last rows' mass times max(N, F)/N (the noise floor then
// reads F = 0).
inline Proxy with_last_rows(const Proxy& all, const Config& cfg) {
  const int64_t R = cfg.proxy_last_rows;
  Proxy P = all;
  const int64_t rows = std::min(R, P.L);
  std::vector<double> pv_last(static_cast<size_t>(P.N), 0.0), ps_last(static_cast<size_t>(P.N), 0.0);
  for (int64_t i = P.L - rows; i < P.L; ++i)
    for (int64_t j = 0; j <= P.p(i); ++j) {
      pv_last[static_cast<size_t>(j / P.B)] += P.a(i, j) / static_cast<double>(rows);
      ps_last[static_cast<size_t>((P.p(i) - j) / P.B)] += P.a(i, j) / static_cast<double>(rows);
    }
  const auto scale = [&](bool vertical) {
    return cfg.uniform_floor_last_rows
               ? static_cast<double>(std::max<int64_t>(P.N, held_floor_blocks(cfg, vertical))) / P.N
               : 1.0;
  };
  const double v_scale = scale(true), s_scale = scale(false);
  for (int b = 0; b < P.N; ++b) {
    P.pv[static_cast<size_t>(b)] = std::max(P.pv[static_cast<size_t>(b)], pv_last[static_cast<size_t>(b)] * v_scale);
    P.ps[static_cast<size_t>(b)] = std::max(P.ps[static_cast<size_t>(b)], ps_last[static_cast<size_t>(b)] * s_scale);
  }
  P.jsd = js_distance(P.abar, P.pv);
  return P;
}

// The full plan of one (sequence, query head) given its proxy.
inline HeadResult plan_head(const Proxy& all_rows, const Config& cfg, double tol) {
  const Proxy P = cfg.proxy_last_rows > 0 ? with_last_rows(all_rows, cfg) : all_rows;
  HeadResult h;
  const int N = P.N;
  if (cfg.dense || is_short(P.n, cfg)) {
    h.route = Route::dense;
    dense_layout(h, N, P.first_row);
    return h;
  }
  h.c_struct = c_struct(P, cfg.w_sink, cfg.w_local);
  h.jsd = P.jsd;
  switch (cfg.routing) {
    case crisp::Routing::cstruct:
      h.route = h.c_struct >= cfg.tau_proxy ? Route::vs : Route::pe;
      if (near(h.c_struct, cfg.tau_proxy, tol)) h.fragile.push_back("routing: c_struct at tau_proxy");
      break;
    case crisp::Routing::cstruct_rel: {
      const double rel = h.c_struct * static_cast<double>(P.n) / static_cast<double>(cfg.w_sink + cfg.w_local);
      h.route = rel >= cfg.rho ? Route::vs : Route::pe;
      if (near(rel, cfg.rho, tol)) h.fragile.push_back("routing: c_rel at rho");
      break;
    }
    case crisp::Routing::jsd:
      h.route = h.jsd < cfg.tau ? Route::pe : Route::vs;
      if (near(h.jsd, cfg.tau, tol)) h.fragile.push_back("routing: jsd at tau");
      break;
    case crisp::Routing::none:
      h.route = Route::vs;
      break;
  }

  const int min_blocks = static_cast<int>(std::min<int64_t>((cfg.min_budget + P.B - 1) / P.B, N));
  const int max_blocks = cfg.max_budget > 0 ? static_cast<int>(std::min<int64_t>(std::max<int64_t>(1, cfg.max_budget / P.B), N)) : N;

  std::vector<bool> vflag, sflag, pe;
  if (h.route == Route::vs) {
    vflag = vs_select(P, cfg, true, min_blocks, tol, h.fragile);
    sflag = vs_select(P, cfg, false, min_blocks, tol, h.fragile);
    apply_min_budget(vflag, P.pv, min_blocks, tol, h.fragile, "vertical min_budget");
    apply_min_budget(sflag, P.ps, min_blocks, tol, h.fragile, "slash min_budget");
    apply_max_budget(vflag, P.pv, max_blocks, tol, h.fragile, "vertical max_budget");
    apply_max_budget(sflag, P.ps, max_blocks, tol, h.fragile, "slash max_budget");
  } else {
    vflag.assign(static_cast<size_t>(N), false);
    sflag.assign(static_cast<size_t>(N), false);
    vflag[0] = sflag[0] = true;
    apply_min_budget(vflag, P.pv, min_blocks, tol, h.fragile, "PE vertical min_budget");
    apply_min_budget(sflag, P.ps, min_blocks, tol, h.fragile, "PE slash min_budget");
    pe = cfg.pe_rule == crisp::PeRule::floor ? pe_row_floor(P, cfg, tol, h.fragile)
                                             : pe_global_coverage(P, cfg, tol, h.fragile);
  }
  h.vertical = sorted_set(vflag);
  h.slash = sorted_set(sflag);
  build_layout(h, N, vflag, sflag, pe, cfg.slash_cover, P.first_row);
  return h;
}

// ---------------------------------------------------------------- a whole batch
// The oracle of crisp::plan for contiguous [H, tokens, d] float inputs. Proxies depend only on
// (block size, scale), so they are cached for the parameter grids.
class Planner {
 public:
  // Whole prompts: sequence s is tokens [cu[s], cu[s+1]) of q and k.
  Planner(const std::vector<float>& q, const std::vector<float>& k, int64_t hq, int64_t hkv, int64_t tokens,
          int64_t d, crisp::SeqLens cu = {})
      : q_(Tensor::from_floats(q, hq, tokens, d)), k_(Tensor::from_floats(k, hkv, tokens, d)), cu_(std::move(cu)) {
    if (cu_.empty()) cu_ = {0, tokens};
    cu_k_ = cu_;
  }
  // §11: sequence s has the queries [cu_q[s], cu_q[s+1]) of q (q_tokens rows) and the keys
  // [cu_k[s], cu_k[s+1]) of k (kv_tokens rows, contiguous), the queries the last of its positions.
  Planner(const std::vector<float>& q, const std::vector<float>& k, int64_t hq, int64_t hkv, int64_t q_tokens,
          int64_t kv_tokens, int64_t d, crisp::SeqLens cu_q, crisp::SeqLens cu_k)
      : q_(Tensor::from_floats(q, hq, q_tokens, d)), k_(Tensor::from_floats(k, hkv, kv_tokens, d)),
        cu_(std::move(cu_q)), cu_k_(std::move(cu_k)) {}

  double resolved_scale(const Config& cfg) const {
    return cfg.softmax_scale > 0.0 ? cfg.softmax_scale : 1.0 / std::sqrt(static_cast<double>(q_.dim));
  }

  const crisp::SeqLens& cu_seqlens() const { return cu_; }
  int64_t num_sequences() const { return static_cast<int64_t>(cu_.size()) - 1; }

  // result[s][h]
  std::vector<std::vector<HeadResult>> plan(const Config& cfg, double tol = 1e-9) {
    const double scale = resolved_scale(cfg);
    std::vector<std::vector<HeadResult>> out;
    for (int64_t s = 0; s + 1 < static_cast<int64_t>(cu_.size()); ++s) {
      const int64_t n = cu_k_[static_cast<size_t>(s + 1)] - cu_k_[static_cast<size_t>(s)];
      const int64_t n_q = cu_[static_cast<size_t>(s + 1)] - cu_[static_cast<size_t>(s)];
      std::vector<HeadResult> heads;
      for (int64_t h = 0; h < q_.heads; ++h) {
        if (cfg.dense || is_short(n, cfg)) {
          HeadResult r;
          dense_layout(r, num_blocks(n, cfg.block_size), static_cast<int>((n - n_q) / cfg.block_size));
          heads.push_back(r);
        } else {
          heads.push_back(plan_head(proxy(s, h, cfg.block_size, scale), cfg, tol));
        }
      }
      out.push_back(std::move(heads));
    }
    return out;
  }

  const Proxy& proxy(int64_t s, int64_t h, int B, double scale) {
    auto key = std::make_tuple(s, h, B, scale);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    const int64_t q0 = cu_[static_cast<size_t>(s)], n_q = cu_[static_cast<size_t>(s + 1)] - q0;
    const int64_t k0 = cu_k_[static_cast<size_t>(s)], n = cu_k_[static_cast<size_t>(s + 1)] - k0;
    const int64_t kvh = h / (q_.heads / k_.heads);
    return cache_.emplace(key, make_proxy(q_.row(h, q0), k_.row(kvh, k0), n, q_.dim, B, scale, n_q)).first->second;
  }

 private:
  Tensor q_, k_;
  crisp::SeqLens cu_;    // queries
  crisp::SeqLens cu_k_;  // keys
  std::map<std::tuple<int64_t, int64_t, int, double>, Proxy> cache_;
};

// ---------------------------------------------------------------- §6 naive attention
struct Attention {
  Tensor out;               // [Hq, tokens, d]
  std::vector<double> lse;  // [Hq, tokens]
};

using Layouts = std::vector<std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>>>;

// §6 and §11: sequence s has the queries [cu_q[s], cu_q[s+1]) of q and the keys [cu_k[s],
// cu_k[s+1]) of k and v. Its query i sits at position p = n_k - n_q + i and attends the keys
// j <= p whose block is listed for p's block in layouts[s][h] (CSR row_ptr, col over the blocks
// of positions); with layouts == nullptr, every key j <= p (dense bottom-right causal attention).
// §12: with window > 0 the query at p attends only keys j with p - j < window (0: no window).
inline Attention attend_chunks(const Tensor& q, const Tensor& k, const Tensor& v, const crisp::SeqLens& cu_q,
                               const crisp::SeqLens& cu_k, int B, double scale, const Layouts* layouts,
                               int64_t window = 0) {
  Attention res{Tensor(q.heads, q.tokens, v.dim), std::vector<double>(static_cast<size_t>(q.heads * q.tokens), 0.0)};
  const int64_t group = q.heads / k.heads;
  for (size_t s = 0; s + 1 < cu_q.size(); ++s) {
    const int64_t q0 = cu_q[s], n_q = cu_q[s + 1] - q0;
    const int64_t k0 = cu_k[s], n_k = cu_k[s + 1] - k0;
    for (int64_t h = 0; h < q.heads; ++h) {
      const int64_t kvh = h / group;
      for (int64_t i = 0; i < n_q; ++i) {
        const int64_t p = n_k - n_q + i;
        const int64_t r = p / B;
        std::vector<bool> allowed(static_cast<size_t>(r + 1), layouts == nullptr);
        if (layouts != nullptr) {
          const auto& rp = (*layouts)[s][static_cast<size_t>(h)].first;
          const auto& col = (*layouts)[s][static_cast<size_t>(h)].second;
          for (int32_t e = rp[static_cast<size_t>(r)]; e < rp[static_cast<size_t>(r + 1)]; ++e)
            allowed[static_cast<size_t>(col[static_cast<size_t>(e)])] = true;
        }
        double mx = -std::numeric_limits<double>::infinity();
        std::vector<double> logit(static_cast<size_t>(p + 1), 0.0);
        auto sees = [&](int64_t j) { return allowed[static_cast<size_t>(j / B)] && (window == 0 || p - j < window); };
        for (int64_t j = 0; j <= p; ++j) {
          if (!sees(j)) continue;
          logit[static_cast<size_t>(j)] = scale * dot(q.row(h, q0 + i), k.row(kvh, k0 + j), q.dim);
          mx = std::max(mx, logit[static_cast<size_t>(j)]);
        }
        double z = 0.0;
        double* o = res.out.row(h, q0 + i);
        for (int64_t j = 0; j <= p; ++j) {
          if (!sees(j)) continue;
          const double w = std::exp(logit[static_cast<size_t>(j)] - mx);
          z += w;
          const double* vr = v.row(kvh, k0 + j);
          for (int64_t x = 0; x < v.dim; ++x) o[x] += w * vr[x];
        }
        for (int64_t x = 0; x < v.dim; ++x) o[x] /= z;
        res.lse[static_cast<size_t>(h * q.tokens + q0 + i)] = mx + std::log(z);
      }
    }
  }
  return res;
}

// Whole prompts (queries and keys the same positions): a query at position i of a sequence
// attends the keys j <= i whose block is listed for i's block.
inline Attention attend(const Tensor& q, const Tensor& k, const Tensor& v, const crisp::SeqLens& cu, int B, double scale,
                        const Layouts& layouts) {
  return attend_chunks(q, k, v, cu, cu, B, scale, &layouts);
}

// §12, by brute force over positions: does row r of a sequence of n_k keys whose queries are its
// last n_q positions hold some query that sees some key of block c through a window of w tokens?
inline bool window_band_has(int64_t n_k, int64_t n_q, int B, int64_t w, int64_t r, int64_t c) {
  for (int64_t p = std::max(r * B, n_k - n_q); p < std::min((r + 1) * B, n_k); ++p)
    for (int64_t j = c * B; j < std::min((c + 1) * B, n_k); ++j)
      if (j <= p && (w == 0 || p - j < w)) return true;
  return false;
}

// All causal blocks of a sequence of n tokens.
inline std::pair<std::vector<int32_t>, std::vector<int32_t>> dense_csr(int64_t n, int B) {
  HeadResult h;
  dense_layout(h, num_blocks(n, B));
  return {h.row_ptr, h.col};
}

}  // namespace oracle
