// src/model/llama.cpp — the Llama-family decoder on the CPU (see llama.h).
#include "model/llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <ctime>

#include <unistd.h>  // sysconf

#include "common/shape_rules.h"
#include "common/fast_exp.h"  // fast_exp, CRISP_CPU_CLONES
#include "model/matmul.h"
#include "model/tokenizer.h"

#if defined(CRISP_WITH_CUDA)
#include "model/cuda/llama_cuda.h"
#endif

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace crisp {
namespace model {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int resolve_threads(int threads) {
  if (threads < 0 || threads > kMaxThreads)
    throw Error("threads", "is " + std::to_string(threads),
                "0 (all hardware threads) or a count up to " + std::to_string(kMaxThreads));
#if defined(_OPENMP)
  return threads > 0 ? threads : omp_get_max_threads();
#else
  (void)threads;
  return 1;
#endif
}

std::string shape_string(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

// Dequantises a tensor of the expected ggml shape (ne[0] = the contiguous dimension) into
// `dst` (which must hold its elements), rows in parallel.
void load_tensor_into(const GgufFile& file, const std::string& name, const std::vector<int64_t>& ne,
                      float* dst) {
  const GgufTensor& t = file.tensor(name);
  std::vector<int64_t> got = t.ne;
  while (got.size() > ne.size() && got.back() == 1) got.pop_back();  // trailing 1s are the same shape
  if (got != ne) {
    throw Error(name, "has shape " + shape_string(t.ne), "shape " + shape_string(ne) + " (ggml order)");
  }
  const int64_t row = ne[0];
  const int64_t rows = t.numel() / row;
  const std::size_t row_bytes = ggml_row_bytes(t.type, row);
  if (row_bytes * static_cast<std::size_t>(rows) > t.nbytes) {
    throw Error(name, "holds " + std::to_string(t.nbytes) + " bytes",
                std::to_string(row_bytes * rows) + " bytes for its shape and type " + to_string(t.type));
  }
  dequantize_rows(t.type, file.data(t), row_bytes, dst, rows, row);
}

std::vector<float> load_tensor(const GgufFile& file, const std::string& name, const std::vector<int64_t>& ne) {
  int64_t count = 1;
  for (int64_t e : ne) count *= e;
  std::vector<float> out(static_cast<size_t>(count));
  load_tensor_into(file, name, ne, out.data());
  return out;
}

int64_t positive_int(const GgufFile& file, const std::string& key) {
  const int64_t v = file.get_int(key);
  if (v <= 0) throw Error(key, "is " + std::to_string(v), "a positive integer");
  return v;
}

// y = x / sqrt(mean(x²) + eps) ⊙ weight, one row of `dim`.
inline void rms_norm_row(const float* x, const float* weight, float* y, int64_t dim, double eps) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < dim; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(sum_sq / static_cast<double>(dim) + eps));
  for (int64_t i = 0; i < dim; ++i) y[i] = (x[i] * inv) * weight[i];
}

void rms_norm_rows(const float* x, const float* weight, float* y, int64_t rows, int64_t dim, double eps,
                   int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows > 8)
  for (int64_t r = 0; r < rows; ++r) rms_norm_row(x + r * dim, weight, y + r * dim, dim, eps);
}

// a[i] = SiLU(g[i]) · u[i]. The library's clamped polynomial exp (a few ulp; no libm call, no
// errno, no inf or subnormal intermediates) vectorises; std::exp here cost more than all matmuls.
CRISP_CPU_CLONES void swiglu_row(const float* g, const float* u, float* a, int64_t ff) {
#pragma omp simd
  for (int64_t i = 0; i < ff; ++i) a[i] = g[i] / (1.0f + cpu::fast_exp(-g[i])) * u[i];
}

