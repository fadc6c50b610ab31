// src/cpu/cpu_plan.cpp — the CPU planner: §1 proxy map, §2 routing, §3 VS rules, §4 PE global
// coverage, §5 layout and §7 short sequences of ../shared/crisp-spec.md, per (sequence, query head).
//
// Every decision goes through src/plan/rules.h; this file only decides how the data is streamed.
// Precision::f64 runs everything in double (the reference). Precision::f32 computes dot products
// and exponentials in float and accumulates the spec's sums (softmax denominators, the proxy
// masses v/u/pv/ps, C_struct, JSD, block means, the coverage running sum) in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend.h"
#include "cpu/cpu_common.h"
#include "plan/rules.h"

namespace crisp {
namespace detail {

HeadPlan make_dense_head(int32_t num_blocks) {
  HeadPlan head;
  head.route = Route::dense;
  head.c_struct = std::numeric_limits<double>::quiet_NaN();
  head.jsd = std::numeric_limits<double>::quiet_NaN();
  head.row_ptr.resize(static_cast<size_t>(num_blocks) + 1);
  head.col.reserve(static_cast<size_t>(rules::causal_blocks(num_blocks)));
  head.row_ptr[0] = 0;
  for (int32_t r = 0; r < num_blocks; ++r) {
    for (int32_t c = 0; c <= r; ++c) head.col.push_back(c);
    head.row_ptr[r + 1] = static_cast<int32_t>(head.col.size());
  }
  head.density = num_blocks > 0 ? rules::density(static_cast<int64_t>(head.col.size()), num_blocks) : 1.0;
  return head;
}

}  // namespace detail

namespace cpu {
namespace {

// NOTE: proxy rows are scored in chunks of 64, so the score buffer is 64 x n values (8 MiB at 32k
// tokens in float) instead of L x n, while K is streamed only L / 64 = 2 times per head (16-row
// chunks made the planner memory-bound on K at 32k tokens).
constexpr int kProxyRowsPerChunk = 64;

// Everything a head's planning reads, shared by all (sequence, head) tasks.
template <typename T>
struct PlanInputs {
  const TensorView& q;
  const TensorView& k;
  const Config& config;
  const SeqLens& cu;
  const BlockIndex& index;
  const PackedKeys<T>& keys;
  double scale;
  int64_t group;  // Hq / Hkv
};

// Scores of proxy rows against key blocks [0, last_block]: scores[r][c*B + j] = q_r . k_{cB+j}
// (raw dot products). Multi-versioned: this is the planner's hot loop.
template <typename T>
CRISP_CPU_INLINE void proxy_scores_impl(const T* q_rows, int rows_pad, const PackedKeys<T>& keys, int64_t g,
                                        int64_t first_block, int32_t last_block, T* scores, int64_t lds) {
  for (int32_t c = 0; c <= last_block; ++c)
    qk_tile(q_rows, rows_pad, keys.tile(g, first_block + c), keys.dpad, keys.block, scores + c * keys.block, lds);
}
CRISP_CPU_CLONES void proxy_scores(const float* q_rows, int rows_pad, const PackedKeys<float>& keys, int64_t g,
                                   int64_t first_block, int32_t last_block, float* scores, int64_t lds) {
  proxy_scores_impl(q_rows, rows_pad, keys, g, first_block, last_block, scores, lds);
}
CRISP_CPU_CLONES void proxy_scores(const double* q_rows, int rows_pad, const PackedKeys<double>& keys, int64_t g,
                                   int64_t first_block, int32_t last_block, double* scores, int64_t lds) {
  proxy_scores_impl(q_rows, rows_pad, keys, g, first_block, last_block, scores, lds);
}

// §1 output for one head: token-level v and u, block-pooled pv and ps, and C_struct (§2).
struct ProxyMasses {
  std::vector<double> v, u, pv, ps;
  double c_struct = 0.0;
};

template <typename T>
ProxyMasses proxy_map(const PlanInputs<T>& in, int64_t s, int64_t h, std::vector<T>& proxy_queries) {
  const int B = in.config.block_size;
  const int64_t offset = in.cu[s];
  const int64_t n = in.cu[s + 1] - offset;
  const int32_t N = rules::num_blocks(n, B);
  const int64_t L = rules::proxy_rows(n, B);
  const int64_t g = h / in.group;
  const int64_t d = in.q.dim();
  const int64_t dpad = in.keys.dpad;

  // The L proxy queries, zero padded to whole chunks.
  const int64_t rows_alloc = round_up(L, kProxyRowsPerChunk);
  proxy_queries.assign(static_cast<size_t>(rows_alloc * dpad), T(0));
  for (int64_t i = 0; i < L; ++i)
    load_row(in.q, h, offset + rules::proxy_position(n, L, i), d, proxy_queries.data() + i * dpad);

  ProxyMasses m;
  m.v.assign(static_cast<size_t>(n), 0.0);
  m.u.assign(static_cast<size_t>(n), 0.0);
  const int64_t lds = static_cast<int64_t>(N) * B;
  std::vector<T> scores(static_cast<size_t>(kProxyRowsPerChunk * lds));
  std::vector<T> exps(static_cast<size_t>(n));
  const int64_t w_sink = in.config.w_sink, w_local = in.config.w_local;
  double c_struct_sum = 0.0;

  for (int64_t i0 = 0; i0 < L; i0 += kProxyRowsPerChunk) {
    const int rows = static_cast<int>(std::min<int64_t>(kProxyRowsPerChunk, L - i0));
    const int rows_pad = static_cast<int>(round_up(rows, kRowBlock));
    const int64_t last_position = rules::proxy_position(n, L, i0 + rows - 1);
    const int32_t last_block = static_cast<int32_t>(last_position / B);
    proxy_scores(proxy_queries.data() + i0 * dpad, rows_pad, in.keys, g, in.index.first_block[s], last_block,
                 scores.data(), lds);
    for (int r = 0; r < rows; ++r) {
      const int64_t p = rules::proxy_position(n, L, i0 + r);
      const T* row = scores.data() + r * lds;
      const T scale = static_cast<T>(in.scale);
      // A[i, j] = softmax_j(s q_p . k_j) over j <= p.
      T row_max = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j <= p; ++j) row_max = std::max(row_max, scale * row[j]);
      double denominator = 0.0;
      for (int64_t j = 0; j <= p; ++j) {
        exps[j] = std::exp(scale * row[j] - row_max);
        denominator += static_cast<double>(exps[j]);
      }
      const double inv = 1.0 / denominator;
      double structural = 0.0;
      for (int64_t j = 0; j <= p; ++j) {
        const double a = static_cast<double>(exps[j]) * inv;
        m.v[j] += a;
        m.u[p - j] += a;
        if (rules::in_structural_set(j, p, w_sink, w_local)) structural += a;
      }
      c_struct_sum += structural;
    }
  }
  const double inv_L = 1.0 / static_cast<double>(L);
  for (double& x : m.v) x *= inv_L;
  for (double& x : m.u) x *= inv_L;
  m.c_struct = c_struct_sum * inv_L;
  m.pv.assign(N, 0.0);
  m.ps.assign(N, 0.0);
  for (int64_t j = 0; j < n; ++j) m.pv[j / B] += m.v[j];
  for (int64_t t = 0; t < n; ++t) m.ps[t / B] += m.u[t];
  return m;
}

// Block means (true length of a partial block) of rows [offset, offset + n) of head h, summed in
// double: [N][dpad].
template <typename T>
std::vector<T> block_means(const TensorView& view, int64_t h, int64_t offset, int64_t n, int B, int64_t dpad) {
  const int32_t N = rules::num_blocks(n, B);
  const int64_t d = view.dim();
  std::vector<T> means(static_cast<size_t>(N * dpad), T(0));
  std::vector<double> sum(static_cast<size_t>(d));
  std::vector<double> row(static_cast<size_t>(d));
  for (int32_t b = 0; b < N; ++b) {
    std::fill(sum.begin(), sum.end(), 0.0);
    const int64_t begin = rules::block_begin(b, B), end = rules::block_end(b, B, n);
    for (int64_t t = begin; t < end; ++t) {
      load_row(view, h, offset + t, d, row.data());
      for (int64_t x = 0; x < d; ++x) sum[x] += row[x];
    }
    const double inv = 1.0 / static_cast<double>(end - begin);
    for (int64_t x = 0; x < d; ++x) means[b * dpad + x] = static_cast<T>(sum[x] * inv);
  }
  return means;
}

template <typename T>
T dot(const T* a, const T* b, int64_t count) {
  T acc = 0;
  for (int64_t x = 0; x < count; ++x) acc += a[x] * b[x];
  return acc;
}

// Indices [0, size) in the spec's tie order: larger value first, then smaller index.
std::vector<int32_t> tie_order(const std::vector<double>& values) {
  std::vector<int32_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return rules::ranks_before(values[a], a, values[b], b); });
  return order;
}

