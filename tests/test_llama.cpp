// tests/test_llama.cpp — the Llama runner: matmul and RoPE on their own (no model needed), then
// SmolLM2-135M-Instruct against an independent implementation (Hugging Face transformers' GGUF
// loader, float32; tests/data/ref_logits_smollm2.json written by scripts/ref_logits.py).
//
// The model cases skip, saying so, when the GGUF file is absent: scripts/fetch_model.sh fetches
// it into .cache/model/ (or set CRISP_MODEL_PATH).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/llama.h"
#include "model/matmul.h"
#include "model/model_path.h"
#include "model/rope.h"
#include "model/tokenizer.h"

namespace cm = crisp::model;

namespace {

// ---------------------------------------------------------------- matmul (no model)

std::vector<float> random_values(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

// Every tile/micro-kernel remainder: token counts and row counts not multiples of any MR/NR or
// tile size, depths not multiples of the vector width, padded leading dimensions.
TEST(LlamaMatmul, MatchesFloat64ReferenceOnOddShapes) {
  const int64_t shapes[][3] = {{1, 1, 1},   {1, 576, 576}, {7, 13, 37},  {6, 4, 16},
                               {49, 97, 33}, {50, 200, 64}, {5, 3, 1536}, {100, 7, 17}};
  for (const auto& s : shapes) {
    const int64_t tokens = s[0], rows = s[1], depth = s[2];
    const int64_t ldx = depth + 3, ldw = depth + 5, ldy = rows + 2;
    const std::vector<float> x = random_values(static_cast<size_t>(tokens * ldx), 1);
    const std::vector<float> w = random_values(static_cast<size_t>(rows * ldw), 2);
    std::vector<float> y(static_cast<size_t>(tokens * ldy), -7.0f);
    cm::matmul_xwt(x.data(), ldx, w.data(), ldw, y.data(), ldy, tokens, rows, depth, 2);
    for (int64_t i = 0; i < tokens; ++i) {
      for (int64_t j = 0; j < rows; ++j) {
        double ref = 0.0, abs_sum = 0.0;
        for (int64_t p = 0; p < depth; ++p) {
          ref += static_cast<double>(x[i * ldx + p]) * w[j * ldw + p];
          abs_sum += std::fabs(static_cast<double>(x[i * ldx + p]) * w[j * ldw + p]);
        }
        // float32 accumulation: error bounded by ~depth·eps·Σ|terms|; 1e-6·Σ|terms| is far above
        // the typical error and far below any indexing mistake.
        ASSERT_NEAR(y[i * ldy + j], ref, 1e-6 * abs_sum + 1e-6)
            << "tokens " << tokens << " rows " << rows << " depth " << depth << " at (" << i << ", " << j << ")";
      }
      for (int64_t j = rows; j < ldy; ++j) ASSERT_EQ(y[i * ldy + j], -7.0f) << "wrote past the rows";
    }
  }
  SCOPED_TRACE(cm::matmul_kernel_name());
}

// ---------------------------------------------------------------- RoPE (no model)

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

TEST(LlamaRope, RotationKeepsNormsAndDependsOnlyOnRelativePosition) {
  cm::Rope rope(64, 100000.0, 8192, {});
  rope.reserve(2000);
  const std::vector<float> q0 = random_values(64, 3), k0 = random_values(64, 4);
  auto rotated = [&](const std::vector<float>& v, int64_t pos) {
    std::vector<float> r = v;
    rope.apply(r.data(), 1, 64, pos);
    return r;
  };
  EXPECT_NEAR(dot(rotated(q0, 1234), rotated(q0, 1234)), dot(q0, q0), 1e-4);
  // q at m, k at m - 7: the score depends on the distance only.
  const double near = dot(rotated(q0, 10), rotated(k0, 3));
  const double far = dot(rotated(q0, 1907), rotated(k0, 1900));
  EXPECT_NEAR(near, far, 2e-4);
  // Position 0 is the identity.
  EXPECT_EQ(rotated(q0, 0), q0);
}

TEST(LlamaRope, ScalingVariantsChangeFrequenciesAsDocumented) {
  const double base = 10000.0;
  const cm::Rope plain(64, base, 4096, {});
  const cm::Rope linear(64, base, 4096, {cm::RopeScalingType::linear, 4.0});
  const cm::Rope ntk(64, base, 4096, {cm::RopeScalingType::ntk, 4.0});
  const cm::Rope yarn(64, base, 4096, {cm::RopeScalingType::yarn, 4.0});
  const auto& f = plain.inverse_frequencies();
  ASSERT_EQ(f.size(), 32u);
  EXPECT_DOUBLE_EQ(f[0], 1.0);
  EXPECT_NEAR(f[1], std::pow(base, -2.0 / 64.0), 1e-15);
  for (size_t i = 0; i < f.size(); ++i) EXPECT_NEAR(linear.inverse_frequencies()[i], f[i] / 4.0, 1e-15);
  // NTK: base · 4^(64/62); the highest frequency (i = 0) is unchanged, the lowest one
  // (i = 31) is divided by almost exactly the factor.
  EXPECT_DOUBLE_EQ(ntk.inverse_frequencies()[0], 1.0);
  EXPECT_NEAR(ntk.inverse_frequencies()[31] / f[31], 1.0 / 4.0, 0.01);
  // YaRN: high frequencies kept, low ones interpolated by the factor, and the attention factor.
  EXPECT_DOUBLE_EQ(yarn.inverse_frequencies()[0], f[0]);
  EXPECT_NEAR(yarn.inverse_frequencies()[31], f[31] / 4.0, 1e-15);
  EXPECT_NEAR(yarn.attention_factor(), 0.1 * std::log(4.0) + 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(plain.attention_factor(), 1.0);
  EXPECT_THROW(cm::Rope(64, base, 4096, {cm::RopeScalingType::linear, 0.5}), crisp::Error);
  EXPECT_THROW(cm::Rope(63, base, 4096, {}), crisp::Error);
  EXPECT_THROW(cm::parse_rope_scaling("dynamic"), crisp::Error);
}

// ---------------------------------------------------------------- the real model

struct RealModel {
  std::unique_ptr<cm::GgufFile> file;
  std::unique_ptr<cm::Tokenizer> tokenizer;
  std::unique_ptr<cm::LlamaModel> model;
  nlohmann::json reference;
};

const std::string& skip_reason() {
  static std::string reason;
  return reason;
}

// Loaded once for the whole suite (dequantising the weights takes a second or two).
RealModel* real_model() {
  static std::unique_ptr<RealModel> loaded;
  static bool tried = false;
  if (tried) return loaded.get();
  tried = true;
  const std::string path = cm::default_model_path();
  if (!std::filesystem::exists(path)) {
    const_cast<std::string&>(skip_reason()) =
        "model file " + path + " not found: run scripts/fetch_model.sh (or set CRISP_MODEL_PATH)";
    return nullptr;
  }
  const std::filesystem::path ref_path =
      std::filesystem::path(__FILE__).parent_path() / "data" / "ref_logits_smollm2.json";
  std::ifstream ref_in(ref_path);
  if (!ref_in) {
    const_cast<std::string&>(skip_reason()) = "reference " + ref_path.string() + " missing";
    return nullptr;
  }
  auto m = std::make_unique<RealModel>();
  ref_in >> m->reference;
  m->file = std::make_unique<cm::GgufFile>(path);
  m->tokenizer = std::make_unique<cm::Tokenizer>(*m->file);
  m->model = std::make_unique<cm::LlamaModel>(*m->file);
  loaded = std::move(m);
  return loaded.get();
}

#define REQUIRE_REAL_MODEL(var)                          \
  RealModel* var = real_model();                         \
  if (!var) GTEST_SKIP() << skip_reason();

TEST(LlamaSmolLM2, HparamsFromMetadata) {
  REQUIRE_REAL_MODEL(m);
  const cm::LlamaHparams& hp = m->model->hparams();
  EXPECT_EQ(hp.n_layer, 30);
  EXPECT_EQ(hp.n_embd, 576);
  EXPECT_EQ(hp.n_head, 9);
  EXPECT_EQ(hp.n_head_kv, 3);
  EXPECT_EQ(hp.head_dim, 64);
  EXPECT_EQ(hp.n_ff, 1536);
  EXPECT_EQ(hp.n_vocab, 49152);
  EXPECT_EQ(hp.n_ctx_train, 8192);
  EXPECT_DOUBLE_EQ(hp.rope_freq_base, 100000.0);
  EXPECT_TRUE(hp.tied_embeddings);
}

// NOTE: tolerance. Both sides dequantise the same Q4_1/Q8_0 bytes to the same float32 weights
// and compute in float32; they differ only in summation order (blocked SIMD dot products here,
// oneDNN/ATen GEMMs there) and in exp/rsqrt rounding, compounded over 30 layers. Measured here:
// max |Δ| / std(logits) = 3.3e-5 (the test prints it). 1e-4 keeps a 3x margin while a real
// mistake (a wrong RoPE pairing, a norm epsilon, a transposed weight) moves logits by O(std).
constexpr double kLogitRelTolerance = 1e-4;

TEST(LlamaSmolLM2, LogitsMatchTransformersReference) {
  REQUIRE_REAL_MODEL(m);
  const nlohmann::json& ref = m->reference;
  const std::vector<int32_t> ids = ref.at("token_ids").get<std::vector<int32_t>>();
  const std::vector<double> ref_last = ref.at("last_logits").get<std::vector<double>>();
  const std::vector<int32_t> ref_argmax = ref.at("argmax").get<std::vector<int32_t>>();
  const std::vector<double> ref_gap = ref.at("top2_gap").get<std::vector<double>>();
  const double ref_std = ref.at("last_std").get<double>();
  const int64_t vocab = m->model->hparams().n_vocab;
  ASSERT_EQ(static_cast<int64_t>(ref_last.size()), vocab);
  ASSERT_GE(ids.size(), 250u);

  cm::LlamaContext context(*m->model, static_cast<int64_t>(ids.size()));  // dense attention
  const cm::PrefillResult result = context.prefill(ids, /*all_logits=*/true);
  ASSERT_EQ(result.logits.size(), ids.size() * static_cast<size_t>(vocab));
  EXPECT_DOUBLE_EQ(result.density, 1.0);

  const float* last = result.logits.data() + (ids.size() - 1) * vocab;
  double max_abs = 0.0;
  for (int64_t i = 0; i < vocab; ++i) max_abs = std::max(max_abs, std::fabs(last[i] - ref_last[i]));
  const double rel = max_abs / ref_std;
  std::printf("[ logits ] %zu tokens: last position max|diff| = %.3g, / std %.4f = %.3g (tolerance %.0e)\n",
              ids.size(), max_abs, ref_std, rel, kLogitRelTolerance);
  EXPECT_LE(rel, kLogitRelTolerance);

  size_t agree = 0;
  double min_gap_of_flips = INFINITY;
  for (size_t t = 0; t < ids.size(); ++t) {
    const int32_t mine = cm::argmax(result.logits.data() + t * vocab, vocab);
    if (mine == ref_argmax[t]) {
      ++agree;
    } else {
      min_gap_of_flips = std::min(min_gap_of_flips, ref_gap[t]);
      std::printf("[ logits ] position %zu: argmax %d vs reference %d (reference top-2 gap %.4g)\n", t, mine,
                  ref_argmax[t], ref_gap[t]);
    }
  }
  const double agreement = static_cast<double>(agree) / static_cast<double>(ids.size());
  std::printf("[ logits ] argmax agreement %zu / %zu = %.4f\n", agree, ids.size(), agreement);
  EXPECT_GE(agreement, 0.99);
}

TEST(LlamaSmolLM2, TokenizerReproducesReferenceIds) {
  REQUIRE_REAL_MODEL(m);
  const nlohmann::json& ref = m->reference;
  EXPECT_EQ(m->tokenizer->encode(ref.at("prompt").get<std::string>()),
            ref.at("token_ids").get<std::vector<int32_t>>());
  EXPECT_EQ(m->tokenizer->encode(ref.at("answer_prompt").get<std::string>()),
            ref.at("answer_prompt_ids").get<std::vector<int32_t>>());
}

TEST(LlamaSmolLM2, GreedyChatAnswerNamesParis) {
  REQUIRE_REAL_MODEL(m);
  const std::string prompt =
      m->tokenizer->apply_chat_template({{"user", "What is the capital of France?"}}, true);
  EXPECT_EQ(prompt, m->reference.at("answer_prompt").get<std::string>());
  const std::vector<int32_t> ids = m->tokenizer->encode(prompt);
  cm::GenerateOptions options;
  options.max_new_tokens = 24;
  const cm::GenerateResult answer = cm::generate(*m->model, *m->tokenizer, ids, options);
  std::printf("[ answer ] %s\n", answer.text.c_str());
  EXPECT_NE(answer.text.find("Paris"), std::string::npos) << answer.text;
  // Greedy decoding over logits that agree to ~1e-5 relative picks the same tokens as the
  // reference's greedy generation (its ids include the end-of-generation token, ours stop before).
  std::vector<int32_t> expected = m->reference.at("answer_ids").get<std::vector<int32_t>>();
  if (answer.stopped_at_end && !expected.empty() && m->tokenizer->is_end_of_generation(expected.back())) {
    expected.pop_back();
  }
  EXPECT_EQ(answer.tokens, expected);
}

// The KV-cache decode path must give the logits a full prefill gives at the same position.
TEST(LlamaSmolLM2, DecodeWithKvCacheMatchesPrefill) {
  REQUIRE_REAL_MODEL(m);
  const std::vector<int32_t> ids = m->reference.at("answer_prompt_ids").get<std::vector<int32_t>>();
  const int64_t vocab = m->model->hparams().n_vocab;
  const size_t split = ids.size() - 5;
  const std::vector<float> full = cm::prefill_logits(*m->model, ids);

  cm::LlamaContext context(*m->model, static_cast<int64_t>(ids.size()));
  context.prefill(std::vector<int32_t>(ids.begin(), ids.begin() + split));
  std::vector<float> stepped;
  for (size_t t = split; t < ids.size(); ++t) stepped = context.decode(ids[t]);
  EXPECT_EQ(context.position(), static_cast<int64_t>(ids.size()));
  double max_abs = 0.0, sum_sq = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(stepped[i] - full[i])));
    sum_sq += static_cast<double>(full[i]) * full[i];
  }
  const double rms = std::sqrt(sum_sq / static_cast<double>(vocab));
  EXPECT_LE(max_abs, 1e-4 * rms) << "decode and prefill logits differ";
  EXPECT_EQ(cm::argmax(stepped.data(), vocab), cm::argmax(full.data(), vocab));
  EXPECT_THROW(context.decode(ids[0]), crisp::Error);  // full: capacity was the prompt length
}