// act[r, i] = SiLU(gate[r, i]) · up[r, i], gate_up rows laid out [gate (ff) | up (ff)].
void swiglu_rows(const float* gate_up, float* act, int64_t rows, int64_t ff, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows > 8)
  for (int64_t r = 0; r < rows; ++r) swiglu_row(gate_up + r * 2 * ff, gate_up + r * 2 * ff + ff, act + r * ff, ff);
}

void add_rows(float* x, const float* delta, int64_t count) {
  for (int64_t i = 0; i < count; ++i) x[i] += delta[i];
}

}  // namespace

int32_t argmax(const float* values, int64_t count) {
  int64_t best = 0;
  for (int64_t i = 1; i < count; ++i)
    if (values[i] > values[best]) best = i;
  return static_cast<int32_t>(best);
}

// ---------------------------------------------------------------- backends

const char* to_string(ModelBackend backend) {
  switch (backend) {
    case ModelBackend::cpu: return "cpu";
    case ModelBackend::cuda: return "cuda";
  }
  return "?";
}

ModelBackend parse_model_backend(const std::string& name, const std::string& argument) {
  if (name == "cpu") return ModelBackend::cpu;
  if (name == "cuda") return ModelBackend::cuda;
  throw Error(argument, "unknown backend '" + name + "'", "cpu or cuda");
}

const char* to_string(CudaPrefillAttention attention) {
  switch (attention) {
    case CudaPrefillAttention::crisp_f16: return "f16";
    case CudaPrefillAttention::reference_f32: return "f32-reference";
  }
  return "?";
}

CudaPrefillAttention parse_cuda_prefill_attention(const std::string& name, const std::string& argument) {
  if (name == "f16") return CudaPrefillAttention::crisp_f16;
  if (name == "f32-reference") return CudaPrefillAttention::reference_f32;
  throw Error(argument, "is '" + name + "'", "f16 or f32-reference");
}

void require_model_backend(ModelBackend backend, const std::string& argument) {
  if (backend == ModelBackend::cpu) return;
#if defined(CRISP_WITH_CUDA)
  if (!cuda_runner::cuda_device_visible()) {
    throw Error(argument, "is cuda but no CUDA device is visible", "--backend cpu, or a machine with a GPU");
  }
#else
  throw Error(argument, "is cuda but this build has no CUDA backend",
              "--backend cpu, or a build configured with -DCRISP_CUDA=ON");
#endif
}

std::string model_backend_device(ModelBackend backend) {
#if defined(CRISP_WITH_CUDA)
  if (backend == ModelBackend::cuda) return cuda_runner::device_name();
#endif
  (void)backend;
  return "";
}

// ---------------------------------------------------------------- LlamaModel

