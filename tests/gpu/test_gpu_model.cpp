// tests/gpu/test_gpu_model.cpp — the CUDA backend of the Llama runner (src/model/cuda/) against
// the CPU runner, on the tiny synthetic Llama of tests/tiny_llama_model.h (random weights, 2
// layers, 4 query / 2 KV heads of dim 64): logits of every position, the plans' densities,
// greedy tokens, and the KV-cache decode against a full prefill. Every CUDA buffer is filled
// with NaN when allocated (RunOptions::cuda_poison_buffers), so a value a kernel fails to write
// reaches the logits as NaN and fails the comparisons.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>  // getpid

#include "crisp/cuda.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "tiny_llama_model.h"

namespace cm = crisp::model;

namespace {

#define SKIP_WITHOUT_GPU() \
  if (!crisp::cuda::available()) GTEST_SKIP() << "no CUDA device"

// NOTE: tolerances, relative to the standard deviation of all compared logits.
// - f32-reference attention: both backends compute every step in float32 from the same weights;
//   they differ in summation order only (cuBLAS vs the CPU's blocked kernels, a warp-reduced dot
//   vs a sequential one). The CPU runner's check against transformers uses 1e-4 for the same
//   situation over 30 layers; here 2 layers.
// - f16 (crisp's kernel): Q/K/V and the attention output are rounded to float16 (relative
//   2^-11 ≈ 4.9e-4 per element). With scores of a few units that moves softmax weights by ~1e-3
//   relative and the logits by about that much of their spread; 2e-2 leaves a 5-10x margin while
//   a wrong head mapping, stride or a missed block moves logits by O(std).
constexpr double kF32Tolerance = 1e-4;
constexpr double kF16Tolerance = 2e-2;
constexpr int64_t kPromptTokens = 700;  // 11 blocks of 64: long enough for sparse selection
constexpr int kBlock = 64;

struct TinyModel {
  std::unique_ptr<cm::GgufFile> file;
  std::unique_ptr<cm::Tokenizer> tokenizer;
  std::unique_ptr<cm::LlamaModel> model;
  uint32_t vocab = 0;
};

// A model file of this process alone: ctest runs each test in its own process, several at once
// (-j), and a file shared between them is rewritten while another reads it. The file is removed
// once read (GgufFile keeps its own copy of the bytes).
std::string process_temp_path(const std::string& stem) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "crisp_gpu_model_test";
  std::filesystem::create_directories(dir);
  return (dir / (stem + "." + std::to_string(::getpid()) + ".gguf")).string();
}

const TinyModel& tiny() {
  static std::unique_ptr<TinyModel> loaded;
  if (!loaded) {
    auto t = std::make_unique<TinyModel>();
    const std::string path = process_temp_path("tiny_llama");
    t->vocab = crisp_test::write_tiny_llama(path);
    t->file = std::make_unique<cm::GgufFile>(path);
    std::filesystem::remove(path);
    t->tokenizer = std::make_unique<cm::Tokenizer>(*t->file);
    t->model = std::make_unique<cm::LlamaModel>(*t->file);
    loaded = std::move(t);
  }
  return *loaded;
}

cm::RunOptions options(const std::string& policy, cm::ModelBackend backend,
                       cm::CudaPrefillAttention attention = cm::CudaPrefillAttention::crisp_f16,
                       int block_size = kBlock) {
  cm::RunOptions run;
  run.attention = crisp::Config::from_preset(policy);
  run.attention.block_size = block_size;
  run.threads = 2;
  run.backend = backend;
  run.cuda_attention = attention;
  run.cuda_poison_buffers = true;
  return run;
}

struct LogitDiff {
  double max_abs = 0.0;
  double std = 0.0;
  double rel = 0.0;  // max_abs / std
  int64_t positions = 0;
  int64_t argmax_agree = 0;
  bool finite = true;
};

LogitDiff compare_logits(const std::vector<float>& gpu, const std::vector<float>& cpu, int64_t vocab) {
  LogitDiff d;
  d.positions = static_cast<int64_t>(cpu.size()) / vocab;
  double sum = 0.0, sum_sq = 0.0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    sum += cpu[i];
    sum_sq += static_cast<double>(cpu[i]) * cpu[i];
    if (!std::isfinite(gpu[i])) d.finite = false;
    d.max_abs = std::max(d.max_abs, std::fabs(static_cast<double>(gpu[i]) - cpu[i]));
  }
  const double mean = sum / static_cast<double>(cpu.size());
  d.std = std::sqrt(std::max(0.0, sum_sq / static_cast<double>(cpu.size()) - mean * mean));
  d.rel = d.finite ? d.max_abs / d.std : INFINITY;
  for (int64_t t = 0; t < d.positions; ++t) {
    d.argmax_agree += cm::argmax(gpu.data() + t * vocab, vocab) == cm::argmax(cpu.data() + t * vocab, vocab);
  }
  return d;
}

