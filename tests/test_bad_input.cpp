// tests/test_bad_input.cpp — every bad input gives a crisp::Error naming the argument (never a
// crash, hang or silently wrong result), and the documented results of the edge cases that are
// valid: n = 1, n < B, n not a multiple of B.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend.h"  // detail::within_memory
#include "crisp/attention.h"
#include "crisp/context_parallel.h"
#include "crisp/crisp.h"
#include "crisp/cuda.h"
#include "crisp/npy.h"
#include "crisp/workload.h"
#include "oracle.h"
#include "test_util.h"

namespace {

using crisp_test::Tensor3;

// Runs f; it must throw crisp::Error whose argument() is `argument` and whose what() names it.
void expect_error(const std::function<void()>& f, const std::string& argument, const std::string& note = "") {
  try {
    f();
    ADD_FAILURE() << note << ": no crisp::Error thrown (expected one naming '" << argument << "')";
  } catch (const crisp::Error& e) {
    EXPECT_EQ(e.argument(), argument) << note << ": what() = " << e.what();
    EXPECT_NE(std::string(e.what()).find(argument), std::string::npos) << note << ": what() = " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << note << ": threw a non-crisp exception: " << e.what();
  }
}

struct Qkv {
  Tensor3 q, k, v;
  Qkv(int64_t hq, int64_t hkv, int64_t n, int64_t d, uint64_t seed = 7)
      : q(crisp_test::random_tensor(seed, hq, n, d)),
        k(crisp_test::random_tensor(seed + 1, hkv, n, d)),
        v(crisp_test::random_tensor(seed + 2, hkv, n, d)) {}
};

crisp::Config crisp_cfg() { return crisp::Config::from_preset("crisp"); }

// ---------------------------------------------------------------- shapes

TEST(BadInput, ErrorReasonIsWhatWithoutTheArgument) {
  const crisp::Error with_expected("config.alpha", "is 2", "(0, 1]");
  EXPECT_STREQ(with_expected.what(), "config.alpha: is 2; expected (0, 1]");
  EXPECT_EQ(with_expected.reason(), "is 2; expected (0, 1]");
  const crisp::Error colon_inside("--q a: b.npy", "cannot be read");
  EXPECT_EQ(colon_inside.reason(), "cannot be read");
}

TEST(BadInput, TokenCountsDisagree) {
  Tensor3 q = crisp_test::random_tensor(1, 2, 300, 16), k = crisp_test::random_tensor(2, 1, 299, 16);
  expect_error([&] { crisp::plan(q.view(), k.view(), crisp_cfg()); }, "k", "k tokens");
  Qkv x(2, 1, 300, 16);
  Tensor3 v = crisp_test::random_tensor(3, 1, 301, 16);
  crisp::Plan p = crisp::plan(x.q.view(), x.k.view(), crisp_cfg());
  std::vector<float> out(2 * 300 * 16), lse(2 * 300);
  auto ov = crisp::TensorView::contiguous(out.data(), crisp::DType::f32, 2, 300, 16);
  auto lv = crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, 2, 300);
  expect_error([&] { crisp::attend(x.q.view(), x.k.view(), v.view(), p, ov, lv); }, "v", "v tokens");
  // out / lse of the wrong shape
  auto bad_out = crisp::TensorView::contiguous(out.data(), crisp::DType::f32, 2, 299, 16);
  expect_error([&] { crisp::attend(x.q.view(), x.k.view(), x.v.view(), p, bad_out, lv); }, "out", "out shape");
  auto bad_lse = crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, 1, 300);
  expect_error([&] { crisp::attend(x.q.view(), x.k.view(), x.v.view(), p, ov, bad_lse); }, "lse", "lse shape");
  std::vector<uint16_t> lse16(2 * 300);
  auto lse_f16 = crisp::TensorView::contiguous2d(lse16.data(), crisp::DType::f16, 2, 300);
  expect_error([&] { crisp::attend(x.q.view(), x.k.view(), x.v.view(), p, ov, lse_f16); }, "lse", "lse dtype");
}

TEST(BadInput, HeadDimDisagrees) {
  Tensor3 q = crisp_test::random_tensor(1, 2, 300, 16), k = crisp_test::random_tensor(2, 1, 300, 8);
  expect_error([&] { crisp::plan(q.view(), k.view(), crisp_cfg()); }, "k", "k dim");
}

TEST(BadInput, QueryHeadsNotMultipleOfKvHeads) {
  Tensor3 q = crisp_test::random_tensor(1, 3, 300, 16), k = crisp_test::random_tensor(2, 2, 300, 16);
  expect_error([&] { crisp::plan(q.view(), k.view(), crisp_cfg()); }, "k", "3 % 2");
  expect_error([&] { crisp::dense_plan(3, 2, 16, {0, 300}); }, "num_kv_heads", "dense_plan 3 % 2");
}

TEST(BadInput, HeadDimTooLarge) {
  Tensor3 q = crisp_test::random_tensor(1, 1, 4, 257), k = crisp_test::random_tensor(2, 1, 4, 257);
  expect_error([&] { crisp::plan(q.view(), k.view(), crisp_cfg()); }, "q", "d = 257");
  // d = 256 is accepted.
  Tensor3 q2 = crisp_test::random_tensor(1, 1, 4, 256), k2 = crisp_test::random_tensor(2, 1, 4, 256);
  EXPECT_NO_THROW(crisp::plan(q2.view(), k2.view(), crisp_cfg()));
}

// The CUDA kernels' head dims, answered without a device (CPU-only builds included): what a caller
// such as a framework hook asks before it hands a layer to crisp on the GPU.
TEST(BadInput, CudaHeadDimQuery) {
  for (const int64_t d : {64, 128, 256}) EXPECT_TRUE(crisp::cuda::head_dim_supported(d)) << d;
  for (const int64_t d : {-128, 0, 32, 96, 192, 255, 257, 512}) EXPECT_FALSE(crisp::cuda::head_dim_supported(d)) << d;
}

// Kernel::automatic's size rule, answered without a device too: calls of less causal work than
// 2^35 (query heads x keys seen x head dim) take the portable kernel.
TEST(BadInput, AutomaticKernelSizeRule) {
  using crisp::cuda::automatic_prefers_hopper;
  EXPECT_FALSE(automatic_prefers_hopper(0, crisp::Batch{0, 8192}, 256));
  EXPECT_FALSE(automatic_prefers_hopper(9, crisp::Batch{0, 8192}, 64));   // SmolLM2 at 8k: 2^34.2
  EXPECT_TRUE(automatic_prefers_hopper(9, crisp::Batch{0, 16384}, 64));   // SmolLM2 at 16k
  EXPECT_FALSE(automatic_prefers_hopper(4, crisp::Batch{0, 2048}, 256));  // Gemma 3's global layers at 2k
  EXPECT_TRUE(automatic_prefers_hopper(4, crisp::Batch{0, 8192}, 256));   // ... at 8k: 2^35 and a little
  EXPECT_FALSE(automatic_prefers_hopper(32, crisp::Batch{0, 2048}, 128));
  EXPECT_TRUE(automatic_prefers_hopper(32, crisp::Batch{0, 4096}, 128));
  EXPECT_TRUE(automatic_prefers_hopper(32, crisp::Batch{0, 131072}, 128));
  // A chunk counts the keys its queries see: llama.cpp's 512-query ubatch over 8k keys is small.
  EXPECT_FALSE(automatic_prefers_hopper(4, crisp::Batch({0, 512}, {0, 8192}), 256));
  // The threshold itself: one query over 2^35 keys (it sees them all) is at it, one key fewer below.
  EXPECT_TRUE(automatic_prefers_hopper(1, crisp::Batch({0, 1}, {0, int64_t{1} << 35}), 1));
  EXPECT_FALSE(automatic_prefers_hopper(1, crisp::Batch({0, 1}, {0, (int64_t{1} << 35) - 1}), 1));
  // Varlen: the sequences' work adds up (two 4k prompts of 32 heads at d 64: 2^34 each).
  EXPECT_FALSE(automatic_prefers_hopper(32, crisp::Batch{0, 4096}, 64));
  EXPECT_TRUE(automatic_prefers_hopper(32, crisp::Batch{0, 4096, 8192}, 64));
  // Never throws: offsets that do not increase count as empty sequences.
  EXPECT_FALSE(automatic_prefers_hopper(32, crisp::Batch{0, 2048, 100}, 128));
  EXPECT_FALSE(automatic_prefers_hopper(-3, crisp::Batch{}, -1));
}

