// src/cpu/cpu_plan.cpp — the CPU planner: §1 proxy map, §2 routing, §3 VS rules, §4 PE rules
// (global coverage, row floor), §5 layout and §7 short sequences (docs/spec.md), per (sequence,
// query head).
//
// The selection pipeline is src/plan/select.h (over the rules of src/plan/rules.h); this file
// computes the proxy map and supplies the pipeline's primitives as serial loops.
// Precision::f64 runs everything in double (the reference). Precision::f32 computes dot products
// and exponentials in float and accumulates the spec's sums (softmax denominators, the proxy
// masses v/u/pv/ps, C_struct, JSD, block means, the coverage running sum) in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "common/shape_rules.h"
#include "backend.h"
#include "cpu/cpu_common.h"
#include "plan/plan_params.h"
#include "plan/proxy.h"
#include "plan/rules.h"
#include "plan/select.h"

namespace crisp {

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
  const PlanParams& params;
  const std::vector<SequencePlan>& shapes;  // offsets and lengths of every sequence (§11)
  const KeyRows& key_rows;
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
  const int B = in.params.block_size;
  const SequencePlan& shape = in.shapes[s];
  const int64_t n = shape.n_k;
  const int32_t N = rules::num_blocks(n, B);
  const int64_t L = rules::proxy_rows(shape.n_q, B);
  const int64_t g = h / in.group;
  const int64_t d = in.q.dim();
  const int64_t dpad = in.keys.dpad;

  // The L proxy queries (the last of the call's queries), zero padded to whole chunks.
  const int64_t rows_alloc = round_up(L, kProxyRowsPerChunk);
  proxy_queries.assign(static_cast<size_t>(rows_alloc * dpad), T(0));
  const int64_t first_position = rules::first_query_position(n, shape.n_q);
  for (int64_t i = 0; i < L; ++i)
    load_row(in.q, h, shape.q_offset + rules::proxy_position(n, L, i) - first_position, d,
             proxy_queries.data() + i * dpad);

  ProxyMasses m;
  m.v.assign(static_cast<size_t>(n), 0.0);
  m.u.assign(static_cast<size_t>(n), 0.0);
  const int64_t lds = static_cast<int64_t>(N) * B;
  std::vector<T> scores(static_cast<size_t>(kProxyRowsPerChunk * lds));
  std::vector<T> exps(static_cast<size_t>(n));
  const int64_t w_sink = in.params.w_sink, w_local = in.params.w_local;
  double c_struct_sum = 0.0;
  // proxy_last_rows: the last R rows' own v and u (pooled into pv / ps below, then combined).
  const int64_t R = in.params.proxy_last_rows;
  std::vector<double> v_last(R > 0 ? static_cast<size_t>(n) : 0, 0.0), u_last(v_last.size(), 0.0);

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
      const bool last_row = proxy::in_last_rows(i0 + r, L, R);  // per row, not per key
      for (int64_t j = 0; j <= p; ++j) {
        const double a = proxy::softmax_share<double>(exps[j], inv);
        const int64_t t = proxy::slash_distance(p, j);
        m.v[j] += a;
        m.u[t] += a;
        if (last_row) {
          v_last[j] += a;
          u_last[t] += a;
        }
        if (rules::in_structural_set(j, p, w_sink, w_local)) structural += a;
      }
      c_struct_sum += structural;
    }
  }
  const double inv_L = proxy::rows_inverse(L);
  for (double& x : m.v) x *= inv_L;
  for (double& x : m.u) x *= inv_L;
  m.c_struct = c_struct_sum * inv_L;
  // Token-level v / u (times `scale`) pooled into key blocks and distance blocks.
  const auto pool = [&](const std::vector<double>& v, const std::vector<double>& u, double scale,
                        std::vector<double>& pv, std::vector<double>& ps) {
    pv.assign(N, 0.0);
    ps.assign(N, 0.0);
    for (int64_t j = 0; j < n; ++j) pv[proxy::vertical_block(j, B)] += v[j] * scale;
    for (int64_t t = 0; t < n; ++t) ps[proxy::distance_block(t, B)] += u[t] * scale;
  };
  pool(m.v, m.u, 1.0, m.pv, m.ps);  // v and u are already means over the L rows
  if (R > 0) {
    std::vector<double> pv_last, ps_last;
    pool(v_last, u_last, proxy::last_rows_inverse(L, R), pv_last, ps_last);
    const double vertical_scale = select::last_rows_mass_scale(in.params, true, N);
    const double slash_scale = select::last_rows_mass_scale(in.params, false, N);
    for (int32_t b = 0; b < N; ++b) {
      m.pv[b] = proxy::with_last_rows(m.pv[b], pv_last[b] * vertical_scale);
      m.ps[b] = proxy::with_last_rows(m.ps[b], ps_last[b] * slash_scale);
    }
  }
  return m;
}

