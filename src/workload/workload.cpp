// src/workload/workload.cpp — the seeded structured synthetic workload (docs/workload.md).
//
// Q and K are built from components that live in disjoint coordinate blocks of the head
// dimension, so each component's contribution to the scaled logit s·q·k is set exactly:
//
//   dims     component     key side                          query side (structured / diffuse)
//   [0]      sink          sqrt(S_sink/s) on keys < sink     sqrt(S_sink/s)         / 0
//   [1]      length bias   sqrt(1/s) on ordinary keys        -Δ(p)·sqrt(1/s)        / 0
//   needle   needles       sqrt(S_needle/s) on needle keys   same, on one needle    / 0
//   topic    topics        sqrt(S_topic/s), segment topic    0                      / same, query topic
//   bg       background    N(0, 1)                           random direction, norm so the total
//                                                             logit noise has std background_scale
//   pos      position      c_j, an AR(1) code, unit var.     a_L c_p + Σ_l a_S c_{p-t_l} / 0
//
// (s = 1/sqrt(d), the default softmax scale.) The AR(1) code has E[c_p·c_j] = D ρ^|p-j|, which gives
// the local window (peak local_strength at distance 0, decaying over local_width) and one slash line
// per extra term at distance t_l. Δ(p) = max(0, log((p+1)/T)) lifts sink and needles over all other
// keys beyond the reference length T, so that the share of attention each tier gets stays put as
// the context grows: the spec's picture of a sink, a few signal blocks, and a flat tail of mass
// Θ(1/n) per block.
//
// Random numbers: a counter-based splitmix64 (value = mix(stream_key + index·golden)) and our own
// Box-Muller, so the result does not depend on the standard library's distributions, on the
// thread count, or on the order of the loops (std::log/cos/sin may still differ in the last ulp
// between C libraries).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "crisp/error.h"
#include "crisp/workload.h"

