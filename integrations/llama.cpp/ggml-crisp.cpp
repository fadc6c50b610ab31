// integrations/llama.cpp/ggml-crisp.cpp — routes llama.cpp's prompt-processing attention on the
// CPU backend through crisp (plan + attend). Compiled into ggml-cpu by crisp.patch; the layouts,
// the mask rule and the fallbacks are explained in docs/llama_cpp.md.
#include "ggml-crisp.h"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "crisp/crisp.h"
#include "ggml-cpu.h"
#include "ggml-impl.h"
#include "ggml.h"

namespace {

// What --sparse-prefill chose: a crisp Config, or nothing (off).
struct SparsePrefill {
  std::string policy;
  crisp::Config config;
};

std::mutex g_mutex;                              // guards g_setting and g_reasons
std::shared_ptr<const SparsePrefill> g_setting;  // null: off
std::set<std::string> g_reasons;                 // messages already logged
std::atomic<int64_t> g_handled{0}, g_declined{0};

std::shared_ptr<const SparsePrefill> current_setting() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_setting;
}

// Logs each distinct message once per process (ggml's log, so llama.cpp's log settings apply): a
// model whose layers fall back says so once, not once per layer and ubatch.
void log_once(const std::string & message) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_reasons.insert(message).second) GGML_LOG_INFO("crisp: %s\n", message.c_str());
}

// The ggml types crisp reads directly; the others (quantised caches) fall back.
bool crisp_dtype(ggml_type type, crisp::DType * out) {
  switch (type) {
    case GGML_TYPE_F32:  *out = crisp::DType::f32;  return true;
    case GGML_TYPE_F16:  *out = crisp::DType::f16;  return true;
    case GGML_TYPE_BF16: *out = crisp::DType::bf16; return true;
    default: return false;
  }
}

// A rank-3 crisp view [heads, tokens, d] of a ggml tensor whose ne are [d, tokens, heads, 1],
// covering `heads` heads from `first_head` and the first `tokens` tokens. False when a stride is
// not a whole number of elements (crisp's strides count elements, ggml's count bytes).
bool view_of(const ggml_tensor * t, int64_t first_head, int64_t heads, int64_t tokens, crisp::TensorView * view) {
  crisp::DType dtype;
  if (!crisp_dtype(t->type, &dtype)) return false;
  const size_t es = ggml_type_size(t->type);
  if (t->nb[0] != es || t->nb[1] % es != 0 || t->nb[2] % es != 0) return false;
  view->data = static_cast<char *>(t->data) + first_head * t->nb[2];
  view->dtype = dtype;
  view->device = crisp::Device::cpu;
  view->rank = 3;
  view->shape = {heads, tokens, t->ne[0]};
  view->stride = {static_cast<int64_t>(t->nb[2] / es), static_cast<int64_t>(t->nb[1] / es), 1};
  return true;
}

// F16 bit patterns of the two values llama.cpp's KQ mask holds for plain causal attention.
bool is_zero_f16(uint16_t bits) { return (bits & 0x7fff) == 0; }
bool is_minus_inf_f16(uint16_t bits) { return bits == 0xfc00; }

// n_past when the first n_q rows of the F16 mask [n_kv, >= n_q] are exactly bottom-right causal
// over a contiguous prefix of the cache: row i is 0 on cells [0, n_past + i] and -inf on the rest.
// -1 for anything else (non-causal, sliding window beyond its reach, several sequences, holes in
// the cache, ALiBi biases). Every cell is read: detect, don't guess.
int64_t causal_prefix(const ggml_tensor * mask, int64_t n_q) {
  const int64_t n_kv = mask->ne[0];
  const uint16_t * row0 = static_cast<const uint16_t *>(mask->data);
  int64_t visible = 0;
  while (visible < n_kv && is_zero_f16(row0[visible])) ++visible;
  const int64_t n_past = visible - 1;
  if (n_past < 0 || n_past + n_q > n_kv) return -1;
  for (int64_t i = 0; i < n_q; ++i) {
    const uint16_t * row = reinterpret_cast<const uint16_t *>(static_cast<const char *>(mask->data) + i * mask->nb[1]);
    const int64_t last = n_past + i;  // the last visible cell of row i
    for (int64_t j = 0; j <= last; ++j)
      if (!is_zero_f16(row[j])) return -1;
    for (int64_t j = last + 1; j < n_kv; ++j)
      if (!is_minus_inf_f16(row[j])) return -1;
  }
  return n_past;
}

