// integrations/llama.cpp/crisp_llama_capture.cpp — see crisp_llama_capture.h.
#include "crisp_llama_capture.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <utility>

#include "crisp/error.h"
#include "crisp/npy.h"
#include "ggml-backend.h"
#include "ggml.h"

namespace crisp_llama {

namespace {

// The bytes a tensor (or a view's span) covers, from whichever backend holds them.
std::vector<uint8_t> tensor_bytes(const ggml_tensor* t) {
  std::vector<uint8_t> bytes(ggml_nbytes(t));
  ggml_backend_tensor_get(t, bytes.data(), 0, bytes.size());
  return bytes;
}

// Whether rows along ne[0] of t can be converted to float: F32, or a type with to_float whose
// rows are stored whole (quantized blocks run along ne[0]).
bool convertible(const ggml_tensor* t) {
  if (t->type == GGML_TYPE_F32) return t->nb[0] == sizeof(float);
  const ggml_type_traits* traits = ggml_get_type_traits(t->type);
  return traits->to_float != nullptr && t->nb[0] == ggml_type_size(t->type) && t->ne[0] % ggml_blck_size(t->type) == 0;
}

void row_to_float(const ggml_tensor* t, const uint8_t* row, float* out) {
  if (t->type == GGML_TYPE_F32) {
    std::memcpy(out, row, static_cast<size_t>(t->ne[0]) * sizeof(float));
  } else {
    ggml_get_type_traits(t->type)->to_float(row, out, t->ne[0]);
  }
}

// [heads, n, ne[0]] float from t, its tokens along token_axis and its heads along head_axis.
std::vector<float> gather(const ggml_tensor* t, int token_axis, int head_axis, int64_t n) {
  const std::vector<uint8_t> bytes = tensor_bytes(t);
  const int64_t d = t->ne[0], heads = t->ne[head_axis];
  std::vector<float> out(static_cast<size_t>(heads * n * d));
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < n; ++i) {
      row_to_float(t, bytes.data() + i * t->nb[token_axis] + h * t->nb[head_axis], &out[static_cast<size_t>((h * n + i) * d)]);
    }
  }
  return out;
}

// The layer index in a cache view's name ("cache_k_l12 (view) (permuted)"), or -1.
int64_t cache_layer(const ggml_tensor* k) {
  int layer = -1;
  if (std::sscanf(k->name, "cache_k_l%d", &layer) != 1) return -1;
  return layer;
}

}  // namespace

AttentionCapture::AttentionCapture(std::string out_dir, std::vector<char> wanted, int64_t n_tokens, bool with_output)
    : out_dir_(std::move(out_dir)), wanted_(std::move(wanted)), n_tokens_(n_tokens), with_output_(with_output) {}

std::string AttentionCapture::layer_file(int64_t layer, const char* which) {
  char name[64];
  std::snprintf(name, sizeof(name), "layer_%02lld_%s.npy", static_cast<long long>(layer), which);
  return name;
}

bool AttentionCapture::callback(ggml_tensor* t, bool ask, void* user_data) {
  auto* self = static_cast<AttentionCapture*>(user_data);
  if (ask) return t->op == GGML_OP_FLASH_ATTN_EXT;
  if (t->op != GGML_OP_FLASH_ATTN_EXT || !self->error_.empty()) return self->error_.empty();
  try {
    return self->observe(t);
  } catch (const std::exception& e) {  // never through llama.cpp's C interface
    self->error_ = e.what();
    return false;
  }
}

std::optional<int64_t> AttentionCapture::mask_window(const ggml_tensor* mask) {
  if (auto it = mask_windows_.find(mask); it != mask_windows_.end()) return it->second;
  if (!convertible(mask)) throw crisp::Error("capture", std::string("the attention mask has type ") + ggml_type_name(mask->type), "F16 or F32");
  const std::vector<uint8_t> bytes = tensor_bytes(mask);
  const int64_t n_kv = mask->ne[0], n = n_tokens_;
  std::vector<float> row(static_cast<size_t>(n_kv));
  std::vector<int64_t> first(static_cast<size_t>(n));  // the first key row i sees
  const std::string expected = "every query i of the prompt seeing a contiguous range of keys that ends at i, "
                               "cells 0..n-1 holding the prompt's positions in order (a fresh cache, one sequence)";
  for (int64_t i = 0; i < n; ++i) {
    row_to_float(mask, bytes.data() + i * mask->nb[1], row.data());
    int64_t lo = -1, hi = -1, seen = 0;
    for (int64_t j = 0; j < n_kv; ++j) {
      if (std::isinf(row[j]) && row[j] < 0) continue;
      if (row[j] != 0.0f) throw crisp::Error("capture", "the mask adds a bias (" + std::to_string(row[j]) + ") to a key", "a 0 / -inf mask");
      if (lo < 0) lo = j;
      hi = j;
      ++seen;
    }
    if (hi != i || seen != hi - lo + 1) {
      throw crisp::Error("capture", "query " + std::to_string(i) + " sees " + std::to_string(seen) + " keys in [" +
                                        std::to_string(lo) + ", " + std::to_string(hi) + "]", expected);
    }
    first[i] = lo;
  }
  std::optional<int64_t> window;
  for (int64_t i = 0; i < n; ++i) {
    if (first[i] > 0) window = std::max(window.value_or(0), i - first[i] + 1);
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t want = window ? std::max<int64_t>(0, i - *window + 1) : 0;
    if (first[i] != want) {
      throw crisp::Error("capture", "query " + std::to_string(i) + " sees keys from " + std::to_string(first[i]) + ", not " +
                                        std::to_string(want), "a causal or sliding-window mask of one size");
    }
  }
  mask_windows_[mask] = window;
  return window;
}