TEST(BadInput, ZeroTokens) {
  std::vector<float> q(16), k(16);
  auto qv = crisp::TensorView::contiguous(q.data(), crisp::DType::f32, 1, 0, 16);
  auto kv = crisp::TensorView::contiguous(k.data(), crisp::DType::f32, 1, 0, 16);
  expect_error([&] { crisp::plan(qv, kv, crisp_cfg()); }, "q", "n = 0");
  // An empty tensor often has no data pointer: its length is the problem to report.
  auto empty = crisp::TensorView::contiguous(nullptr, crisp::DType::f32, 1, 0, 16);
  try {
    crisp::plan(empty, empty, crisp_cfg());
    ADD_FAILURE() << "n = 0 with a null pointer accepted";
  } catch (const crisp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("n = 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(">= 1"), std::string::npos) << e.what();
  }
}

// A thread count far beyond any machine crashed the OpenMP runtime (stack exhaustion): bounded.
TEST(BadInput, ThreadCountIsBounded) {
  Qkv x(2, 1, 64, 16);
  for (int threads : {-1, crisp::kMaxThreads + 1, 100000}) {
    crisp::Options options;
    options.num_threads = threads;
    expect_error([&] { crisp::plan(x.q.view(), x.k.view(), crisp_cfg(), {}, options); }, "options.num_threads",
                 "num_threads " + std::to_string(threads));
  }
}

// A stride-0 view claiming 2^40 tokens (e.g. torch's expand) is refused by its size before any
// scan of its values (the scan of the NaN check ran for hours).
TEST(BadInput, HugeStrideZeroViewIsRefusedBeforeScanning) {
  std::vector<float> one_row(16, 0.5f);
  const int64_t tokens = int64_t{1} << 40;
  crisp::TensorView q{one_row.data(), crisp::DType::f32, crisp::Device::cpu, 3, {1, tokens, 16}, {0, 0, 1}};
  expect_error([&] { crisp::plan(q, q, crisp_cfg()); }, "q", "2^40 tokens");
}

TEST(BadInput, NullDataAndBadRank) {
  Tensor3 k = crisp_test::random_tensor(2, 1, 300, 16);
  auto qv = crisp::TensorView::contiguous(nullptr, crisp::DType::f32, 1, 300, 16);
  expect_error([&] { crisp::plan(qv, k.view(), crisp_cfg()); }, "q", "null q");
  Tensor3 q = crisp_test::random_tensor(1, 1, 300, 16);
  auto q2 = q.view();
  q2.rank = 2;
  expect_error([&] { crisp::plan(q2, k.view(), crisp_cfg()); }, "q", "rank 2 q");
}

// Finite inputs whose scores overflow float32 (q = k = 1e19: q·k ~ 1e38 * d) or whose float64
// values do not fit float32 gave all-NaN outputs with no error.
TEST(BadInput, OverflowingMagnitudes) {
  {
    Tensor3 q(2, 64, 16, 1e19f), k(1, 64, 16, 1e19f), v(1, 64, 16, 1.0f);
    expect_error([&] { crisp::plan(q.view(), k.view(), crisp_cfg()); }, "q", "q = k = 1e19");
    std::vector<float> out(2 * 64 * 16), lse(2 * 64);
    expect_error([&] {
      crisp::prefill(q.view(), k.view(), v.view(), crisp_cfg(), crisp::TensorView::contiguous(out.data(), crisp::DType::f32, 2, 64, 16),
                     crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, 2, 64));
    }, "q", "q = k = 1e19, prefill");
  }
  {
    Qkv x(2, 1, 64, 16);
    for (float& e : x.v.data) e = 1e37f;  // 64 tokens * 1e37 overflows the output sums
    std::vector<float> out(2 * 64 * 16), lse(2 * 64);
    expect_error([&] {
      crisp::prefill(x.q.view(), x.k.view(), x.v.view(), crisp_cfg(), crisp::TensorView::contiguous(out.data(), crisp::DType::f32, 2, 64, 16),
                     crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, 2, 64));
    }, "v", "v = 1e37");
  }
  {
    // The same checks through crisp::Attention (plan once, run many times): its plan and run
    // skipped them and returned all-NaN outputs.
    Tensor3 q(2, 64, 16, 1e19f), k(1, 64, 16, 1e19f), v(1, 64, 16, 1.0f);
    crisp::Attention attention(crisp_cfg());
    expect_error([&] { attention.plan(q.view(), k.view()); }, "q", "q = k = 1e19, Attention::plan");
    Qkv x(2, 1, 64, 16);
    attention.plan(x.q.view(), x.k.view());
    for (float& e : x.v.data) e = 1e37f;
    std::vector<float> out(2 * 64 * 16), lse(2 * 64);
    expect_error([&] {
      attention.run(x.q.view(), x.k.view(), x.v.view(), crisp::TensorView::contiguous(out.data(), crisp::DType::f32, 2, 64, 16),
                    crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, 2, 64));
    }, "v", "v = 1e37, Attention::run");
  }
  {
    std::vector<double> q(1 * 64 * 16, 0.5), k(q);
    q[100] = 1e300;  // finite in float64, Inf once converted to float32
    auto qv = crisp::TensorView::contiguous(q.data(), crisp::DType::f64, 1, 64, 16);
    auto kv = crisp::TensorView::contiguous(k.data(), crisp::DType::f64, 1, 64, 16);
    expect_error([&] { crisp::plan(qv, kv, crisp_cfg()); }, "q", "f64 1e300 in f32 precision");
  }
}

// Large but representable scores: the float32 softmax must stay finite and match float64. Scores
// were scaled twice (once for the max, once fused into the exponent's fma), so the exponent could
// exceed 0 by the product's rounding (an ulp of 1e12 is 1e5): Inf outputs, exit 0.
TEST(BadInput, LargeScoresStayFiniteAndExact) {
  const int64_t n = 256, d = 100;
  Tensor3 q = crisp_test::random_tensor(11, 1, n, d, 1e5), k = crisp_test::random_tensor(12, 1, n, d, 1e5);
  Tensor3 v = crisp_test::random_tensor(13, 1, n, d);
  crisp::Config dense = crisp::Config::from_preset("dense");
  dense.softmax_scale = 0.1;
  std::vector<float> out(n * d), lse(n);
  const crisp::Plan plan =
      crisp::prefill(q.view(), k.view(), v.view(), dense, crisp::TensorView::contiguous(out.data(), crisp::DType::f32, 1, n, d),
                     crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, 1, n));
  const oracle::Attention want = oracle::attend_chunks(
      oracle::Tensor::from_floats(q.data, 1, n, d), oracle::Tensor::from_floats(k.data, 1, n, d),
      oracle::Tensor::from_floats(v.data, 1, n, d), {0, n}, {0, n}, plan.block_size, 0.1, nullptr);
  double worst = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_TRUE(std::isfinite(out[i])) << "out[" << i << "] = " << out[i];
    worst = std::max(worst, std::fabs(out[i] - want.out.data[i]));
  }
  // Scores of ~1e11 leave each row one or two keys of weight ~1: float32's error is its rounding
  // of the scores (~1e4 absolute, so ~1e-3 relative on the weights), not the scale of the scores.
  EXPECT_LT(worst, 1e-2);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(lse[i], want.lse[i], 1e-6 * std::fabs(want.lse[i]) + 1e-3) << i;
}

// A softmax scale beyond float32 (the kernels scale in float32), and scale times scores that
// overflow: errors naming softmax_scale and q, not NaN outputs.
TEST(BadInput, SoftmaxScaleAndOutputRanges) {
  Qkv x(1, 1, 128, 16);
  std::vector<float> out(128 * 16), lse(128);
  const auto ov = crisp::TensorView::contiguous(out.data(), crisp::DType::f32, 1, 128, 16);
  const auto lv = crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, 1, 128);
  crisp::Config huge = crisp::Config::from_preset("dense");
  huge.softmax_scale = 1e300;
  expect_error([&] { crisp::prefill(x.q.view(), x.k.view(), x.v.view(), huge, ov, lv); }, "softmax_scale", "scale 1e300");
  crisp::Config large = crisp::Config::from_preset("dense");
  large.softmax_scale = 1e37;  // float32 holds it, but scores of ~4 times it do not
  expect_error([&] { crisp::prefill(x.q.view(), x.k.view(), x.v.view(), large, ov, lv); }, "q", "scale 1e37");
  crisp::Options f64;
  f64.precision = crisp::Precision::f64;
  // float64 arithmetic holds the scores, a float32 lse does not: refused naming lse.
  expect_error([&] { crisp::prefill(x.q.view(), x.k.view(), x.v.view(), large, ov, lv, {}, f64); }, "lse", "f32 lse");
  std::vector<double> lse64(128);
  crisp::prefill(x.q.view(), x.k.view(), x.v.view(), large, ov, crisp::TensorView::contiguous2d(lse64.data(), crisp::DType::f64, 1, 128),
                 {}, f64);
  for (float o : out) ASSERT_TRUE(std::isfinite(o));
  // v beyond float16's range into an f16 out.
  for (float& e : x.v.data) e *= 1e5f;
  std::vector<uint16_t> out16(128 * 16);
  expect_error([&] {
    crisp::prefill(x.q.view(), x.k.view(), x.v.view(), crisp_cfg(), crisp::TensorView::contiguous(out16.data(), crisp::DType::f16, 1, 128, 16), lv);
  }, "out", "v 1e5 into f16");
}