LlamaModel::LlamaModel(const GgufFile& file) {
  hp_.architecture = file.get_string("general.architecture");
  if (hp_.architecture != "llama") {
    throw Error("general.architecture", "is '" + hp_.architecture + "'", "'llama' (a Llama-family model)");
  }
  const std::string p = hp_.architecture + ".";
  hp_.n_layer = positive_int(file, p + "block_count");
  hp_.n_embd = positive_int(file, p + "embedding_length");
  hp_.n_ff = positive_int(file, p + "feed_forward_length");
  hp_.n_head = positive_int(file, p + "attention.head_count");
  hp_.n_head_kv = file.has(p + "attention.head_count_kv") ? positive_int(file, p + "attention.head_count_kv")
                                                          : hp_.n_head;
  if (hp_.n_embd % hp_.n_head != 0) {
    throw Error(p + "attention.head_count", std::to_string(hp_.n_head) + " does not divide the embedding length " +
                                                std::to_string(hp_.n_embd), "a divisor of embedding_length");
  }
  if (hp_.n_head % hp_.n_head_kv != 0) {
    throw Error(p + "attention.head_count_kv", std::to_string(hp_.n_head_kv) + " does not divide head_count " +
                                                   std::to_string(hp_.n_head), "a divisor of head_count");
  }
  hp_.head_dim = hp_.n_embd / hp_.n_head;
  hp_.n_ctx_train = file.get_int_or(p + "context_length", 2048);
  hp_.rope_dim = file.get_int_or(p + "rope.dimension_count", hp_.head_dim);
  if (hp_.rope_dim <= 0 || hp_.rope_dim > hp_.head_dim || hp_.rope_dim % 2 != 0) {
    throw Error(p + "rope.dimension_count", "is " + std::to_string(hp_.rope_dim),
                "an even number <= the head dimension " + std::to_string(hp_.head_dim));
  }
  hp_.rope_freq_base = file.get_float_or(p + "rope.freq_base", 10000.0);
  hp_.rms_eps = file.get_float_or(p + "attention.layer_norm_rms_epsilon", 1e-5);
  // A file trained with its own RoPE scaling would need it applied always; not supported here.
  const std::string file_scaling = file.get_string_or(p + "rope.scaling.type", "none");
  if (file_scaling != "none") {
    throw Error(p + "rope.scaling.type", "is '" + file_scaling + "' (not supported by this runner)",
                "a model without built-in RoPE scaling");
  }

  const GgufTensor& embd = file.tensor("token_embd.weight");
  if (embd.ne.size() < 2 || embd.ne[0] != hp_.n_embd) {
    throw Error("token_embd.weight", "has shape " + shape_string(embd.ne),
                "[" + std::to_string(hp_.n_embd) + ", n_vocab]");
  }
  hp_.n_vocab = embd.ne[1];
  const int64_t E = hp_.n_embd, hd = hp_.head_dim;
  token_embd_ = load_tensor(file, "token_embd.weight", {E, hp_.n_vocab});
  output_norm_ = load_tensor(file, "output_norm.weight", {E});
  hp_.tied_embeddings = file.find_tensor("output.weight") == nullptr;
  if (!hp_.tied_embeddings) output_ = load_tensor(file, "output.weight", {E, hp_.n_vocab});

  const int64_t q_rows = hp_.n_head * hd, kv_rows = hp_.n_head_kv * hd;
  layers_.resize(static_cast<size_t>(hp_.n_layer));
  for (int64_t l = 0; l < hp_.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    LayerWeights& w = layers_[l];
    w.attn_norm = load_tensor(file, b + "attn_norm.weight", {E});
    w.ffn_norm = load_tensor(file, b + "ffn_norm.weight", {E});
    w.wqkv.resize(static_cast<size_t>((q_rows + 2 * kv_rows) * E));
    load_tensor_into(file, b + "attn_q.weight", {E, q_rows}, w.wqkv.data());
    load_tensor_into(file, b + "attn_k.weight", {E, kv_rows}, w.wqkv.data() + q_rows * E);
    load_tensor_into(file, b + "attn_v.weight", {E, kv_rows}, w.wqkv.data() + (q_rows + kv_rows) * E);
    w.wo = load_tensor(file, b + "attn_output.weight", {q_rows, E});
    w.w_gate_up.resize(static_cast<size_t>(2 * hp_.n_ff * E));
    load_tensor_into(file, b + "ffn_gate.weight", {E, hp_.n_ff}, w.w_gate_up.data());
    load_tensor_into(file, b + "ffn_up.weight", {E, hp_.n_ff}, w.w_gate_up.data() + hp_.n_ff * E);
    w.w_down = load_tensor(file, b + "ffn_down.weight", {hp_.n_ff, E});
  }
}

const float* LlamaModel::token_embedding(int32_t token) const {
  return token_embd_.data() + static_cast<int64_t>(token) * hp_.n_embd;
}

const float* LlamaModel::output_weight() const {
  return hp_.tied_embeddings ? token_embd_.data() : output_.data();
}

std::size_t LlamaModel::weight_bytes() const {
  std::size_t n = token_embd_.size() + output_.size() + output_norm_.size();
  for (const LayerWeights& w : layers_) {
    n += w.attn_norm.size() + w.wqkv.size() + w.wo.size() + w.ffn_norm.size() + w.w_gate_up.size() +
         w.w_down.size();
  }
  return n * sizeof(float);
}