bool AttentionCapture::observe(const ggml_tensor* node) {
  const ggml_tensor* q = node->src[0];
  const ggml_tensor* k = node->src[1];
  const ggml_tensor* v = node->src[2];
  const ggml_tensor* mask = node->src[3];
  const int64_t layer = cache_layer(k);
  const std::string where = "capture: layer " + std::to_string(layer);
  if (layer < 0) {
    throw crisp::Error("capture", std::string("a flash-attention node whose K is '") + k->name + "', not a view of cache_k_l<L>",
                       "attention over llama.cpp's KV cache");
  }
  if (layers_.count(layer) != 0) {
    throw crisp::Error(where, "ran twice: the prompt was split into several ubatches or decoded twice", "one ubatch (n_ubatch >= the prompt)");
  }
  if (q->ne[1] != n_tokens_ || q->ne[3] != 1 || k->ne[1] < n_tokens_) {
    throw crisp::Error(where, "attention of " + std::to_string(q->ne[1]) + " queries over " + std::to_string(k->ne[1]) +
                                  " cells (" + std::to_string(q->ne[3]) + " streams)",
                       "the whole prompt of " + std::to_string(n_tokens_) + " tokens in one ubatch of one sequence");
  }
  if (mask == nullptr) throw crisp::Error(where, "has no attention mask", "a causal model");
  float params[3];
  std::memcpy(params, node->op_params, sizeof params);  // scale, max_bias, logit_softcap (ggml_flash_attn_ext)
  if (params[1] != 0.0f || params[2] != 0.0f || node->src[4] != nullptr) {
    throw crisp::Error(where, "uses ALiBi, a logit softcap or attention sinks",
                       "softmax(q k^T * scale) attention (the capture format has no place for the others)");
  }
  for (const ggml_tensor* t : {q, k, v}) {
    if (!convertible(t)) throw crisp::Error(where, std::string("has a tensor of type ") + ggml_type_name(t->type), "a cache type with a float conversion");
  }
  CapturedLayer c;
  c.layer = layer;
  c.head_dim = q->ne[0];
  c.n_head = q->ne[2];
  c.n_head_kv = k->ne[2];
  c.kq_scale = params[0];
  c.window = mask_window(mask);
  c.k_type = ggml_type_name(k->type);
  c.v_type = ggml_type_name(v->type);
  if (k->ne[0] != c.head_dim || v->ne[0] != c.head_dim || v->ne[2] != c.n_head_kv || c.n_head % c.n_head_kv != 0) {
    throw crisp::Error(where, "Q, K, V of head sizes " + std::to_string(q->ne[0]) + ", " + std::to_string(k->ne[0]) + ", " +
                                  std::to_string(v->ne[0]) + " and " + std::to_string(c.n_head) + " / " + std::to_string(c.n_head_kv) + " heads",
                       "one head size, query heads a multiple of the KV heads");
  }
  if (layer < static_cast<int64_t>(wanted_.size()) && wanted_[layer]) {
    const std::vector<int64_t> q_shape{c.n_head, n_tokens_, c.head_dim}, kv_shape{c.n_head_kv, n_tokens_, c.head_dim};
    namespace fs = std::filesystem;
    std::vector<float> qs = gather(q, 1, 2, n_tokens_);
    // The capture format's attention is softmax(q k^T / sqrt(d)); a model whose op scale differs
    // (Gemma 3 scales q before the op and passes 1) is captured with that scale folded into q.
    const float rescale = c.kq_scale * std::sqrt(static_cast<float>(c.head_dim));
    if (std::abs(rescale - 1.0f) > 1e-6f) {
      for (float& x : qs) x *= rescale;
    }
    crisp::write_npy((fs::path(out_dir_) / layer_file(layer, "q")).string(), qs.data(), q_shape);
    crisp::write_npy((fs::path(out_dir_) / layer_file(layer, "k")).string(), gather(k, 1, 2, n_tokens_).data(), kv_shape);
    crisp::write_npy((fs::path(out_dir_) / layer_file(layer, "v")).string(), gather(v, 1, 2, n_tokens_).data(), kv_shape);
    if (with_output_) {  // the op's result: [d, n_head, n]
      crisp::write_npy((fs::path(out_dir_) / layer_file(layer, "o")).string(), gather(node, 2, 1, n_tokens_).data(), q_shape);
    }
    c.written = true;
  }
  layers_[layer] = c;
  return true;
}

void AttentionCapture::finish(int64_t n_layer) const {
  if (!error_.empty()) throw std::runtime_error(error_);
  for (int64_t l = 0; l < n_layer && l < static_cast<int64_t>(wanted_.size()); ++l) {
    if (wanted_[l] && layers_.count(l) == 0) {
      throw crisp::Error("--layers", "layer " + std::to_string(l) + " ran no flash-attention op over the KV cache",
                         "layers with attention (and flash attention on)");
    }
  }
}

}  // namespace crisp_llama