// Why crisp cannot compute this op, or "" when it can. Depends only on the op's tensors.
std::string decline_reason(const ggml_tensor * dst, int64_t * n_past) {
  const ggml_tensor * q = dst->src[0];
  const ggml_tensor * k = dst->src[1];
  const ggml_tensor * v = dst->src[2];
  const ggml_tensor * mask = dst->src[3];
  const ggml_tensor * sinks = dst->src[4];
  float max_bias = 0.0f, softcap = 0.0f;
  std::memcpy(&max_bias, reinterpret_cast<const float *>(dst->op_params) + 1, sizeof(float));
  std::memcpy(&softcap, reinterpret_cast<const float *>(dst->op_params) + 2, sizeof(float));
  crisp::DType unused;
  if (max_bias != 0.0f) return "ALiBi (max_bias != 0)";
  if (softcap != 0.0f) return "logit softcap";
  if (sinks) return "attention sinks";
  if (!mask) return "no KQ mask (non-causal attention)";
  if (mask->type != GGML_TYPE_F16) return "a KQ mask that is not F16";
  if (mask->ne[2] != 1 || mask->ne[3] != 1) return "a KQ mask per head or per stream";
  if (q->ne[3] != 1 || k->ne[3] != 1 || v->ne[3] != 1) return "several KV streams in one ubatch";
  if (q->type != GGML_TYPE_F32) return "Q that is not F32";
  if (!crisp_dtype(k->type, &unused) || !crisp_dtype(v->type, &unused)) return "a quantised KV cache (F16, BF16 or F32 only)";
  if (k->ne[0] != v->ne[0]) return "K and V head dims differ";
  if (q->ne[0] > 256) return "head dim above 256";
  if (q->ne[2] % k->ne[2] != 0 || v->ne[2] != k->ne[2]) return "head counts that are not GQA";
  if (!ggml_is_contiguous(dst)) return "a non-contiguous output";
  crisp::TensorView probe;
  if (!view_of(q, 0, 1, 1, &probe) || !view_of(k, 0, 1, 1, &probe) || !view_of(v, 0, 1, 1, &probe))
    return "Q/K/V strides that are not whole elements";
  *n_past = causal_prefix(mask, q->ne[1]);
  if (*n_past < 0) return "a KQ mask that is not plain causal over a contiguous prefix (non-causal, sliding window, several sequences)";
  return "";
}

}  // namespace

extern "C" bool ggml_cpu_set_sparse_prefill(const char * policy, const char * const * settings, int n_settings,
                                            char * error, size_t error_size) {
  auto fail = [&](const std::string & message) {
    if (error && error_size > 0) std::snprintf(error, error_size, "%s", message.c_str());
    return false;
  };
  if (!policy) return fail("policy is null; expected crisp, flexprefill, minference, dense or off");
  if (n_settings < 0 || (n_settings > 0 && !settings)) return fail("settings: expected n_settings >= 0 key=value strings");
  const std::string name = policy;
  if (name != "crisp" && name != "flexprefill" && name != "minference" && name != "dense" && name != "off")
    return fail("unknown policy '" + name + "'; expected crisp, flexprefill, minference, dense or off");
  if (name == "off") {
    if (n_settings > 0) return fail("--sparse-prefill-set given with --sparse-prefill off");
    std::lock_guard<std::mutex> lock(g_mutex);
    g_setting.reset();
    return true;
  }
  auto setting = std::make_shared<SparsePrefill>();
  setting->policy = name;
  try {
    setting->config = crisp::Config::from_preset(name);
    for (int i = 0; i < n_settings; ++i) setting->config.set(std::string(settings[i]));
    setting->config.validate();
  } catch (const std::exception & e) {
    return fail(e.what());
  }
  // Each layer's scale is the model's (the op's scale parameter); a fixed one would be wrong.
  if (setting->config.softmax_scale != 0.0)
    return fail("softmax_scale: is set by the model in llama.cpp; expected it unset (0)");
  std::lock_guard<std::mutex> lock(g_mutex);
  g_setting = std::move(setting);
  return true;
}