// Outputs that would overwrite inputs or each other, and expanded outputs.
TEST(BadInput, OutputMemory) {
  Qkv x(2, 1, 128, 16);
  std::vector<float> out(2 * 128 * 16), lse(2 * 128);
  const auto ov = crisp::TensorView::contiguous(out.data(), crisp::DType::f32, 2, 128, 16);
  const auto lv = crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, 2, 128);
  const auto run = [&](const crisp::TensorView& o, const crisp::TensorView& l) {
    crisp::prefill(x.q.view(), x.k.view(), x.v.view(), crisp_cfg(), o, l);
  };
  expect_error([&] { run(ov, crisp::TensorView::contiguous2d(out.data(), crisp::DType::f32, 2, 128)); }, "lse", "lse in out");
  expect_error([&] { run(ov, crisp::TensorView::contiguous2d(x.k.data.data(), crisp::DType::f32, 2, 128)); }, "lse", "lse in k");
  {
    std::vector<float> vo(2 * 128 * 16);  // v in the first half of out's buffer
    std::copy(x.v.data.begin(), x.v.data.end(), vo.begin());
    const auto vview = crisp::TensorView::contiguous(vo.data(), crisp::DType::f32, 1, 128, 16);
    const auto oview = crisp::TensorView::contiguous(vo.data(), crisp::DType::f32, 2, 128, 16);
    expect_error([&] { crisp::prefill(x.q.view(), x.k.view(), vview, crisp_cfg(), oview, lv); }, "out", "out over v");
  }
  {
    // out one row after q in one buffer: rows another block still reads would be overwritten.
    std::vector<float> qo(2 * 128 * 16 + 16);
    std::copy(x.q.data.begin(), x.q.data.end(), qo.begin());
    const auto qview = crisp::TensorView::contiguous(qo.data(), crisp::DType::f32, 2, 128, 16);
    const auto oview = crisp::TensorView::contiguous(qo.data() + 16, crisp::DType::f32, 2, 128, 16);
    expect_error([&] { crisp::prefill(qview, x.k.view(), x.v.view(), crisp_cfg(), oview, lv); }, "out", "out shifted over q");
  }
  {
    std::vector<float> kv(2 * 128 * 16);  // k and out share one buffer
    std::copy(x.k.data.begin(), x.k.data.end(), kv.begin());
    const auto kview = crisp::TensorView::contiguous(kv.data(), crisp::DType::f32, 1, 128, 16);
    const auto oview = crisp::TensorView::contiguous(kv.data(), crisp::DType::f32, 2, 128, 16);
    expect_error([&] { crisp::prefill(x.q.view(), kview, x.v.view(), crisp_cfg(), oview, lv); }, "out", "out over k");
  }
  crisp::TensorView expanded = ov;
  expanded.stride[1] = 0;
  expect_error([&] { run(expanded, lv); }, "out", "out with token stride 0");
  crisp::TensorView lse_expanded = lv;
  lse_expanded.stride[0] = 0;
  expect_error([&] { run(ov, lse_expanded); }, "lse", "lse with head stride 0");
  // Strides under which two indices meet with no zero stride: results overwrote each other (a probe
  // found O off by 3 and LSE by 5 with no error).
  crisp::TensorView folded = ov;
  folded.stride = {128 * 16, 1, 1};  // token t, dim x and token t + 1, dim x - 1 are one element
  expect_error([&] { run(folded, lv); }, "out", "out with overlapping strides");
  crisp::TensorView lse_folded = lv;
  lse_folded.stride = {1, 1, 1};
  expect_error([&] { run(ov, lse_folded); }, "lse", "lse with overlapping strides");
  {
    // Padded, permuted and negative-stride outputs keep their elements apart: accepted, and equal to
    // the contiguous run.
    run(ov, lv);
    const std::vector<float> want = out;
    std::vector<float> padded(2 * 128 * 20, -1.0f);
    crisp::TensorView token_major = ov;  // [T, H, d] memory with rows padded to 20
    token_major.data = padded.data();
    token_major.stride = {20, 2 * 20, 1};
    run(token_major, lv);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t t = 0; t < 128; ++t)
        for (int64_t e = 0; e < 16; ++e)
          ASSERT_EQ(padded[static_cast<size_t>(t * 40 + h * 20 + e)], want[static_cast<size_t>((h * 128 + t) * 16 + e)]);
  }
  {
    // lse within a strided out's span: refused, whether it meets out's elements (it wrote over
    // out's rows unnoticed when out was not dense) or lies in out's padding only (the rule is the
    // spans': no layout has a reason to interleave the two outputs).
    std::vector<float> shared(2 * 128 * 32);
    crisp::TensorView padded_out = ov;
    padded_out.data = shared.data();
    padded_out.stride = {128 * 32, 32, 1};
    const auto lse_over_rows = crisp::TensorView::contiguous2d(shared.data(), crisp::DType::f32, 2, 128);
    expect_error([&] { run(padded_out, lse_over_rows); }, "lse", "lse over a padded out's rows");
    crisp::TensorView lse_in_padding = lse_over_rows;
    lse_in_padding.data = shared.data() + 16;  // columns 16-31 of out's rows: padding
    lse_in_padding.stride = {128 * 32, 32};
    expect_error([&] { run(padded_out, lse_in_padding); }, "lse", "lse in a padded out's padding");
  }
  // out may be q itself: the result equals a run into separate memory.
  run(ov, lv);
  Tensor3 q_copy = x.q;
  crisp::prefill(x.q.view(), x.k.view(), x.v.view(), crisp_cfg(), x.q.view(), lv);
  EXPECT_EQ(x.q.data, out);
  // Views of one fused buffer [T, 3, H, d] (q, k, v interleaved; H = 1 here, so no GQA) are not
  // refused, out written into q's slots among them.
  const int64_t T = 128, d = 16;
  std::vector<float> qkv(static_cast<size_t>(T * 3 * d));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t x_ = 0; x_ < d; ++x_) {
      qkv[static_cast<size_t>((t * 3 + 0) * d + x_)] = q_copy.data[static_cast<size_t>(t * d + x_)];
      qkv[static_cast<size_t>((t * 3 + 1) * d + x_)] = x.k.data[static_cast<size_t>(t * d + x_)];
      qkv[static_cast<size_t>((t * 3 + 2) * d + x_)] = x.v.data[static_cast<size_t>(t * d + x_)];
    }
  const auto slot = [&](int part) {
    crisp::TensorView view = crisp::TensorView::contiguous(qkv.data() + part * d, crisp::DType::f32, 1, T, d);
    view.stride = {T * 3 * d, 3 * d, 1};
    return view;
  };
  std::vector<float> lse1(T), out1(T * d);
  crisp::prefill(crisp::TensorView::contiguous(q_copy.data.data(), crisp::DType::f32, 1, T, d), x.k.view(), x.v.view(),
                 crisp_cfg(), crisp::TensorView::contiguous(out1.data(), crisp::DType::f32, 1, T, d),
                 crisp::TensorView::contiguous2d(lse1.data(), crisp::DType::f32, 1, T));
  ASSERT_NO_THROW(crisp::prefill(slot(0), slot(1), slot(2), crisp_cfg(), slot(0),
                                 crisp::TensorView::contiguous2d(lse1.data(), crisp::DType::f32, 1, T)));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t x_ = 0; x_ < d; ++x_)
      ASSERT_EQ(qkv[static_cast<size_t>((t * 3) * d + x_)], out1[static_cast<size_t>(t * d + x_)]) << t << ", " << x_;
}

// Strides whose element offsets overflow int64 (every head read as head 0), and a block table
// whose row stride no real table has (two sequences: a crash, or sequence 1 reading row 0).
TEST(BadInput, StridesAndTableStridesBeyondMemory) {
  Qkv x(2, 1, 64, 16);
  crisp::TensorView q = x.q.view();
  q.stride[0] = int64_t(1) << 62;
  expect_error([&] { crisp::plan(q, x.k.view(), crisp_cfg()); }, "q", "head stride 2^62");
  crisp::TensorView k = x.k.view();
  k.stride[1] = -(int64_t(1) << 61);
  expect_error([&] { crisp::plan(x.q.view(), k, crisp_cfg()); }, "k", "token stride -2^61");
  // The largest extents and strides: the reach is computed without overflowing (UBSan) and refused.
  crisp::TensorView q_max = x.q.view();
  q_max.shape[0] = q_max.stride[0] = std::numeric_limits<int64_t>::max();
  crisp::TensorView k_one = x.k.view();
  expect_error([&] { crisp::plan(q_max, k_one, crisp_cfg()); }, "q", "INT64_MAX heads and head stride");
  // Stride-0 views span no memory whatever their extents: an element count beyond 2^62 is refused
  // before anything multiplies the extents (it escaped as std::length_error).
  crisp::TensorView q_wide = x.q.view();
  q_wide.shape = {int64_t(1) << 40, (int64_t(1) << 31) - 1, 256};
  q_wide.stride = {0, 0, 0};
  {
    const std::string m = crisp_test::error_of([&] { crisp::plan(q_wide, x.k.view(), crisp_cfg()); });
    EXPECT_NE(m.find("q: has shape [1099511627776, 2147483647, 256], more than 2^62 elements"), std::string::npos) << m;
  }
  // TensorView::contiguous of extents whose head stride overflows (UBSan found the multiply).
  expect_error([&] { crisp::TensorView::contiguous(x.q.data.data(), crisp::DType::f32, 2, int64_t(1) << 62, 4); },
               "tokens", "contiguous head stride beyond int64");

  std::vector<int32_t> table(8, 0);
  crisp::Batch batch({0, 32, 64}, {0, 32, 64});
  batch.block_table.data = table.data();
  batch.block_table.page_size = 16;
  batch.block_table.max_pages_per_sequence = int64_t(1) << 40;
  expect_error([&] { crisp::plan(x.q.view(), x.k.view(), crisp_cfg(), batch); }, "batch.block_table.max_pages_per_sequence",
               "stride 2^40");
}

