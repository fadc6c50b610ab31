// src/model/llama.h — a Llama-family decoder (SmolLM2, Llama 2/3 shapes) run from a GGUF file on
// the CPU, with the prefill attention going through the crisp library.
//
//   GgufFile file(path);
//   LlamaModel model(file);                       // weights dequantised to float32
//   LlamaContext ctx(model, capacity, options);   // KV cache + RoPE table of one sequence
//   PrefillResult r = ctx.prefill(tokens);        // crisp::prefill with options.attention
//   std::vector<float> next = ctx.decode(token);  // dense attention over the KV cache
//
// One layer: h += W_o · Attn(RoPE(W_q · n1), RoPE(W_k · n1), W_v · n1), n1 = RMSNorm(h);
//            h += W_down · (SiLU(W_gate · n2) ⊙ W_up · n2), n2 = RMSNorm(h).
// Logits = W_out · RMSNorm(h), W_out the token embedding when the file has no output.weight.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "crisp/crisp.h"
#include "model/gguf.h"
#include "model/rope.h"

namespace crisp {
namespace model {

class Tokenizer;

// Shapes and constants, read from the file's "<arch>.*" metadata.
struct LlamaHparams {
  std::string architecture;   // general.architecture ("llama")
  int64_t n_layer = 0;        // block_count
  int64_t n_embd = 0;         // embedding_length
  int64_t n_ff = 0;           // feed_forward_length
  int64_t n_head = 0;         // attention.head_count
  int64_t n_head_kv = 0;      // attention.head_count_kv
  int64_t head_dim = 0;       // n_embd / n_head
  int64_t n_vocab = 0;        // rows of token_embd.weight
  int64_t n_ctx_train = 0;    // context_length
  int64_t rope_dim = 0;       // rope.dimension_count (default head_dim)
  double rope_freq_base = 10000.0;
  double rms_eps = 1e-5;      // attention.layer_norm_rms_epsilon
  bool tied_embeddings = false;  // no output.weight: logits use token_embd.weight
};

struct LayerWeights {
  std::vector<float> attn_norm;  // [n_embd]
  std::vector<float> wqkv;       // [(n_head + 2 n_head_kv) head_dim, n_embd]: Q rows, K rows, V rows
  std::vector<float> wo;         // [n_embd, n_head head_dim]
  std::vector<float> ffn_norm;   // [n_embd]
  std::vector<float> w_gate_up;  // [2 n_ff, n_embd]: gate rows then up rows
  std::vector<float> w_down;     // [n_embd, n_ff]
};

class LlamaModel {
 public:
  // Reads hparams and dequantises every weight to float32 (rows stay in file order: one
  // contiguous row per output feature). Throws crisp::Error naming the tensor or key for a file
  // that is not a Llama-family model or whose tensors have unexpected shapes.
  explicit LlamaModel(const GgufFile& file);

