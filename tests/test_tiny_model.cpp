// tests/test_tiny_model.cpp — the model runner end to end on a tiny synthetic Llama GGUF
// (tests/tiny_llama_model.h: random weights, byte-level BPE vocabulary), so CI exercises the GGUF
// reader, tokenizer, chat template, prefill with dense and sparse policies, the KV-cache decode
// and greedy generation without the real model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <sys/wait.h>  // WEXITSTATUS

#include "crisp/error.h"
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

// Every tensor type the GGUF parser accepts loads as the model's projection matrices and runs:
// a type the parser accepts but the loader cannot dequantise would abort (an exception thrown
// inside the loader's parallel loop) or be refused here.
TEST(TinyLlama, EveryAcceptedTensorTypeLoadsAndRuns) {
  int types = 0;
  for (uint32_t raw = 0; raw < 256; ++raw) {
    try {
      (void)cm::ggml_row_bytes(static_cast<cm::GgmlType>(raw), 0);
    } catch (const crisp::Error&) {
      continue;  // not a type the parser accepts
    }
    ++types;
    SCOPED_TRACE(cm::to_string(static_cast<cm::GgmlType>(raw)));
    crisp_test::TinyLlamaSpec spec;
    spec.weight_type = raw;
    const std::string path = (crisp_test::temp_dir() / ("tiny_" + std::to_string(raw) + ".gguf")).string();
    const uint32_t vocab = crisp_test::write_tiny_llama(path, spec);
    const cm::GgufFile file(path);
    EXPECT_EQ(static_cast<uint32_t>(file.tensor("blk.0.ffn_down.weight").type), raw);
    const cm::LlamaModel model(file);
    cm::RunOptions run;
    run.threads = 2;
    const std::vector<float> logits = cm::prefill_logits(model, crisp_test::tiny_prompt(40, vocab), run);
    ASSERT_EQ(logits.size(), vocab);
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  }
  EXPECT_GE(types, 14);  // F32, F16, BF16 and the eleven block types of src/model/gguf.h
}

TEST(TinyLlama, ThreadCountIsBounded) {
  const Tiny t = load_tiny();
  cm::RunOptions run;
  run.threads = 100000;
  try {
    (void)cm::prefill_logits(*t.model, crisp_test::tiny_prompt(8, t.vocab), run);
    FAIL() << "100000 threads accepted";
  } catch (const crisp::Error& e) {
    EXPECT_EQ(e.argument(), "threads") << e.what();
  }
}

