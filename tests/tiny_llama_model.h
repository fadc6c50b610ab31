// tests/tiny_llama_model.h — a tiny Llama-architecture GGUF file with random float32 weights and
// a byte-level BPE vocabulary, written with tests/gguf_writer.h: the model runner end to end
// (GGUF reader, tokenizer, both backends) in CI, without the real model.
//
// Shape: 2 layers, 4 query heads and 2 KV heads of head_dim 64 (GQA group 2), embedding 256,
// feed-forward 512, vocabulary 3 control tokens + 256 byte tokens + a few merges (~270).
// The weights are uniform in ±weight_range: large enough (0.2) that the attention maps are
// peaked and uneven (scores of a few units), so sparse policies keep different blocks per head
// rather than seeing a uniform map.
#pragma once
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gguf_writer.h"

namespace crisp_test {

struct TinyLlamaSpec {
  uint32_t layers = 2;
  uint32_t embd = 256;
  uint32_t heads = 4;
  uint32_t kv_heads = 2;
  uint32_t ff = 512;
  uint32_t context = 4096;       // llama.context_length
  float rope_base = 10000.0f;
  float weight_range = 0.2f;     // uniform(-r, r) for the projection weights
  uint32_t seed = 7;
};

namespace tiny_detail {

inline std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(float));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

}  // namespace tiny_detail

// Writes the model to `path`; returns its vocabulary size.
inline uint32_t write_tiny_llama(const std::string& path, const TinyLlamaSpec& spec = {}) {
  using tiny_detail::f32_bytes;
  std::vector<std::string> tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  std::vector<int32_t> types = {3, 3, 3};
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(gpt2_spell_byte(static_cast<unsigned char>(b)));
    types.push_back(1);
  }
  const std::vector<std::string> merges = {"t h", "th e", "Ġ the", "i n", "a n", "e r", "o n", "r e", "Ġ a"};
  for (const std::string& m : merges) {
    const std::size_t sp = m.find(' ');
    tokens.push_back(m.substr(0, sp) + m.substr(sp + 1));
    types.push_back(1);
  }
  const uint32_t vocab = static_cast<uint32_t>(tokens.size());

  GgufWriter w;
  w.string("general.architecture", "llama");
  w.u32("llama.block_count", spec.layers);
  w.u32("llama.embedding_length", spec.embd);
  w.u32("llama.feed_forward_length", spec.ff);
  w.u32("llama.attention.head_count", spec.heads);
  w.u32("llama.attention.head_count_kv", spec.kv_heads);
  w.u32("llama.context_length", spec.context);
  w.f32("llama.rope.freq_base", spec.rope_base);
  w.f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.string("tokenizer.ggml.model", "gpt2");
  w.string("tokenizer.ggml.pre", "smollm");
  w.string_array("tokenizer.ggml.tokens", tokens);
  w.i32_array("tokenizer.ggml.token_type", types);
  w.string_array("tokenizer.ggml.merges", merges);
  w.u32("tokenizer.ggml.bos_token_id", 1);
  w.u32("tokenizer.ggml.eos_token_id", 2);
  w.string("tokenizer.chat_template",
           "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
           "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}");

  std::mt19937 rng(spec.seed);
  auto uniform = [&](std::size_t count, float range) {
    std::uniform_real_distribution<float> dist(-range, range);
    std::vector<float> v(count);
    for (float& x : v) x = dist(rng);
    return v;
  };
  auto norm_weight = [&](std::size_t count) {  // around 1, as trained RMSNorm weights are
    std::uniform_real_distribution<float> dist(0.8f, 1.2f);
    std::vector<float> v(count);
    for (float& x : v) x = dist(rng);
    return v;
  };
  const uint64_t E = spec.embd, hd = spec.embd / spec.heads, q_rows = spec.heads * hd, kv_rows = spec.kv_heads * hd;
  const uint32_t kF32 = 0;  // ggml type id
  w.tensor("token_embd.weight", kF32, {E, vocab}, f32_bytes(uniform(E * vocab, 1.0f)));
  w.tensor("output_norm.weight", kF32, {E}, f32_bytes(norm_weight(E)));
  const float r = spec.weight_range;
  // NOTE: the MLP and output projections are scaled down by sqrt(fan-in / E)-ish factors so the
  // residual stream stays O(1) over the layers instead of growing with each random projection.
  for (uint32_t l = 0; l < spec.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    w.tensor(b + "attn_norm.weight", kF32, {E}, f32_bytes(norm_weight(E)));
    w.tensor(b + "attn_q.weight", kF32, {E, q_rows}, f32_bytes(uniform(E * q_rows, r)));
    w.tensor(b + "attn_k.weight", kF32, {E, kv_rows}, f32_bytes(uniform(E * kv_rows, r)));
    w.tensor(b + "attn_v.weight", kF32, {E, kv_rows}, f32_bytes(uniform(E * kv_rows, r)));
    w.tensor(b + "attn_output.weight", kF32, {q_rows, E}, f32_bytes(uniform(q_rows * E, 0.5f * r)));
    w.tensor(b + "ffn_norm.weight", kF32, {E}, f32_bytes(norm_weight(E)));
    w.tensor(b + "ffn_gate.weight", kF32, {E, spec.ff}, f32_bytes(uniform(E * spec.ff, r)));
    w.tensor(b + "ffn_up.weight", kF32, {E, spec.ff}, f32_bytes(uniform(E * spec.ff, r)));
    w.tensor(b + "ffn_down.weight", kF32, {spec.ff, E}, f32_bytes(uniform(spec.ff * E, 0.5f * r)));
  }
  write_file(path, w.bytes());
  return vocab;
}

// A deterministic pseudo-random prompt of `count` token ids in [3, vocab) (no control tokens).
inline std::vector<int32_t> tiny_prompt(int64_t count, uint32_t vocab, uint32_t seed = 11) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(3, static_cast<int32_t>(vocab) - 1);
  std::vector<int32_t> ids(static_cast<std::size_t>(count));
  for (int32_t& t : ids) t = dist(rng);
  return ids;
}

}  // namespace crisp_test