// A call's allocation failure reads as every other refused input (crisp::Error naming q), not as
// std::bad_alloc or std::length_error escaping the library; other results pass through.
TEST(BadInput, AllocationFailuresAreErrors) {
  expect_error([] { crisp::detail::within_memory([]() -> int { throw std::bad_alloc(); }); }, "q", "bad_alloc");
  expect_error([] { crisp::detail::within_memory([]() -> int { throw std::length_error("vector"); }); }, "q",
               "length_error");
  EXPECT_EQ(crisp::detail::within_memory([] { return 7; }), 7);
  EXPECT_NE(crisp_test::error_of([] { crisp::detail::within_memory([]() -> int { throw std::bad_alloc(); }); })
                .find("out of memory"),
            std::string::npos);
}

// Token counts beyond int32 in the functions that take counts, not tensors.
TEST(BadInput, TokenCountsBeyondInt32WithoutTensors) {
  const int64_t too_many = (int64_t(1) << 39) + 261;
  expect_error([&] { crisp::dense_plan(2, 1, 16, crisp::SeqLens{0, too_many}); }, "cu_seqlens", "dense_plan 2^39");
  expect_error([&] { crisp::dense_plan(2, 1, 16, crisp::SeqLens{0, std::numeric_limits<int64_t>::max()}); }, "cu_seqlens",
               "dense_plan INT64_MAX");
  expect_error([&] { crisp::dense_plan(2, 1, 16, crisp::Batch(crisp::SeqLens{0, 64}, crisp::SeqLens{0, too_many})); },
               "batch.cu_seqlens_k", "dense_plan keys 2^39");
  // Within int32 tokens, but the causal blocks of one head overflow the CSR's int32 (a std::bad_alloc
  // before, or an int32 overflow at 4-8M tokens): an error naming what gave the key count.
  expect_error([&] { crisp::dense_plan(2, 1, 16, crisp::SeqLens{0, int64_t(1) << 30}, 64); }, "cu_seqlens",
               "dense_plan 2^30 tokens");
  expect_error([&] { crisp::dense_plan(2, 1, 16, crisp::SeqLens{0, 65535 * 128 + 1}); }, "cu_seqlens",
               "dense_plan 65536 blocks");
  expect_error([&] { crisp::cp_shard(too_many, 64, crisp::CpPartition::zigzag, 0, 2); }, "n", "cp_shard 2^39");
}

// crisp::check_inputs: plan's shape checks alone (callers check before allocating outputs);
// crisp::check_workload: make_workload's checks alone.
TEST(BadInput, ShapeChecksAloneNameTheArgument) {
  Qkv x(4, 2, 96, 16);
  EXPECT_NO_THROW(crisp::check_inputs(x.q.view(), x.k.view(), nullptr));
  crisp::TensorView v = x.v.view();
  EXPECT_NO_THROW(crisp::check_inputs(x.q.view(), x.k.view(), &v));
  crisp::TensorView bad_k = x.k.view();
  bad_k.shape[0] = 3;  // does not divide 4 query heads
  expect_error([&] { crisp::check_inputs(x.q.view(), bad_k, nullptr); }, "k", "Hkv 3");
  crisp::TensorView short_v = x.v.view();
  short_v.shape[1] = 95;
  expect_error([&] { crisp::check_inputs(x.q.view(), x.k.view(), &short_v); }, "v", "v tokens");
  crisp::TensorView chunk = x.q.view();
  chunk.shape[1] = 40;  // the last 40 of 96 positions: valid with a batch saying so
  EXPECT_NO_THROW(crisp::check_inputs(chunk, x.k.view(), nullptr, crisp::Batch(crisp::SeqLens{0, 40}, crisp::SeqLens{0, 96})));
  expect_error([&] { crisp::check_inputs(x.q.view(), x.k.view(), nullptr, crisp::Batch(crisp::SeqLens{0, 96}, crisp::SeqLens{0, 40})); },
               "batch.cu_seqlens_k", "cu_seqlens_k ends below k's tokens");
  crisp::WorkloadSpec spec;
  spec.seq_lens = {256};
  EXPECT_NO_THROW(crisp::check_workload(spec));
  spec.head_dim = 7;
  expect_error([&] { crisp::check_workload(spec); }, "workload.head_dim", "head_dim 7");
  spec.head_dim = 64;
  spec.seq_lens = {4};
  expect_error([&] { crisp::check_workload(spec); }, "workload.needles", "4 tokens, 4 needles");
}

// CUDA views where no CUDA device can be used: an error naming q from the first check, not a
// failure of the first CUDA call inside the planner (a CUDA build on a machine without a GPU) or
// "not built" (a CPU-only build). Where a device exists, the views would be real: skipped.
TEST(BadInput, CudaViewsWithoutADevice) {
  if (crisp::cuda::available()) GTEST_SKIP() << "a CUDA device is available";
  Qkv x(2, 1, 64, 16);
  crisp::TensorView q = x.q.view(), k = x.k.view();
  q.device = k.device = crisp::Device::cuda;
  q.dtype = k.dtype = crisp::DType::bf16;
  expect_error([&] { crisp::plan(q, k, crisp_cfg()); }, "q", "cuda views, no device");
  try {
    crisp::plan(q, k, crisp_cfg());
  } catch (const crisp::Error& e) {  // a CUDA build: no usable device; a CPU-only build: not built
    const std::string what = e.what();
    EXPECT_TRUE(what.find("no usable CUDA device") != std::string::npos || what.find("not built") != std::string::npos)
        << what;
  }
}

// A moved-from Attention refuses every call with an error (plan dereferenced its empty state).
TEST(BadInput, MovedFromAttention) {
  Qkv x(2, 1, 64, 16);
  crisp::Attention a(crisp_cfg());
  crisp::Attention b(std::move(a));
  expect_error([&] { a.plan(x.q.view(), x.k.view()); }, "Attention", "plan after move");  // NOLINT(bugprone-use-after-move)
  expect_error([&] { (void)a.config(); }, "Attention", "config after move");
  b.plan(x.q.view(), x.k.view());
  EXPECT_TRUE(b.planned());
}

TEST(BadInput, NonFiniteValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  {
    Qkv x(2, 1, 300, 16);
    x.q.at(1, 299, 15) = nan;  // the very last element
    expect_error([&] { crisp::plan(x.q.view(), x.k.view(), crisp_cfg()); }, "q", "NaN in q");
  }
  {
    Qkv x(2, 1, 300, 16);
    x.k.at(0, 17, 3) = -inf;
    expect_error([&] { crisp::plan(x.q.view(), x.k.view(), crisp_cfg()); }, "k", "-Inf in k");
    // also the dense preset, which does no estimation, must refuse it
    expect_error([&] { crisp::plan(x.q.view(), x.k.view(), crisp::Config::from_preset("dense")); }, "k", "Inf in k, dense");
  }
  {
    Qkv x(2, 1, 300, 16);
    crisp::Plan p = crisp::plan(x.q.view(), x.k.view(), crisp_cfg());
    x.v.at(0, 100, 0) = inf;
    std::vector<float> out(2 * 300 * 16), lse(2 * 300);
    expect_error([&] {
      crisp::attend(x.q.view(), x.k.view(), x.v.view(), p, crisp::TensorView::contiguous(out.data(), crisp::DType::f32, 2, 300, 16),
                    crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, 2, 300));
    }, "v", "Inf in v");
    std::vector<float> o2(out.size()), l2(lse.size());
    expect_error([&] {
      crisp::prefill(x.q.view(), x.k.view(), x.v.view(), crisp_cfg(), crisp::TensorView::contiguous(o2.data(), crisp::DType::f32, 2, 300, 16),
                     crisp::TensorView::contiguous2d(l2.data(), crisp::DType::f32, 2, 300));
    }, "v", "Inf in v, prefill");
  }
  {
    // a NaN in f16 input
    std::vector<uint16_t> q(1 * 200 * 8, crisp_test::float_to_half(0.5f)), k(q);
    q[5] = 0x7E00;
    expect_error([&] {
      crisp::plan(crisp::TensorView::contiguous(q.data(), crisp::DType::f16, 1, 200, 8),
                  crisp::TensorView::contiguous(k.data(), crisp::DType::f16, 1, 200, 8), crisp_cfg());
    }, "q", "NaN in f16 q");
  }
}

TEST(BadInput, CuSeqlens) {
  Qkv x(2, 1, 300, 16);
  auto plan_with = [&](crisp::SeqLens cu) { return [&x, cu] { crisp::plan(x.q.view(), x.k.view(), crisp::Config::from_preset("crisp"), cu); }; };
  expect_error(plan_with({1, 300}), "cu_seqlens", "not starting at 0");
  expect_error(plan_with({0, 200, 100, 300}), "cu_seqlens", "decreasing");
  expect_error(plan_with({0, 200}), "cu_seqlens", "not ending at tokens");
  expect_error(plan_with({0, 400}), "cu_seqlens", "ending beyond tokens");
  expect_error(plan_with({0, 100, 100, 300}), "cu_seqlens", "empty sequence");
  expect_error(plan_with({0}), "cu_seqlens", "one entry");
  expect_error(plan_with({-5, 300}), "cu_seqlens", "negative start");
  // valid: {0, 300} and {0, 1, 300}
  EXPECT_NO_THROW(plan_with({0, 300})());
  EXPECT_NO_THROW(plan_with({0, 1, 300})());
}