  const LlamaHparams& hparams() const { return hp_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const float* token_embedding(int32_t token) const;  // [n_embd]; token checked by the caller
  const std::vector<float>& output_norm() const { return output_norm_; }
  const float* output_weight() const;                   // [n_vocab, n_embd]
  std::size_t weight_bytes() const;

  // Storage for a backend's own copy of the weights (the CUDA runner uploads them on first use
  // and keeps them here, so every context of this model shares one upload). Opaque here.
  std::shared_ptr<void>& backend_cache() const { return backend_cache_; }

 private:
  LlamaHparams hp_;
  mutable std::shared_ptr<void> backend_cache_;
  std::vector<float> token_embd_;  // [n_vocab, n_embd]
  std::vector<float> output_;      // [n_vocab, n_embd], empty when tied
  std::vector<float> output_norm_;
  std::vector<LayerWeights> layers_;
};

// Where the model runs.
enum class ModelBackend {
  cpu,   // float32 matmuls (src/model/matmul.h), crisp::prefill on CPU views
  cuda,  // float32 cuBLAS matmuls, crisp::cuda::plan_async + attend_async (src/model/cuda/)
};
const char* to_string(ModelBackend backend);
// "cpu" or "cuda"; throws crisp::Error naming `argument` otherwise.
ModelBackend parse_model_backend(const std::string& name, const std::string& argument = "--backend");
// Throws crisp::Error naming `argument` when `backend` cannot run here: a CPU-only build ("this
// build has no CUDA backend") or no visible CUDA device. Cheap: call it before loading a model.
void require_model_backend(ModelBackend backend, const std::string& argument = "--backend");

// The device a backend runs on, for reports: "" for the CPU, the GPU's name for CUDA.
std::string model_backend_device(ModelBackend backend);

// Prefill attention arithmetic of the CUDA backend.
enum class CudaPrefillAttention {
  // crisp's CUDA kernel (attend_async) on float16 copies of the post-RoPE Q/K/V, output rounded
  // to float16: the fast path, what `crisp run` and `crisp eval niah` measure.
  crisp_f16,
  // A plain float32 kernel that follows the same device plan (one warp per query row): as exact
  // as the CPU backend, for logit checks; O(n^2) without tensor cores, slow past a few thousand
  // tokens.
  reference_f32,
};

// "f16" (crisp_f16) or "f32-reference" (reference_f32), the names of the command line.
const char* to_string(CudaPrefillAttention attention);
CudaPrefillAttention parse_cuda_prefill_attention(const std::string& name,
                                                  const std::string& argument = "--cuda-attention");

// How one sequence is run.
struct RunOptions {
  // Prefill attention: any crisp preset/config (the dense preset is the exact model).
  crisp::Config attention = crisp::Config::from_preset("dense");
  crisp::Precision attention_precision = crisp::Precision::f32;  // CPU backend only
  RopeScaling rope;
  int threads = 0;  // OpenMP threads for matmuls and attention (0 = all)
  ModelBackend backend = ModelBackend::cpu;
  CudaPrefillAttention cuda_attention = CudaPrefillAttention::crisp_f16;  // CUDA backend only
  // CUDA backend, for tests: fill every device buffer with NaN bytes (0xFF) when it is allocated,
  // so a value a kernel should have written but did not shows up as NaN in the logits.
  bool cuda_poison_buffers = false;
};

// Makes the backend ready for `model` outside any timed region: the CUDA backend uploads the
// weights (once per model) and initialises cuBLAS and the kernels by running a 16-token dense
// prefill. Returns the seconds it took (0 for the CPU, which needs nothing).
double warm_up_backend(const LlamaModel& model, const RunOptions& options);

// Post-RoPE projections of one layer during prefill (views into the runner's buffers, valid only
// during the callback): q [n_head, n, head_dim], k and v [n_head_kv, n, head_dim].
using QkvObserver =
    std::function<void(int64_t layer, const TensorView& q, const TensorView& k, const TensorView& v)>;

struct PrefillResult {
  int64_t tokens = 0;
  std::vector<float> logits;   // [n_vocab] of the last position, or [tokens, n_vocab] if asked
  double seconds = 0.0;        // whole prefill, logits included (wall clock)
  double cpu_seconds = 0.0;    // process CPU time over the prefill, all threads (std::clock): on
                               // a shared machine, wall time / cpu_seconds shows the contention
  int threads = 1;             // OpenMP threads used
  double attention_seconds = 0.0;  // time inside crisp::prefill (plan + attend), all layers;
                                   // CUDA: CUDA-event time of plan_async + attend_async (the
                                   // float16 conversion of Q/K/V included), summed over layers
  double density = 1.0;        // mean over layers of Plan::density()
  double vs_share = 0.0;       // mean over layers of Plan::vs_share()
  std::vector<double> layer_density;
  bool beyond_training = false;  // some position >= the trained context
};

namespace detail {
// A non-CPU implementation of one LlamaContext (src/model/cuda/). LlamaContext checks the
// arguments (token ids, capacity, position) before calling it.
class ContextBackend {
 public:
  virtual ~ContextBackend() = default;
  // Tokens at positions [0, n); fills every PrefillResult field but `seconds`/`cpu_seconds`.
  virtual PrefillResult prefill(const std::vector<int32_t>& tokens, bool all_logits,
                                const QkvObserver& observer) = 0;
  // One token at `position`; returns the next token's logits.
  virtual std::vector<float> decode(int32_t token, int64_t position) = 0;
};
}  // namespace detail

// The KV cache and RoPE table of one sequence (on the backend of options.backend).
class LlamaContext {
 public:
  // capacity: the most positions the sequence will hold (prompt + generated tokens).
  LlamaContext(const LlamaModel& model, int64_t capacity, const RunOptions& options = {});

