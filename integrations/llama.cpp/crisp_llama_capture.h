// integrations/llama.cpp/crisp_llama_capture.h — the Q/K/V that llama.cpp's attention reads in a
// prompt's prefill, observed through llama.cpp's eval callback (llama_context_params::cb_eval, as
// llama.cpp's eval-callback and imatrix tools do) and written in the capture format of
// `crisp eval fidelity` / `crisp eval pareto --captures`: per layer layer_LL_q.npy [n_head, n, d]
// and layer_LL_k.npy / layer_LL_v.npy [n_head_kv, n, d], float32.
//
//   AttentionCapture capture(out_dir, wanted_layers, n_tokens, with_output);
//   params.cb_eval = AttentionCapture::callback; params.cb_eval_user_data = &capture;
//   llama_decode(...);             // the whole prompt in one ubatch (n_ubatch >= n_tokens)
//   capture.finish(n_layer);       // throws crisp::Error on anything the callback refused
//
// The observed node is each layer's GGML_OP_FLASH_ATTN_EXT: src[0] the queries after RoPE
// (permuted to [d, n, n_head]), src[1] / src[2] views of the layer's K / V cache
// ([d, n_kv, n_head_kv], the cache's type: F16 by default), src[3] the mask. Its layer is the
// index in the cache tensor's name (cache_k_l<L>); its mask tells causal from sliding-window.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

struct ggml_tensor;

namespace crisp_llama {

struct CapturedLayer {
  int64_t layer = 0;
  int64_t n_head = 0, n_head_kv = 0, head_dim = 0;
  float kq_scale = 0;                 // the op's softmax scale (the captured q is rescaled to 1/sqrt(d))
  std::optional<int64_t> window;      // keys each query sees in a sliding-window layer; none: causal
  std::string k_type, v_type;         // the cache's types (the captured K/V are its values)
  bool written = false;               // a wanted layer: its .npy files are written
};

class AttentionCapture {
 public:
  // wanted[l]: write layer l's files into out_dir. n_tokens: the prompt's length, all in one ubatch.
  // with_output: also layer_LL_o.npy [n_head, n, d], llama.cpp's attention output of the layer.
  AttentionCapture(std::string out_dir, std::vector<char> wanted, int64_t n_tokens, bool with_output);

  // llama.cpp's cb_eval (ggml_backend_sched_eval_callback). Asks to see every flash-attention
  // node; on one that cannot be captured it records why and returns false (the graph stops).
  static bool callback(ggml_tensor* t, bool ask, void* user_data);

  // After llama_decode: throws crisp::Error with the first refusal, or when a wanted layer of the
  // model's n_layer was not observed (e.g. flash attention off, or a layer without attention).
  void finish(int64_t n_layer) const;

  // Every observed layer (wanted or not), by layer index.
  const std::map<int64_t, CapturedLayer>& layers() const { return layers_; }

  static std::string layer_file(int64_t layer, const char* which);

 private:
  bool observe(const ggml_tensor* node);
  // The window of the mask tensor (causal: none), checked once per mask: row i must see exactly
  // the keys [max(0, i - w + 1), i] of cells 0..n-1, i.e. the cache holds the prompt in order.
  std::optional<int64_t> mask_window(const ggml_tensor* mask);

  std::string out_dir_;
  std::vector<char> wanted_;
  int64_t n_tokens_;
  bool with_output_;
  std::map<int64_t, CapturedLayer> layers_;
  std::map<const ggml_tensor*, std::optional<int64_t>> mask_windows_;
  std::string error_;
};

}  // namespace crisp_llama
