// tests/gpu/gpu_test_util.h — helpers shared by the GPU test files: an owning device allocation and
// the random block layout the attention tests run the kernels on.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/half.h"
#include "crisp/crisp.h"
#include "crisp/cuda.h"
#include "crisp/plan.h"
#include "crisp/tensor.h"
#include "crisp/workload.h"
#include "plan/rules.h"
#include "test_util.h"

namespace crisp_gpu_test {

// One cudaMalloc, freed on scope exit. `ptr` is null when the allocation failed (tests check it).
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(std::size_t bytes) {
    if (cudaMalloc(&ptr, bytes) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

using crisp_test::ScopedEnv;

// A random layout of the plan's shape: per (sequence, head, row holding queries) the anchors
// (block 0, and blocks r and r-1 that the local slash anchor reaches under the exact cover) plus
// each other block c with probability `keep`; a chunk's rows before first_row stay empty (spec
// §11). Routed PE (its entries are free-form).
inline crisp::Plan random_plan(const crisp::Plan& dense, double keep, uint64_t seed) {
  crisp::Plan plan = dense;
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution take(keep);
  for (auto& sp : plan.sequences) {
    for (auto& hp : sp.heads) {
      hp.route = crisp::Route::pe;
      hp.vertical = {0};
      hp.slash = {0};
      hp.row_ptr.assign(1, 0);
      hp.col.clear();
      for (int32_t r = 0; r < sp.num_blocks; ++r) {
        if (r >= sp.first_row)
          for (int32_t c = 0; c <= r; ++c)
            if (c == 0 || c >= r - 1 || take(rng)) hp.col.push_back(c);
        hp.row_ptr.push_back(static_cast<int32_t>(hp.col.size()));
      }
      hp.density = crisp::rules::density_of_rows(static_cast<int64_t>(hp.col.size()), sp.first_row, sp.num_blocks);
    }
  }
  return plan;
}

// bf16 / f16 bit patterns of a float (round to nearest even) and back.
inline uint16_t to_bits(float x, crisp::DType dt) {
  return dt == crisp::DType::bf16 ? crisp::half::float_to_bf16(x) : crisp::half::float_to_f16(x);
}
inline float from_bits(uint16_t b, crisp::DType dt) {
  return dt == crisp::DType::bf16 ? crisp::half::bf16_to_float(b) : crisp::half::f16_to_float(b);
}

// Rounds `values` to the dtype: the bits for the device, the rounded floats for the reference.
inline void round_to(const std::vector<float>& values, crisp::DType dt, std::vector<uint16_t>& bits,
                     std::vector<float>& rounded) {
  bits.resize(values.size());
  rounded.resize(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    bits[i] = to_bits(values[i], dt);
    rounded[i] = from_bits(bits[i], dt);
  }
}

// Inputs of one attention case, rounded to the dtype: bits for the device, the same values as
// floats for the CPU reference. q [Hq, tokens, d], k and v [Hkv, tokens, d].
struct RoundedInputs {
  crisp::DType dtype = crisp::DType::bf16;
  int64_t num_q_heads = 0, num_kv_heads = 0, tokens = 0, head_dim = 0;
  std::vector<uint16_t> q_bits, k_bits, v_bits;
  std::vector<float> q, k, v;
};

// The workload's q, k, v rounded to `dtype`.
inline RoundedInputs round_inputs(const crisp::Workload& w, crisp::DType dtype) {
  RoundedInputs in;
  in.dtype = dtype;
  in.num_q_heads = w.spec.num_q_heads;
  in.num_kv_heads = w.spec.num_kv_heads;
  in.tokens = w.total_tokens;
  in.head_dim = w.spec.head_dim;
  round_to(w.q, dtype, in.q_bits, in.q);
  round_to(w.k, dtype, in.k_bits, in.k);
  round_to(w.v, dtype, in.v_bits, in.v);
  return in;
}

// The float64 CPU attention of `plan` on the rounded inputs: O [Hq, tokens, d] and LSE [Hq, tokens].
inline void reference_f64(RoundedInputs& in, const crisp::Plan& plan, std::vector<double>& ref_out,
                          std::vector<double>& ref_lse) {
  const int64_t Hq = in.num_q_heads, Hkv = in.num_kv_heads, T = in.tokens, d = in.head_dim;
  ref_out.assign(static_cast<std::size_t>(Hq * T * d), 0.0);
  ref_lse.assign(static_cast<std::size_t>(Hq * T), 0.0);
  crisp::Options f64;
  f64.precision = crisp::Precision::f64;
  crisp::attend(crisp::TensorView::contiguous(in.q.data(), crisp::DType::f32, Hq, T, d),
                crisp::TensorView::contiguous(in.k.data(), crisp::DType::f32, Hkv, T, d),
                crisp::TensorView::contiguous(in.v.data(), crisp::DType::f32, Hkv, T, d), plan,
                crisp::TensorView::contiguous(ref_out.data(), crisp::DType::f64, Hq, T, d),
                crisp::TensorView::contiguous2d(ref_lse.data(), crisp::DType::f64, Hq, T), f64);
}

// crisp::cuda::attend_async of `plan` on the device copies of the inputs, with O and LSE poisoned
// with NaN before the launch (0xffff is NaN in f16 and bf16, 0xffffffff in f32), so an element the
// kernel leaves unwritten shows as NaN; returns O (dtype bits) and LSE. The kernel is the one
// `options` select (Kernel::automatic: CRISP_KERNEL when set).
inline void attend_poisoned(const RoundedInputs& in, const crisp::Plan& plan, std::vector<uint16_t>& out_bits,
                            std::vector<float>& lse, const crisp::CudaOptions& options = {}) {
  const int64_t Hq = in.num_q_heads, Hkv = in.num_kv_heads, T = in.tokens, d = in.head_dim;
  const std::size_t q_bytes = in.q_bits.size() * 2, kv_bytes = in.k_bits.size() * 2;
  const std::size_t lse_bytes = static_cast<std::size_t>(Hq * T) * sizeof(float);
  DeviceBuffer dq(q_bytes), dk(kv_bytes), dv(kv_bytes), dout(q_bytes), dlse(lse_bytes);
  ASSERT_TRUE(dq.ptr && dk.ptr && dv.ptr && dout.ptr && dlse.ptr);
  ASSERT_EQ(cudaMemcpy(dq.ptr, in.q_bits.data(), q_bytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dk.ptr, in.k_bits.data(), kv_bytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dv.ptr, in.v_bits.data(), kv_bytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(dout.ptr, 0xff, q_bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(dlse.ptr, 0xff, lse_bytes), cudaSuccess);
  const auto dev = crisp::Device::cuda;
  crisp::cuda::DevicePlan dplan(plan);
  crisp::cuda::attend_async(crisp::TensorView::contiguous(dq.ptr, in.dtype, Hq, T, d, dev),
                            crisp::TensorView::contiguous(dk.ptr, in.dtype, Hkv, T, d, dev),
                            crisp::TensorView::contiguous(dv.ptr, in.dtype, Hkv, T, d, dev), dplan,
                            crisp::TensorView::contiguous(dout.ptr, in.dtype, Hq, T, d, dev),
                            crisp::TensorView::contiguous2d(dlse.ptr, crisp::DType::f32, Hq, T, dev), nullptr,
                            options);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  out_bits.resize(in.q_bits.size());
  lse.resize(static_cast<std::size_t>(Hq * T));
  ASSERT_EQ(cudaMemcpy(out_bits.data(), dout.ptr, q_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(lse.data(), dlse.ptr, lse_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
}

// The parity check of an attention kernel against the float64 CPU reference on the same plan and
// the same rounded inputs, per (sequence, head) of an [Hq, tokens, d] output (dtype bits) and its
// [Hq, tokens] LSE: relative Frobenius error of O <= 1e-2, |LSE - ref| <= 1e-3 (absolute: it is a
// log), and no element left unwritten (the tests NaN-poison the outputs before the launch).
struct ReferenceErrors {
  double worst_rel = 0.0;
  double worst_lse = 0.0;
};
inline ReferenceErrors expect_matches_reference(const crisp::SeqLens& cu_seqlens, int64_t num_q_heads, int64_t tokens,
                                                int64_t d, crisp::DType dtype, const std::vector<uint16_t>& out_bits,
                                                const std::vector<float>& lse, const std::vector<double>& ref_out,
                                                const std::vector<double>& ref_lse) {
  ReferenceErrors worst;
  for (std::size_t s = 0; s + 1 < cu_seqlens.size(); ++s) {
    for (int64_t h = 0; h < num_q_heads; ++h) {
      double err2 = 0.0, ref2 = 0.0;
      for (int64_t t = cu_seqlens[s]; t < cu_seqlens[s + 1]; ++t) {
        const float l = lse[h * tokens + t];
        EXPECT_TRUE(std::isfinite(l)) << "lse unwritten or non-finite at head " << h << ", token " << t;
        if (!std::isfinite(l)) return worst;
        worst.worst_lse = std::max(worst.worst_lse, std::fabs(l - ref_lse[h * tokens + t]));
        for (int64_t x = 0; x < d; ++x) {
          const std::size_t i = static_cast<std::size_t>((h * tokens + t) * d + x);
          const float o = from_bits(out_bits[i], dtype);
          EXPECT_TRUE(std::isfinite(o)) << "out unwritten or non-finite at head " << h << ", token " << t << ", dim "
                                        << x;
          if (!std::isfinite(o)) return worst;
          err2 += (o - ref_out[i]) * (o - ref_out[i]);
          ref2 += ref_out[i] * ref_out[i];
        }
      }
      const double rel = std::sqrt(err2 / ref2);
      worst.worst_rel = std::max(worst.worst_rel, rel);
      EXPECT_LE(rel, 1e-2) << "sequence " << s << ", head " << h;
    }
  }
  EXPECT_LE(worst.worst_lse, 1e-3);
  return worst;
}

}  // namespace crisp_gpu_test