// ---------------------------------------------------------------- configuration

// Extreme windows made w_sink + w_local overflow int64 in the routing rule (UBSan): bounded.
TEST(BadInput, StructuralWindowsAreBounded) {
  for (const char* key : {"w_sink", "w_local"}) {
    crisp::Config c = crisp_cfg();
    expect_error([&] { c.set(key, "9223372036854775807"); }, key, std::string(key) + " = INT64_MAX");
  }
  crisp::Config c = crisp_cfg();
  EXPECT_NO_THROW(c.set("w_sink", "1099511627776"));  // 2^40: the documented bound
}

TEST(BadInput, UnknownPresetAndParameters) {
  expect_error([] { crisp::Config::from_preset("sparse"); }, "preset", "unknown preset");
  expect_error([] { crisp::Config::from_preset(""); }, "preset", "empty preset");
  crisp::Config c = crisp_cfg();
  expect_error([&] { c.set("alhpa", "1"); }, "alhpa", "unknown key");
  expect_error([&] { c.set("alhpa=1"); }, "alhpa", "unknown key via key=value");
  expect_error([&] { c.set("alpha1.5"); }, "--set", "no '='");
  expect_error([&] { c.set("alpha", "abc"); }, "alpha", "unparsable");
  expect_error([&] { c.set("alpha", "1.5x"); }, "alpha", "trailing garbage");
  expect_error([&] { c.set("alpha", ""); }, "alpha", "empty value");
  expect_error([&] { c.set("alpha", "-1"); }, "alpha", "negative alpha");
  expect_error([&] { c.set("alpha", "nan"); }, "alpha", "NaN alpha");
  expect_error([&] { c.set("gamma", "1.5"); }, "gamma", "gamma > 1");
  expect_error([&] { c.set("pe_gamma", "0"); }, "pe_gamma", "pe_gamma = 0");
  expect_error([&] { c.set("tau_proxy", "2"); }, "tau_proxy", "tau_proxy > 1");
  expect_error([&] { c.set("rho", "0"); }, "rho", "rho = 0");
  expect_error([&] { c.set("w_sink", "-1"); }, "w_sink", "negative w_sink");
  expect_error([&] { c.set("min_budget", "1.5"); }, "min_budget", "fractional tokens");
  expect_error([&] { c.set("routing", "flex"); }, "routing", "unknown routing");
  expect_error([&] { c.set("vs_budget", "topp"); }, "vs_budget", "unknown rule");
  expect_error([&] { c.set("slash_cover", "double"); }, "slash_cover", "unknown cover");
  expect_error([&] { c.set("vs_floor", "median"); }, "vs_floor", "unknown floor");
  expect_error([&] { c.set("uniform_alpha", "0"); }, "uniform_alpha", "uniform_alpha = 0");
  expect_error([&] { c.set("uniform_alpha", "inf"); }, "uniform_alpha", "infinite uniform_alpha");
  expect_error([&] { c.set("uniform_floor_slash_blocks", "-2"); }, "uniform_floor_slash_blocks",
               "uniform_floor_slash_blocks below -1");
  expect_error([&] { c.set("pe_rule", "walk"); }, "pe_rule", "unknown PE rule");
  expect_error([&] { c.set("pe_alpha", "-0.5"); }, "pe_alpha", "negative pe_alpha");
  expect_error([&] { c.set("pe_alpha", "nan"); }, "pe_alpha", "NaN pe_alpha");
  expect_error([&] { c.set("block_size", "96"); }, "block_size", "block 96");
  expect_error([&] { c.set("block_size", "256"); }, "block_size", "block 256");
  // A rejected set() leaves the config unchanged.
  EXPECT_DOUBLE_EQ(c.alpha, 1.0);
  EXPECT_EQ(c.block_size, 128);
  // Every name in parameter_names() is accepted by set() with its current value.
  for (const auto& kv : c.to_key_values()) {
    if (kv.first == "preset") continue;
    EXPECT_NO_THROW(c.set(kv.first, kv.second)) << kv.first << "=" << kv.second;
  }
}

TEST(BadInput, InvalidConfigFieldsRejectedByPlan) {
  Qkv x(2, 1, 300, 16);
  struct Case {
    std::function<void(crisp::Config&)> mutate;
    const char* argument;
  };
  const std::vector<Case> cases = {
      {[](crisp::Config& c) { c.block_size = 96; }, "block_size"},
      {[](crisp::Config& c) { c.alpha = -1; }, "alpha"},
      {[](crisp::Config& c) { c.alpha = std::numeric_limits<double>::quiet_NaN(); }, "alpha"},
      {[](crisp::Config& c) { c.gamma = 0; }, "gamma"},
      {[](crisp::Config& c) { c.pe_gamma = 1.5; }, "pe_gamma"},
      {[](crisp::Config& c) { c.softmax_scale = -0.5; }, "softmax_scale"},
      {[](crisp::Config& c) { c.min_budget = -1; }, "min_budget"},
      {[](crisp::Config& c) { c.vertical_tokens = 0; }, "vertical_tokens"},
      // Out-of-range enum values (a cast from an int read elsewhere) must not silently plan.
      {[](crisp::Config& c) { c.routing = static_cast<crisp::Routing>(42); }, "routing"},
      {[](crisp::Config& c) { c.vs_budget = static_cast<crisp::VsRule>(7); }, "vs_budget"},
      {[](crisp::Config& c) { c.slash_cover = static_cast<crisp::SlashCover>(5); }, "slash_cover"},
      {[](crisp::Config& c) { c.vs_floor = static_cast<crisp::VsFloor>(3); }, "vs_floor"},
      {[](crisp::Config& c) { c.pe_rule = static_cast<crisp::PeRule>(2); }, "pe_rule"},
      {[](crisp::Config& c) { c.uniform_alpha = 0.0; }, "uniform_alpha"},
      {[](crisp::Config& c) { c.uniform_floor_slash_blocks = -5; }, "uniform_floor_slash_blocks"},
      // The last rows' held floor needs the uniform floor and last rows to apply to.
      {[](crisp::Config& c) { c.uniform_floor_last_rows = true; c.vs_floor = crisp::VsFloor::mean; c.proxy_last_rows = 16; },
       "uniform_floor_last_rows"},
      {[](crisp::Config& c) { c.uniform_floor_last_rows = true; c.vs_floor = crisp::VsFloor::uniform; c.proxy_last_rows = 0; },
       "uniform_floor_last_rows"},
      {[](crisp::Config& c) { c.pe_alpha = std::numeric_limits<double>::infinity(); }, "pe_alpha"},
  };
  for (const auto& c : cases) {
    crisp::Config cfg = crisp_cfg();
    c.mutate(cfg);
    expect_error([&] { crisp::plan(x.q.view(), x.k.view(), cfg); }, c.argument, std::string("config.") + c.argument);
  }
}

// ---------------------------------------------------------------- plan / attend mismatch

TEST(BadInput, AttendWithPlanOfOtherShapes) {
  Qkv small(2, 1, 300, 16), longer(2, 1, 400, 16), wide(4, 1, 300, 16), deep(2, 1, 300, 32);
  crisp::Plan p = crisp::plan(small.q.view(), small.k.view(), crisp_cfg());
  auto run = [&](Qkv& x) {
    return [&x, &p] {
      std::vector<float> out(x.q.data.size()), lse(static_cast<size_t>(x.q.heads * x.q.tokens));
      crisp::attend(x.q.view(), x.k.view(), x.v.view(), p,
                    crisp::TensorView::contiguous(out.data(), crisp::DType::f32, x.q.heads, x.q.tokens, x.q.dim),
                    crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, x.q.heads, x.q.tokens));
    };
  };
  expect_error(run(longer), "plan", "other token count");
  expect_error(run(wide), "plan", "other head count");
  expect_error(run(deep), "plan", "other head dim");
  // A plan whose layout was tampered with (a column beyond the diagonal) is refused, not run.
  crisp::Plan bad = p;
  auto& hp = bad.sequences[0].heads[0];
  hp.col[hp.row_ptr[1]] = 2;  // row 1 lists block 2
  std::vector<float> out(small.q.data.size()), lse(2 * 300);
  expect_error([&] {
    crisp::attend(small.q.view(), small.k.view(), small.v.view(), bad, crisp::TensorView::contiguous(out.data(), crisp::DType::f32, 2, 300, 16),
                  crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, 2, 300));
  }, "plan", "tampered layout");
  // A plan of a varlen batch does not fit a one-sequence call of the same total length.
  crisp::Plan varlen = crisp::plan(small.q.view(), small.k.view(), crisp_cfg(), {0, 150, 300});
  expect_error([&] {
    crisp::Plan v2 = varlen;
    v2.sequences[1].q_offset = 140;
    crisp::attend(small.q.view(), small.k.view(), small.v.view(), v2, crisp::TensorView::contiguous(out.data(), crisp::DType::f32, 2, 300, 16),
                  crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, 2, 300));
  }, "plan", "overlapping sequences");
}

// ---------------------------------------------------------------- chunks and paged K/V (§11)