// §2 jsd: JS distance between the pooled estimate softmax_c(s mean_i(q_{p_i}) . k̄_c) and pv.
template <typename T>
double js_distance(const PlanInputs<T>& in, const std::vector<T>& proxy_queries, int64_t L,
                   const std::vector<T>& key_means, const std::vector<double>& pv) {
  const int64_t dpad = in.keys.dpad;
  const int32_t N = static_cast<int32_t>(pv.size());
  std::vector<T> mean_query(static_cast<size_t>(dpad), T(0));
  for (int64_t x = 0; x < dpad; ++x) {
    double sum = 0.0;
    for (int64_t i = 0; i < L; ++i) sum += static_cast<double>(proxy_queries[i * dpad + x]);
    mean_query[x] = static_cast<T>(sum / static_cast<double>(L));
  }
  std::vector<T> logits(N);
  T max_logit = -std::numeric_limits<T>::infinity();
  for (int32_t c = 0; c < N; ++c) {
    logits[c] = static_cast<T>(in.scale) * dot(mean_query.data(), key_means.data() + c * dpad, dpad);
    max_logit = std::max(max_logit, logits[c]);
  }
  std::vector<double> pooled(N);
  double denominator = 0.0;
  for (int32_t c = 0; c < N; ++c) {
    pooled[c] = static_cast<double>(static_cast<T>(std::exp(logits[c] - max_logit)));
    denominator += pooled[c];
  }
  double kl_pooled = 0.0, kl_proxy = 0.0;
  for (int32_t c = 0; c < N; ++c) {
    pooled[c] /= denominator;
    const double mid = 0.5 * (pooled[c] + pv[c]);
    kl_pooled += rules::kl_term(pooled[c], mid);
    kl_proxy += rules::kl_term(pv[c], mid);
  }
  return rules::js_distance(kl_pooled, kl_proxy);
}

