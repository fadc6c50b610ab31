// src/model/rope.cpp — RoPE tables and rotation (see rope.h for the formulas).
#include "model/rope.h"

#include <algorithm>
#include <cmath>

#include "crisp/error.h"

namespace crisp {
namespace model {

const char* to_string(RopeScalingType type) {
  switch (type) {
    case RopeScalingType::none: return "none";
    case RopeScalingType::linear: return "linear";
    case RopeScalingType::ntk: return "ntk";
    case RopeScalingType::yarn: return "yarn";
  }
  return "?";
}

RopeScalingType parse_rope_scaling(const std::string& name, const std::string& argument) {
  if (name == "none") return RopeScalingType::none;
  if (name == "linear") return RopeScalingType::linear;
  if (name == "ntk") return RopeScalingType::ntk;
  if (name == "yarn") return RopeScalingType::yarn;
  throw Error(argument, "unknown RoPE scaling '" + name + "'", "one of none, linear, ntk, yarn");
}

namespace {

// YaRN: the pair index whose wavelength fits `rotations` times into the trained context L,
// i.e. the i solving L / (2π / θ_i) = rotations with θ_i = base^(-2i/d).
double yarn_correction_dim(double rotations, int64_t dim, double base, int64_t trained_context) {
  const double kPi = 3.14159265358979323846;
  return static_cast<double>(dim) * std::log(static_cast<double>(trained_context) / (rotations * 2.0 * kPi)) /
         (2.0 * std::log(base));
}

}  // namespace

Rope::Rope(int64_t rotary_dim, double base, int64_t trained_context, const RopeScaling& scaling)
    : rotary_dim_(rotary_dim), scaling_(scaling) {
  if (rotary_dim <= 0 || rotary_dim % 2 != 0) {
    throw Error("rope.dimension_count", "is " + std::to_string(rotary_dim), "a positive even number");
  }
  if (!(base > 1.0) || !std::isfinite(base)) {
    throw Error("rope.freq_base", "is " + std::to_string(base), "a finite number > 1");
  }
  if (trained_context <= 0) {
    throw Error("context_length", "is " + std::to_string(trained_context), "a positive token count");
  }
  const bool scaled = scaling.type != RopeScalingType::none;
  if (scaled && (!(scaling.factor >= 1.0) || !std::isfinite(scaling.factor))) {
    throw Error("--rope-factor", "is " + std::to_string(scaling.factor), "a finite factor >= 1");
  }
  const int64_t half = rotary_dim / 2;
  const double d = static_cast<double>(rotary_dim);
  const double factor = scaled ? scaling.factor : 1.0;
  double effective_base = base;
  if (scaling.type == RopeScalingType::ntk) effective_base = base * std::pow(factor, d / (d - 2.0));

  inv_freq_.resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv_freq_[i] = std::pow(effective_base, -2.0 * static_cast<double>(i) / d);
  }
  if (scaling.type == RopeScalingType::linear) {
    for (double& f : inv_freq_) f /= factor;
  } else if (scaling.type == RopeScalingType::yarn) {
    if (!(scaling.beta_fast > scaling.beta_slow) || !(scaling.beta_slow > 0.0)) {
      throw Error("rope.yarn", "beta_fast must exceed beta_slow > 0", "beta_fast > beta_slow > 0");
    }
    double low = std::floor(yarn_correction_dim(scaling.beta_fast, rotary_dim, base, trained_context));
    double high = std::ceil(yarn_correction_dim(scaling.beta_slow, rotary_dim, base, trained_context));
    low = std::max(low, 0.0);
    high = std::min(high, d - 1.0);
    if (low == high) high += 0.001;  // a ramp of zero width would divide by zero
    for (int64_t i = 0; i < half; ++i) {
      // keep = 1 for high-frequency pairs (i <= low: many rotations over L), 0 for low-frequency.
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      const double keep = 1.0 - ramp;
      const double trained = inv_freq_[i];
      inv_freq_[i] = trained / factor * (1.0 - keep) + trained * keep;
    }
    attention_factor_ = 0.1 * std::log(factor) + 1.0;
  }
}

void Rope::reserve(int64_t positions) {
  if (positions <= positions_) return;
  const int64_t half = rotary_dim_ / 2;
  cos_.resize(static_cast<size_t>(positions * half));
  sin_.resize(static_cast<size_t>(positions * half));
  for (int64_t p = positions_; p < positions; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      // Angles in float64: at position 32k a float32 angle would be off by ~1e-3 rad.
      const double angle = static_cast<double>(p) * inv_freq_[i];
      cos_[p * half + i] = static_cast<float>(std::cos(angle) * attention_factor_);
      sin_[p * half + i] = static_cast<float>(std::sin(angle) * attention_factor_);
    }
  }
  positions_ = positions;
}

void Rope::apply(float* x, int64_t heads, int64_t head_stride, int64_t pos) const {
  const int64_t half = rotary_dim_ / 2;
  const float* c = cos_.data() + pos * half;
  const float* s = sin_.data() + pos * half;
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * head_stride;
    for (int64_t i = 0; i < half; ++i) {
      const float x0 = v[2 * i], x1 = v[2 * i + 1];
      v[2 * i] = x0 * c[i] - x1 * s[i];
      v[2 * i + 1] = x0 * s[i] + x1 * c[i];
    }
  }
}

}  // namespace model
}  // namespace crisp