// Block means (true length of a partial block) of positions [first, n) of head h, position t at
// row row_of(t) of the view, summed in double: [N][dpad] (blocks before first's block stay zero).
template <typename T, typename RowOf>
std::vector<T> block_means(const TensorView& view, int64_t h, int64_t first, int64_t n, int B, int64_t dpad,
                           RowOf row_of) {
  const int32_t N = rules::num_blocks(n, B);
  const int64_t d = view.dim();
  std::vector<T> means(static_cast<size_t>(N * dpad), T(0));
  std::vector<double> sum(static_cast<size_t>(d));
  std::vector<double> row(static_cast<size_t>(d));
  for (int32_t b = static_cast<int32_t>(first / B); b < N; ++b) {
    std::fill(sum.begin(), sum.end(), 0.0);
    const int64_t begin = std::max(rules::block_begin(b, B), first), end = rules::block_end(b, B, n);
    for (int64_t t = begin; t < end; ++t) {
      load_row(view, h, row_of(t), d, row.data());
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
    mean_query[x] = proxy::mean_query_component<T>(sum, L);
  }
  std::vector<T> logits(N);
  T max_logit = -std::numeric_limits<T>::infinity();
  for (int32_t c = 0; c < N; ++c) {
    logits[c] = static_cast<T>(in.scale) * dot(mean_query.data(), key_means.data() + c * dpad, dpad);
    max_logit = std::max(max_logit, logits[c]);
  }
  std::vector<T> exps(N);
  double denominator = 0.0;
  for (int32_t c = 0; c < N; ++c) {
    exps[c] = static_cast<T>(std::exp(logits[c] - max_logit));
    denominator += static_cast<double>(exps[c]);
  }
  double kl_abar = 0.0, kl_proxy = 0.0;
  for (int32_t c = 0; c < N; ++c) proxy::add_js_terms(proxy::abar_share(exps[c], denominator), pv[c], kl_abar, kl_proxy);
  return rules::js_distance(kl_abar, kl_proxy);
}

// The ordered walk of src/plan/select.h over values[first, len) in rank order (rules::ranks_before):
// mark(i) for every kept entry; returns how many were kept.
template <typename Mark>
int64_t ranked_walk(const double* values, int64_t first, int64_t len, const select::WalkRule& walk, Mark mark) {
  std::vector<int64_t> order(static_cast<size_t>(std::max<int64_t>(len - first, 0)));
  std::iota(order.begin(), order.end(), first);
  const auto before = [&](int64_t a, int64_t b) { return rules::ranks_before(values[a], a, values[b], b); };
  auto walked = order.end();
  if (walk.mode == select::kCount) {  // only the first k can be kept: a partial sort suffices
    walked = order.begin() + std::min<int64_t>(walk.k, static_cast<int64_t>(order.size()));
    std::partial_sort(order.begin(), walked, order.end(), before);
  } else {
    std::sort(order.begin(), order.end(), before);
  }
  double running = 0.0;
  int64_t kept = 0;
  for (auto it = order.begin(); it != walked; ++it) {
    const double x = values[*it];
    if (!select::walk_keeps(walk, running, kept, x)) break;
    mark(*it);
    running += x;
    ++kept;
  }
  return kept;
}

int32_t count_flags(const std::vector<char>& flags) {
  return static_cast<int32_t>(std::count(flags.begin(), flags.end(), char(1)));
}

// One side (verticals with pv and v, or slashes with ps and u) of one head: the primitives of
// src/plan/select.h as serial loops.
class CpuSide {
 public:
  CpuSide(const std::vector<double>& pooled, const std::vector<double>& tokens, int block)
      : pooled_(pooled), tokens_(tokens), order_(tie_order(pooled)), block_(block), flags_(pooled.size(), 0) {}

  int32_t num_blocks() const { return static_cast<int32_t>(pooled_.size()); }
  double mass(int32_t b) const { return pooled_[b]; }
  double sum_mass(int32_t first, int32_t last) const {
    double sum = 0.0;
    for (int32_t b = first; b <= last; ++b) sum += pooled_[b];
    return sum;
  }
  template <typename Pred>
  void keep_where(Pred pred) {
    for (int32_t b = 0; b < num_blocks(); ++b)
      if (pred(b)) flags_[b] = 1;
  }
  void add_in_rank_order(int32_t target) {
    int32_t kept = count_flags(flags_);
    for (int32_t b : order_) {
      if (kept >= target) break;
      if (!flags_[b]) {
        flags_[b] = 1;
        ++kept;
      }
    }
  }
  void trim_in_rank_order(int32_t limit) {
    if (count_flags(flags_) <= limit) return;
    std::vector<char> kept(flags_.size(), 0);
    kept[0] = 1;
    int32_t count = 1;
    for (int32_t b : order_) {
      if (count >= limit) break;
      if (flags_[b] && !kept[b]) {
        kept[b] = 1;
        ++count;
      }
    }
    flags_.swap(kept);
  }
  int64_t walk_tokens(const select::TokenWalk& walk, bool mark_blocks) {
    return ranked_walk(tokens_.data(), walk.first, static_cast<int64_t>(tokens_.size()), walk.rule, [&](int64_t t) {
      if (mark_blocks) flags_[t / block_] = 1;
    });
  }
  const std::vector<char>& flags() const { return flags_; }

 private:
  const std::vector<double>& pooled_;
  const std::vector<double>& tokens_;
  std::vector<int32_t> order_;
  int block_;
  std::vector<char> flags_;
};

std::vector<int32_t> flagged(const std::vector<char>& flags) {
  std::vector<int32_t> out;
  for (size_t b = 0; b < flags.size(); ++b)
    if (flags[b]) out.push_back(static_cast<int32_t>(b));
  return out;
}

// §4 global coverage or the row floor over the block-causal softmax of block means; returns the
// kept flags of the causal entries, row r at r (r + 1) / 2.
// A chunk (§11) has entries only in its rows first_row .. N-1: the walk covers those, with the
// coverage target of that many rows.
template <typename T>
std::vector<char> pe_entries(const PlanInputs<T>& in, int64_t s, int64_t h, const std::vector<T>& key_means) {
  const int B = in.params.block_size;
  const SequencePlan& shape = in.shapes[s];
  const int64_t n = shape.n_k;
  const int32_t N = rules::num_blocks(n, B);
  const int32_t first_row = shape.first_row;
  const int64_t dpad = in.keys.dpad;
  const int64_t first_position = rules::first_query_position(n, shape.n_q);
  const std::vector<T> query_means = block_means<T>(in.q, h, first_position, n, B, dpad, [&](int64_t t) {
    return shape.q_offset + t - first_position;
  });

  const int64_t entries = rules::causal_blocks(N);
  const int64_t first_entry = rules::causal_blocks(first_row);
  std::vector<double> prob(static_cast<size_t>(entries), 0.0);
  std::vector<T> logits(N);
  int64_t e = first_entry;
  for (int32_t r = first_row; r < N; ++r) {
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
    for (int32_t c = 0; c <= r; ++c) prob[e + c] /= denominator;
    e += r + 1;
  }
  std::vector<char> keep(static_cast<size_t>(entries), 0);
  if (select::pe_walks(in.params)) {
    // Entry order e = r (r + 1) / 2 + c ranks ties like the spec's r N + c.
    ranked_walk(prob.data(), first_entry, entries, select::pe_walk(in.params, N - first_row),
                [&](int64_t kept) { keep[kept] = 1; });
  } else {
    for (int32_t r = first_row; r < N; ++r)
      for (int64_t c = 0; c <= r; ++c) {
        const int64_t entry = rules::causal_blocks(r) + c;
        keep[entry] = select::pe_floor_keeps(in.params, r, prob[entry]);
      }
  }
  return keep;
}

// The layout's CSR of one head from its side flags and PE entries (empty for VS heads).
void layout_rows(const PlanParams& params, int32_t route, const SequencePlan& shape, const std::vector<char>& vertical,
                 const std::vector<char>& slash, const std::vector<char>& pe, HeadPlan& head) {
  const int32_t N = shape.num_blocks, first_row = shape.first_row;
  const std::vector<char> no_pe(N, 0);
  head.row_ptr.assign(static_cast<size_t>(N) + 1, 0);
  for (int32_t r = first_row; r < N; ++r) {
    const char* pe_row = pe.empty() ? no_pe.data() : pe.data() + rules::causal_blocks(r);
    const int32_t first_kb = select::first_listed_block(params, r, shape.n_k, shape.n_q);
    for (int32_t kb = first_kb; kb <= r; ++kb)
      if (select::layout_keeps(params, route, r, kb, first_kb, vertical, slash, pe_row)) head.col.push_back(kb);
    head.row_ptr[r + 1] = static_cast<int32_t>(head.col.size());
  }
  head.density = rules::density_of_rows(static_cast<int64_t>(head.col.size()), first_row, N);
}

template <typename T>
HeadPlan plan_head(const PlanInputs<T>& in, int64_t s, int64_t h) {
  const PlanParams& params = in.params;
  const int B = params.block_size;
  const SequencePlan& shape = in.shapes[s];
  const int64_t n = shape.n_k;
  if (!select::estimates(params, n)) return detail::make_dense_head(shape, B, params.window);
  const auto key_row = [&](int64_t t) { return in.key_rows(s, t); };

  HeadPlan head;
  std::vector<T> proxy_queries;
  const ProxyMasses masses = proxy_map(in, s, h, proxy_queries);
  head.c_struct = masses.c_struct;

  std::vector<T> key_means;
  if (select::needs_jsd(params)) {
    key_means = block_means<T>(in.k, h / in.group, 0, n, B, in.keys.dpad, key_row);
    head.jsd = js_distance(in, proxy_queries, rules::proxy_rows(shape.n_q, B), key_means, masses.pv);
  }
  const int32_t route = select::decide_route(params, head.c_struct, head.jsd, n);
  head.route = route == rules::kRoutePe ? Route::pe : Route::vs;

  CpuSide vertical(masses.pv, masses.v, B), slash(masses.ps, masses.u, B);
  select::select_side(params, route, n, true, vertical);
  select::select_side(params, route, n, false, slash);
  head.vertical = flagged(vertical.flags());
  head.slash = flagged(slash.flags());

  std::vector<char> pe;
  if (route == rules::kRoutePe) {
    if (key_means.empty()) key_means = block_means<T>(in.k, h / in.group, 0, n, B, in.keys.dpad, key_row);
    pe = pe_entries(in, s, h, key_means);
  }
  layout_rows(params, route, shape, vertical.flags(), slash.flags(), pe, head);
  return head;
}

template <typename T>
Plan plan_all(const TensorView& q, const TensorView& k, const Config& config, const Batch& batch,
              const Options& options) {
  const int threads = thread_count(options);
  Plan plan;
  plan.config = config;
  plan.block_size = config.block_size;
  plan.num_q_heads = q.heads();
  plan.num_kv_heads = k.heads();
  plan.head_dim = q.dim();
  plan.softmax_scale = shape_rules::resolve_softmax_scale(config.softmax_scale, q.dim());
  const int64_t Hq = q.heads();
  plan.sequences = detail::sequence_shapes(batch, config.block_size);
  const int64_t sequences = static_cast<int64_t>(plan.sequences.size());
  for (SequencePlan& sp : plan.sequences) sp.heads.resize(static_cast<size_t>(Hq));
  const std::vector<SequencePlan> shapes = plan.sequences;  // read by the tasks while heads are written
  const PlanParams params = plan_params(config);
  // Keys are packed only when some head estimates (the dense preset and short sequences do not).
  bool any_estimation = false;
  for (const SequencePlan& sp : plan.sequences)
    any_estimation |= select::estimates(params, sp.n_k);
  const SeqLens& cu_k = batch.cu_seqlens_k;
  const BlockIndex index(cu_k, config.block_size);
  const KeyRows key_rows{cu_k, batch.block_table};
  PackedKeys<T> keys;
  if (any_estimation) {
    keys = pack_keys<T>(k, cu_k, index, key_rows, threads);
  } else {
    keys.dpad = round_up(k.dim(), kDimAlign);
    keys.block = config.block_size;
  }
  const PlanInputs<T> inputs{q, k, params, shapes, key_rows, index, keys, plan.softmax_scale, Hq / k.heads()};
  parallel_for(sequences * Hq, threads, [&](int64_t task) {
    const int64_t s = task / Hq, h = task % Hq;
    plan.sequences[s].heads[h] = plan_head(inputs, s, h);
  });
  return plan;
}

}  // namespace
}  // namespace cpu

namespace detail {

Plan cpu_plan(const TensorView& q, const TensorView& k, const Config& given, const Batch& normalized_batch,
              const Options& options) {
  const Config config = given.for_keys(normalized_batch.longest_keys());  // the short-prompt block size
  if (options.precision == Precision::f64) return cpu::plan_all<double>(q, k, config, normalized_batch, options);
  return cpu::plan_all<float>(q, k, config, normalized_batch, options);
}

}  // namespace detail
}  // namespace crisp