namespace {

// Two sequences over a KV prefix: 100 queries of 300 keys, then 64 queries of 200 keys; q [2, 164,
// 16], contiguous k and v [1, 500, 16], and the same keys in a pool of 16-token pages.
struct ChunkCall {
  static constexpr int64_t kPage = 16;
  Tensor3 q = crisp_test::random_tensor(11, 2, 164, 16);
  Tensor3 k = crisp_test::random_tensor(12, 1, 500, 16);
  Tensor3 v = crisp_test::random_tensor(13, 1, 500, 16);
  crisp::SeqLens cu_q{0, 100, 164}, cu_k{0, 300, 500};
  // Pool of 32 pages (19 for sequence 0, 13 for sequence 1), ids in reverse order.
  Tensor3 k_pool = crisp_test::random_tensor(14, 1, 32 * kPage, 16);
  Tensor3 v_pool = crisp_test::random_tensor(15, 1, 32 * kPage, 16);
  std::vector<int32_t> table = std::vector<int32_t>(2 * 19, 0);
  std::vector<float> out = std::vector<float>(2 * 164 * 16), lse = std::vector<float>(2 * 164);

  ChunkCall() {
    for (int32_t p = 0; p < 19; ++p) table[p] = 31 - p;
    for (int32_t p = 0; p < 13; ++p) table[19 + p] = 12 - p;
  }
  crisp::BlockTable block_table() {
    crisp::BlockTable t;
    t.data = table.data();
    t.max_pages_per_sequence = 19;
    t.page_size = kPage;
    return t;
  }
  crisp::Batch batch() const { return crisp::Batch(cu_q, cu_k); }
  crisp::Batch paged() { return crisp::Batch(cu_q, cu_k, block_table()); }
  crisp::TensorView out_view() { return crisp::TensorView::contiguous(out.data(), crisp::DType::f32, 2, 164, 16); }
  crisp::TensorView lse_view() { return crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, 2, 164); }
  // Every entry point that takes a batch, each expected to refuse it naming `argument`.
  void expect_refused(const crisp::Batch& batch, Tensor3& keys, Tensor3& values, const std::string& argument,
                      const std::string& note) {
    expect_error([&] { crisp::plan(q.view(), keys.view(), crisp_cfg(), batch); }, argument, note + " (plan)");
    expect_error([&] {
      crisp::prefill(q.view(), keys.view(), values.view(), crisp_cfg(), out_view(), lse_view(), batch);
    }, argument, note + " (prefill)");
    expect_error([&] {
      crisp::Attention attention(crisp_cfg());
      attention.plan(q.view(), keys.view(), batch);
    }, argument, note + " (Attention::plan)");
  }
};

}  // namespace

TEST(BadInput, ChunkedBatchSeqlens) {
  ChunkCall c;
  ASSERT_NO_THROW(crisp::plan(c.q.view(), c.k.view(), crisp_cfg(), c.batch()));
  auto refused = [&](crisp::SeqLens q, crisp::SeqLens k, const std::string& argument, const std::string& note) {
    c.expect_refused(crisp::Batch(std::move(q), std::move(k)), c.k, c.v, argument, note);
  };
  refused({0, 100, 165}, c.cu_k, "batch.cu_seqlens_q", "cu_seqlens_q beyond q's tokens");
  refused({1, 100, 164}, c.cu_k, "batch.cu_seqlens_q", "cu_seqlens_q not starting at 0");
  refused({0, 100, 100, 164}, {0, 300, 400, 500}, "batch.cu_seqlens_q", "an empty query sequence");
  refused(c.cu_q, {0, 300, 499}, "batch.cu_seqlens_k", "cu_seqlens_k short of k's tokens");
  refused(c.cu_q, {0, 310, 300, 500}, "batch.cu_seqlens_k", "cu_seqlens_k decreasing");
  refused(c.cu_q, {0, 100, 300, 500}, "batch.cu_seqlens_k", "three key sequences for two query sequences");
  refused({}, c.cu_k, "batch.cu_seqlens_k", "one query sequence (empty cu_seqlens_q) for two key sequences");
  refused(c.cu_q, {0, 50, 500}, "batch.cu_seqlens_q", "n_q > n_k (100 queries over 50 keys)");
  expect_error([&] { crisp::dense_plan(2, 1, 16, crisp::Batch({0, 100, 164}, {0, 50, 500})); }, "batch.cu_seqlens_q",
               "dense_plan with n_q > n_k");
  expect_error([&] { crisp::dense_plan(2, 1, 16, crisp::Batch({0, 100, 164}, {0, 300, 400, 500})); },
               "batch.cu_seqlens_k", "dense_plan with sequence counts that differ");
}

TEST(BadInput, BlockTable) {
  ChunkCall c;
  ASSERT_NO_THROW(crisp::plan(c.q.view(), c.k_pool.view(), crisp_cfg(), c.paged()));
  auto refused = [&](const crisp::BlockTable& t, const std::string& argument, const std::string& note) {
    c.expect_refused(crisp::Batch(c.cu_q, c.cu_k, t), c.k_pool, c.v_pool, argument, note);
  };
  for (int64_t page_size : {8, 24, -16}) {
    crisp::BlockTable t = c.block_table();
    t.page_size = page_size;
    refused(t, "batch.block_table.page_size", "page_size " + std::to_string(page_size));
  }
  crisp::BlockTable t = c.block_table();
  t.data = nullptr;
  refused(t, "batch.block_table.data", "null table");
  t = c.block_table();
  t.device = crisp::Device::cuda;
  refused(t, "batch.block_table.device", "table on cuda, tensors on the cpu");
  t = c.block_table();
  t.device = static_cast<crisp::Device>(7);
  refused(t, "batch.block_table.device", "invalid device");
  {
    const std::string m = crisp_test::error_of([&] { crisp::plan(c.q.view(), c.k_pool.view(), crisp_cfg(), crisp::Batch(c.cu_q, c.cu_k, t)); });
    EXPECT_NE(m.find("is an invalid device"), std::string::npos) << m;  // it read "is cpu but q is on cpu"
  }
  t = c.block_table();
  t.max_pages_per_sequence = 18;
  refused(t, "batch.block_table.max_pages_per_sequence", "fewer pages than the longest sequence's 19");
  for (int32_t bad_id : {32, -1, 1 << 30}) {
    ChunkCall d;
    d.table[19 + 12] = bad_id;  // the last page sequence 1 reads
    c.expect_refused(d.paged(), d.k_pool, d.v_pool, "batch.block_table", "page id " + std::to_string(bad_id));
  }
  // The pool must hold whole pages, and v the same pool as k.
  Tensor3 ragged_k = crisp_test::random_tensor(16, 1, 32 * ChunkCall::kPage - 4, 16);
  Tensor3 ragged_v = crisp_test::random_tensor(17, 1, 32 * ChunkCall::kPage - 4, 16);
  c.expect_refused(c.paged(), ragged_k, ragged_v, "k", "a pool that is not a whole number of pages");
  Tensor3 short_v = crisp_test::random_tensor(18, 1, 31 * ChunkCall::kPage, 16);
  expect_error([&] {
    crisp::prefill(c.q.view(), c.k_pool.view(), short_v.view(), crisp_cfg(), c.out_view(), c.lse_view(), c.paged());
  }, "v", "v of another pool size");
}

// A sequence may read one page more than once: its keys then outnumber the pool's rows, and the
// bound on v's output sums must count the keys (64 here, over a pool of 16 rows). With uniform
// weights the output sums 64 * 8e36, beyond float32: an error naming v, not an infinite output.
TEST(BadInput, PagedValuesWhoseSumsOverflow) {
  Tensor3 q(1, 1, 16, 0.0f), k = crisp_test::random_tensor(21, 1, 16, 16), v(1, 16, 16, 8e36f);
  std::vector<int32_t> table = {0, 0, 0, 0};
  crisp::BlockTable t;
  t.data = table.data();
  t.max_pages_per_sequence = 4;
  t.page_size = 16;
  std::vector<float> out(16), lse(1);
  expect_error([&] {
    crisp::prefill(q.view(), k.view(), v.view(), crisp_cfg(), crisp::TensorView::contiguous(out.data(), crisp::DType::f32, 1, 1, 16),
                   crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, 1, 1), crisp::Batch({0, 1}, {0, 64}, t));
  }, "v", "v sums over 64 keys of a 16-row pool");
}

