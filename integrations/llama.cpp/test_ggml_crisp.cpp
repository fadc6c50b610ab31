// integrations/llama.cpp/test_ggml_crisp.cpp — the hook of crisp.patch on ggml's own
// flash-attention op, with the layouts llama.cpp builds (Q permuted from [D, H, n], K/V views of
// an F16 cache padded to 256 cells, an F16 causal mask with padded rows):
//   - dense through crisp matches an f64 reference of the same inputs, at least as closely as
//     llama.cpp's own CPU kernel does, for a whole prompt and for a later ubatch (n_past > 0), at
//     SmolLM2's shapes and Gemma 3's (head dim 256, 4 query heads on 1 KV head), and for a
//     sliding-window mask whose window still covers every cell (it is plain causal then);
//   - every op the hook must not take (decode, ALiBi, softcap, non-causal mask, a hole in the
//     cache, several sequences, a sliding window shorter than the prefix) runs llama.cpp's kernel: bit-identical to the run with
//     sparse prefill off, and counted as declined (decode is not counted: it is never a candidate);
//   - the sparse policies run; bad settings are refused with a message.
// Built by scripts/llama_cpp.sh against the patched ggml; run by tests/llama_cpp/test_llama_cpp.sh.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ggml-cpu.h"
#include "ggml.h"

namespace {

int g_failures = 0;
void check(bool ok, const std::string & what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++g_failures;
}

constexpr int kThreads = 2;

// Which cells row i of the mask sees.
enum class MaskKind { causal, non_causal, hole, two_sequences, sliding_window };

struct Case {
  int64_t n_q = 300;      // queries in the ubatch (not a multiple of crisp's block size)
  int64_t n_past = 0;     // cached tokens before them
  int64_t dim = 64, heads = 4, kv_heads = 2;  // SmolLM2's head dim, a GQA group of 2
  MaskKind mask = MaskKind::causal;
  int64_t window = 0;     // sliding_window: row i sees the `window` cells up to its own (Gemma 3's SWA)
  float max_bias = 0.0f;  // ALiBi
  float softcap = 0.0f;
};

bool visible(const Case & c, int64_t i, int64_t j) {
  const int64_t last = c.n_past + i;
  switch (c.mask) {
    case MaskKind::causal: return j <= last;
    case MaskKind::non_causal: return j < c.n_past + c.n_q;
    case MaskKind::hole: return j <= last && j != 5;
    case MaskKind::two_sequences: {  // rows and cells split in two halves, each causal in its own
      const int64_t half = (c.n_past + c.n_q) / 2;
      return (j < half) == (last < half) && j <= last;
    }
    case MaskKind::sliding_window: return j <= last && last - j < c.window;
  }
  return false;
}

struct Run {
  std::vector<float> out;  // [n_q][heads][dim], ggml's permuted result
  std::vector<double> reference;
  int64_t handled = 0, declined = 0;
};

// Builds one flash-attention op as llama.cpp's build_attn_mha does and computes it.
Run run(const Case & c, uint32_t seed) {
  const int64_t n_tokens = c.n_past + c.n_q;
  const int64_t n_kv = (n_tokens + 255) / 256 * 256;  // llama.cpp pads the cache view to 256 cells
  const int64_t n_q_pad = (c.n_q + GGML_KQ_MASK_PAD - 1) / GGML_KQ_MASK_PAD * GGML_KQ_MASK_PAD;
  ggml_init_params params = {size_t(256) << 20, nullptr, false};
  ggml_context * ctx = ggml_init(params);

  const int64_t dim = c.dim, heads = c.heads, kv_heads = c.kv_heads;
  ggml_tensor * q_rows = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, dim, heads, c.n_q);
  ggml_tensor * k_cache = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, dim, kv_heads, n_kv);
  ggml_tensor * v_cache = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, dim, kv_heads, n_kv);
  ggml_tensor * mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_kv, n_q_pad);

  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  float * qd = static_cast<float *>(q_rows->data);
  // NOTE: q scaled by 3 so that the softmax is peaked rather than near uniform (scores up to ~24).
  for (int64_t i = 0; i < ggml_nelements(q_rows); ++i) qd[i] = 3.0f * uniform(rng);
  ggml_fp16_t * kd = static_cast<ggml_fp16_t *>(k_cache->data);
  ggml_fp16_t * vd = static_cast<ggml_fp16_t *>(v_cache->data);
  for (int64_t i = 0; i < ggml_nelements(k_cache); ++i) {
    kd[i] = ggml_fp32_to_fp16(uniform(rng));
    vd[i] = ggml_fp32_to_fp16(uniform(rng));
  }
  ggml_fp16_t * md = static_cast<ggml_fp16_t *>(mask->data);
  for (int64_t i = 0; i < n_q_pad; ++i)
    for (int64_t j = 0; j < n_kv; ++j)
      md[i * n_kv + j] = ggml_fp32_to_fp16(i < c.n_q && j < n_tokens && visible(c, i, j) ? 0.0f : -INFINITY);

  ggml_tensor * q = ggml_permute(ctx, q_rows, 0, 2, 1, 3);  // [D, n_q, H]
  ggml_tensor * k = ggml_permute(ctx, k_cache, 0, 2, 1, 3);  // [D, n_kv, H_kv], strided into the cache
  ggml_tensor * v = ggml_permute(ctx, v_cache, 0, 2, 1, 3);
  const float scale = 1.0f / std::sqrt(float(dim));
  ggml_tensor * out = ggml_flash_attn_ext(ctx, q, k, v, mask, scale, c.max_bias, c.softcap);
  ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32);
  ggml_cgraph * graph = ggml_new_graph(ctx);
  ggml_build_forward_expand(graph, out);

  Run r;
  int64_t h0, d0, h1, d1;
  ggml_cpu_get_sparse_prefill_stats(&h0, &d0);
  if (ggml_graph_compute_with_ctx(ctx, graph, kThreads) != GGML_STATUS_SUCCESS) check(false, "ggml_graph_compute");
  ggml_cpu_get_sparse_prefill_stats(&h1, &d1);
  r.handled = h1 - h0;
  r.declined = d1 - d0;
  r.out.assign(static_cast<float *>(out->data), static_cast<float *>(out->data) + ggml_nelements(out));

  // f64 reference of plain causal attention on the same (F16-rounded) inputs.
  const bool window_covers_all = c.mask == MaskKind::sliding_window && c.window >= n_tokens;
  if ((c.mask == MaskKind::causal || window_covers_all) && c.max_bias == 0.0f && c.softcap == 0.0f) {
    r.reference.assign(r.out.size(), 0.0);
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t kh = h / (heads / kv_heads);
      for (int64_t i = 0; i < c.n_q; ++i) {
        std::vector<double> s(c.n_past + i + 1);
        double m = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j <= c.n_past + i; ++j) {
          double dot = 0.0;
          for (int64_t x = 0; x < dim; ++x)
            dot += double(qd[(i * heads + h) * dim + x]) * ggml_fp16_to_fp32(kd[(j * kv_heads + kh) * dim + x]);
          s[j] = dot * scale;
          m = std::max(m, s[j]);
        }
        for (double & e : s) sum += (e = std::exp(e - m));
        for (int64_t x = 0; x < dim; ++x) {
          double acc = 0.0;
          for (int64_t j = 0; j <= c.n_past + i; ++j) acc += s[j] * ggml_fp16_to_fp32(vd[(j * kv_heads + kh) * dim + x]);
          r.reference[(i * heads + h) * dim + x] = acc / sum;
        }
      }
    }
  }
  ggml_free(ctx);
  return r;
}