// A corrupt norm tensor (one huge weight) makes a layer's activations overflow: the error names
// the model and the layer, not a "q" argument the caller never passed.
TEST(TinyLlama, NonFiniteActivationNamesTheLayer) {
  crisp_test::TinyLlamaSpec spec;
  spec.edit_norm = [](const std::string& name, std::vector<float>& values) {
    if (name == "blk.1.attn_norm.weight") values[5] = 3e38f;
  };
  const std::string path = (crisp_test::temp_dir() / "corrupt_norm.gguf").string();
  const uint32_t vocab = crisp_test::write_tiny_llama(path, spec);
  const cm::GgufFile file(path);
  const cm::LlamaModel model(file);
  cm::RunOptions run;
  run.threads = 2;
  try {
    (void)cm::prefill_logits(model, crisp_test::tiny_prompt(16, vocab), run);
    FAIL() << "non-finite activations accepted";
  } catch (const crisp::Error& e) {
    EXPECT_EQ(e.argument(), "model") << e.what();
    EXPECT_NE(std::string(e.what()).find("layer 1"), std::string::npos) << e.what();
  }
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

#ifdef CRISP_CLI_PATH
// The CLI tests' setting: the tiny model written to a fresh temporary directory of the test, and the
// command line of one `crisp` call whose output goes to a log file there.
struct TinyModelCli {
  std::filesystem::path dir = crisp_test::temp_dir();
  std::string model = (dir / "tiny_llama.gguf").string();
  TinyModelCli() { crisp_test::write_tiny_llama(model); }
  std::string command(const std::string& args, const std::string& log) const {
    return std::string(CRISP_CLI_PATH) + " " + args + " > " + (dir / log).string() + " 2>&1";
  }
};
#endif

// The command line on the tiny model: `crisp run --json` and `crisp eval niah` write valid JSON
// even though a random model's text is not valid UTF-8, and the sample dump / outside scoring
// round trip (--dump-samples, --score) scores outputs with the official rules.
TEST(TinyLlama, CliRunAndNiahDumpScoreRoundTrip) {
#ifndef CRISP_CLI_PATH
  GTEST_SKIP() << "no CLI path";
#else
  if (!std::filesystem::exists(CRISP_CLI_PATH)) GTEST_SKIP() << "crisp CLI not built";
  const TinyModelCli t;
  const std::filesystem::path& dir = t.dir;
  const std::string& model = t.model;
  const std::string run_json = (dir / "run.json").string();
  std::string cmd =
      t.command("run --model " + model + " --prompt 'the rain' --max-new-tokens 12 --threads 2 --quiet --json " + run_json,
                "run.log");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream run_in(run_json);
  const nlohmann::json run = nlohmann::json::parse(run_in);
  EXPECT_EQ(run.at("backend"), "cpu");
  // "config" has the shape of `crisp plan --json`'s: {"preset": ..., name: value} (it was a list of pairs).
  ASSERT_TRUE(run.at("config").is_object()) << run.at("config").dump();
  EXPECT_EQ(run.at("config").at("preset"), run.at("policy")) << run.at("config").dump();
  EXPECT_GT(run.at("generated_tokens").get<int>(), 0);

  const std::string samples = (dir / "samples.jsonl").string();
  cmd = t.command("eval niah --model " + model + " --tasks passkey,kv_retrieval --lengths 600 --depths 0.5 " +
                      "--policies dense,crisp:routing=cstruct_rel:rho=2.2 --threads 2 --quiet --dump-samples " + samples +
                      " --json " + (dir / "niah.json").string(),
                  "niah.log");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream niah_in(dir / "niah.json");
  const nlohmann::json niah = nlohmann::json::parse(niah_in);
  ASSERT_EQ(niah.at("samples").size(), 2u);
  // A policy given with overrides runs under its full spec and records the configuration it used.
  ASSERT_TRUE(niah.at("samples")[0].at("outcomes").contains("crisp:routing=cstruct_rel:rho=2.2")) << niah.dump();
  const auto& variant = niah.at("policy_configs").at("crisp:routing=cstruct_rel:rho=2.2");
  EXPECT_EQ(variant.at("routing"), "cstruct_rel") << variant.dump();
  EXPECT_DOUBLE_EQ(std::stod(variant.at("rho").get<std::string>()), 2.2) << variant.dump();

  // Outputs made "elsewhere": dense right, crisp wrong, read back by --score.
  std::ifstream dump(samples);
  std::ofstream outputs(dir / "outputs.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(dump, line)) {
    const nlohmann::json s = nlohmann::json::parse(line);
    ASSERT_EQ(s.at("prompt_ids").size(), niah.at("samples")[lines].at("prompt_tokens").get<std::size_t>());
    EXPECT_EQ(s.at("id"), niah.at("samples")[lines].at("id"));
    ++lines;
    const std::string expected = s.at("expected");
    outputs << nlohmann::json{{"id", s.at("id")}, {"policy", "dense"}, {"task", s.at("task")}, {"length", s.at("length")},
                              {"expected", expected}, {"output", " " + expected + "."}}.dump()
            << "\n";
    outputs << nlohmann::json{{"id", s.at("id")}, {"policy", "crisp"}, {"task", s.at("task")}, {"length", s.at("length")},
                              {"expected", expected}, {"output", "I do not know."}}.dump()
            << "\n";
  }
  outputs.close();
  ASSERT_EQ(lines, 2);
  const std::string scores = (dir / "scores.json").string();
  cmd = t.command("eval niah --score " + (dir / "outputs.jsonl").string() + " --json " + scores, "score.log");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream score_in(scores);
  const nlohmann::json scored = nlohmann::json::parse(score_in);
  int rows = 0;
  for (const nlohmann::json& row : scored.at("rows")) {
    ++rows;
    EXPECT_EQ(row.at("accuracy").get<double>(), row.at("policy") == "dense" ? 1.0 : 0.0) << row.dump();
    EXPECT_EQ(row.at("dense_accuracy").get<double>(), 1.0);
  }
  EXPECT_EQ(rows, 4);  // 2 tasks x 2 policies
#endif
}

// `crisp capture` then `crisp eval fidelity` on the tiny model: the capture directory is read
// back, and --policies takes preset specs with overrides (PRESET:key=value), each evaluated under
// its own configuration and reported under its full spec.
TEST(TinyLlama, CliCaptureThenFidelityWithPolicySpecs) {
#ifndef CRISP_CLI_PATH
  GTEST_SKIP() << "no CLI path";
#else
  if (!std::filesystem::exists(CRISP_CLI_PATH)) GTEST_SKIP() << "crisp CLI not built";
  const TinyModelCli t;
  const std::filesystem::path& dir = t.dir;
  const std::string& model = t.model;
  {
    std::ofstream prompt(dir / "prompt.txt");
    for (int i = 0; i < 60; ++i) prompt << "the rain in the plain falls mainly at night. ";
  }
  const std::string capture_dir = (dir / "capture").string();
  std::string cmd = t.command("capture --model " + model + " --prompt-file " + (dir / "prompt.txt").string() +
                                  " --layers 0 --threads 2 --quiet --out " + capture_dir,
                              "capture.log");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::string fidelity_json = (dir / "fidelity.json").string();
  const std::string variant = "crisp:uniform_alpha=4";
  cmd = t.command("eval fidelity --captures " + capture_dir + " --policies dense,crisp," + variant +
                      " --block 64 --threads 2 --quiet --json " + fidelity_json,
                  "fidelity.log");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(fidelity_json);
  const nlohmann::json out = nlohmann::json::parse(in);
  ASSERT_EQ(out.at("policies").size(), 3u) << out.at("policies").dump();
  EXPECT_EQ(out.at("policies")[2].at("name"), variant);
  // Each policy's configuration is a list of [key, value] pairs.
  const auto config_value = [](const nlohmann::json& config, const std::string& key) {
    for (const nlohmann::json& kv : config)
      if (kv.at(0) == key) return std::stod(kv.at(1).get<std::string>());
    ADD_FAILURE() << "no " << key << " in " << config.dump();
    return std::nan("");
  };
  EXPECT_DOUBLE_EQ(config_value(out.at("policies")[2].at("config"), "uniform_alpha"), 4.0);
  EXPECT_DOUBLE_EQ(config_value(out.at("policies")[1].at("config"), "uniform_alpha"), 0.5);
  const nlohmann::json& summary = out.at("captures").at(0).at("summary");
  ASSERT_TRUE(summary.contains(variant)) << summary.dump();
  // A higher noise-floor multiple keeps fewer blocks than the preset's uniform_alpha = 0.5, so the
  // override took effect.
  EXPECT_LT(summary.at(variant).at("density_mean").get<double>(), summary.at("crisp").at("density_mean").get<double>());
  EXPECT_DOUBLE_EQ(summary.at("dense").at("density_mean").get<double>(), 1.0);

  // An unknown parameter in a spec is an error naming --policies.
  cmd = t.command("eval fidelity --captures " + capture_dir + " --policies crisp:no_such_key=1 --quiet --json " +
                      (dir / "bad.json").string(),
                  "bad.log");
  EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 2) << cmd;
  std::ifstream bad_log(dir / "bad.log");
  const std::string log((std::istreambuf_iterator<char>(bad_log)), std::istreambuf_iterator<char>());
  EXPECT_NE(log.find("--policies"), std::string::npos) << log;
#endif
}

}  // namespace