// ---------------------------------------------------------------- LlamaContext

uint64_t kv_cache_bytes(const LlamaHparams& hp, int64_t positions) {
  return 2ull * static_cast<uint64_t>(hp.n_layer) * static_cast<uint64_t>(hp.n_head_kv) *
         static_cast<uint64_t>(hp.head_dim) * static_cast<uint64_t>(std::max<int64_t>(positions, 0)) * sizeof(float);
}

uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page_size = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page_size > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size) : 0;
}

void require_kv_cache_fits(const LlamaHparams& hp, int64_t positions, uint64_t memory_bytes,
                           const std::string& argument) {
  const uint64_t need = kv_cache_bytes(hp, positions);
  if (memory_bytes == 0 || need <= memory_bytes) return;
  auto gib = [](uint64_t bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
    return std::string(text);
  };
  const uint64_t per_position = kv_cache_bytes(hp, 1);
  throw Error(argument,
              std::to_string(positions) + " positions need a KV cache of " + gib(need) + ", more than this machine's " +
                  gib(memory_bytes) + " of memory",
              "at most " + std::to_string(memory_bytes / per_position) + " positions (prompt + new tokens)");
}

LlamaContext::LlamaContext(const LlamaModel& model, int64_t capacity, const RunOptions& options)
    : model_(model),
      options_(options),
      threads_(resolve_threads(options.threads)),
      capacity_(capacity),
      rope_(model.hparams().rope_dim, model.hparams().rope_freq_base, model.hparams().n_ctx_train, options.rope) {
  if (capacity <= 0) throw Error("capacity", "is " + std::to_string(capacity), "a positive token count");
  options_.attention.validate();
  const LlamaHparams& hp = model.hparams();
  rope_.reserve(capacity);
  if (options_.backend != ModelBackend::cpu) {
    require_model_backend(options_.backend, "--backend");
#if defined(CRISP_WITH_CUDA)
    device_ = cuda_runner::make_cuda_context(model_, capacity_, options_, rope_);
#endif
    return;
  }
  const size_t cache = static_cast<size_t>(hp.n_head_kv * capacity * hp.head_dim);
  k_cache_.assign(static_cast<size_t>(hp.n_layer), std::vector<float>(cache));
  v_cache_.assign(static_cast<size_t>(hp.n_layer), std::vector<float>(cache));
}

void LlamaContext::check_tokens(const std::vector<int32_t>& tokens) const {
  const int64_t vocab = model_.hparams().n_vocab;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      throw Error("tokens", "token " + std::to_string(i) + " has id " + std::to_string(tokens[i]),
                  "ids in [0, " + std::to_string(vocab) + ")");
    }
  }
}

void LlamaContext::logits_of(const float* hidden, int64_t rows, float* out) const {
  const LlamaHparams& hp = model_.hparams();
  std::vector<float> normed(static_cast<size_t>(rows * hp.n_embd));
  rms_norm_rows(hidden, model_.output_norm().data(), normed.data(), rows, hp.n_embd, hp.rms_eps, threads_);
  matmul_xwt(normed.data(), hp.n_embd, model_.output_weight(), hp.n_embd, out, hp.n_vocab, rows, hp.n_vocab,
             hp.n_embd, threads_);
}

// The attention of layer `layer`. Its q/k/v are the model's own activations: when the library
// refuses them (NaN/Inf, or magnitudes that overflow the scores) the cause is the model (corrupt
// weights such as a norm tensor, or activations that blow up), so the error names the layer and
// the activation rather than an argument the caller never passed.
Plan LlamaContext::prefill_attention(int64_t layer, const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& out, const TensorView& lse,
                                     const crisp::Options& attention_options) const {
  try {
    return crisp::prefill(q, k, v, options_.attention, out, lse, {}, attention_options);
  } catch (const Error& e) {
    const std::string& which = e.argument();
    if (which != "q" && which != "k" && which != "v") throw;
    throw Error("model", "layer " + std::to_string(layer) + ": its attention " + which +
                             " (the projected hidden state) is unusable: " + e.what(),
                "finite activations (a corrupt weight tensor, e.g. a norm, makes NaN/Inf)");
  }
}