bool set_policy(const char * policy, std::vector<const char *> settings = {}, std::string * error = nullptr) {
  char message[512] = "";
  const bool ok = ggml_cpu_set_sparse_prefill(policy, settings.data(), int(settings.size()), message, sizeof(message));
  if (error) *error = message;
  return ok;
}

double max_error(const std::vector<float> & got, const std::vector<double> & want) {
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
  return worst;
}

void dense_matches_reference(const std::string & name, const Case & c) {
  set_policy("off");
  const Run llama = run(c, 1);
  set_policy("dense");
  const Run crisp = run(c, 1);
  check(crisp.handled == 1 && crisp.declined == 0, name + ": crisp computed the op");
  const double llama_error = max_error(llama.out, llama.reference), crisp_error = max_error(crisp.out, crisp.reference);
  std::printf("      max |out - f64 reference|: llama.cpp %.3g, crisp dense %.3g\n", llama_error, crisp_error);
  // NOTE: 1e-4: crisp computes in f32 (softmax over <= 400 keys, |v| <= 1), so its error is
  // rounding at ~1e-6 relative; llama.cpp's kernel rounds Q to F16 and accumulates in F16 (~1e-3).
  check(crisp_error <= 1e-4, name + ": crisp dense within 1e-4 of the f64 reference");
  check(crisp_error <= llama_error, name + ": crisp at least as close to the reference as llama.cpp's kernel");
}