// count(x, gamma) of §3 cumulative: entries of x sorted descending whose running sum is <= gamma,
// plus one.
int64_t cumulative_count(std::vector<double> x, double gamma) {
  std::sort(x.begin(), x.end(), [](double a, double b) { return a > b; });
  double running = 0.0;
  int64_t count = 0;
  for (double value : x) {
    running += value;
    if (!rules::cumulative_within(running, gamma)) break;
    ++count;
  }
  return count + 1;
}

int32_t count_flags(const std::vector<char>& flags) {
  return static_cast<int32_t>(std::count(flags.begin(), flags.end(), char(1)));
}

// Adds blocks in `order` until `target` blocks are flagged.
void add_until(std::vector<char>& flags, const std::vector<int32_t>& order, int32_t target) {
  int32_t kept = count_flags(flags);
  for (int32_t b : order) {
    if (kept >= target) break;
    if (!flags[b]) {
      flags[b] = 1;
      ++kept;
    }
  }
}

// max_budget: keeps the anchor (block 0) and the first flagged blocks of `order` up to `limit`.
void trim_to(std::vector<char>& flags, const std::vector<int32_t>& order, int32_t limit) {
  if (count_flags(flags) <= limit) return;
  std::vector<char> kept(flags.size(), 0);
  kept[0] = 1;
  int32_t count = 1;
  for (int32_t b : order) {
    if (count >= limit) break;
    if (flags[b] && !kept[b]) {
      kept[b] = 1;
      ++count;
    }
  }
  flags.swap(kept);
}