PrefillResult LlamaContext::prefill(const std::vector<int32_t>& tokens, bool all_logits,
                                    const QkvObserver& observer) {
  const Clock::time_point start = Clock::now();
  const std::clock_t cpu_start = std::clock();
  const LlamaHparams& hp = model_.hparams();
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) throw Error("prompt", "is empty", "at least one token");
  if (position_ != 0) throw Error("prefill", "the context already holds tokens", "a fresh context");
  if (n > capacity_) {
    throw Error("prompt", "has " + std::to_string(n) + " tokens",
                "at most the context capacity " + std::to_string(capacity_));
  }
  check_tokens(tokens);
  if (device_) {
    PrefillResult result = device_->prefill(tokens, all_logits, observer);
    result.beyond_training = n > hp.n_ctx_train;
    position_ = n;
    result.seconds = seconds_since(start);
    result.cpu_seconds = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
    return result;
  }

  const int64_t E = hp.n_embd, hd = hp.head_dim, F = hp.n_ff;
  const int64_t Hq = hp.n_head, Hkv = hp.n_head_kv;
  const int64_t q_dim = Hq * hd, kv_dim = Hkv * hd, qkv_dim = q_dim + 2 * kv_dim;
  const int T = threads_;

  std::vector<float> x(static_cast<size_t>(n * E)), xn(static_cast<size_t>(n * E));
  std::vector<float> qkv(static_cast<size_t>(n * qkv_dim)), attn(static_cast<size_t>(n * q_dim));
  std::vector<float> delta(static_cast<size_t>(n * E)), gate_up(static_cast<size_t>(n * 2 * F));
  std::vector<float> act(static_cast<size_t>(n * F)), lse(static_cast<size_t>(Hq * n));
  for (int64_t t = 0; t < n; ++t) std::memcpy(&x[t * E], model_.token_embedding(tokens[t]), E * sizeof(float));

  crisp::Options attention_options;
  attention_options.precision = options_.attention_precision;
  attention_options.num_threads = T;

  PrefillResult result;
  result.tokens = n;
  result.threads = T;
  result.beyond_training = n > hp.n_ctx_train;
  result.layer_density.reserve(static_cast<size_t>(hp.n_layer));
  double vs_share_sum = 0.0;

  for (int64_t l = 0; l < hp.n_layer; ++l) {
    const LayerWeights& w = model_.layers()[l];
    float* k_cache = k_cache_[l].data();
    float* v_cache = v_cache_[l].data();

    rms_norm_rows(x.data(), w.attn_norm.data(), xn.data(), n, E, hp.rms_eps, T);
    matmul_xwt(xn.data(), E, w.wqkv.data(), E, qkv.data(), qkv_dim, n, qkv_dim, E, T);
#pragma omp parallel for schedule(static) num_threads(T)
    for (int64_t t = 0; t < n; ++t) {
      float* row = &qkv[t * qkv_dim];
      rope_.apply(row, Hq, hd, t);           // Q heads
      rope_.apply(row + q_dim, Hkv, hd, t);  // K heads
      for (int64_t g = 0; g < Hkv; ++g) {
        std::memcpy(k_cache + (g * capacity_ + t) * hd, row + q_dim + g * hd, hd * sizeof(float));
        std::memcpy(v_cache + (g * capacity_ + t) * hd, row + q_dim + kv_dim + g * hd, hd * sizeof(float));
      }
    }

    // Views straight into the token-major buffers: no transposes. Q [Hq, n, hd] inside qkv,
    // K/V [Hkv, n, hd] in the cache, O [Hq, n, hd] inside attn (token-major, ready for W_o).
    TensorView q_view{qkv.data(), DType::f32, Device::cpu, 3, {Hq, n, hd}, {hd, qkv_dim, 1}};
    TensorView k_view{k_cache, DType::f32, Device::cpu, 3, {Hkv, n, hd}, {capacity_ * hd, hd, 1}};
    TensorView v_view{v_cache, DType::f32, Device::cpu, 3, {Hkv, n, hd}, {capacity_ * hd, hd, 1}};
    TensorView o_view{attn.data(), DType::f32, Device::cpu, 3, {Hq, n, hd}, {hd, q_dim, 1}};
    TensorView lse_view = TensorView::contiguous2d(lse.data(), DType::f32, Hq, n);
    if (observer) observer(l, q_view, k_view, v_view);

    const Clock::time_point attention_start = Clock::now();
    const Plan plan = prefill_attention(l, q_view, k_view, v_view, o_view, lse_view, attention_options);
    result.attention_seconds += seconds_since(attention_start);
    result.layer_density.push_back(plan.density());
    vs_share_sum += plan.vs_share();

    matmul_xwt(attn.data(), q_dim, w.wo.data(), q_dim, delta.data(), E, n, E, q_dim, T);
    add_rows(x.data(), delta.data(), n * E);

    rms_norm_rows(x.data(), w.ffn_norm.data(), xn.data(), n, E, hp.rms_eps, T);
    matmul_xwt(xn.data(), E, w.w_gate_up.data(), E, gate_up.data(), 2 * F, n, 2 * F, E, T);
    swiglu_rows(gate_up.data(), act.data(), n, F, T);
    matmul_xwt(act.data(), F, w.w_down.data(), F, delta.data(), E, n, E, F, T);
    add_rows(x.data(), delta.data(), n * E);
  }

  const int64_t logit_rows = all_logits ? n : 1;
  result.logits.resize(static_cast<size_t>(logit_rows * hp.n_vocab));
  logits_of(x.data() + (n - logit_rows) * E, logit_rows, result.logits.data());

  double density_sum = 0.0;
  for (double d : result.layer_density) density_sum += d;
  result.density = density_sum / static_cast<double>(hp.n_layer);
  result.vs_share = vs_share_sum / static_cast<double>(hp.n_layer);
  position_ = n;
  result.seconds = seconds_since(start);
  result.cpu_seconds = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
  return result;
}

