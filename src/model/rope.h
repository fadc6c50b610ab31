// src/model/rope.h — rotary position embeddings (RoPE) and their context-extension variants.
//
// Layout: GGUF llama files store the Q/K projection rows permuted by the converter so that the
// pairs rotated together are adjacent, (x[2i], x[2i+1]) — ggml's "normal" rope mode — instead of
// Hugging Face's (x[i], x[i + d/2]) ("NEOX"/rotate_half). Rotating adjacent pairs of the GGUF
// rows is the same computation on permuted coordinates, so dot products q·k are unchanged.
// Pair i turns by angle pos · θ_i, θ_i = base^(-2i/d).
//
// Scaling for positions past the trained context L (each changes θ_i):
//  - linear (position interpolation): θ_i / factor.
//  - ntk (static NTK-aware): base' = base · factor^(d/(d-2)), i.e. low frequencies are
//    interpolated and high frequencies kept.
//  - yarn (YaRN): per pair, r_i = L / wavelength_i decides: r_i > β_fast (32) keeps θ_i,
//    r_i < β_slow (1) interpolates θ_i / factor, a linear ramp blends in between; cos and sin are
//    multiplied by the attention factor 0.1·ln(factor) + 1, which scales q·k by its square.
// All of them go beyond what the model was trained on: the runner flags their use.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace crisp {
namespace model {

enum class RopeScalingType { none, linear, ntk, yarn };
const char* to_string(RopeScalingType type);
// "none", "linear", "ntk", "yarn"; throws crisp::Error naming `argument` otherwise.
RopeScalingType parse_rope_scaling(const std::string& name, const std::string& argument = "--rope-scaling");

struct RopeScaling {
  RopeScalingType type = RopeScalingType::none;
  double factor = 1.0;     // context multiplier (>= 1); ignored for none
  double beta_fast = 32.0;  // YaRN: rotations over L above which a pair is kept as trained
  double beta_slow = 1.0;   // YaRN: rotations over L below which a pair is fully interpolated
};

class Rope {
 public:
  // rotary_dim: rotated leading dimensions of a head (even); base: θ base (rope.freq_base);
  // trained_context: L, the context the model was trained on. Throws crisp::Error on bad values.
  Rope(int64_t rotary_dim, double base, int64_t trained_context, const RopeScaling& scaling);

  // Makes the cos/sin table cover positions [0, positions).
  void reserve(int64_t positions);
  // Rotates `heads` head vectors (head_stride floats apart) of one token at position pos, in place.
  // pos must be < the reserved count.
  void apply(float* x, int64_t heads, int64_t head_stride, int64_t pos) const;

  int64_t rotary_dim() const { return rotary_dim_; }
  double attention_factor() const { return attention_factor_; }
  const std::vector<double>& inverse_frequencies() const { return inv_freq_; }
  const RopeScaling& scaling() const { return scaling_; }
  // The tables apply() uses, [reserved positions][rotary_dim / 2], the attention factor included
  // (the CUDA runner uploads these, so both backends rotate with the same float values).
  int64_t reserved_positions() const { return positions_; }
  const float* cos_table() const { return cos_.data(); }
  const float* sin_table() const { return sin_.data(); }

 private:
  int64_t rotary_dim_;
  RopeScaling scaling_;
  double attention_factor_ = 1.0;
  std::vector<double> inv_freq_;  // θ_i, i < rotary_dim / 2
  int64_t positions_ = 0;
  std::vector<float> cos_, sin_;  // [position][i], the attention factor included
};

}  // namespace model
}  // namespace crisp