namespace crisp {

namespace {

// ---------------------------------------------------------------- tuning constants
// NOTE: reference length T of the length-stationary tail: below T the strengths apply literally;
// above it sink and needle logits grow by log((p+1)/T) so their attention share stays constant.
constexpr double kReferenceTokens = 4096.0;
// NOTE: logit of a diffuse query on keys of its own topic; 3.0 puts ~70% of a diffuse head's mass
// on the ~1/8 of keys that share its topic at 8 topics: broad but input-dependent.
constexpr double kTopicStrength = 3.0;
// NOTE: at most 8 topics (one dimension each); fewer at small head_dim.
constexpr int64_t kMaxTopics = 8;
// NOTE: key topic segments span 128..512 tokens (one to four 128-blocks), query topic spans
// 256..1024 tokens, so a query block mostly reads one topic and block means keep it (the PE path).
constexpr int64_t kKeySegmentMin = 128, kKeySegmentMax = 512;
constexpr int64_t kQuerySegmentMin = 256, kQuerySegmentMax = 1024;
// NOTE: the local bonus decays as exp(-t / tau) with tau = local_width / 4: at t = local_width it
// is e^-4 ≈ 2% of local_strength.
constexpr double kLocalDecaysPerWidth = 4.0;
// NOTE: slash distances are drawn log-uniformly in [2, 64] × local_width: outside the local window,
// within the range where real RoPE heads show diagonals.
constexpr double kSlashMinWidths = 2.0, kSlashMaxWidths = 64.0;
// NOTE: attempts to place a slash line at least local_width away from the head's other lines.
constexpr int kSlashRedraws = 64;
// NOTE: needles lie in [max(sink_tokens, n/8), 7n/8): clear of the sink block and of the last
// queries (the proxy), which come after them.
constexpr double kNeedleStart = 0.125, kNeedleSpan = 0.875;
// NOTE: bounds on the spec, keeping every generated value finite and well inside f16/bf16 range.
constexpr double kMaxStrength = 100.0;
constexpr double kMaxBackground = 10.0;
constexpr int64_t kMaxSlashLines = 64;
constexpr uint64_t kMaxElements = uint64_t{1} << 40;

// ---------------------------------------------------------------- counter-based RNG
uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Purposes of the independent streams.
enum Purpose : uint64_t {
  kDiffuseChoice = 1,
  kSlashDistances,
  kKeyPosition,
  kKeyBackground,
  kKeyTopics,
  kNeedlePositions,
  kValues,
  kQueryBackground,
  kQueryNeedle,
  kQueryTopics,
};

struct Stream {
  uint64_t key;
  Stream(uint64_t seed, uint64_t purpose, uint64_t a = 0, uint64_t b = 0)
      : key(mix64(seed ^ mix64(purpose ^ mix64(a ^ mix64(b + 0x632be59bd9b4e019ULL))))) {}
  uint64_t bits(uint64_t i) const { return mix64(key + i * 0x9e3779b97f4a7c15ULL); }
  // Uniform in (0, 1]: never 0, so log() is finite.
  double uniform(uint64_t i) const { return (static_cast<double>(bits(i) >> 11) + 1.0) * 0x1.0p-53; }
  // Uniform integer in [0, bound) (bound >= 1); the modulo bias is below 2^-40 for our bounds.
  uint64_t below(uint64_t i, uint64_t bound) const { return bits(i) % bound; }
  // Box-Muller: the pair of standard normals number `pair`.
  void normal_pair(uint64_t pair, double& z0, double& z1) const {
    const double r = std::sqrt(-2.0 * std::log(uniform(2 * pair)));
    const double theta = 6.283185307179586476925 * uniform(2 * pair + 1);
    z0 = r * std::cos(theta);
    z1 = r * std::sin(theta);
  }
  // `count` standard normals for row `row` (rows never share pairs).
  void normals(uint64_t row, int64_t count, double* out) const {
    const uint64_t pairs_per_row = static_cast<uint64_t>((count + 1) / 2);
    for (int64_t k = 0; k < count; k += 2) {
      double z0, z1;
      normal_pair(row * pairs_per_row + static_cast<uint64_t>(k / 2), z0, z1);
      out[k] = z0;
      if (k + 1 < count) out[k + 1] = z1;
    }
  }
};

// ---------------------------------------------------------------- layout of the head dimension
struct Dims {
  int64_t sink = 0, bias = 1;
  int64_t needle_begin = 2, needle_count = 0;
  int64_t topic_begin = 0, topic_count = 0, topics = 0;
  int64_t bg_begin = 0, bg_count = 0;
  int64_t pos_begin = 0, pos_count = 0;
};

Dims layout_dims(int64_t d, int64_t needles) {
  Dims m;
  m.needle_count = needles > 0 ? std::min<int64_t>(needles, std::max<int64_t>(1, d / 32)) : 0;
  m.topic_begin = m.needle_begin + m.needle_count;
  m.topic_count = std::min<int64_t>(kMaxTopics, std::max<int64_t>(1, d / 16));
  // With one topic dimension there are still two topics: "on" and "off" that dimension.
  m.topics = std::max<int64_t>(2, m.topic_count);
  m.bg_begin = m.topic_begin + m.topic_count;
  m.bg_count = std::max<int64_t>(1, d / 8);
  m.pos_begin = m.bg_begin + m.bg_count;
  m.pos_count = d - m.pos_begin;
  return m;
}

[[noreturn]] void bad(const std::string& field, const std::string& problem, const std::string& expected) {
  throw Error("workload." + field, problem, expected);
}

void check_strength(const char* field, double value, double max) {
  if (!std::isfinite(value) || value < 0.0 || value > max)
    bad(field, "value " + std::to_string(value) + " is out of range",
        "a finite number in [0, " + std::to_string(static_cast<int>(max)) + "]");
}

void validate_spec(const WorkloadSpec& spec) {
  if (spec.num_q_heads < 1) bad("num_q_heads", std::to_string(spec.num_q_heads) + " heads", "at least 1");
  if (spec.num_kv_heads < 1) bad("num_kv_heads", std::to_string(spec.num_kv_heads) + " heads", "at least 1");
  if (spec.num_q_heads % spec.num_kv_heads != 0)
    bad("num_q_heads", std::to_string(spec.num_q_heads) + " is not a multiple of num_kv_heads = " +
                           std::to_string(spec.num_kv_heads),
        "num_q_heads % num_kv_heads == 0 (GQA)");
  if (spec.head_dim < kWorkloadMinHeadDim || spec.head_dim > kWorkloadMaxHeadDim)
    bad("head_dim", std::to_string(spec.head_dim) + " is out of range",
        "an integer in [" + std::to_string(kWorkloadMinHeadDim) + ", " + std::to_string(kWorkloadMaxHeadDim) + "]");
  if (spec.seq_lens.empty()) bad("seq_lens", "no sequences", "at least one sequence length");
  uint64_t total = 0;
  for (size_t i = 0; i < spec.seq_lens.size(); ++i) {
    const int64_t n = spec.seq_lens[i];
    if (n < 1) bad("seq_lens", "sequence " + std::to_string(i) + " has length " + std::to_string(n), "lengths >= 1");
    if (spec.needles >= n)
      bad("needles", std::to_string(spec.needles) + " needles in sequence " + std::to_string(i) + " of " +
                         std::to_string(n) + " tokens",
          "fewer needles than tokens in every sequence");
    total += static_cast<uint64_t>(n);
    if (total > kMaxElements) bad("seq_lens", "total token count too large", "at most 2^40 tokens");
  }
  const uint64_t heads = static_cast<uint64_t>(std::max(spec.num_q_heads, spec.num_kv_heads));
  if (heads > kMaxElements || total * static_cast<uint64_t>(spec.head_dim) > kMaxElements / heads)
    bad("seq_lens", "workload too large (heads x tokens x head_dim exceeds 2^40 elements)",
        "a workload that fits in memory");
  if (!std::isfinite(spec.diffuse_head_share) || spec.diffuse_head_share < 0.0 || spec.diffuse_head_share > 1.0)
    bad("diffuse_head_share", "value " + std::to_string(spec.diffuse_head_share) + " is out of range", "a number in [0, 1]");
  if (!std::isfinite(spec.no_local_head_share) || spec.no_local_head_share < 0.0 ||
      spec.no_local_head_share + spec.diffuse_head_share > 1.0 + 1e-12)
    bad("no_local_head_share", "value " + std::to_string(spec.no_local_head_share) + " is out of range",
        "a number in [0, 1 - diffuse_head_share]");
  check_strength("sink_strength", spec.sink_strength, kMaxStrength);
  check_strength("local_strength", spec.local_strength, kMaxStrength);
  check_strength("slash_strength", spec.slash_strength, kMaxStrength);
  check_strength("needle_strength", spec.needle_strength, kMaxStrength);
  check_strength("background_scale", spec.background_scale, kMaxBackground);
  if (spec.sink_tokens < 0) bad("sink_tokens", std::to_string(spec.sink_tokens), "an integer >= 0");
  if (spec.local_width < 1) bad("local_width", std::to_string(spec.local_width), "an integer >= 1");
  if (spec.slash_lines < 0 || spec.slash_lines > kMaxSlashLines)
    bad("slash_lines", std::to_string(spec.slash_lines), "an integer in [0, " + std::to_string(kMaxSlashLines) + "]");
  if (spec.needles < 0) bad("needles", std::to_string(spec.needles), "an integer >= 0");
}

// Distinct positions: Floyd's sampling of `count` values from [lo, hi), returned ascending.
std::vector<int64_t> sample_distinct(const Stream& rng, int64_t lo, int64_t hi, int64_t count) {
  std::set<int64_t> chosen;
  const int64_t range = hi - lo;
  uint64_t draw = 0;
  for (int64_t j = range - count; j < range; ++j) {
    const int64_t t = static_cast<int64_t>(rng.below(draw++, static_cast<uint64_t>(j + 1)));
    chosen.insert(chosen.count(t) ? j : t);
  }
  std::vector<int64_t> out;
  for (int64_t v : chosen) out.push_back(lo + v);
  return out;
}

// Topic of every position: consecutive segments of random length, each with a random topic.
std::vector<int32_t> topic_segments(const Stream& rng, int64_t n, int64_t min_len, int64_t max_len, int64_t topics) {
  std::vector<int32_t> topic(static_cast<size_t>(n));
  uint64_t draw = 0;
  for (int64_t start = 0; start < n;) {
    const int64_t len = min_len + static_cast<int64_t>(rng.below(draw++, static_cast<uint64_t>(max_len - min_len + 1)));
    const int32_t t = static_cast<int32_t>(rng.below(draw++, static_cast<uint64_t>(topics)));
    const int64_t end = std::min(n, start + len);
    for (int64_t j = start; j < end; ++j) topic[static_cast<size_t>(j)] = t;
    start = end;
  }
  return topic;
}

// The topic a diffuse query at position p reads: its query segment's topic, moved to the next one
// (cyclically) while it equals the topic of the keys at the start of the sequence, at p, or a
// local-window width before p. A diffuse head reads related content elsewhere in the context, not
// its own surroundings, so its mass stays off the sink and the local window.
int32_t diffuse_topic(int32_t preferred, const std::vector<int32_t>& key_topic, int64_t p, int64_t local_width,
                      int64_t topics) {
  // NOTE: 128 = the spec's default w_sink / w_local: the window C_struct measures.
  constexpr int64_t kWindow = 128;
  const int64_t window = std::max(local_width, kWindow);
  const int32_t avoid[3] = {key_topic[0], key_topic[static_cast<size_t>(p)],
                            key_topic[static_cast<size_t>(std::max<int64_t>(0, p - window + 1))]};
  int32_t t = preferred;
  for (int64_t tries = 0; tries < topics; ++tries) {
    if (t != avoid[0] && t != avoid[1] && t != avoid[2]) return t;
    t = static_cast<int32_t>((t + 1) % topics);
  }
  return preferred;  // fewer than four topics: nothing to avoid with
}

}  // namespace

TensorView Workload::q_view() {
  return TensorView::contiguous(q.data(), DType::f32, spec.num_q_heads, total_tokens, spec.head_dim);
}
TensorView Workload::k_view() {
  return TensorView::contiguous(k.data(), DType::f32, spec.num_kv_heads, total_tokens, spec.head_dim);
}
TensorView Workload::v_view() {
  return TensorView::contiguous(v.data(), DType::f32, spec.num_kv_heads, total_tokens, spec.head_dim);
}

void check_workload(const WorkloadSpec& spec) { validate_spec(spec); }

Workload make_workload(const WorkloadSpec& spec) {
  validate_spec(spec);
  Workload w;
  w.spec = spec;
  const int64_t Hq = spec.num_q_heads, Hkv = spec.num_kv_heads, d = spec.head_dim;
  const int64_t group = Hq / Hkv;
  const int64_t S = static_cast<int64_t>(spec.seq_lens.size());
  w.cu_seqlens.assign(1, 0);
  for (int64_t n : spec.seq_lens) w.cu_seqlens.push_back(w.cu_seqlens.back() + n);
  w.total_tokens = w.cu_seqlens.back();
  const int64_t T = w.total_tokens;
  w.q.assign(static_cast<size_t>(Hq * T * d), 0.0f);
  w.k.assign(static_cast<size_t>(Hkv * T * d), 0.0f);
  w.v.assign(static_cast<size_t>(Hkv * T * d), 0.0f);
  w.needle_positions.assign(static_cast<size_t>(S * Hkv), {});

  const double s = 1.0 / std::sqrt(static_cast<double>(d));  // the default softmax scale
  const Dims dims = layout_dims(d, spec.needles);
  // Key- and query-side amplitudes: a component with both sides = sqrt(x / s) adds exactly x to s·q·k.
  const double sink_amp = std::sqrt(spec.sink_strength / s);
  const double needle_amp = std::sqrt(spec.needle_strength / s);
  const double topic_amp = std::sqrt(kTopicStrength / s);
  const double bias_amp = std::sqrt(1.0 / s);
  // E[c_p · c_p] = pos_count, so these query weights put local_strength / slash_strength on the peak.
  const double local_weight = spec.local_strength / (s * static_cast<double>(dims.pos_count));
  const double slash_weight = spec.slash_strength / (s * static_cast<double>(dims.pos_count));
  const double tau = std::max(1.0, static_cast<double>(spec.local_width) / kLocalDecaysPerWidth);
  const double rho = std::exp(-1.0 / tau);
  const double innovation = std::sqrt(1.0 - rho * rho);

  // Diffuse heads: the first round(share · Hq) of a seeded permutation; heads without local
  // structure the next round(no_local_head_share · Hq) of it.
  w.head_is_diffuse.assign(static_cast<size_t>(Hq), false);
  w.head_has_no_local.assign(static_cast<size_t>(Hq), false);
  {
    std::vector<int64_t> order(static_cast<size_t>(Hq));
    for (int64_t h = 0; h < Hq; ++h) order[static_cast<size_t>(h)] = h;
    const Stream rng(spec.seed, kDiffuseChoice);
    for (int64_t i = Hq - 1; i > 0; --i)
      std::swap(order[static_cast<size_t>(i)], order[rng.below(static_cast<uint64_t>(i), static_cast<uint64_t>(i + 1))]);
    const int64_t count = std::llround(spec.diffuse_head_share * static_cast<double>(Hq));
    for (int64_t i = 0; i < count; ++i) w.head_is_diffuse[static_cast<size_t>(order[static_cast<size_t>(i)])] = true;
    const int64_t plain = std::min(Hq - count, static_cast<int64_t>(std::llround(spec.no_local_head_share * static_cast<double>(Hq))));
    for (int64_t i = count; i < count + plain; ++i)
      w.head_has_no_local[static_cast<size_t>(order[static_cast<size_t>(i)])] = true;
  }

  // Slash distances of each structured query head (the same in every sequence: a property of the head).
  std::vector<std::vector<int64_t>> slash_distance(static_cast<size_t>(Hq));
  for (int64_t h = 0; h < Hq; ++h) {
    const Stream rng(spec.seed, kSlashDistances, static_cast<uint64_t>(h));
    const double lo = std::log(kSlashMinWidths * static_cast<double>(spec.local_width));
    const double hi = std::log(kSlashMaxWidths * static_cast<double>(spec.local_width));
    std::vector<int64_t>& lines = slash_distance[static_cast<size_t>(h)];
    uint64_t draw = 0;
    for (int64_t l = 0; l < spec.slash_lines; ++l) {
      // Lines closer than local_width would add their bumps into one line of twice the strength:
      // redraw (a bounded number of times) until this one is clear of the others.
      int64_t t = 0;
      for (int tries = 0; tries < kSlashRedraws; ++tries) {
        t = static_cast<int64_t>(std::llround(std::exp(lo + (hi - lo) * rng.uniform(draw++))));
        bool clear = true;
        for (int64_t other : lines) clear = clear && std::llabs(other - t) >= spec.local_width;
        if (clear) break;
      }
      lines.push_back(t);
    }
  }

  for (int64_t seq = 0; seq < S; ++seq) {
    const int64_t offset = w.cu_seqlens[static_cast<size_t>(seq)];
    const int64_t n = spec.seq_lens[static_cast<size_t>(seq)];
    const uint64_t useq = static_cast<uint64_t>(seq);

    // ------------------------------------------------------------ keys and values
    std::vector<std::vector<int32_t>> key_topics(static_cast<size_t>(Hkv));
    for (int64_t g = 0; g < Hkv; ++g) {
      const uint64_t ug = static_cast<uint64_t>(g);
      float* kg = w.k.data() + (g * T + offset) * d;
      float* vg = w.v.data() + (g * T + offset) * d;

      // Needle positions in [lo, hi), distinct.
      const int64_t lo = std::min(std::max(spec.sink_tokens, static_cast<int64_t>(kNeedleStart * static_cast<double>(n))),
                                  n - spec.needles);
      const int64_t hi = std::max(lo + spec.needles, static_cast<int64_t>(kNeedleSpan * static_cast<double>(n)));
      std::vector<int64_t>& needles = w.needle_positions[static_cast<size_t>(seq * Hkv + g)];
      needles = sample_distinct(Stream(spec.seed, kNeedlePositions, useq, ug), lo, std::min(hi, n), spec.needles);
      std::vector<int64_t> needle_index(static_cast<size_t>(n), -1);
      // Needle m sits on needle dimension m mod needle_count (the order of `needles` is ascending).
      for (size_t m = 0; m < needles.size(); ++m) needle_index[static_cast<size_t>(needles[m])] = static_cast<int64_t>(m);

      const std::vector<int32_t> topic =
          topic_segments(Stream(spec.seed, kKeyTopics, useq, ug), n, kKeySegmentMin, kKeySegmentMax, dims.topics);

      const Stream bg_rng(spec.seed, kKeyBackground, useq, ug);
      const Stream v_rng(spec.seed, kValues, useq, ug);
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < n; ++j) {
        float* kj = kg + j * d;
        double buf[kWorkloadMaxHeadDim];
        const bool is_sink = j < spec.sink_tokens;
        const bool is_needle = needle_index[static_cast<size_t>(j)] >= 0;
        if (is_sink) kj[dims.sink] = static_cast<float>(sink_amp);
        // Sink and needle keys do not carry the bias, so the query's -Δ(p) lowers every other key.
        if (!is_sink && !is_needle) kj[dims.bias] = static_cast<float>(bias_amp);
        if (is_needle)
          kj[dims.needle_begin + needle_index[static_cast<size_t>(j)] % dims.needle_count] = static_cast<float>(needle_amp);
        const int32_t t = topic[static_cast<size_t>(j)];
        if (t < dims.topic_count) kj[dims.topic_begin + t] = static_cast<float>(topic_amp);
        bg_rng.normals(static_cast<uint64_t>(j), dims.bg_count, buf);
        for (int64_t x = 0; x < dims.bg_count; ++x) kj[dims.bg_begin + x] = static_cast<float>(buf[x]);
        v_rng.normals(static_cast<uint64_t>(j), d, buf);
        float* vj = vg + j * d;
        for (int64_t x = 0; x < d; ++x) vj[x] = static_cast<float>(buf[x]);
      }

      // Positional AR(1) code c_j = rho c_{j-1} + sqrt(1 - rho^2) xi_j: the innovations xi are drawn
      // in parallel into the key rows, then one sequential pass turns them into the code.
      {
        const Stream pos_rng(spec.seed, kKeyPosition, useq, ug);
#pragma omp parallel for schedule(static)
        for (int64_t j = 0; j < n; ++j) {
          double xi[kWorkloadMaxHeadDim];
          pos_rng.normals(static_cast<uint64_t>(j), dims.pos_count, xi);
          float* kj = kg + j * d + dims.pos_begin;
          for (int64_t x = 0; x < dims.pos_count; ++x) kj[x] = static_cast<float>(xi[x]);
        }
        std::vector<double> c(static_cast<size_t>(dims.pos_count));
        for (int64_t j = 0; j < n; ++j) {
          float* kj = kg + j * d + dims.pos_begin;
          // Sink keys carry no positional code (as the position-independent sink keys of real
          // models): otherwise the code's random overlap with the last queries would make the sink
          // mass, and so C_struct, swing from head to head.
          const bool is_sink = j < spec.sink_tokens;
          for (int64_t x = 0; x < dims.pos_count; ++x) {
            double& cx = c[static_cast<size_t>(x)];
            cx = j == 0 ? static_cast<double>(kj[x]) : rho * cx + innovation * static_cast<double>(kj[x]);
            kj[x] = is_sink ? 0.0f : static_cast<float>(cx);
          }
        }
      }
      key_topics[static_cast<size_t>(g)] = topic;
    }

    // ------------------------------------------------------------ queries
    for (int64_t h = 0; h < Hq; ++h) {
      const uint64_t uh = static_cast<uint64_t>(h);
      const int64_t g = h / group;
      const float* kg = w.k.data() + (g * T + offset) * d;
      float* qh = w.q.data() + (h * T + offset) * d;
      const bool diffuse = w.head_is_diffuse[static_cast<size_t>(h)];
      const bool no_local = w.head_has_no_local[static_cast<size_t>(h)];
      // A head without local structure has no positional term at all: no window, no slash lines.
      const std::vector<int64_t> lines = no_local ? std::vector<int64_t>() : slash_distance[static_cast<size_t>(h)];
      const std::vector<int32_t> query_topic =
          diffuse ? topic_segments(Stream(spec.seed, kQueryTopics, useq, uh), n, kQuerySegmentMin, kQuerySegmentMax,
                                   dims.topics)
                  : std::vector<int32_t>();
      const Stream bg_rng(spec.seed, kQueryBackground, useq, uh);
      const Stream needle_rng(spec.seed, kQueryNeedle, useq, uh);
      const double bg_scale2 = spec.background_scale * spec.background_scale;

#pragma omp parallel for schedule(static)
      for (int64_t p = 0; p < n; ++p) {
        float* qp = qh + p * d;
        double buf[kWorkloadMaxHeadDim];
        double residual2 = 0.0;  // variance of the positional code's logit on far keys
        if (diffuse) {
          const int32_t t = diffuse_topic(query_topic[static_cast<size_t>(p)], key_topics[static_cast<size_t>(g)], p,
                                          spec.local_width, dims.topics);
          if (t < dims.topic_count) qp[dims.topic_begin + t] = static_cast<float>(topic_amp);
        } else {
          qp[dims.sink] = static_cast<float>(sink_amp);
          const double lift = std::max(0.0, std::log(static_cast<double>(p + 1) / kReferenceTokens));
          qp[dims.bias] = static_cast<float>(-lift * bias_amp);
          if (dims.needle_count > 0) {
            const int64_t m = static_cast<int64_t>(needle_rng.below(static_cast<uint64_t>(p), static_cast<uint64_t>(spec.needles)));
            qp[dims.needle_begin + m % dims.needle_count] = static_cast<float>(needle_amp);
          }
          // q_pos = local_weight · c_p + Σ_l slash_weight · c_{p - t_l}, read back from the stored keys
          // so that q·k uses exactly the values the attention will see (the first sink_tokens
          // queries therefore have no local term: the sink keys' code is zero).
          double* pos = buf;
          const float* cp = kg + p * d + dims.pos_begin;
          for (int64_t x = 0; x < dims.pos_count; ++x) pos[x] = no_local ? 0.0 : local_weight * cp[x];
          for (int64_t t : lines) {
            if (p - t < 0) continue;
            const float* ct = kg + (p - t) * d + dims.pos_begin;
            for (int64_t x = 0; x < dims.pos_count; ++x) pos[x] += slash_weight * ct[x];
          }
          double norm2 = 0.0;
          for (int64_t x = 0; x < dims.pos_count; ++x) {
            qp[dims.pos_begin + x] = static_cast<float>(pos[x]);
            norm2 += pos[x] * pos[x];
          }
          residual2 = s * s * norm2;
        }
        // Background: the keys' bg coordinates are i.i.d. N(0,1), so s·q_bg·k_bg is exactly
        // N(0, (s |q_bg|)^2) over keys; choose |q_bg| so the total noise std is background_scale
        // (when the positional residual alone exceeds it, the tail is heavier: docs/workload.md).
        const double bg_std = std::sqrt(std::max(0.0, bg_scale2 - residual2));
        bg_rng.normals(static_cast<uint64_t>(p), dims.bg_count, buf);
        double norm2 = 0.0;
        for (int64_t x = 0; x < dims.bg_count; ++x) norm2 += buf[x] * buf[x];
        const double factor = norm2 > 0.0 ? bg_std / (s * std::sqrt(norm2)) : 0.0;
        for (int64_t x = 0; x < dims.bg_count; ++x) qp[dims.bg_begin + x] = static_cast<float>(factor * buf[x]);
      }
    }
  }
  return w;
}