// §3 topk: forced tokens first, then the top tokens of `x` in tie order until `budget` tokens;
// each token mapped to its block.
void topk_blocks(const std::vector<double>& x, int64_t forced, int64_t budget, int B, std::vector<char>& flags) {
  const int64_t n = static_cast<int64_t>(x.size());
  forced = std::min(forced, n);
  for (int64_t t = 0; t < forced; ++t) flags[t / B] = 1;
  const int64_t extra = std::min(std::max<int64_t>(budget - forced, 0), n - forced);
  if (extra <= 0) return;
  std::vector<int64_t> candidates(static_cast<size_t>(n - forced));
  std::iota(candidates.begin(), candidates.end(), forced);
  std::partial_sort(candidates.begin(), candidates.begin() + extra, candidates.end(),
                    [&](int64_t a, int64_t b) { return rules::ranks_before(x[a], a, x[b], b); });
  for (int64_t i = 0; i < extra; ++i) flags[candidates[i] / B] = 1;
}

std::vector<int32_t> flagged(const std::vector<char>& flags) {
  std::vector<int32_t> out;
  for (size_t b = 0; b < flags.size(); ++b)
    if (flags[b]) out.push_back(static_cast<int32_t>(b));
  return out;
}

// §4 global coverage over the block-causal softmax of block means; returns [N][N] row flags.
template <typename T>
std::vector<char> pe_entries(const PlanInputs<T>& in, int64_t s, int64_t h, const std::vector<T>& key_means) {
  const int B = in.config.block_size;
  const int64_t offset = in.cu[s];
  const int64_t n = in.cu[s + 1] - offset;
  const int32_t N = rules::num_blocks(n, B);
  const int64_t dpad = in.keys.dpad;
  const std::vector<T> query_means = block_means<T>(in.q, h, offset, n, B, dpad);

  const int64_t entries = rules::causal_blocks(N);
  std::vector<double> prob(static_cast<size_t>(entries));
  std::vector<int64_t> linear(static_cast<size_t>(entries));
  std::vector<T> logits(N);
  int64_t e = 0;
  for (int32_t r = 0; r < N; ++r) {
    T max_logit = -std::numeric_limits<T>::infinity();
    for (int32_t c = 0; c <= r; ++c) {
      logits[c] = static_cast<T>(in.scale) * dot(query_means.data() + r * dpad, key_means.data() + c * dpad, dpad);
      max_logit = std::max(max_logit, logits[c]);
    }
    double denominator = 0.0;
    for (int32_t c = 0; c <= r; ++c) {
      prob[e + c] = static_cast<double>(static_cast<T>(std::exp(logits[c] - max_logit)));
      denominator += prob[e + c];
    }
    for (int32_t c = 0; c <= r; ++c) {
      prob[e + c] /= denominator;
      linear[e + c] = static_cast<int64_t>(r) * N + c;
    }
    e += r + 1;
  }
  std::vector<int64_t> order(static_cast<size_t>(entries));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return rules::ranks_before(prob[a], linear[a], prob[b], linear[b]);
  });
  std::vector<char> keep(static_cast<size_t>(N) * N, 0);
  const double target = rules::pe_coverage_target(in.config.pe_gamma, N);
  double running = 0.0;
  for (int64_t idx : order) {
    if (!rules::pe_keeps_next(running, target)) break;
    keep[linear[idx]] = 1;
    running += prob[idx];
  }
  return keep;
}