std::vector<float> LlamaContext::decode(int32_t token) {
  const LlamaHparams& hp = model_.hparams();
  check_tokens({token});
  if (position_ >= capacity_) {
    throw Error("decode", "the context is full (" + std::to_string(capacity_) + " positions)",
                "a context created with room for every generated token");
  }
  if (device_) {
    std::vector<float> logits = device_->decode(token, position_);
    ++position_;
    return logits;
  }
  const int64_t E = hp.n_embd, hd = hp.head_dim, F = hp.n_ff;
  const int64_t Hq = hp.n_head, Hkv = hp.n_head_kv, group = Hq / Hkv;
  const int64_t q_dim = Hq * hd, kv_dim = Hkv * hd, qkv_dim = q_dim + 2 * kv_dim;
  const int64_t pos = position_, keys = pos + 1;
  const int T = threads_;
  // Decode attention is the model's own: scale 1/sqrt(d) unless the config sets one.
  const float scale = static_cast<float>(shape_rules::resolve_softmax_scale(options_.attention.softmax_scale, hd));

  std::vector<float> x(model_.token_embedding(token), model_.token_embedding(token) + E);
  std::vector<float> xn(E), qkv(qkv_dim), attn(q_dim), delta(E), gate_up(2 * F), act(F);
  std::vector<float> scores(static_cast<size_t>(Hq * keys));

  for (int64_t l = 0; l < hp.n_layer; ++l) {
    const LayerWeights& w = model_.layers()[l];
    float* k_cache = k_cache_[l].data();
    float* v_cache = v_cache_[l].data();
    rms_norm_row(x.data(), w.attn_norm.data(), xn.data(), E, hp.rms_eps);
    matmul_xwt(xn.data(), E, w.wqkv.data(), E, qkv.data(), qkv_dim, 1, qkv_dim, E, T);
    rope_.apply(qkv.data(), Hq, hd, pos);
    rope_.apply(qkv.data() + q_dim, Hkv, hd, pos);
    for (int64_t g = 0; g < Hkv; ++g) {
      std::memcpy(k_cache + (g * capacity_ + pos) * hd, &qkv[q_dim + g * hd], hd * sizeof(float));
      std::memcpy(v_cache + (g * capacity_ + pos) * hd, &qkv[q_dim + kv_dim + g * hd], hd * sizeof(float));
    }
    // Dense attention of the one new query over every cached key (softmax in float, max-shifted).
#pragma omp parallel for schedule(static) num_threads(T) if (keys > 256)
    for (int64_t h = 0; h < Hq; ++h) {
      const float* q = &qkv[h * hd];
      const float* kc = k_cache + (h / group) * capacity_ * hd;
      const float* vc = v_cache + (h / group) * capacity_ * hd;
      float* s = &scores[h * keys];
      float max_score = -INFINITY;
      for (int64_t t = 0; t < keys; ++t) {
        float dot = 0.0f;
        for (int64_t i = 0; i < hd; ++i) dot += q[i] * kc[t * hd + i];
        s[t] = dot * scale;
        max_score = std::max(max_score, s[t]);
      }
      double sum = 0.0;
      for (int64_t t = 0; t < keys; ++t) {
        s[t] = std::exp(s[t] - max_score);
        sum += s[t];
      }
      const float inv = static_cast<float>(1.0 / sum);
      float* o = &attn[h * hd];
      std::fill(o, o + hd, 0.0f);
      for (int64_t t = 0; t < keys; ++t) {
        const float p = s[t] * inv;
        for (int64_t i = 0; i < hd; ++i) o[i] += p * vc[t * hd + i];
      }
    }
    matmul_xwt(attn.data(), q_dim, w.wo.data(), q_dim, delta.data(), E, 1, E, q_dim, T);
    add_rows(x.data(), delta.data(), E);
    rms_norm_row(x.data(), w.ffn_norm.data(), xn.data(), E, hp.rms_eps);
    matmul_xwt(xn.data(), E, w.w_gate_up.data(), E, gate_up.data(), 2 * F, 1, 2 * F, E, T);
    swiglu_rows(gate_up.data(), act.data(), 1, F, T);
    matmul_xwt(act.data(), F, w.w_down.data(), F, delta.data(), E, 1, E, F, T);
    add_rows(x.data(), delta.data(), E);
  }
  position_ = keys;
  std::vector<float> logits(static_cast<size_t>(hp.n_vocab));
  logits_of(x.data(), 1, logits.data());
  return logits;
}