// A plan carries its batch's key positions, not its table: attend must get the keys that plan was
// made for, or refuse naming what does not fit.
TEST(BadInput, PlanUsedWithTheWrongKeysOrTable) {
  ChunkCall c;
  const crisp::Plan paged = crisp::plan(c.q.view(), c.k_pool.view(), crisp_cfg(), c.paged());
  const crisp::Plan contiguous = crisp::plan(c.q.view(), c.k.view(), crisp_cfg(), c.batch());
  // Returns the call to check (the views are taken when it runs).
  auto attend = [&c](const crisp::Plan* plan, Tensor3* keys, Tensor3* values, crisp::BlockTable table) {
    return [&c, plan, keys, values, table] {
      crisp::attend(c.q.view(), keys->view(), values->view(), *plan, c.out_view(), c.lse_view(), {}, table);
    };
  };
  // A paged plan without its table reads the pool as contiguous keys: refused (512 pool rows, 500 keys).
  EXPECT_EQ(paged.page_size, ChunkCall::kPage);
  EXPECT_EQ(contiguous.page_size, 0);
  expect_error(attend(&paged, &c.k_pool, &c.v_pool, {}), "block_table", "paged plan, no table");
  {
    // ... also where the pool holds as many rows as the batch has keys (it ran as contiguous K/V,
    // silently wrong): 500 keys over a pool of 512 rows cut to 500 is not a pool, so a batch whose
    // keys fill the pool exactly: 512 keys.
    Tensor3 q1 = crisp_test::random_tensor(21, 2, 12, 16);
    std::vector<int32_t> ids(32);
    for (int32_t p = 0; p < 32; ++p) ids[static_cast<size_t>(p)] = 31 - p;
    crisp::BlockTable table;
    table.data = ids.data();
    table.max_pages_per_sequence = 32;
    table.page_size = ChunkCall::kPage;
    const crisp::Plan full = crisp::plan(q1.view(), c.k_pool.view(), crisp_cfg(), crisp::Batch({0, 12}, {0, 512}, table));
    std::vector<float> out1(2 * 12 * 16), lse1(2 * 12);
    expect_error([&] {
      crisp::attend(q1.view(), c.k_pool.view(), c.v_pool.view(), full,
                    crisp::TensorView::contiguous(out1.data(), crisp::DType::f32, 2, 12, 16),
                    crisp::TensorView::contiguous2d(lse1.data(), crisp::DType::f32, 2, 12));
    }, "block_table", "paged plan, no table, pool rows = keys");
    // The Attention object's host plan carries the page size too.
    crisp::Attention attention(crisp_cfg());
    attention.plan(q1.view(), c.k_pool.view(), crisp::Batch({0, 12}, {0, 512}, table));
    EXPECT_EQ(attention.host_plan().page_size, ChunkCall::kPage);
  }
  // A table with page ids but page size 0 ("no table") read the pool as contiguous keys.
  crisp::BlockTable zero_page = c.block_table();
  zero_page.page_size = 0;
  c.expect_refused(crisp::Batch(c.cu_q, c.cu_k, zero_page), c.k_pool, c.v_pool, "batch.block_table.page_size",
                   "page ids with page size 0");
  expect_error(attend(&contiguous, &c.k, &c.v, zero_page), "block_table.page_size", "attend: page ids with page size 0");
  // A contiguous plan on a pool too small for its keys' pages.
  crisp::BlockTable small = c.block_table();
  small.max_pages_per_sequence = 18;
  expect_error(attend(&contiguous, &c.k_pool, &c.v_pool, small), "batch.block_table.max_pages_per_sequence",
               "table too narrow for the plan's keys");
  ChunkCall d;
  d.table[5] = 40;
  expect_error(attend(&contiguous, &d.k_pool, &d.v_pool, d.block_table()), "batch.block_table",
               "page id beyond the pool");
  crisp::Plan tampered = contiguous;
  tampered.sequences[0].first_row = 0;
  expect_error(attend(&tampered, &c.k, &c.v, {}), "plan", "first_row that does not follow from n_q and n_k");
  tampered = contiguous;
  tampered.sequences[1].n_q = 63;
  expect_error(attend(&tampered, &c.k, &c.v, {}), "plan", "query counts that do not cover q");
  // Counts beyond any call's: refused before they are added (this overflowed int64 in the checks).
  tampered = contiguous;
  tampered.sequences[0].n_q = tampered.sequences[0].n_k = std::numeric_limits<int64_t>::max();
  expect_error(attend(&tampered, &c.k, &c.v, {}), "plan", "n_q = n_k = INT64_MAX");
  // Attention::run with keys other than the planned pool's.
  crisp::Attention attention(crisp_cfg());
  attention.plan(c.q.view(), c.k_pool.view(), c.paged());
  expect_error([&] { attention.run(c.q.view(), c.k.view(), c.v.view(), c.out_view(), c.lse_view()); }, "k",
               "Attention planned on pages, run on contiguous keys");
}

// ---------------------------------------------------------------- .npy files

class Npy : public ::testing::Test {
 protected:
  std::filesystem::path dir = crisp_test::temp_dir();
  std::string path(const std::string& name) { return (dir / name).string(); }
  void expect_read_error(const std::string& name, const std::string& bytes, const std::string& note) {
    const std::string p = path(name);
    crisp_test::write_bytes(p, bytes);
    expect_error([&] { crisp::read_npy(p); }, p, note);
  }
};

TEST_F(Npy, RoundTrip) {
  std::vector<float> x = crisp_test::gaussian(3, 2 * 5 * 4);
  const std::string p = path("ok.npy");
  crisp::write_npy(p, x.data(), {2, 5, 4});
  crisp::NpyArray a = crisp::read_npy(p);
  EXPECT_EQ(a.dtype, crisp::DType::f32);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 5, 4}));
  ASSERT_EQ(a.bytes.size(), x.size() * 4);
  EXPECT_EQ(std::memcmp(a.bytes.data(), x.data(), a.bytes.size()), 0);
  crisp::TensorView v = a.view("Q.npy");
  EXPECT_EQ(v.heads(), 2);
  EXPECT_EQ(v.tokens(), 5);
  EXPECT_EQ(v.dim(), 4);
}

TEST_F(Npy, HandWrittenFilesAreRead) {
  // float32, float16 and float64, header written by hand as numpy does (v1.0 and v2.0).
  std::vector<float> x = {1.5f, -2.0f, 0.25f, 4.0f, 5.0f, 6.0f};
  const std::string p = path("f4.npy");
  crisp_test::write_bytes(p, crisp_test::npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3), }", crisp_test::float_payload(x)));
  crisp::NpyArray a = crisp::read_npy(p);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{1, 2, 3}));
  std::vector<uint16_t> h(6);
  for (size_t i = 0; i < 6; ++i) h[i] = crisp_test::float_to_half(x[i]);
  const std::string p2 = path("f2.npy");
  crisp_test::write_bytes(p2, crisp_test::npy_bytes("{'descr': '<f2', 'fortran_order': False, 'shape': (1, 2, 3), }",
                                                   std::string(reinterpret_cast<const char*>(h.data()), 12)));
  crisp::NpyArray b = crisp::read_npy(p2);
  EXPECT_EQ(b.dtype, crisp::DType::f16);
  ASSERT_EQ(b.bytes.size(), 12u);
  EXPECT_EQ(std::memcmp(b.bytes.data(), h.data(), 12), 0);
}

TEST_F(Npy, MissingFile) {
  const std::string p = path("does_not_exist.npy");
  std::filesystem::remove(p);
  expect_error([&] { crisp::read_npy(p); }, p, "missing");
  expect_error([&] { crisp::read_npy(dir.string()); }, dir.string(), "a directory");
}

TEST_F(Npy, CorruptFiles) {
  const std::string good_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 4), }";
  const std::string payload = crisp_test::float_payload(std::vector<float>(24, 1.0f));
  expect_read_error("empty.npy", "", "empty file");
  expect_read_error("garbage.npy", std::string("this is not a numpy file at all, just text\n") + std::string(100, 'x'), "garbage");
  expect_read_error("magic_only.npy", "\x93NUMPY", "magic only");
  expect_read_error("truncated_data.npy", crisp_test::npy_bytes(good_dict, payload.substr(0, 50)), "truncated data");
  std::string cut_header = crisp_test::npy_bytes(good_dict, payload);
  expect_read_error("truncated_header.npy", cut_header.substr(0, 30), "truncated header");
  expect_read_error("bad_version.npy", crisp_test::npy_bytes(good_dict, payload, 9), "version 9");
  expect_read_error("bad_dict.npy", crisp_test::npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, }", payload), "unterminated shape");
  expect_read_error("not_a_dict.npy", crisp_test::npy_bytes("hello world", payload), "header not a dict");
  expect_read_error("no_shape.npy", crisp_test::npy_bytes("{'descr': '<f4', 'fortran_order': False, }", payload), "no shape");
  expect_read_error("neg_shape.npy", crisp_test::npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3, 4), }", payload), "negative extent");
  expect_read_error("huge_shape.npy", crisp_test::npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4), }", payload), "overflowing shape");
  expect_read_error("big_endian.npy", crisp_test::npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3, 4), }", payload), "big-endian");
  // '|' marks single-byte types in numpy; a 4-byte float written so is malformed.
  expect_read_error("bar_f4.npy", crisp_test::npy_bytes("{'descr': '|f4', 'fortran_order': False, 'shape': (2, 3, 4), }", payload), "|f4");
  expect_read_error("fortran.npy", crisp_test::npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3, 4), }", payload), "fortran order");
  expect_read_error("int32.npy", crisp_test::npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3, 4), }", payload), "int32 dtype");
  // header length field pointing beyond the file
  std::string long_len = crisp_test::npy_bytes(good_dict, "");
  long_len[8] = '\xff';
  long_len[9] = '\x7f';
  expect_read_error("header_len.npy", long_len, "header length beyond the file");
}

TEST_F(Npy, WrongRankForAView) {
  const std::string p = path("rank1.npy");
  std::vector<float> x(8, 1.0f);
  crisp::write_npy(p, x.data(), {8});
  crisp::NpyArray a = crisp::read_npy(p);
  expect_error([&] { a.view("Q.npy"); }, "Q.npy", "rank-1 array as a view");
}