// Past the trained context without RoPE scaling `crisp run` refused to run only in words (a
// warning, then meaningless output): now an error naming --rope-scaling, before any generation.
TEST(TinyLlama, CliRunPastTrainedContextIsAnError) {
#ifndef CRISP_CLI_PATH
  GTEST_SKIP() << "no CLI path";
#else
  if (!std::filesystem::exists(CRISP_CLI_PATH)) GTEST_SKIP() << "crisp CLI not built";
  const std::filesystem::path dir = crisp_test::temp_dir();
  const std::string model = (dir / "ctx64.gguf").string();
  crisp_test::TinyLlamaSpec spec;
  spec.context = 64;
  crisp_test::write_tiny_llama(model, spec);
  const std::string log = (dir / "run.log").string();
  auto run = [&](const std::string& args) {
    const std::string cmd = std::string(CRISP_CLI_PATH) + " run --model " + model + " --quiet --threads 2 " + args +
                            " > " + log + " 2>&1";
    const int status = std::system(cmd.c_str());
    std::ifstream in(log);
    return std::make_pair(WEXITSTATUS(status), std::string(std::istreambuf_iterator<char>(in), {}));
  };
  std::string long_prompt;
  for (int i = 0; i < 40; ++i) long_prompt += "the rain ";
  for (const std::string& args : {"--prompt '" + long_prompt + "' --max-new-tokens 4",  // the prompt alone
                                  std::string("--prompt 'the rain' --max-new-tokens 100")}) {  // prompt + new tokens
    const auto [code, output] = run(args);
    EXPECT_EQ(code, 2) << args << "\n" << output;
    EXPECT_NE(output.find("crisp: error: --rope-scaling"), std::string::npos) << output;
  }
  // With RoPE scaling the same run goes ahead (a warning says it is beyond the training).
  const auto [code, output] = run("--prompt 'the rain' --max-new-tokens 100 --rope-scaling linear");
  EXPECT_EQ(code, 0) << output;
#endif
}