void set_workload_field(WorkloadSpec& spec, const std::string& field_equals_value, const std::string& argument) {
  const std::size_t eq = field_equals_value.find('=');
  if (eq == std::string::npos)
    throw Error(argument, "'" + field_equals_value + "' has no '='", "field=value, e.g. background_scale=2");
  const std::string field = field_equals_value.substr(0, eq), value = field_equals_value.substr(eq + 1);
  struct IntField { const char* name; int64_t WorkloadSpec::*member; };
  struct RealField { const char* name; double WorkloadSpec::*member; };
  static const IntField int_fields[] = {
      {"num_q_heads", &WorkloadSpec::num_q_heads}, {"num_kv_heads", &WorkloadSpec::num_kv_heads},
      {"head_dim", &WorkloadSpec::head_dim},       {"sink_tokens", &WorkloadSpec::sink_tokens},
      {"local_width", &WorkloadSpec::local_width}, {"slash_lines", &WorkloadSpec::slash_lines},
      {"needles", &WorkloadSpec::needles}};
  static const RealField real_fields[] = {
      {"diffuse_head_share", &WorkloadSpec::diffuse_head_share},
      {"no_local_head_share", &WorkloadSpec::no_local_head_share},
      {"sink_strength", &WorkloadSpec::sink_strength},
      {"local_strength", &WorkloadSpec::local_strength},
      {"slash_strength", &WorkloadSpec::slash_strength},
      {"needle_strength", &WorkloadSpec::needle_strength},
      {"background_scale", &WorkloadSpec::background_scale}};
  std::size_t used = 0;
  for (const IntField& f : int_fields) {
    if (field != f.name) continue;
    int64_t parsed = 0;
    try {
      parsed = std::stoll(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (value.empty() || used != value.size()) throw Error(argument, field + " is '" + value + "'", "an integer");
    spec.*f.member = parsed;
    return;
  }
  for (const RealField& f : real_fields) {
    if (field != f.name) continue;
    double parsed = 0.0;
    try {
      parsed = std::stod(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (value.empty() || used != value.size()) throw Error(argument, field + " is '" + value + "'", "a number");
    spec.*f.member = parsed;
    return;
  }
  std::string names;
  for (const IntField& f : int_fields) names += std::string(names.empty() ? "" : ", ") + f.name;
  for (const RealField& f : real_fields) names += std::string(", ") + f.name;
  throw Error(argument, "unknown field '" + field + "'", "one of " + names);
}

}  // namespace crisp