// ---------------------------------------------------------------- free functions

double warm_up_backend(const LlamaModel& model, const RunOptions& options) {
  if (options.backend == ModelBackend::cpu) return 0.0;
  const Clock::time_point start = Clock::now();
  RunOptions dense = options;
  dense.attention = crisp::Config::from_preset("dense");
  dense.rope = {};
  // NOTE: 16 tokens: enough to launch every kernel of a prefill and a decode step once.
  constexpr int64_t kWarmUpTokens = 16;
  LlamaContext context(model, kWarmUpTokens + 1, dense);
  const int32_t token = static_cast<int32_t>(std::min<int64_t>(1, model.hparams().n_vocab - 1));
  context.prefill(std::vector<int32_t>(kWarmUpTokens, token));
  context.decode(token);
  return seconds_since(start);
}

std::vector<float> prefill_logits(const LlamaModel& model, const std::vector<int32_t>& tokens,
                                  const RunOptions& options, PrefillResult* stats) {
  LlamaContext context(model, std::max<int64_t>(1, static_cast<int64_t>(tokens.size())), options);
  PrefillResult result = context.prefill(tokens);
  std::vector<float> logits = std::move(result.logits);
  if (stats) *stats = std::move(result);
  return logits;
}

std::vector<LayerQkv> capture_qkv(const LlamaModel& model, const std::vector<int32_t>& tokens,
                                  const std::vector<int64_t>& layers, const RunOptions& options) {
  const LlamaHparams& hp = model.hparams();
  std::vector<char> wanted(static_cast<size_t>(hp.n_layer), layers.empty() ? 1 : 0);
  for (int64_t l : layers) {
    if (l < 0 || l >= hp.n_layer) {
      throw Error("layers", "layer " + std::to_string(l) + " does not exist",
                  "layers in [0, " + std::to_string(hp.n_layer) + ")");
    }
    wanted[l] = 1;
  }
  std::vector<LayerQkv> captured;
  // Copies a strided [heads, n, d] view into a contiguous buffer.
  auto copy_view = [](const TensorView& v) {
    std::vector<float> out(static_cast<size_t>(v.numel()));
    const float* src = static_cast<const float*>(v.data);
    for (int64_t h = 0; h < v.heads(); ++h)
      for (int64_t t = 0; t < v.tokens(); ++t)
        std::memcpy(&out[(h * v.tokens() + t) * v.dim()], src + v.offset(h, t), v.dim() * sizeof(float));
    return out;
  };
  QkvObserver observer = [&](int64_t layer, const TensorView& q, const TensorView& k, const TensorView& v) {
    if (!wanted[layer]) return;
    LayerQkv c;
    c.layer = layer;
    c.tokens = q.tokens();
    c.q = copy_view(q);
    c.k = copy_view(k);
    c.v = copy_view(v);
    captured.push_back(std::move(c));
  };
  LlamaContext context(model, std::max<int64_t>(1, static_cast<int64_t>(tokens.size())), options);
  context.prefill(tokens, false, observer);
  return captured;
}

