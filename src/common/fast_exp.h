// src/common/fast_exp.h — host math shared by the CPU backend and the model runner: function
// multi-versioning macros and a vectorizable exp.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

// Hot loops are compiled once per instruction set and picked at load time (GCC function
// multi-versioning), so one portable binary still runs AVX-512/AVX2 code where the CPU has it.
// Every helper called from a multi-versioned function is CRISP_CPU_INLINE so it is compiled with
// the caller's instruction set.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define CRISP_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CRISP_CPU_CLONES
#endif
#if defined(__GNUC__)
#define CRISP_CPU_INLINE inline __attribute__((always_inline))
#else
#define CRISP_CPU_INLINE inline
#endif

namespace crisp {
namespace cpu {

// exp for the float path, vectorizable inside `omp simd` loops (std::exp is not).
// Cody-Waite range reduction x = k ln2 + r, |r| <= ln2/2, and a degree-6 Taylor polynomial:
// relative error below 2e-7 (about 2 ulp). Arguments below -87 return ~1e-38 instead of a
// denormal or zero; callers only pass x <= 0 and mask excluded keys explicitly.
CRISP_CPU_INLINE float fast_exp(float x) {
  x = std::max(x, -87.0f);
  x = std::min(x, 88.0f);
  const float k = std::nearbyint(x * 1.44269504088896341f);
  float r = x - k * 0.693145751953125f;  // ln2 high part (exact in float)
  r = r - k * 1.42860682030941723212e-6f;  // ln2 low part
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // NaN passes both clamps (every comparison with it is false) and must come out as NaN, which
  // p carries; the exponent takes 0 in its place, since converting NaN to an integer (and then
  // shifting the negative result) is undefined behaviour. k + 127 is in [1, 254] otherwise.
  const float exponent = k == k ? k : 0.0f;
  const auto bits = static_cast<uint32_t>(static_cast<int32_t>(exponent) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}
CRISP_CPU_INLINE double fast_exp(double x) { return std::exp(x); }

}  // namespace cpu
}  // namespace crisp