struct PrefillCase {
  std::string policy;
  cm::CudaPrefillAttention attention;
  int block_size = kBlock;  // 128: the presets' block, the one `crisp eval niah` runs
};

std::string case_name(const PrefillCase& c) {
  return c.policy + (c.attention == cm::CudaPrefillAttention::crisp_f16 ? "_f16" : "_f32ref") + "_B" +
         std::to_string(c.block_size);
}

class GpuModelPrefill : public ::testing::TestWithParam<PrefillCase> {};

// Every position's logits, CUDA vs CPU, same policy; the plan densities per layer agree.
TEST_P(GpuModelPrefill, LogitsOfEveryPositionMatchCpu) {
  SKIP_WITHOUT_GPU();
  const PrefillCase& c = GetParam();
  const TinyModel& t = tiny();
  const std::vector<int32_t> ids = crisp_test::tiny_prompt(kPromptTokens, t.vocab);

  cm::LlamaContext cpu(*t.model, kPromptTokens,
                       options(c.policy, cm::ModelBackend::cpu, cm::CudaPrefillAttention::crisp_f16, c.block_size));
  const cm::PrefillResult ref = cpu.prefill(ids, /*all_logits=*/true);
  cm::LlamaContext gpu(*t.model, kPromptTokens, options(c.policy, cm::ModelBackend::cuda, c.attention, c.block_size));
  const cm::PrefillResult got = gpu.prefill(ids, /*all_logits=*/true);

  ASSERT_EQ(got.logits.size(), ref.logits.size());
  const LogitDiff d = compare_logits(got.logits, ref.logits, t.vocab);
  const bool f16 = c.attention == cm::CudaPrefillAttention::crisp_f16;
  const double tolerance = f16 ? kF16Tolerance : kF32Tolerance;
  std::printf("[ model ] %-22s %lld positions: max|diff| %.3g / std %.3g = %.3g (tolerance %.0e), argmax %lld/%lld, "
              "density cpu %.4f gpu %.4f, attention %.2f ms\n",
              case_name(c).c_str(), static_cast<long long>(d.positions), d.max_abs, d.std, d.rel, tolerance,
              static_cast<long long>(d.argmax_agree), static_cast<long long>(d.positions), ref.density, got.density,
              got.attention_seconds * 1e3);
  EXPECT_TRUE(d.finite) << "NaN/Inf in the CUDA logits: a buffer was read before being written";
  EXPECT_LE(d.rel, tolerance);
  EXPECT_GE(static_cast<double>(d.argmax_agree), 0.99 * static_cast<double>(d.positions));

  // The plans: layer 0 reads identical inputs up to float32 rounding, so its plan (density) must
  // be the CPU's. Later layers too with float32 attention; with f16 attention their Q/K differ from
  // the CPU's by ~1e-3 relative, which may flip a block at a threshold, so they are reported.
  ASSERT_EQ(got.layer_density.size(), ref.layer_density.size());
  EXPECT_EQ(got.layer_density[0], ref.layer_density[0]);
  if (!f16) EXPECT_EQ(got.layer_density, ref.layer_density);
  EXPECT_EQ(got.tokens, kPromptTokens);
  EXPECT_GT(got.attention_seconds, 0.0);
  if (c.policy == "dense") EXPECT_DOUBLE_EQ(got.density, 1.0);
  if (c.policy == "crisp" && c.block_size == kBlock) {
    EXPECT_LT(got.density, 1.0) << "the test prompt should make crisp sparse";
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, GpuModelPrefill,
                         ::testing::Values(PrefillCase{"dense", cm::CudaPrefillAttention::reference_f32},
                                           PrefillCase{"crisp", cm::CudaPrefillAttention::reference_f32},
                                           PrefillCase{"flexprefill", cm::CudaPrefillAttention::reference_f32},
                                           PrefillCase{"minference", cm::CudaPrefillAttention::reference_f32},
                                           PrefillCase{"dense", cm::CudaPrefillAttention::crisp_f16},
                                           PrefillCase{"crisp", cm::CudaPrefillAttention::crisp_f16},
                                           PrefillCase{"flexprefill", cm::CudaPrefillAttention::crisp_f16},
                                           PrefillCase{"minference", cm::CudaPrefillAttention::crisp_f16},
                                           PrefillCase{"dense", cm::CudaPrefillAttention::crisp_f16, 128},
                                           PrefillCase{"crisp", cm::CudaPrefillAttention::crisp_f16, 128},
                                           PrefillCase{"crisp", cm::CudaPrefillAttention::reference_f32, 128}),
                         [](const ::testing::TestParamInfo<PrefillCase>& info) { return case_name(info.param); });

// Greedy generation on both backends: the same tokens. With f16 attention a divergence is
// accepted only at a near-tie: where the CPU's own top-2 logit gap is below the f16 tolerance.
TEST(GpuModel, GreedyTokensMatchCpu) {
  SKIP_WITHOUT_GPU();
  const TinyModel& t = tiny();
  std::vector<int32_t> prompt = crisp_test::tiny_prompt(600, t.vocab);
  const std::vector<int32_t> chat = t.tokenizer->encode(
      t.tokenizer->apply_chat_template({{"user", "the rain in the north"}}, true));
  prompt.insert(prompt.end(), chat.begin(), chat.end());
  for (const char* policy : {"dense", "crisp"}) {
    for (cm::CudaPrefillAttention attention :
         {cm::CudaPrefillAttention::reference_f32, cm::CudaPrefillAttention::crisp_f16}) {
      SCOPED_TRACE(std::string(policy) + " " + cm::to_string(attention));
      cm::GenerateOptions cpu_options, gpu_options;
      cpu_options.max_new_tokens = gpu_options.max_new_tokens = 16;
      cpu_options.run = options(policy, cm::ModelBackend::cpu);
      gpu_options.run = options(policy, cm::ModelBackend::cuda, attention);
      const cm::GenerateResult cpu = cm::generate(*t.model, *t.tokenizer, prompt, cpu_options);
      const cm::GenerateResult gpu = cm::generate(*t.model, *t.tokenizer, prompt, gpu_options);
      std::printf("[ model ] greedy %s %s: cpu %zu tokens, gpu %zu tokens, ttft gpu %.3f s, density %.3f\n", policy,
                  cm::to_string(attention), cpu.tokens.size(), gpu.tokens.size(), gpu.time_to_first_token,
                  gpu.prefill.density);
      EXPECT_GT(gpu.time_to_first_token, 0.0);
      if (attention == cm::CudaPrefillAttention::reference_f32 || gpu.tokens == cpu.tokens) {
        EXPECT_EQ(gpu.tokens, cpu.tokens);
        continue;
      }
      // f16 and a divergence: find it and check the CPU's margin there.
      std::size_t first = 0;
      while (first < cpu.tokens.size() && first < gpu.tokens.size() && cpu.tokens[first] == gpu.tokens[first]) ++first;
      std::vector<int32_t> ids = prompt;
      ids.insert(ids.end(), cpu.tokens.begin(), cpu.tokens.begin() + static_cast<std::ptrdiff_t>(first));
      std::vector<float> logits = cm::prefill_logits(*t.model, ids, cpu_options.run);
      double sum = 0.0, sum_sq = 0.0;
      for (float v : logits) {
        sum += v;
        sum_sq += static_cast<double>(v) * v;
      }
      const double mean = sum / static_cast<double>(logits.size());
      const double std_dev = std::sqrt(sum_sq / static_cast<double>(logits.size()) - mean * mean);
      std::partial_sort(logits.begin(), logits.begin() + 2, logits.end(), std::greater<float>());
      const double gap = (logits[0] - logits[1]) / std_dev;
      std::printf("[ model ] diverged at generated token %zu: CPU top-2 gap %.3g std\n", first, gap);
      EXPECT_LT(gap, kF16Tolerance) << "greedy tokens diverge at " << first << " without a near-tie";
    }
  }
}

// Decoding the last tokens one by one over the CUDA KV cache gives the logits a full CUDA
// prefill gives (float32 attention on both paths, so float32 rounding apart).
TEST(GpuModel, DecodeWithKvCacheMatchesPrefill) {
  SKIP_WITHOUT_GPU();
  const TinyModel& t = tiny();
  const std::vector<int32_t> ids = crisp_test::tiny_prompt(300, t.vocab, 5);
  const cm::RunOptions run = options("dense", cm::ModelBackend::cuda, cm::CudaPrefillAttention::reference_f32);
  const std::vector<float> full = cm::prefill_logits(*t.model, ids, run);
  const std::size_t split = ids.size() - 5;
  cm::LlamaContext context(*t.model, static_cast<int64_t>(ids.size()), run);
  context.prefill(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(split)));
  std::vector<float> stepped;
  for (std::size_t i = split; i < ids.size(); ++i) stepped = context.decode(ids[i]);
  EXPECT_EQ(context.position(), static_cast<int64_t>(ids.size()));
  const LogitDiff d = compare_logits(stepped, full, t.vocab);
  std::printf("[ model ] decode vs prefill: max|diff| %.3g / std %.3g = %.3g\n", d.max_abs, d.std, d.rel);
  EXPECT_TRUE(d.finite);
  EXPECT_LE(d.rel, kF32Tolerance);
  EXPECT_EQ(d.argmax_agree, 1);
  EXPECT_THROW(context.decode(ids[0]), crisp::Error);  // full: capacity was the prompt length

  // And the CPU's decode of the same tokens.
  cm::LlamaContext cpu(*t.model, static_cast<int64_t>(ids.size()), options("dense", cm::ModelBackend::cpu));
  cpu.prefill(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(split)));
  std::vector<float> cpu_stepped;
  for (std::size_t i = split; i < ids.size(); ++i) cpu_stepped = cpu.decode(ids[i]);
  const LogitDiff dc = compare_logits(stepped, cpu_stepped, t.vocab);
  std::printf("[ model ] decode cuda vs cpu: max|diff| %.3g / std %.3g = %.3g\n", dc.max_abs, dc.std, dc.rel);
  EXPECT_LE(dc.rel, kF32Tolerance);
}