template <typename T>
HeadPlan plan_head(const PlanInputs<T>& in, int64_t s, int64_t h) {
  const Config& cfg = in.config;
  const int B = cfg.block_size;
  const int64_t offset = in.cu[s];
  const int64_t n = in.cu[s + 1] - offset;
  const int32_t N = rules::num_blocks(n, B);
  if (cfg.dense || rules::is_short_sequence(n, B, cfg.min_budget, cfg.dense_below))
    return detail::make_dense_head(N);

  HeadPlan head;
  std::vector<T> proxy_queries;
  ProxyMasses masses = proxy_map(in, s, h, proxy_queries);
  head.c_struct = masses.c_struct;

  std::vector<T> key_means;
  const bool need_jsd = cfg.routing == Routing::jsd;
  if (need_jsd) {
    key_means = block_means<T>(in.k, h / in.group, offset, n, B, in.keys.dpad);
    head.jsd = js_distance(in, proxy_queries, rules::proxy_rows(n, B), key_means, masses.pv);
  }
  const int32_t route = rules::route_head(static_cast<int32_t>(cfg.routing), head.c_struct, head.jsd, n, cfg.w_sink,
                                          cfg.w_local, cfg.tau_proxy, cfg.rho, cfg.tau);
  head.route = route == rules::kRoutePe ? Route::pe : Route::vs;

  // Verticals and slashes; anchors (vertical 0, slash 0) always kept.
  std::vector<char> vertical(N, 0), slash(N, 0);
  vertical[0] = 1;
  slash[0] = 1;
  const std::vector<int32_t> vertical_order = tie_order(masses.pv);
  const std::vector<int32_t> slash_order = tie_order(masses.ps);
  const int32_t min_blocks = rules::min_budget_blocks(cfg.min_budget, B, N);
  const int32_t max_blocks = rules::max_budget_blocks(cfg.max_budget, B, N);

  if (head.route == Route::vs) {
    switch (cfg.vs_budget) {
      case VsRule::noise_floor: {
        const int32_t first = rules::noise_floor_first(N), last = rules::noise_floor_last(N);
        double floor_v = 0.0, floor_s = 0.0;
        for (int32_t b = first; b <= last; ++b) {
          floor_v += masses.pv[b];
          floor_s += masses.ps[b];
        }
        floor_v /= static_cast<double>(last - first + 1);
        floor_s /= static_cast<double>(last - first + 1);
        for (int32_t b = 1; b < N; ++b) {
          if (rules::noise_floor_keeps(masses.pv[b], floor_v, cfg.alpha)) vertical[b] = 1;
          if (rules::noise_floor_keeps(masses.ps[b], floor_s, cfg.alpha)) slash[b] = 1;
        }
        break;
      }
      case VsRule::cumulative: {
        const int32_t n_v = rules::cumulative_blocks(cumulative_count(masses.v, cfg.gamma), B, min_blocks, N);
        const int32_t n_s = rules::cumulative_blocks(cumulative_count(masses.u, cfg.gamma), B, min_blocks, N);
        add_until(vertical, vertical_order, n_v);
        add_until(slash, slash_order, n_s);
        break;
      }
      case VsRule::topk:
        topk_blocks(masses.v, rules::kTopkForcedVerticalTokens, cfg.vertical_tokens, B, vertical);
        topk_blocks(masses.u, rules::kTopkForcedSlashTokens, cfg.slash_tokens, B, slash);
        break;
    }
  }
  // Budget clamps. min_budget applies to every VS rule and to PE heads (§4: "union with the
  // min_budget verticals/slashes"); max_budget clamps the VS rules' selection only (§3), a PE head
  // keeping exactly {0} plus its min_budget blocks.
  add_until(vertical, vertical_order, min_blocks);
  add_until(slash, slash_order, min_blocks);
  if (head.route == Route::vs) {
    trim_to(vertical, vertical_order, max_blocks);
    trim_to(slash, slash_order, max_blocks);
  }
  head.vertical = flagged(vertical);
  head.slash = flagged(slash);

  std::vector<char> pe;
  if (head.route == Route::pe) {
    if (key_means.empty()) key_means = block_means<T>(in.k, h / in.group, offset, n, B, in.keys.dpad);
    pe = pe_entries(in, s, h, key_means);
  }
  const std::vector<char> no_pe(N, 0);

  // §5 layout as CSR.
  const int32_t cover = static_cast<int32_t>(cfg.slash_cover);
  head.row_ptr.resize(static_cast<size_t>(N) + 1);
  head.row_ptr[0] = 0;
  for (int32_t r = 0; r < N; ++r) {
    const char* pe_row = pe.empty() ? no_pe.data() : pe.data() + static_cast<size_t>(r) * N;
    for (int32_t kb = 0; kb <= r; ++kb)
      if (rules::layout_has_block(r, kb, vertical, slash, pe_row, cover)) head.col.push_back(kb);
    head.row_ptr[r + 1] = static_cast<int32_t>(head.col.size());
  }
  head.density = rules::density(static_cast<int64_t>(head.col.size()), N);
  return head;
}