void falls_back(const std::string & name, const Case & c, bool candidate = true) {
  set_policy("off");
  const Run llama = run(c, 2);
  set_policy("dense");
  const Run hooked = run(c, 2);
  check(hooked.handled == 0 && hooked.declined == (candidate ? 1 : 0), name + ": left to llama.cpp");
  check(std::memcmp(llama.out.data(), hooked.out.data(), llama.out.size() * sizeof(float)) == 0,
        name + ": output identical to llama.cpp's");
}

void sparse_policies_run() {
  Case prompt;
  prompt.n_q = 1024;  // eight 128-token blocks: room for the policies to skip some
  Case chunk;         // the second half of the same length as a later ubatch
  chunk.n_q = 512;
  chunk.n_past = 512;
  for (const char * policy : {"crisp", "flexprefill", "minference"}) {
    set_policy(policy);
    for (const Case & c : {prompt, chunk}) {
      const Run r = run(c, 3);
      bool finite = true;
      for (float x : r.out) finite = finite && std::isfinite(x);
      check(r.handled == 1 && finite, std::string(policy) + (c.n_past ? ", chunk" : ", prompt") +
                                          ": crisp computed the op, finite output");
    }
  }
}

// Each setting refused, with a message naming the culprit.
void refused(const std::string & name, const char * policy, std::vector<const char *> settings, const std::string & named) {
  std::string error;
  const bool accepted = set_policy(policy, std::move(settings), &error);
  check(!accepted && error.find(named) != std::string::npos, name + " refused: " + error);
}

void bad_settings_refused() {
  refused("bad policy", "bogus", {}, "unknown policy 'bogus'");
  refused("settings with off", "off", {"alpha=1"}, "off");
  refused("bad key", "crisp", {"no_such_key=1"}, "no_such_key");
  refused("bad value", "crisp", {"alpha=banana"}, "alpha");
  refused("softmax_scale", "dense", {"softmax_scale=0.5"}, "softmax_scale");
  std::string error;
  const bool accepted = set_policy("crisp", {"alpha=1.5", "block_size=64"}, &error);
  check(accepted, "good settings accepted " + error);
}

}  // namespace

int main() {
  dense_matches_reference("whole prompt", Case{});
  Case chunk;  // a later ubatch: 300 queries after 100 cached tokens
  chunk.n_past = 100;
  dense_matches_reference("chunk (n_past > 0)", chunk);
  // Gemma 3: head dim 256, 4 query heads on 1 KV head; its global layers' plain causal masks.
  Case gemma;
  gemma.dim = 256;
  gemma.heads = 4;
  gemma.kv_heads = 1;
  dense_matches_reference("head dim 256, GQA 4:1 (Gemma 3), whole prompt", gemma);
  Case gemma_chunk = gemma;
  gemma_chunk.n_past = 100;
  dense_matches_reference("head dim 256, GQA 4:1 (Gemma 3), chunk", gemma_chunk);
  // Gemma 3's sliding-window layers, once the window no longer covers the prefix: in the prompt
  // (row i > window) and in a later ubatch (its first row already past the window).
  Case window = gemma;
  window.mask = MaskKind::sliding_window;
  window.window = 128;
  falls_back("sliding window shorter than the prompt", window);
  // A window that still covers every cell is plain causal, cell for cell: crisp computes it.
  Case wide_window = window;
  wide_window.window = 512;
  dense_matches_reference("sliding window covering the whole prompt", wide_window);
  Case window_chunk = window;
  window_chunk.n_past = 200;
  falls_back("sliding window, later ubatch", window_chunk);
  Case decode;
  decode.n_q = 1;
  decode.n_past = 40;
  falls_back("decode (n_q = 1)", decode, false);
  Case alibi;
  alibi.max_bias = 8.0f;
  falls_back("ALiBi", alibi);
  Case softcap;
  softcap.softcap = 30.0f;
  falls_back("softcap", softcap);
  Case non_causal;
  non_causal.mask = MaskKind::non_causal;
  falls_back("non-causal mask", non_causal);
  Case hole;
  hole.mask = MaskKind::hole;
  falls_back("a hole in the cache", hole);
  Case two;
  two.mask = MaskKind::two_sequences;
  falls_back("two sequences", two);
  sparse_policies_run();
  bad_settings_refused();
  set_policy("off");
  std::printf("%s\n", g_failures == 0 ? "all checks passed" : "some checks failed");
  return g_failures == 0 ? 0 : 1;
}
