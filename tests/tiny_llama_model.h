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
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
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
  // ggml type id of the projection matrices (attention and MLP); the embedding and the norms stay
  // float32. Block types get pseudo-random codes (see tiny_detail::weight_bytes).
  uint32_t weight_type = 0;
  // Called with each float32 norm weight before it is written (name, values): lets a test corrupt one.
  std::function<void(const std::string&, std::vector<float>&)> edit_norm;
};

namespace tiny_detail {

inline std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(float));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// Block geometry and scale fields of the ggml block types (from the format's block definitions):
// elements and bytes per block, the byte offsets of its f16 scale fields, and the largest
// |value| / scale that its codes and sub-block scales can reach.
struct BlockFormat {
  uint32_t type;
  uint32_t elements, bytes;
  std::vector<uint32_t> f16_scales;
  double max_factor;
};

inline const std::vector<BlockFormat>& block_formats() {
  static const std::vector<BlockFormat> formats = {
      {2, 32, 18, {0}, 8},                 // Q4_0
      {3, 32, 20, {0, 2}, 30},             // Q4_1
      {6, 32, 22, {0}, 16},                // Q5_0
      {7, 32, 24, {0, 2}, 62},             // Q5_1
      {8, 32, 34, {0}, 128},               // Q8_0
      {10, 256, 84, {80, 82}, 60},         // Q2_K
      {11, 256, 110, {108}, 128},          // Q3_K
      {12, 256, 144, {0, 2}, 1890},        // Q4_K
      {13, 256, 176, {0, 2}, 3906},        // Q5_K
      {14, 256, 210, {208}, 4096},         // Q6_K
      {15, 256, 292, {}, 128},             // Q8_K (float32 scale at byte 0)
  };
  return formats;
}

// f16 bits of 2^-k (k in 0..24; subnormal below 2^-14).
inline uint16_t f16_pow2_neg(int k) {
  return static_cast<uint16_t>(k <= 14 ? (15 - k) << 10 : 1 << (24 - k));
}

// Encodes `values` as ggml type `type`: F32 exactly, F16 / BF16 by truncating each value's bits;
// a block type gets pseudo-random codes with scales that bound every weight by about `range` (for
// block types the values only set the count: the point is loading and running each format).
inline std::vector<uint8_t> weight_bytes(uint32_t type, const std::vector<float>& values, float range,
                                         std::mt19937& rng) {
  if (type == 0) return f32_bytes(values);
  if (type == 1 || type == 30) {  // F16, BF16
    std::vector<uint8_t> out;
    for (float v : values) {
      uint32_t u;
      std::memcpy(&u, &v, 4);
      uint16_t bits;
      if (type == 30) {
        bits = static_cast<uint16_t>(u >> 16);
      } else {  // |v| <= 1 here: normal f16 or (below 2^-14) zero
        const uint32_t sign = (u >> 16) & 0x8000u;
        const int exp = static_cast<int>((u >> 23) & 0xff) - 127;
        bits = static_cast<uint16_t>(exp < -14 ? sign : sign | ((exp + 15) << 10) | ((u >> 13) & 0x3ff));
      }
      out.push_back(static_cast<uint8_t>(bits & 0xff));
      out.push_back(static_cast<uint8_t>(bits >> 8));
    }
    return out;
  }
  for (const BlockFormat& f : block_formats()) {
    if (f.type != type) continue;
    int k = 0;  // the scale 2^-k keeps max_factor * scale <= range
    while (f.max_factor * std::ldexp(1.0, -k) > range && k < 24) ++k;
    const std::size_t blocks = values.size() / f.elements;
    std::vector<uint8_t> out(blocks * f.bytes);
    for (uint8_t& byte : out) byte = static_cast<uint8_t>(rng());
    for (std::size_t b = 0; b < blocks; ++b) {
      uint8_t* blk = out.data() + b * f.bytes;
      for (uint32_t at : f.f16_scales) {
        const uint16_t bits = f16_pow2_neg(k);
        blk[at] = static_cast<uint8_t>(bits & 0xff);
        blk[at + 1] = static_cast<uint8_t>(bits >> 8);
      }
      if (f.f16_scales.empty()) {
        const float d = static_cast<float>(std::ldexp(1.0, -k));
        std::memcpy(blk, &d, 4);
      }
    }
    return out;
  }
  throw std::invalid_argument("tiny model: no encoder for ggml type " + std::to_string(type));
}

}  // namespace tiny_detail

// Writes the model to `path`; returns its vocabulary size.
inline uint32_t write_tiny_llama(const std::string& path, const TinyLlamaSpec& spec = {}) {
  using tiny_detail::f32_bytes;
  using tiny_detail::weight_bytes;
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
  auto norm_weight = [&](const std::string& name, std::size_t count) {  // around 1, as trained RMSNorm weights are
    std::uniform_real_distribution<float> dist(0.8f, 1.2f);
    std::vector<float> v(count);
    for (float& x : v) x = dist(rng);
    if (spec.edit_norm) spec.edit_norm(name, v);
    return v;
  };
  const uint64_t E = spec.embd, hd = spec.embd / spec.heads, q_rows = spec.heads * hd, kv_rows = spec.kv_heads * hd;
  const uint32_t kF32 = 0;  // ggml type id
  w.tensor("token_embd.weight", kF32, {E, vocab}, f32_bytes(uniform(E * vocab, 1.0f)));
  w.tensor("output_norm.weight", kF32, {E}, f32_bytes(norm_weight("output_norm.weight", E)));
  const float r = spec.weight_range;
  const uint32_t wt = spec.weight_type;
  // NOTE: the MLP and output projections are scaled down by sqrt(fan-in / E)-ish factors so the
  // residual stream stays O(1) over the layers instead of growing with each random projection.
  for (uint32_t l = 0; l < spec.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    w.tensor(b + "attn_norm.weight", kF32, {E}, f32_bytes(norm_weight(b + "attn_norm.weight", E)));
    w.tensor(b + "attn_q.weight", wt, {E, q_rows}, weight_bytes(wt, uniform(E * q_rows, r), r, rng));
    w.tensor(b + "attn_k.weight", wt, {E, kv_rows}, weight_bytes(wt, uniform(E * kv_rows, r), r, rng));
    w.tensor(b + "attn_v.weight", wt, {E, kv_rows}, weight_bytes(wt, uniform(E * kv_rows, r), r, rng));
    w.tensor(b + "attn_output.weight", wt, {q_rows, E}, weight_bytes(wt, uniform(q_rows * E, 0.5f * r), 0.5f * r, rng));
    w.tensor(b + "ffn_norm.weight", kF32, {E}, f32_bytes(norm_weight(b + "ffn_norm.weight", E)));
    w.tensor(b + "ffn_gate.weight", wt, {E, spec.ff}, weight_bytes(wt, uniform(E * spec.ff, r), r, rng));
    w.tensor(b + "ffn_up.weight", wt, {E, spec.ff}, weight_bytes(wt, uniform(E * spec.ff, r), r, rng));
    w.tensor(b + "ffn_down.weight", wt, {spec.ff, E}, weight_bytes(wt, uniform(spec.ff * E, 0.5f * r), 0.5f * r, rng));
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