template <typename T>
Plan plan_all(const TensorView& q, const TensorView& k, const Config& config, const SeqLens& cu,
              const Options& options) {
  const int threads = thread_count(options);
  Plan plan;
  plan.config = config;
  plan.block_size = config.block_size;
  plan.num_q_heads = q.heads();
  plan.num_kv_heads = k.heads();
  plan.head_dim = q.dim();
  plan.softmax_scale = config.softmax_scale > 0.0 ? config.softmax_scale : 1.0 / std::sqrt(static_cast<double>(q.dim()));
  const int64_t sequences = static_cast<int64_t>(cu.size()) - 1;
  const int64_t Hq = q.heads();
  plan.sequences.resize(static_cast<size_t>(sequences));
  for (int64_t s = 0; s < sequences; ++s) {
    SequencePlan& sp = plan.sequences[s];
    sp.token_offset = cu[s];
    sp.n = cu[s + 1] - cu[s];
    sp.num_blocks = rules::num_blocks(sp.n, config.block_size);
    sp.heads.resize(static_cast<size_t>(Hq));
  }
  // Keys are packed only when some head estimates (the dense preset and short sequences do not).
  bool any_estimation = false;
  for (const SequencePlan& sp : plan.sequences)
    any_estimation |= !config.dense && !rules::is_short_sequence(sp.n, config.block_size, config.min_budget,
                                                                 config.dense_below);
  const BlockIndex index(cu, config.block_size);
  PackedKeys<T> keys;
  if (any_estimation) {
    keys = pack_keys<T>(k, cu, index, threads);
  } else {
    keys.dpad = round_up(k.dim(), kDimAlign);
    keys.block = config.block_size;
  }
  const PlanInputs<T> inputs{q, k, config, cu, index, keys, plan.softmax_scale, Hq / k.heads()};
  parallel_for(sequences * Hq, threads, [&](int64_t task) {
    const int64_t s = task / Hq, h = task % Hq;
    plan.sequences[s].heads[h] = plan_head(inputs, s, h);
  });
  return plan;
}

}  // namespace
}  // namespace cpu

namespace detail {

Plan cpu_plan(const TensorView& q, const TensorView& k, const Config& config, const SeqLens& normalized_cu_seqlens,
              const Options& options) {
  if (options.precision == Precision::f64) return cpu::plan_all<double>(q, k, config, normalized_cu_seqlens, options);
  return cpu::plan_all<float>(q, k, config, normalized_cu_seqlens, options);
}

}  // namespace detail
}  // namespace crisp