// The message names what is wrong: a bool or int8 array's type (not the '|' byte-order mark numpy
// writes for single-byte types), a record array's fields, a FIFO before it is opened (reading one
// with no writer blocked forever).
TEST_F(Npy, ProblemsAreNamedForWhatTheyAre) {
  const std::string payload = crisp_test::float_payload(std::vector<float>(24, 1.0f));
  const auto message_of = [&](const std::string& name, const std::string& dict) {
    const std::string p = path(name);
    crisp_test::write_bytes(p, crisp_test::npy_bytes(dict, payload));
    return crisp_test::error_of([&] { crisp::read_npy(p); });
  };
  for (const char* descr : {"|b1", "|i1", "|u1", "|V2", "<i4"}) {
    const std::string m = message_of("type.npy", std::string("{'descr': '") + descr +
                                                    "', 'fortran_order': False, 'shape': (2, 3, 4), }");
    EXPECT_NE(m.find(std::string("unsupported dtype '") + descr + "'"), std::string::npos) << m;
  }
  const std::string record =
      message_of("record.npy", "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2, 3, 4), }");
  EXPECT_NE(record.find("structured (record) dtype"), std::string::npos) << record;
  // '=' is the native order, little-endian on every host this builds for: read as '<'.
  const std::string p = path("native.npy");
  crisp_test::write_bytes(p, crisp_test::npy_bytes("{'descr': '=f4', 'fortran_order': False, 'shape': (2, 3, 4), }", payload));
  EXPECT_EQ(crisp::read_npy(p).dtype, crisp::DType::f32);
  const std::string fifo = path("fifo.npy");
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string m = crisp_test::error_of([&] { crisp::read_npy(fifo); });
  EXPECT_NE(m.find("is not a regular file"), std::string::npos) << m;
  std::filesystem::remove(fifo);
}

TEST_F(Npy, ViewsOfAStatedRank) {
  std::vector<float> x(8, 1.0f);
  const std::string p = path("rank2.npy");
  crisp::write_npy(p, x.data(), {2, 4});
  crisp::NpyArray a = crisp::read_npy(p);
  EXPECT_EQ(a.view("L.npy").tokens(), 4);  // rank 0: 2 or 3
  const std::string m = crisp_test::error_of([&] { a.view("Q.npy", 3); });
  EXPECT_NE(m.find("Q.npy: has rank 2 (shape (2, 4)); expected a rank-3 [heads, tokens, dim] array"), std::string::npos) << m;
  expect_error([&] { a.view("Q.npy", 4); }, "rank", "rank 4 is not a view's");
  // An empty array is not "too large to index" whatever its other extents: it is left to the
  // caller's shape rules (zero tokens).
  crisp::NpyArray empty;
  empty.shape = {1, 0, int64_t{1} << 62};
  EXPECT_EQ(empty.view("Q.npy", 3).tokens(), 0);
}

TEST_F(Npy, Float64RoundTrip) {
  const std::vector<double> x = {1.0 / 3.0, -2e300, 5e-310, 0.0, 7.25, -1.0};
  const std::string p = path("f8.npy");
  crisp::write_npy(p, x.data(), {1, 2, 3});
  crisp::NpyArray a = crisp::read_npy(p);
  EXPECT_EQ(a.dtype, crisp::DType::f64);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{1, 2, 3}));
  ASSERT_EQ(a.bytes.size(), x.size() * sizeof(double));
  EXPECT_EQ(std::memcmp(a.bytes.data(), x.data(), a.bytes.size()), 0);
}

TEST_F(Npy, UnwritablePath) {
  std::vector<float> x(8, 1.0f);
  const std::string p = (dir / "no_such_dir" / "x.npy").string();
  expect_error([&] { crisp::write_npy(p, x.data(), {8}); }, p, "write into a missing directory");
}

// ---------------------------------------------------------------- documented edge results

TEST(EdgeCases, SingleTokenIsDenseAndReturnsV) {
  // n = 1: one dense block; O = V[0], LSE = s * q . k (softmax over one key).
  const int64_t d = 8;
  Tensor3 q = crisp_test::random_tensor(11, 2, 1, d), k = crisp_test::random_tensor(12, 1, 1, d),
          v = crisp_test::random_tensor(13, 1, 1, d);
  for (const char* preset : {"crisp", "flexprefill", "minference", "dense"}) {
    crisp::Plan p = crisp::plan(q.view(), k.view(), crisp::Config::from_preset(preset));
    ASSERT_EQ(p.sequences.at(0).num_blocks, 1);
    for (const auto& hp : p.sequences[0].heads) {
      EXPECT_EQ(hp.route, crisp::Route::dense) << preset;
      EXPECT_EQ(hp.col, (std::vector<int32_t>{0}));
      EXPECT_TRUE(std::isnan(hp.c_struct));
    }
    std::vector<float> out(2 * d, std::numeric_limits<float>::quiet_NaN()), lse(2, std::numeric_limits<float>::quiet_NaN());
    crisp::attend(q.view(), k.view(), v.view(), p, crisp::TensorView::contiguous(out.data(), crisp::DType::f32, 2, 1, d),
                  crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, 2, 1));
    for (int64_t h = 0; h < 2; ++h) {
      double qk = 0;
      for (int64_t x = 0; x < d; ++x) qk += static_cast<double>(q.at(h, 0, x)) * k.at(0, 0, x);
      EXPECT_NEAR(lse[h], qk / std::sqrt(static_cast<double>(d)), 1e-6) << preset;
      for (int64_t x = 0; x < d; ++x) EXPECT_FLOAT_EQ(out[h * d + x], v.at(0, 0, x)) << preset;
    }
  }
}

TEST(EdgeCases, FewerTokensThanOneBlock) {
  // n < B: L = n proxy rows, N = 1: dense, matches the oracle's dense attention.
  Qkv x(2, 2, 50, 16, 21);
  for (int block : {64, 128}) {
    crisp::Config cfg = crisp_cfg();
    cfg.set("block_size=" + std::to_string(block));
    crisp::Options opt;
    opt.precision = crisp::Precision::f64;
    crisp::Plan p = crisp::plan(x.q.view(), x.k.view(), cfg, {}, opt);
    ASSERT_EQ(p.sequences[0].num_blocks, 1);
    std::vector<double> out(2 * 50 * 16), lse(2 * 50);
    crisp::attend(x.q.view(), x.k.view(), x.v.view(), p, crisp::TensorView::contiguous(out.data(), crisp::DType::f64, 2, 50, 16),
                  crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f64, 2, 50), opt);
    auto ref = oracle::attend(oracle::Tensor::from_floats(x.q.data, 2, 50, 16), oracle::Tensor::from_floats(x.k.data, 2, 50, 16),
                              oracle::Tensor::from_floats(x.v.data, 2, 50, 16), {0, 50}, block, 0.25,
                              {{oracle::dense_csr(50, block), oracle::dense_csr(50, block)}});
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], ref.out.data[i], 1e-12);
    for (size_t i = 0; i < lse.size(); ++i) EXPECT_NEAR(lse[i], ref.lse[i], 1e-12);
  }
}

TEST(EdgeCases, PartialLastBlockIsPlannedAndAttended) {
  // n = 3 * 64 + 1: the last block holds one token; planned (N = 4), oracle-identical.
  Qkv x(2, 1, 193, 16, 31);
  crisp::Config cfg = crisp_test::crisp_v1_config();  // no min_budget: n = 193 is planned, not dense
  cfg.set("block_size=64");
  cfg.set("routing=none");
  crisp::Options opt;
  opt.precision = crisp::Precision::f64;
  crisp::Plan p = crisp::plan(x.q.view(), x.k.view(), cfg, {}, opt);
  ASSERT_EQ(p.sequences[0].num_blocks, 4);
  oracle::Planner op(x.q.data, x.k.data, 2, 1, 193, 16);
  auto ref = op.plan(cfg);
  for (size_t h = 0; h < 2; ++h) {
    EXPECT_EQ(p.sequences[0].heads[h].route, crisp::Route::vs);
    EXPECT_EQ(p.sequences[0].heads[h].vertical, ref[0][h].vertical);
    EXPECT_EQ(p.sequences[0].heads[h].slash, ref[0][h].slash);
    EXPECT_EQ(p.sequences[0].heads[h].col, ref[0][h].col);
    EXPECT_NEAR(p.sequences[0].heads[h].c_struct, ref[0][h].c_struct, 1e-9);
  }
  std::vector<double> out(2 * 193 * 16), lse(2 * 193);
  crisp::attend(x.q.view(), x.k.view(), x.v.view(), p, crisp::TensorView::contiguous(out.data(), crisp::DType::f64, 2, 193, 16),
                crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f64, 2, 193), opt);
  std::vector<std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>>> layouts(1);
  for (const auto& hp : p.sequences[0].heads) layouts[0].push_back({hp.row_ptr, hp.col});
  auto att = oracle::attend(oracle::Tensor::from_floats(x.q.data, 2, 193, 16), oracle::Tensor::from_floats(x.k.data, 1, 193, 16),
                            oracle::Tensor::from_floats(x.v.data, 1, 193, 16), {0, 193}, 64, 0.25, layouts);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], att.out.data[i], 1e-12) << i;
  for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], att.lse[i], 1e-12) << i;
}

}  // namespace