GenerateResult generate(const LlamaModel& model, const Tokenizer& tokenizer, const std::vector<int32_t>& prompt,
                        const GenerateOptions& options, const std::function<void(const std::string&)>& on_token) {
  if (options.max_new_tokens < 1) {
    throw Error("max_new_tokens", "is " + std::to_string(options.max_new_tokens), "at least 1");
  }
  const Clock::time_point start = Clock::now();
  LlamaContext context(model, static_cast<int64_t>(prompt.size()) + options.max_new_tokens, options.run);
  GenerateResult result;
  result.prefill = context.prefill(prompt);
  int32_t next = argmax(result.prefill.logits.data(), model.hparams().n_vocab);
  result.prefill.logits.clear();
  result.prefill.logits.shrink_to_fit();
  result.time_to_first_token = seconds_since(start);
  if (context.position() > model.hparams().n_ctx_train) result.prefill.beyond_training = true;

  const Clock::time_point decode_start = Clock::now();
  while (true) {
    if (tokenizer.is_end_of_generation(next)) {
      result.stopped_at_end = true;
      break;
    }
    result.tokens.push_back(next);
    if (on_token) on_token(tokenizer.token_text(next));
    if (static_cast<int64_t>(result.tokens.size()) >= options.max_new_tokens) break;
    const std::vector<float> logits = context.decode(next);
    next = argmax(logits.data(), model.hparams().n_vocab);
  }
  result.decode_seconds = seconds_since(decode_start);
  if (context.position() > model.hparams().n_ctx_train) result.prefill.beyond_training = true;
  result.text = tokenizer.decode(result.tokens);
  return result;
}

}  // namespace model
}  // namespace crisp