// Bad input reaches the caller as crisp::Error on the CUDA backend too (checked before any
// device work), and a CUDA context past its capacity refuses to decode.
TEST(GpuModel, BadInputIsRejected) {
  SKIP_WITHOUT_GPU();
  const TinyModel& t = tiny();
  const cm::RunOptions run = options("dense", cm::ModelBackend::cuda);
  cm::LlamaContext context(*t.model, 8, run);
  EXPECT_THROW(context.prefill({}), crisp::Error);
  EXPECT_THROW(context.prefill({1, 2, static_cast<int32_t>(t.vocab)}), crisp::Error);
  EXPECT_THROW(context.prefill(std::vector<int32_t>(9, 3)), crisp::Error);
  EXPECT_NO_THROW(cm::require_model_backend(cm::ModelBackend::cuda));
}

// The warm-up (weights upload, first launches) and the shortest prompts: 1 token (one partial
// block), a few tokens, exactly one block and one more; CUDA logits against the CPU's.
TEST(GpuModel, WarmUpAndShortPromptsMatchCpu) {
  SKIP_WITHOUT_GPU();
  const TinyModel& t = tiny();
  EXPECT_GE(cm::warm_up_backend(*t.model, options("crisp", cm::ModelBackend::cuda)), 0.0);
  EXPECT_EQ(cm::warm_up_backend(*t.model, options("crisp", cm::ModelBackend::cpu)), 0.0);
  EXPECT_FALSE(cm::model_backend_device(cm::ModelBackend::cuda).empty());
  for (int64_t n : {1, 5, kBlock, kBlock + 1}) {
    for (cm::CudaPrefillAttention attention :
         {cm::CudaPrefillAttention::reference_f32, cm::CudaPrefillAttention::crisp_f16}) {
      const std::vector<int32_t> ids = crisp_test::tiny_prompt(n, t.vocab, 17);
      cm::LlamaContext cpu(*t.model, n, options("crisp", cm::ModelBackend::cpu));
      cm::LlamaContext gpu(*t.model, n, options("crisp", cm::ModelBackend::cuda, attention));
      const cm::PrefillResult ref = cpu.prefill(ids, true);
      const cm::PrefillResult got = gpu.prefill(ids, true);
      const LogitDiff d = compare_logits(got.logits, ref.logits, t.vocab);
      const double tolerance =
          attention == cm::CudaPrefillAttention::crisp_f16 ? kF16Tolerance : kF32Tolerance;
      EXPECT_TRUE(d.finite) << "n " << n;
      EXPECT_LE(d.rel, tolerance) << "n " << n << " " << cm::to_string(attention);
      EXPECT_DOUBLE_EQ(got.density, 1.0) << "a short prompt runs dense";
    }
  }
}