// A KV cache larger than the machine's memory is refused up front, naming the option.
TEST(TinyLlama, KvCacheLargerThanMemoryIsRefused) {
  const Tiny t = load_tiny();
  const cm::LlamaHparams& hp = t.model->hparams();
  const uint64_t per_position = cm::kv_cache_bytes(hp, 1);
  EXPECT_EQ(per_position, 2ull * 2 * 2 * 64 * sizeof(float));  // K and V, 2 layers, 2 KV heads of 64
  EXPECT_NO_THROW(cm::require_kv_cache_fits(hp, 1000, 1000 * per_position, "--max-new-tokens"));
  try {
    cm::require_kv_cache_fits(hp, 1001, 1000 * per_position, "--max-new-tokens");
    FAIL() << "accepted";
  } catch (const crisp::Error& e) {
    EXPECT_EQ(e.argument(), "--max-new-tokens");
    EXPECT_NE(std::string(e.what()).find("at most 1000 positions"), std::string::npos) << e.what();
  }
}

// Names read from a file reach the terminal escaped: a GGUF key holding an escape sequence and a
// NUL (here a duplicate key, which the reader quotes in its error) is printed as \x1b...\x00.
TEST(TinyLlama, CliEscapesControlBytesOfFileNames) {
#ifndef CRISP_CLI_PATH
  GTEST_SKIP() << "no CLI path";
#else
  if (!std::filesystem::exists(CRISP_CLI_PATH)) GTEST_SKIP() << "crisp CLI not built";
  const std::filesystem::path dir = crisp_test::temp_dir();
  const std::string model = (dir / "evil_key.gguf").string();
  const std::string key("evil\x1b[31m\0key", 13);
  crisp_test::GgufWriter w;
  w.u32(key, 1);
  w.u32(key, 2);
  crisp_test::write_file(model, w.bytes());
  const std::string log = (dir / "run.log").string();
  const std::string cmd = std::string(CRISP_CLI_PATH) + " run --quiet --model " + model + " --prompt x > " + log + " 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 2);
  std::ifstream in(log, std::ios::binary);
  const std::string output(std::istreambuf_iterator<char>(in), {});
  EXPECT_EQ(output.find('\x1b'), std::string::npos) << output;
  EXPECT_EQ(output.find('\0'), std::string::npos) << output;
  EXPECT_NE(output.find("evil\\x1b[31m\\x00key"), std::string::npos) << output;
#endif
}
