// tests/test_tiny_model.cpp — the model runner end to end on a tiny synthetic Llama GGUF
// (tests/tiny_llama_model.h: random weights, byte-level BPE vocabulary), so CI exercises the GGUF
// reader, tokenizer, chat template, prefill with dense and sparse policies, the KV-cache decode
// and greedy generation without the real model.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "test_util.h"
#include "tiny_llama_model.h"

namespace cm = crisp::model;

namespace {

struct Tiny {
  std::unique_ptr<cm::GgufFile> file;
  std::unique_ptr<cm::Tokenizer> tokenizer;
  std::unique_ptr<cm::LlamaModel> model;
  uint32_t vocab = 0;
};

Tiny load_tiny() {
  Tiny t;
  const std::string path = (crisp_test::temp_dir() / "tiny_llama.gguf").string();
  t.vocab = crisp_test::write_tiny_llama(path);
  t.file = std::make_unique<cm::GgufFile>(path);
  t.tokenizer = std::make_unique<cm::Tokenizer>(*t.file);
  t.model = std::make_unique<cm::LlamaModel>(*t.file);
  return t;
}

TEST(TinyLlama, LoadsShapesFromMetadata) {
  const Tiny t = load_tiny();
  const cm::LlamaHparams& hp = t.model->hparams();
  EXPECT_EQ(hp.n_layer, 2);
  EXPECT_EQ(hp.n_head, 4);
  EXPECT_EQ(hp.n_head_kv, 2);
  EXPECT_EQ(hp.head_dim, 64);
  EXPECT_EQ(hp.n_vocab, static_cast<int64_t>(t.vocab));
  EXPECT_TRUE(hp.tied_embeddings);
  EXPECT_EQ(t.tokenizer->vocab_size(), static_cast<int32_t>(t.vocab));
}

// Greedy generation (prefill + KV-cache decode) picks, at every step, the argmax of a full
// prefill of the prompt plus the tokens generated so far: the decode path and the prefill path
// compute the same model.
TEST(TinyLlama, GreedyGenerationEqualsRecomputedPrefills) {
  const Tiny t = load_tiny();
  const std::string prompt_text =
      t.tokenizer->apply_chat_template({{"user", "the rain in the north and the answer there"}}, true);
  const std::vector<int32_t> prompt = t.tokenizer->encode(prompt_text);
  ASSERT_GT(prompt.size(), 10u);
  EXPECT_EQ(t.tokenizer->decode(prompt), prompt_text);

  cm::GenerateOptions options;
  options.max_new_tokens = 12;
  options.run.threads = 2;
  const cm::GenerateResult result = cm::generate(*t.model, *t.tokenizer, prompt, options);
  ASSERT_FALSE(result.tokens.empty() && !result.stopped_at_end);
  EXPECT_GT(result.time_to_first_token, 0.0);
  EXPECT_DOUBLE_EQ(result.prefill.density, 1.0);
  EXPECT_EQ(result.text, t.tokenizer->decode(result.tokens));

  std::vector<int32_t> ids = prompt;
  for (int32_t generated : result.tokens) {
    const std::vector<float> logits = cm::prefill_logits(*t.model, ids, options.run);
    ASSERT_EQ(cm::argmax(logits.data(), t.vocab), generated) << "after " << ids.size() << " tokens";
    ids.push_back(generated);
  }
  if (result.stopped_at_end) {
    const std::vector<float> logits = cm::prefill_logits(*t.model, ids, options.run);
    EXPECT_TRUE(t.tokenizer->is_end_of_generation(cm::argmax(logits.data(), t.vocab)));
  }
  // Deterministic: the same run gives the same tokens.
  EXPECT_EQ(cm::generate(*t.model, *t.tokenizer, prompt, options).tokens, result.tokens);
}

// A sparse policy on a prompt long enough to select blocks: it runs end to end, keeps fewer
// blocks than dense, and its logits stay finite.
TEST(TinyLlama, CrispPolicyPrefillIsSparseAndFinite) {
  const Tiny t = load_tiny();
  const std::vector<int32_t> ids = crisp_test::tiny_prompt(700, t.vocab);
  cm::RunOptions run;
  run.threads = 2;
  run.attention = crisp::Config::from_preset("crisp");
  run.attention.block_size = 64;
  cm::PrefillResult stats;
  const std::vector<float> logits = cm::prefill_logits(*t.model, ids, run, &stats);
  ASSERT_EQ(logits.size(), t.vocab);
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  ASSERT_EQ(stats.layer_density.size(), 2u);
  EXPECT_LT(stats.density, 1.0);
  EXPECT_GT(stats.density, 0.0);
  EXPECT_GT(stats.attention_seconds, 0.0);
}

TEST(TinyLlama, CudaBackendWithoutCudaIsRejectedNamingTheArgument) {
#if defined(CRISP_WITH_CUDA)
  GTEST_SKIP() << "CUDA build: the CUDA backend is tested by tests/gpu/test_gpu_model.cpp";
#else
  const Tiny t = load_tiny();
  cm::RunOptions run;
  run.backend = cm::ModelBackend::cuda;
  try {
    cm::LlamaContext context(*t.model, 16, run);
    FAIL() << "a CPU-only build made a CUDA context";
  } catch (const crisp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--backend"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no CUDA backend"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cm::require_model_backend(cm::ModelBackend::cuda), crisp::Error);
  EXPECT_NO_THROW(cm::require_model_backend(cm::ModelBackend::cpu));
  EXPECT_THROW(cm::parse_model_backend("metal"), crisp::Error);
  EXPECT_EQ(cm::parse_model_backend("cuda"), cm::ModelBackend::cuda);
#endif
}

}  // namespace