// capture_qkv on the CUDA backend (the observer sees the device's post-RoPE Q/K/V, copied back)
// gives the CPU's captures: float32 attention, so float32 rounding apart.
TEST(GpuModel, CaptureQkvMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const TinyModel& t = tiny();
  const std::vector<int32_t> ids = crisp_test::tiny_prompt(200, t.vocab, 23);
  const std::vector<cm::LayerQkv> cpu =
      cm::capture_qkv(*t.model, ids, {0, 1}, options("dense", cm::ModelBackend::cpu));
  const std::vector<cm::LayerQkv> gpu = cm::capture_qkv(
      *t.model, ids, {0, 1}, options("dense", cm::ModelBackend::cuda, cm::CudaPrefillAttention::reference_f32));
  ASSERT_EQ(gpu.size(), 2u);
  ASSERT_EQ(cpu.size(), 2u);
  for (std::size_t l = 0; l < 2; ++l) {
    EXPECT_EQ(gpu[l].layer, cpu[l].layer);
    for (const auto& [a, b] : {std::make_pair(&gpu[l].q, &cpu[l].q), std::make_pair(&gpu[l].k, &cpu[l].k),
                               std::make_pair(&gpu[l].v, &cpu[l].v)}) {
      ASSERT_EQ(a->size(), b->size());
      double max_abs = 0.0, max_ref = 0.0;
      for (std::size_t i = 0; i < a->size(); ++i) {
        max_abs = std::max(max_abs, std::fabs(static_cast<double>((*a)[i]) - (*b)[i]));
        max_ref = std::max(max_ref, std::fabs(static_cast<double>((*b)[i])));
      }
      EXPECT_LE(max_abs, 1e-4 * max_ref) << "layer " << l;  // NOTE: float32 rounding, as the logits
    }
  }
}

