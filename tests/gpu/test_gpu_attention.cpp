// tests/gpu/test_gpu_attention.cpp — the portable CUDA block-sparse attention kernel (forced with
// Kernel::portable, so it is checked on sm_90 too, where auto dispatch runs the Hopper kernel:
// that one is checked in test_gpu_hopper.cpp) against the CPU float64 reference on the same plan
// and the same (bf16/fp16-rounded) inputs, plus the DevicePlan round trip and the argument checks.
// Every test skips itself when no CUDA device is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/half.h"
#include "crisp/crisp.h"
#include "crisp/cuda.h"
#include "gpu/gpu_test_util.h"
#include "crisp/workload.h"

namespace {

using crisp_gpu_test::DeviceBuffer;
using crisp_gpu_test::from_bits;
using crisp_gpu_test::to_bits;
using crisp_gpu_test::random_plan;
using crisp_gpu_test::round_to;

#define SKIP_WITHOUT_GPU() \
  if (!crisp::cuda::available()) GTEST_SKIP() << "no CUDA device"

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

enum class Layout { dense, crisp_plan, random };

struct Case {
  std::string name;
  crisp::DType dtype;
  int64_t head_dim;
  int block_size;
  int64_t num_q_heads, num_kv_heads;
  std::vector<int64_t> seq_lens;
  Layout layout;
  double random_density;  // share of the off-anchor causal blocks kept (Layout::random)
  uint64_t seed;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

class GpuAttention : public ::testing::TestWithParam<Case> {};

TEST_P(GpuAttention, MatchesFloat64ReferenceAndWritesEveryElement) {
  SKIP_WITHOUT_GPU();
  const Case& c = GetParam();

  crisp::WorkloadSpec spec = crisp_test::workload_spec(c.num_q_heads, c.num_kv_heads, c.head_dim, c.seq_lens, c.seed);
  // The workload plants `needles` keys per sequence and needs more tokens than needles.
  const int64_t shortest = *std::min_element(c.seq_lens.begin(), c.seq_lens.end());
  spec.needles = std::min<int64_t>(spec.needles, shortest - 1);
  crisp::Workload w = crisp::make_workload(spec);
  const int64_t tokens = w.total_tokens;
  const int64_t Hq = c.num_q_heads, d = c.head_dim;
  crisp_gpu_test::RoundedInputs in = crisp_gpu_test::round_inputs(w, c.dtype);
  const auto cpu_q = crisp::TensorView::contiguous(in.q.data(), crisp::DType::f32, Hq, tokens, d);
  const auto cpu_k = crisp::TensorView::contiguous(in.k.data(), crisp::DType::f32, c.num_kv_heads, tokens, d);

  crisp::Plan plan;
  const crisp::Plan dense = crisp::dense_plan(Hq, c.num_kv_heads, d, w.cu_seqlens, c.block_size);
  if (c.layout == Layout::dense) {
    plan = dense;
  } else if (c.layout == Layout::crisp_plan) {
    crisp::Config cfg = crisp::Config::from_preset("crisp");
    cfg.block_size = c.block_size;
    plan = crisp::plan(cpu_q, cpu_k, cfg, w.cu_seqlens);
  } else {
    plan = random_plan(dense, c.random_density, c.seed * 7919 + 1);
  }

  // Reference: float64 CPU attention on the rounded inputs, same plan; the device run on
  // NaN-poisoned outputs.
  std::vector<double> ref_out, ref_lse;
  crisp_gpu_test::reference_f64(in, plan, ref_out, ref_lse);
  std::vector<uint16_t> out_bits;
  std::vector<float> lse;
  {
    crisp::CudaOptions portable;
    portable.kernel = crisp::Kernel::portable;
    crisp_gpu_test::attend_poisoned(in, plan, out_bits, lse, portable);
  }
  if (HasFatalFailure()) return;

  // Per (sequence, head): relative Frobenius error of O <= 1e-2, LSE within 1e-3 (absolute, it is
  // a log), and no element left unwritten (NaN).
  const crisp_gpu_test::ReferenceErrors worst = crisp_gpu_test::expect_matches_reference(
      w.cu_seqlens, Hq, tokens, d, c.dtype, out_bits, lse, ref_out, ref_lse);
  std::printf("[ %s ] density %.3f, worst rel. error of O %.2e, worst |LSE - ref| %.2e\n", c.name.c_str(),
              plan.density(), worst.worst_rel, worst.worst_lse);
}

constexpr auto bf16 = crisp::DType::bf16;
constexpr auto f16 = crisp::DType::f16;

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuAttention,
    ::testing::Values(
        // name, dtype, d, B, Hq, Hkv, seq_lens, layout, random density, seed
        Case{"bf16_d128_B128_dense_gqa4_unaligned", bf16, 128, 128, 8, 2, {1000}, Layout::dense, 0, 1},
        Case{"bf16_d128_B128_crisp_gqa4", bf16, 128, 128, 8, 2, {3000}, Layout::crisp_plan, 0, 2},
        Case{"bf16_d128_B64_crisp_gqa8", bf16, 128, 64, 8, 1, {1777}, Layout::crisp_plan, 0, 3},
        Case{"fp16_d128_B128_random30_gqa1", f16, 128, 128, 4, 4, {2100}, Layout::random, 0.3, 4},
        Case{"fp16_d64_B128_dense_gqa1", f16, 64, 128, 4, 4, {1300}, Layout::dense, 0, 5},
        Case{"bf16_d64_B64_random20_gqa4", bf16, 64, 64, 8, 2, {2049}, Layout::random, 0.2, 6},
        Case{"bf16_d64_B128_crisp_gqa4", bf16, 64, 128, 4, 1, {2500}, Layout::crisp_plan, 0, 7},
        Case{"fp16_d64_B64_crisp_gqa8", f16, 64, 64, 8, 1, {1500}, Layout::crisp_plan, 0, 8},
        Case{"bf16_d128_B128_n_below_block", bf16, 128, 128, 4, 1, {37}, Layout::dense, 0, 9},
        Case{"fp16_d64_B64_n_below_block", f16, 64, 64, 4, 2, {3}, Layout::dense, 0, 10},
        Case{"bf16_d128_B128_varlen_dense", bf16, 128, 128, 8, 2, {50, 700, 129, 1024}, Layout::dense, 0, 11},
        Case{"bf16_d128_B64_varlen_random10_gqa8", bf16, 128, 64, 8, 1, {300, 1200, 65, 901}, Layout::random, 0.1, 12},
        Case{"fp16_d64_B128_varlen_crisp", f16, 64, 128, 4, 2, {1500, 77, 2200}, Layout::crisp_plan, 0, 13},
        Case{"bf16_d64_B64_varlen_random5", bf16, 64, 64, 4, 1, {640, 3000}, Layout::random, 0.05, 14},
        // Head dim 256 (Gemma 3: GQA 4:1 among others): one 16-row mma tile per warp, a 3-slot ring.
        Case{"bf16_d256_B128_crisp_gqa4", bf16, 256, 128, 8, 2, {3000}, Layout::crisp_plan, 0, 15},
        Case{"bf16_d256_B64_crisp_gqa4", bf16, 256, 64, 4, 1, {2100}, Layout::crisp_plan, 0, 16},
        Case{"fp16_d256_B128_random20_gqa2", f16, 256, 128, 4, 2, {1700}, Layout::random, 0.2, 17},
        Case{"fp16_d256_B64_dense_gqa1_unaligned", f16, 256, 64, 2, 2, {1001}, Layout::dense, 0, 18},
        Case{"bf16_d256_B128_varlen_random10_gqa4", bf16, 256, 128, 4, 1, {50, 900, 129, 1300}, Layout::random, 0.1,
             19},
        Case{"bf16_d256_B64_n_below_block", bf16, 256, 64, 4, 2, {5}, Layout::dense, 0, 20},
        // SmolLM2's shape: 9 query heads on 3 KV heads (a group of 3), d 64.
        Case{"fp16_d64_B128_crisp_gqa3_smollm2", f16, 64, 128, 9, 3, {2500}, Layout::crisp_plan, 0, 21},
        Case{"fp16_d64_B128_dense_gqa3_smollm2", f16, 64, 128, 9, 3, {1001}, Layout::dense, 0, 22}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// ------------------------------------------------------------------ DevicePlan

crisp::Plan structured_plan(int block, uint64_t seed, std::vector<int64_t> lens) {
  crisp::WorkloadSpec spec = crisp_test::workload_spec(4, 2, 64, std::move(lens), seed);
  crisp::Workload w = crisp::make_workload(spec);
  crisp::Config cfg = crisp::Config::from_preset("crisp");
  cfg.block_size = block;
  return crisp::plan(w.q_view(), w.k_view(), cfg, w.cu_seqlens);
}

TEST(GpuDevicePlan, UploadThenToHostReturnsThePlan) {
  SKIP_WITHOUT_GPU();
  const crisp::Plan plan = structured_plan(64, 21, {1900, 300, 2600});
  crisp::cuda::DevicePlan dplan(plan);
  EXPECT_EQ(dplan.bytes(), crisp::cuda::DevicePlan::bytes_required(4, dplan.cu_seqlens(), 64));
  const crisp::Plan back = dplan.to_host();
  EXPECT_EQ(back.block_size, plan.block_size);
  EXPECT_EQ(back.num_q_heads, plan.num_q_heads);
  EXPECT_EQ(back.num_kv_heads, plan.num_kv_heads);
  EXPECT_EQ(back.head_dim, plan.head_dim);
  EXPECT_DOUBLE_EQ(back.softmax_scale, plan.softmax_scale);
  EXPECT_EQ(back.config.preset, plan.config.preset);
  ASSERT_EQ(back.sequences.size(), plan.sequences.size());
  for (std::size_t s = 0; s < plan.sequences.size(); ++s) {
    const auto& a = plan.sequences[s];
    const auto& b = back.sequences[s];
    EXPECT_EQ(a.q_offset, b.q_offset);
    EXPECT_EQ(a.n_q, b.n_q);
    EXPECT_EQ(a.kv_offset, b.kv_offset);
    EXPECT_EQ(a.n_k, b.n_k);
    EXPECT_EQ(a.num_blocks, b.num_blocks);
    ASSERT_EQ(a.heads.size(), b.heads.size());
    for (std::size_t h = 0; h < a.heads.size(); ++h) {
      const auto& x = a.heads[h];
      const auto& y = b.heads[h];
      EXPECT_EQ(x.route, y.route) << s << "/" << h;
      EXPECT_EQ(x.row_ptr, y.row_ptr) << s << "/" << h;
      EXPECT_EQ(x.col, y.col) << s << "/" << h;
      EXPECT_EQ(x.vertical, y.vertical) << s << "/" << h;
      EXPECT_EQ(x.slash, y.slash) << s << "/" << h;
      EXPECT_DOUBLE_EQ(x.density, y.density) << s << "/" << h;
      // Statistics travel as float32 on the device.
      if (std::isnan(x.c_struct)) EXPECT_TRUE(std::isnan(y.c_struct));
      else EXPECT_NEAR(y.c_struct, x.c_struct, 1e-6 * std::max(1.0, std::fabs(x.c_struct)));
    }
  }
  EXPECT_NO_THROW(back.check_well_formed());
}

TEST(GpuDevicePlan, CallerWorkspaceIsUsedAndChecked) {
  SKIP_WITHOUT_GPU();
  const crisp::Plan plan = structured_plan(128, 22, {2000});
  const crisp::SeqLens cu{0, 2000};
  const std::size_t bytes = crisp::cuda::DevicePlan::bytes_required(4, cu, 128);
  DeviceBuffer ws(bytes);
  ASSERT_NE(ws.ptr, nullptr);
  crisp::Config cfg = plan.config;
  cfg.block_size = 128;
  EXPECT_THROW(crisp::cuda::DevicePlan(4, 2, 64, cu, cfg, ws.ptr, bytes - 1), crisp::Error);
  EXPECT_THROW(crisp::cuda::DevicePlan(4, 2, 64, cu, cfg, static_cast<char*>(ws.ptr) + 16, bytes), crisp::Error);
  crisp::cuda::DevicePlan dplan(4, 2, 64, cu, cfg, ws.ptr, bytes);
  EXPECT_FALSE(dplan.owns_memory());
  dplan.upload(plan);
  EXPECT_EQ(dplan.to_host().sequences[0].heads[1].col, plan.sequences[0].heads[1].col);
  // A plan of another shape is refused.
  const crisp::Plan other = structured_plan(128, 23, {2100});
  try {
    dplan.upload(other);
    ADD_FAILURE() << "upload of a plan of another shape did not throw";
  } catch (const crisp::Error& e) {
    EXPECT_EQ(e.argument(), "plan");
  }
}

// ------------------------------------------------------------------ argument checks

TEST(GpuAttentionArguments, UnsupportedInputsGiveClearErrors) {
  SKIP_WITHOUT_GPU();
  const int64_t H = 2, T = 256, d = 128;
  const crisp::Plan plan = crisp::dense_plan(H, H, d, {0, T}, 128);
  crisp::cuda::DevicePlan dplan(plan);
  DeviceBuffer q(H * T * d * 4), k(H * T * d * 4), v(H * T * d * 4), o(H * T * d * 4), l(H * T * 4);
  const auto dev = crisp::Device::cuda;
  auto view = [&](void* p, crisp::DType dt) { return crisp::TensorView::contiguous(p, dt, H, T, d, dev); };
  const auto lse = crisp::TensorView::contiguous2d(l.ptr, crisp::DType::f32, H, T, dev);
  auto expect_error = [&](const std::string& argument, auto&& call) {
    try {
      call();
      ADD_FAILURE() << "no error for a bad " << argument;
    } catch (const crisp::Error& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
  };
  // f32 inputs are not supported by the kernel.
  expect_error("q", [&] {
    crisp::cuda::attend_async(view(q.ptr, crisp::DType::f32), view(k.ptr, crisp::DType::f32),
                              view(v.ptr, crisp::DType::f32), dplan, view(o.ptr, crisp::DType::f32), lse);
  });
  // Output dtype must be the input dtype.
  expect_error("out", [&] {
    crisp::cuda::attend_async(view(q.ptr, bf16), view(k.ptr, bf16), view(v.ptr, bf16), dplan,
                              view(o.ptr, crisp::DType::f32), lse);
  });
  // Mixed input dtypes.
  expect_error("k", [&] {
    crisp::cuda::attend_async(view(q.ptr, bf16), view(k.ptr, f16), view(v.ptr, bf16), dplan, view(o.ptr, bf16), lse);
  });
  // Last-dimension stride != 1.
  expect_error("v", [&] {
    auto vv = view(v.ptr, bf16);
    vv.shape = {H, T, d};
    vv.stride = {T * d, 1, T};
    crisp::cuda::attend_async(view(q.ptr, bf16), view(k.ptr, bf16), vv, dplan, view(o.ptr, bf16), lse);
  });
  // CPU views.
  expect_error("q", [&] {
    auto qq = view(q.ptr, bf16);
    qq.device = crisp::Device::cpu;
    crisp::cuda::attend_async(qq, view(k.ptr, bf16), view(v.ptr, bf16), dplan, view(o.ptr, bf16), lse);
  });
  // Head dim 96 is not compiled: the error names q and the head dims there are.
  {
    const int64_t d96 = 96;
    const crisp::Plan p96 = crisp::dense_plan(H, H, d96, {0, T}, 128);
    crisp::cuda::DevicePlan dp96(p96);
    auto v96 = [&](void* p) { return crisp::TensorView::contiguous(p, bf16, H, T, d96, dev); };
    expect_error("q", [&] { crisp::cuda::attend_async(v96(q.ptr), v96(k.ptr), v96(v.ptr), dp96, v96(o.ptr), lse); });
    try {
      crisp::cuda::attend_async(v96(q.ptr), v96(k.ptr), v96(v.ptr), dp96, v96(o.ptr), lse);
    } catch (const crisp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("64, 128 or 256"), std::string::npos) << e.what();
    }
  }
  // Head dim 512 has no DevicePlan (no backend takes d > 256).
  try {
    crisp::cuda::DevicePlan dp512(H, H, 512, {0, T}, plan.config);
    ADD_FAILURE() << "a DevicePlan of head dim 512 was made";
  } catch (const crisp::Error& e) {
    EXPECT_EQ(e.argument(), "head_dim") << e.what();
  }
  // Shape that does not match the DevicePlan.
  expect_error("q", [&] {
    auto qq = crisp::TensorView::contiguous(q.ptr, bf16, H, T - 1, d, dev);
    crisp::cuda::attend_async(qq, view(k.ptr, bf16), view(v.ptr, bf16), dplan, view(o.ptr, bf16), lse);
  });
  // Misaligned rows (token stride of 65 elements).
  expect_error("q", [&] {
    auto qq = view(q.ptr, bf16);
    qq.shape = {H, T, 64};
    qq.stride = {T * 65, 65, 1};
    const crisp::Plan p64 = crisp::dense_plan(H, H, 64, {0, T}, 128);
    crisp::cuda::DevicePlan dp64(p64);
    auto v64 = [&](void* p) { return crisp::TensorView::contiguous(p, bf16, H, T, 64, dev); };
    crisp::cuda::attend_async(qq, v64(k.ptr), v64(v.ptr), dp64, v64(o.ptr), lse);
  });
}

// The public crisp::attend on Device::cuda views (uploads the host plan, runs, synchronises) and a
// non-contiguous [tokens, heads, d] layout.
TEST(GpuAttentionApi, PublicAttendOnDeviceViewsMatchesCpu) {
  SKIP_WITHOUT_GPU();
  crisp::WorkloadSpec spec = crisp_test::workload_spec(4, 2, 128, {1400}, 31);
  crisp::Workload w = crisp::make_workload(spec);
  const int64_t T = w.total_tokens, d = 128;
  std::vector<uint16_t> qb, kb, vb;
  std::vector<float> qr, kr, vr;
  round_to(w.q, bf16, qb, qr);
  round_to(w.k, bf16, kb, kr);
  round_to(w.v, bf16, vb, vr);
  auto cq = crisp::TensorView::contiguous(qr.data(), crisp::DType::f32, 4, T, d);
  auto ck = crisp::TensorView::contiguous(kr.data(), crisp::DType::f32, 2, T, d);
  auto cv = crisp::TensorView::contiguous(vr.data(), crisp::DType::f32, 2, T, d);
  crisp::Config cfg = crisp::Config::from_preset("crisp");
  const crisp::Plan plan = crisp::plan(cq, ck, cfg);
  std::vector<double> ref(4 * T * d), ref_lse(4 * T);
  crisp::Options f64;
  f64.precision = crisp::Precision::f64;
  crisp::attend(cq, ck, cv, plan, crisp::TensorView::contiguous(ref.data(), crisp::DType::f64, 4, T, d),
                crisp::TensorView::contiguous2d(ref_lse.data(), crisp::DType::f64, 4, T), f64);

  // Q and O stored [tokens, heads, d] on the device.
  std::vector<uint16_t> q_thd(qb.size());
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t x = 0; x < d; ++x) q_thd[(t * 4 + h) * d + x] = qb[(h * T + t) * d + x];
  DeviceBuffer dq(qb.size() * 2), dk(kb.size() * 2), dv(vb.size() * 2), dout(qb.size() * 2), dlse(4 * T * 4);
  CUDA_OK(cudaMemcpy(dq.ptr, q_thd.data(), qb.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dk.ptr, kb.data(), kb.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dv.ptr, vb.data(), vb.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dout.ptr, 0xff, qb.size() * 2));
  CUDA_OK(cudaMemset(dlse.ptr, 0xff, 4 * T * 4));
  const auto dev = crisp::Device::cuda;
  auto thd = [&](void* p) {
    auto v = crisp::TensorView::contiguous(p, bf16, 4, T, d, dev);
    v.stride = {d, 4 * d, 1};
    return v;
  };
  crisp::attend(thd(dq.ptr), crisp::TensorView::contiguous(dk.ptr, bf16, 2, T, d, dev),
                crisp::TensorView::contiguous(dv.ptr, bf16, 2, T, d, dev), plan, thd(dout.ptr),
                crisp::TensorView::contiguous2d(dlse.ptr, crisp::DType::f32, 4, T, dev));
  std::vector<uint16_t> out(qb.size());
  std::vector<float> lse(4 * T);
  CUDA_OK(cudaMemcpy(out.data(), dout.ptr, out.size() * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(lse.data(), dlse.ptr, lse.size() * 4, cudaMemcpyDeviceToHost));
  for (int64_t h = 0; h < 4; ++h) {
    double e2 = 0, r2 = 0;
    for (int64_t t = 0; t < T; ++t) {
      ASSERT_TRUE(std::isfinite(lse[h * T + t]));
      EXPECT_NEAR(lse[h * T + t], ref_lse[h * T + t], 1e-3);
      for (int64_t x = 0; x < d; ++x) {
        const float o = crisp::half::bf16_to_float(out[(t * 4 + h) * d + x]);
        ASSERT_TRUE(std::isfinite(o));
        const double r = ref[(h * T + t) * d + x];
        e2 += (o - r) * (o - r);
        r2 += r * r;
      }
    }
    EXPECT_LE(std::sqrt(e2 / r2), 1e-2) << "head " << h;
  }
}

// A workload's q/k/v rounded to bf16 and copied to the device, out and lse allocated, and the
// device views of all five. `ok` is false when an allocation or a copy failed.
struct DeviceProblem {
  int64_t q_heads, tokens, dim;
  std::size_t q_elements;
  DeviceBuffer dq, dk, dv, dout, dlse;
  crisp::TensorView q, k, v, out, lse;
  bool ok = false;
  DeviceProblem(const crisp::Workload& w, int64_t Hq, int64_t Hkv, int64_t d)
      : q_heads(Hq), tokens(w.total_tokens), dim(d), q_elements(w.q.size()), dq(w.q.size() * 2),
        dk(w.k.size() * 2), dv(w.v.size() * 2), dout(w.q.size() * 2), dlse(Hq * w.total_tokens * 4) {
    std::vector<uint16_t> qb, kb, vb;
    std::vector<float> unused;
    round_to(w.q, bf16, qb, unused);
    round_to(w.k, bf16, kb, unused);
    round_to(w.v, bf16, vb, unused);
    ok = dq.ptr && dk.ptr && dv.ptr && dout.ptr && dlse.ptr &&
         cudaMemcpy(dq.ptr, qb.data(), qb.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(dk.ptr, kb.data(), kb.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(dv.ptr, vb.data(), vb.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess;
    const auto dev = crisp::Device::cuda;
    const int64_t T = tokens;
    q = crisp::TensorView::contiguous(dq.ptr, bf16, Hq, T, d, dev);
    k = crisp::TensorView::contiguous(dk.ptr, bf16, Hkv, T, d, dev);
    v = crisp::TensorView::contiguous(dv.ptr, bf16, Hkv, T, d, dev);
    out = crisp::TensorView::contiguous(dout.ptr, bf16, Hq, T, d, dev);
    lse = crisp::TensorView::contiguous2d(dlse.ptr, crisp::DType::f32, Hq, T, dev);
  }
  // NaN-poisons out and lse on `stream` (0xffff is NaN in bf16, 0xffffffff in f32).
  cudaError_t poison(cudaStream_t stream = nullptr) {
    const cudaError_t e = cudaMemsetAsync(dout.ptr, 0xff, q_elements * 2, stream);
    return e != cudaSuccess ? e : cudaMemsetAsync(dlse.ptr, 0xff, q_heads * tokens * 4, stream);
  }
  // Copies out (bf16 bits) and lse back (synchronous).
  void download(std::vector<uint16_t>& o, std::vector<float>& l) {
    o.resize(q_elements);
    l.resize(static_cast<std::size_t>(q_heads * tokens));
    ASSERT_EQ(cudaMemcpy(o.data(), dout.ptr, o.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(l.data(), dlse.ptr, l.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  }
};

// plan_async + attend_async make no host synchronisation: both can be captured in one CUDA graph
// and replayed (the Hopper kernel's persistent launch allocates its work counter with
// cudaMallocAsync, a graph memory node). 8 heads x 47 query blocks = 376 work items, more than an
// H200 has SMs, so the persistent CTAs take most rows from the counter. The replay, started on a
// dense plan and NaN-poisoned outputs, must give bit for bit the outputs of a direct run. Twice:
// one head per tile, and GQA packing (GqaPacking::pack on sm_90: the union rows, the packed
// work order's sort and their cudaMallocAsync block are captured too; elsewhere it has no effect).
class GpuAttentionGraph : public ::testing::TestWithParam<crisp::GqaPacking> {};

TEST_P(GpuAttentionGraph, PlanAndAttendCaptureInOneCudaGraph) {
  SKIP_WITHOUT_GPU();
  crisp::CudaOptions options;
  options.gqa_packing = GetParam();
  crisp::WorkloadSpec spec = crisp_test::workload_spec(8, 2, 128, {6000}, 33);
  const crisp::Workload w = crisp::make_workload(spec);
  const int64_t d = 128;
  DeviceProblem problem(w, 8, 2, d);
  ASSERT_TRUE(problem.ok);
  const auto &q = problem.q, &k = problem.k, &v = problem.v, &out = problem.out, &lse = problem.lse;
  const crisp::Config cfg = crisp::Config::from_preset("crisp");
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  crisp::cuda::DevicePlan dplan(8, 2, d, w.cu_seqlens, cfg);

  // Direct run (also the warm-up that sizes the planning workspace).
  crisp::cuda::plan_async(q, k, cfg, dplan, stream);
  crisp::cuda::attend_async(q, k, v, dplan, out, lse, stream, options);
  CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<uint16_t> direct_out, graph_out;
  std::vector<float> direct_lse, graph_lse;
  problem.download(direct_out, direct_lse);

  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  crisp::cuda::plan_async(q, k, cfg, dplan, stream);
  crisp::cuda::attend_async(q, k, v, dplan, out, lse, stream, options);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    dplan.upload(crisp::dense_plan(8, 2, d, w.cu_seqlens, cfg.block_size), stream);
    CUDA_OK(problem.poison(stream));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    problem.download(graph_out, graph_lse);
    EXPECT_EQ(graph_out, direct_out);
    EXPECT_EQ(graph_lse, direct_lse);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(GqaPacking, GpuAttentionGraph,
                         ::testing::Values(crisp::GqaPacking::separate, crisp::GqaPacking::pack),
                         [](const ::testing::TestParamInfo<crisp::GqaPacking>& info) {
                           return std::string(crisp::to_string(info.param));
                         });

// crisp::Attention on the device: one plan, two runs, the same bits, and the same bits as the
// DevicePlan + plan_async + attend_async path it wraps; then a plan of another shape on the same
// object.
TEST(GpuAttentionObject, PlanOnceRunTwiceMatchesTheDevicePlanPath) {
  SKIP_WITHOUT_GPU();
  const int64_t Hq = 4, Hkv = 2, d = 128;
  const crisp::Config cfg = crisp::Config::from_preset("crisp");
  crisp::Options options;
  options.backend = crisp::Backend::cuda;
  crisp::Attention attention(cfg, options);  // kept across both shapes
  for (const int64_t n : {int64_t{3000}, int64_t{1200}}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const crisp::Workload w = crisp::make_workload(crisp_test::workload_spec(Hq, Hkv, d, {n}, 41 + n));
    DeviceProblem problem(w, Hq, Hkv, d);
    ASSERT_TRUE(problem.ok);
    const auto &q = problem.q, &k = problem.k, &v = problem.v, &out = problem.out, &lse = problem.lse;
    auto run_and_download = [&](const std::function<void()>& run, std::vector<uint16_t>& o, std::vector<float>& l) {
      CUDA_OK(problem.poison());
      run();
      CUDA_OK(cudaDeviceSynchronize());
      problem.download(o, l);
    };
    attention.plan(q, k);
    EXPECT_EQ(attention.backend(), crisp::Backend::cuda);
    std::vector<uint16_t> first_out, second_out, direct_out;
    std::vector<float> first_lse, second_lse, direct_lse;
    run_and_download([&] { attention.run(q, k, v, out, lse); }, first_out, first_lse);
    run_and_download([&] { attention.run(q, k, v, out, lse); }, second_out, second_lse);
    EXPECT_EQ(first_out, second_out);
    EXPECT_EQ(first_lse, second_lse);
    crisp::cuda::DevicePlan dplan(Hq, Hkv, d, w.cu_seqlens, cfg);
    run_and_download(
        [&] {
          crisp::cuda::plan_async(q, k, cfg, dplan);
          crisp::cuda::attend_async(q, k, v, dplan, out, lse);
        },
        direct_out, direct_lse);
    EXPECT_EQ(first_out, direct_out);
    EXPECT_EQ(first_lse, direct_lse);
    const crisp::Plan host = attention.host_plan();
    EXPECT_EQ(host.density(), dplan.to_host().density());
  }
}

// ------------------------------------------------------------------ timing (not a test)
// Run with --gtest_also_run_disabled_tests --gtest_filter='*Timing*'. Hq=32, Hkv=8, d=128, bf16,
// CRISP_TIMING_N tokens (default 131072): dense and random layouts of ~10% and ~5% density.
// Effective FLOP = 4 d B^2 (nnz - N/2) per head (the diagonal block counts half, so the dense
// plan gives the usual causal 2 n^2 d).
TEST(GpuAttentionTiming, DISABLED_EffectiveTflops) {
  SKIP_WITHOUT_GPU();
  const char* env = std::getenv("CRISP_TIMING_N");
  const int64_t n = env ? std::atoll(env) : 131072;
  const int64_t Hq = 32, Hkv = 8, d = 128;
  const int B = 128;
  std::vector<uint16_t> qb(Hq * n * d), kb(Hkv * n * d), vb(Hkv * n * d);
  auto fill = [](std::vector<uint16_t>& x, uint64_t seed) {
#pragma omp parallel for
    for (int64_t i = 0; i < static_cast<int64_t>(x.size()); ++i) {
      uint64_t z = (static_cast<uint64_t>(i) + seed) * 0x9E3779B97F4A7C15ull;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z ^= z >> 27;
      const float u = static_cast<float>((z >> 40) & 0xFFFFFF) / 16777216.0f;  // [0, 1)
      x[i] = crisp::half::float_to_bf16(2.0f * u - 1.0f);
    }
  };
  fill(qb, 1);
  fill(kb, 2);
  fill(vb, 3);
  DeviceBuffer dq(qb.size() * 2), dk(kb.size() * 2), dv(vb.size() * 2), dout(qb.size() * 2), dlse(Hq * n * 4);
  ASSERT_TRUE(dq.ptr && dk.ptr && dv.ptr && dout.ptr && dlse.ptr);
  CUDA_OK(cudaMemcpy(dq.ptr, qb.data(), qb.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dk.ptr, kb.data(), kb.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dv.ptr, vb.data(), vb.size() * 2, cudaMemcpyHostToDevice));
  const auto dev = crisp::Device::cuda;
  const auto q = crisp::TensorView::contiguous(dq.ptr, bf16, Hq, n, d, dev);
  const auto k = crisp::TensorView::contiguous(dk.ptr, bf16, Hkv, n, d, dev);
  const auto v = crisp::TensorView::contiguous(dv.ptr, bf16, Hkv, n, d, dev);
  const auto o = crisp::TensorView::contiguous(dout.ptr, bf16, Hq, n, d, dev);
  const auto l = crisp::TensorView::contiguous2d(dlse.ptr, crisp::DType::f32, Hq, n, dev);
  const crisp::Plan dense = crisp::dense_plan(Hq, Hkv, d, {0, n}, B);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (double keep : {1.0, 0.1, 0.05}) {
    const crisp::Plan plan = keep >= 1.0 ? dense : random_plan(dense, keep, 99);
    crisp::cuda::DevicePlan dplan(plan);
    double work_blocks = 0;
    for (const auto& hp : plan.sequences[0].heads)
      work_blocks += static_cast<double>(hp.col.size()) - plan.sequences[0].num_blocks / 2.0;
    const double flop = 4.0 * d * B * B * work_blocks;
    crisp::cuda::attend_async(q, k, v, dplan, o, l);  // warm-up
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> ms;
    for (int rep = 0; rep < 5; ++rep) {
      cudaEventRecord(start);
      crisp::cuda::attend_async(q, k, v, dplan, o, l);
      cudaEventRecord(stop);
      CUDA_OK(cudaEventSynchronize(stop));
      float t = 0;
      cudaEventElapsedTime(&t, start, stop);
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const float med = ms[ms.size() / 2];
    std::printf("TIMING n=%lld Hq=32 Hkv=8 d=128 bf16 B=128 density %.3f: median %.3f ms (min %.3f), %.1f TFLOP/s effective\n",
                static_cast<long long>(n), plan.density(), med, ms.front(), flop / (med * 1e-3) / 1e12);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

}  // namespace