extern "C" void ggml_cpu_get_sparse_prefill_stats(int64_t * handled, int64_t * declined) {
  if (handled) *handled = g_handled.load();
  if (declined) *declined = g_declined.load();
}

bool ggml_crisp_flash_attn_ext(ggml_tensor * dst, int ith, int nth) {
  const ggml_tensor * q = dst->src[0];
  if (q->ne[1] <= 1) return false;  // decode steps stay llama.cpp's
  const std::shared_ptr<const SparsePrefill> setting = current_setting();
  if (!setting) return false;

  int64_t n_past = -1;
  const std::string reason = decline_reason(dst, &n_past);
  if (!reason.empty()) {
    if (ith == 0) {
      ++g_declined;
      log_once("sparse prefill falls back to llama.cpp's attention: " + reason);
    }
    return false;
  }

  const ggml_tensor * k = dst->src[1];
  const ggml_tensor * v = dst->src[2];
  const int64_t n_q = q->ne[1], n_k = n_past + n_q;
  const int64_t heads = q->ne[2], group = q->ne[2] / k->ne[2], dim = q->ne[0];
  float scale = 1.0f;
  std::memcpy(&scale, dst->op_params, sizeof(float));
  crisp::Config config = setting->config;
  config.softmax_scale = scale;

  // ggml's threads split the query heads: each runs crisp on its heads, one head per call, with
  // one crisp thread (nested OpenMP would oversubscribe the cores ggml's threads already hold).
  // Plans are per (sequence, query head), so the split changes nothing in what is computed.
  crisp::Options options;
  options.num_threads = 1;
  // The ubatch's queries are the last n_q of the n_k = n_past + n_q cells (bottom-right causal):
  // a chunk of a chunked prefill, or the whole prompt when n_past == 0.
  const crisp::Batch batch({0, n_q}, {0, n_k});
  std::vector<float> lse(n_q);
  for (int64_t h = heads * ith / nth; h < heads * (ith + 1) / nth; ++h) {
    crisp::TensorView qv, kv, vv;
    view_of(q, h, 1, n_q, &qv);  // cannot fail: decline_reason probed the same tensors
    view_of(k, h / group, 1, n_k, &kv);
    view_of(v, h / group, 1, n_k, &vv);
    // dst is [DV, heads, n_q] (ggml's permuted result): head h of token t at (t * heads + h) rows.
    crisp::TensorView out;
    out.data = static_cast<char *>(dst->data) + h * dst->nb[1];
    out.dtype = crisp::DType::f32;
    out.shape = {1, n_q, dim};
    out.stride = {static_cast<int64_t>(dst->nb[1] / sizeof(float)), static_cast<int64_t>(dst->nb[2] / sizeof(float)), 1};
    const crisp::TensorView lse_view = crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, 1, n_q);
    try {
      crisp::prefill(qv, kv, vv, config, out, lse_view, batch, options);
    } catch (const std::exception & e) {
      // Past the checks above only non-finite Q/K/V values get here (crisp refuses them, where
      // llama.cpp's kernel would carry the NaN on). Other threads may have written their heads
      // already, so there is no consistent fallback left: stop with crisp's message.
      GGML_ABORT("crisp: sparse prefill failed on head %lld: %s", static_cast<long long>(h), e.what());
    }
  }
  if (ith == 0) {
    ++g_handled;
    log_once("sparse prefill '" + setting->policy + "' computes the attention of prompt ubatches");
  }
  return true;
}