// Timings at SmolLM2-135M's shape (30 layers, 576 wide, 9/3 heads of 64, feed-forward 1536) with
// random weights: what one NIAH sample costs per length on this GPU, for the budget of
// the model suite of scripts/gpu.sh. Runs only with CRISP_MODEL_TIMING=1 (it writes a ~430 MB float32 file to the temp directory).
TEST(GpuModel, SmolLM2ShapeTimings) {
  SKIP_WITHOUT_GPU();
  const char* enabled = std::getenv("CRISP_MODEL_TIMING");
  if (enabled == nullptr || std::string(enabled) != "1") GTEST_SKIP() << "set CRISP_MODEL_TIMING=1 to run";
  crisp_test::TinyLlamaSpec spec;
  spec.layers = 30;
  spec.embd = 576;
  spec.heads = 9;
  spec.kv_heads = 3;
  spec.ff = 1536;
  spec.context = 8192;
  spec.rope_base = 100000.0f;
  const std::string path = process_temp_path("smollm2_shape");
  const uint32_t vocab = crisp_test::write_tiny_llama(path, spec);
  const cm::GgufFile file(path);
  std::filesystem::remove(path);
  const cm::LlamaModel model(file);
  for (int64_t n : {2048, 8192, 16384, 32768}) {
    for (const char* policy : {"dense", "crisp"}) {
      cm::RunOptions run;
      run.attention = crisp::Config::from_preset(policy);
      run.backend = cm::ModelBackend::cuda;
      if (n > 8192) run.rope = {cm::RopeScalingType::yarn, static_cast<double>((n + 8191) / 8192)};
      const std::vector<int32_t> ids = crisp_test::tiny_prompt(n - 32, vocab, 3);
      for (int rep = 0; rep < 2; ++rep) {  // the first includes one-time costs (weights upload, cuBLAS)
        const auto start = std::chrono::steady_clock::now();
        cm::LlamaContext context(model, n, run);
        const cm::PrefillResult r = context.prefill(ids);
        int32_t next = cm::argmax(r.logits.data(), vocab);
        const double ttft = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const auto decode_start = std::chrono::steady_clock::now();
        constexpr int kDecodeTokens = 16;
        for (int i = 0; i < kDecodeTokens; ++i) next = cm::argmax(context.decode(next).data(), vocab);
        const double decode_ms =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - decode_start).count() * 1e3 / kDecodeTokens;
        std::printf("[ timing ] n %6lld %-6s rep %d: ttft %.3f s (prefill %.3f s, attention %.3f s, density %.3f), "
                    "decode %.2f ms/token\n",
                    static_cast<long long>(n), policy, rep, ttft, r.seconds, r.attention_seconds, r.density, decode_ms);
        EXPECT_TRUE(std::isfinite(r.logits[0]));
      }
    }
  }
}

}  // namespace