TEST(LlamaSmolLM2, CaptureGivesPostRopeQkvOfChosenLayers) {
  REQUIRE_REAL_MODEL(m);
  const std::vector<int32_t> ids = m->reference.at("answer_prompt_ids").get<std::vector<int32_t>>();
  const cm::LlamaHparams& hp = m->model->hparams();
  const std::vector<cm::LayerQkv> layers = cm::capture_qkv(*m->model, ids, {0, 29});
  ASSERT_EQ(layers.size(), 2u);
  EXPECT_EQ(layers[0].layer, 0);
  EXPECT_EQ(layers[1].layer, 29);
  const int64_t n = static_cast<int64_t>(ids.size());
  for (const cm::LayerQkv& c : layers) {
    EXPECT_EQ(c.tokens, n);
    EXPECT_EQ(static_cast<int64_t>(c.q.size()), hp.n_head * n * hp.head_dim);
    EXPECT_EQ(static_cast<int64_t>(c.k.size()), hp.n_head_kv * n * hp.head_dim);
    EXPECT_EQ(static_cast<int64_t>(c.v.size()), hp.n_head_kv * n * hp.head_dim);
  }
  // Layer 0 recomputed from the weights: q = W_q · RMSNorm(embedding). At position 0 RoPE is the
  // identity, so the capture must equal it; at position 1 RoPE only rotates, so norms per head
  // must agree.
  const cm::LayerWeights& w0 = m->model->layers()[0];
  const int64_t E = hp.n_embd, hd = hp.head_dim;
  for (int64_t pos = 0; pos < 2; ++pos) {
    const float* x = m->model->token_embedding(ids[pos]);
    double sum_sq = 0.0;
    for (int64_t i = 0; i < E; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
    const double inv = 1.0 / std::sqrt(sum_sq / E + hp.rms_eps);
    for (int64_t h = 0; h < hp.n_head; ++h) {
      double norm_ref = 0.0, norm_cap = 0.0;
      for (int64_t e = 0; e < hd; ++e) {
        double q = 0.0;
        for (int64_t i = 0; i < E; ++i) q += w0.wqkv[(h * hd + e) * E + i] * (x[i] * inv * w0.attn_norm[i]);
        const double captured = layers[0].q[(h * n + pos) * hd + e];
        if (pos == 0) ASSERT_NEAR(captured, q, 1e-4 * (1.0 + std::fabs(q))) << "head " << h << " dim " << e;
        norm_ref += q * q;
        norm_cap += captured * captured;
      }
      EXPECT_NEAR(std::sqrt(norm_cap), std::sqrt(norm_ref), 1e-4 * (1.0 + std::sqrt(norm_ref)));
    }
  }
  for (float v : layers[1].q) ASSERT_TRUE(std::isfinite(v));
  EXPECT_THROW(cm::capture_qkv(*m->model, ids, {30}), crisp::Error);
}

TEST(LlamaSmolLM2, BadInputIsRejected) {
  REQUIRE_REAL_MODEL(m);
  cm::LlamaContext context(*m->model, 8);
  EXPECT_THROW(context.prefill({}), crisp::Error);
  EXPECT_THROW(context.prefill({1, 2, 49152}), crisp::Error);
  EXPECT_THROW(context.prefill({1, -1}), crisp::Error);
  EXPECT_THROW(context.prefill(std::vector<int32_t>(9, 1)), crisp::Error);
  EXPECT_THROW(cm::LlamaContext(*m->model, 0), crisp::Error);
}

}  // namespace