  // Runs the prompt from position 0 (the context must be empty). all_logits: logits of every
  // position instead of the last only. observer: called per layer with post-RoPE Q/K/V.
  PrefillResult prefill(const std::vector<int32_t>& tokens, bool all_logits = false,
                        const QkvObserver& observer = {});
  // Appends one token and returns the logits of the next one (dense attention over the cache).
  std::vector<float> decode(int32_t token);

  int64_t position() const { return position_; }
  int64_t capacity() const { return capacity_; }
  const RunOptions& options() const { return options_; }

 private:
  void check_tokens(const std::vector<int32_t>& tokens) const;
  void logits_of(const float* hidden, int64_t rows, float* out) const;
  Plan prefill_attention(int64_t layer, const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& out, const TensorView& lse, const crisp::Options& attention_options) const;

  const LlamaModel& model_;
  RunOptions options_;
  int threads_;
  int64_t capacity_;
  int64_t position_ = 0;
  Rope rope_;
  // Per layer: [n_head_kv, capacity, head_dim], post-RoPE keys and values (CPU backend).
  std::vector<std::vector<float>> k_cache_, v_cache_;
  std::unique_ptr<detail::ContextBackend> device_;  // set for a non-CPU backend
};

// Bytes of the KV cache of `positions` positions: every layer's float32 keys and values.
uint64_t kv_cache_bytes(const LlamaHparams& hp, int64_t positions);
// This machine's physical memory in bytes (0 when unknown).
uint64_t physical_memory_bytes();
// Throws crisp::Error naming `argument` when the KV cache of `positions` positions would need more
// than `memory_bytes` (a 1M-token cache of SmolLM2 is 46 GB); memory_bytes 0 means no limit.
void require_kv_cache_fits(const LlamaHparams& hp, int64_t positions, uint64_t memory_bytes,
                           const std::string& argument);

// The last position's logits of a prompt ([n_vocab]).
std::vector<float> prefill_logits(const LlamaModel& model, const std::vector<int32_t>& tokens,
                                  const RunOptions& options = {}, PrefillResult* stats = nullptr);

// Post-RoPE Q/K/V of the chosen layers (all when `layers` is empty) for a prompt, computed with
// options.attention (dense by default, i.e. the model's own maps).
struct LayerQkv {
  int64_t layer = 0;
  int64_t tokens = 0;
  std::vector<float> q;  // [n_head, tokens, head_dim]
  std::vector<float> k;  // [n_head_kv, tokens, head_dim]
  std::vector<float> v;  // [n_head_kv, tokens, head_dim]
};
std::vector<LayerQkv> capture_qkv(const LlamaModel& model, const std::vector<int32_t>& tokens,
                                  const std::vector<int64_t>& layers = {},
                                  const RunOptions& options = {});

// Greedy generation.
struct GenerateOptions {
  int64_t max_new_tokens = 128;
  RunOptions run;
};
struct GenerateResult {
  std::vector<int32_t> tokens;   // generated, the end-of-generation token excluded
  std::string text;
  bool stopped_at_end = false;   // an end-of-generation token ended it (else max_new_tokens)
  PrefillResult prefill;         // logits not kept
  double time_to_first_token = 0.0;  // seconds: prefill + choosing the first token
  double decode_seconds = 0.0;       // the tokens after the first
};
// on_token (optional) receives each generated token's text as soon as it is chosen.
GenerateResult generate(const LlamaModel& model, const Tokenizer& tokenizer,
                        const std::vector<int32_t>& prompt, const GenerateOptions& options,
                        const std::function<void(const std::string&)>& on_token = {});

// Index of the largest value (the first on ties).
int32_t argmax(const float* values, int64_t count);

}  // namespace model
}  // namespace crisp
