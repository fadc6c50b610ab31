// tools/cmd_run.cpp — `crisp run`: a Llama-family GGUF model (SmolLM2-135M-Instruct by default)
// answers a prompt, with the prefill attention going through a crisp policy; prints the answer,
// the time to first token, the prefill attention time and the attention density.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "io_util.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/matmul.h"
#include "model/model_path.h"
#include "model/tokenizer.h"
#include "model_loading.h"
#include "progress.h"
#include "validators.h"

namespace {

struct RunArgs {
  std::string model_path;
  std::string prompt;
  std::string prompt_file;
  std::string system;
  bool chat = false;
  crisp_cli::PolicyOptions policy;
  int64_t max_new_tokens = 128;
  std::string rope_scaling = "none";
  double rope_factor = 0.0;  // 0: the smallest factor that fits the run in the trained context
  std::string backend = "cpu";
  std::string json_path;
  bool quiet = false;
};

std::string read_prompt_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw crisp::Error("--prompt-file", "cannot open '" + path + "'", "a readable text file");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void run(const RunArgs& args) {
  namespace cm = crisp::model;
  if (args.backend != "cpu") {
    throw crisp_cli::CommandFailure("--backend " + args.backend +
                                    ": the model runner has only the CPU backend so far (use --backend cpu)");
  }
  // Every argument check that needs no model comes before the (seconds-long) model load.
  const cm::RopeScalingType rope_type = cm::parse_rope_scaling(args.rope_scaling);
  if (rope_type == cm::RopeScalingType::none && args.rope_factor > 0.0) {
    throw crisp::Error("--rope-factor", "needs a --rope-scaling method", "--rope-scaling linear|ntk|yarn");
  }
  if (rope_type != cm::RopeScalingType::none && args.rope_factor > 0.0 && args.rope_factor < 1.0) {
    throw crisp::Error("--rope-factor", "is " + std::to_string(args.rope_factor), "a factor >= 1");
  }
  if (!args.system.empty() && !args.chat) throw crisp::Error("--system", "needs --chat", "--chat with --system");
  const crisp::Config attention = crisp_cli::make_config(args.policy);
  const std::string text = args.prompt_file.empty() ? args.prompt : read_prompt_file(args.prompt_file);
  if (text.empty()) throw crisp::Error("--prompt", "is empty", "some text to answer");

  crisp_cli::Progress progress(!args.quiet);
  const crisp_cli::LoadedModel loaded = crisp_cli::load_model(args.model_path, progress);
  const cm::Tokenizer& tokenizer = loaded.tokenizer;
  const cm::LlamaModel& model = loaded.model;
  const cm::LlamaHparams& hp = model.hparams();

  std::string prompt_text = text;
  if (args.chat) {
    std::vector<cm::ChatMessage> messages;
    if (!args.system.empty()) messages.push_back({"system", args.system});
    messages.push_back({"user", text});
    prompt_text = tokenizer.apply_chat_template(messages, true);
  }
  const std::vector<int32_t> prompt = tokenizer.encode(prompt_text);
  if (prompt.empty()) throw crisp::Error("--prompt", "encodes to no tokens", "some text to answer");

  cm::GenerateOptions options;
  options.max_new_tokens = args.max_new_tokens;
  options.run.attention = attention;
  options.run.attention_precision = crisp_cli::make_run_options(args.policy).precision;
  options.run.threads = args.policy.threads;
  options.run.rope.type = rope_type;
  const int64_t positions = static_cast<int64_t>(prompt.size()) + args.max_new_tokens;
  if (rope_type != cm::RopeScalingType::none) {
    options.run.rope.factor =
        args.rope_factor > 0.0 ? args.rope_factor
                               : std::max(1.0, std::ceil(static_cast<double>(positions) / hp.n_ctx_train));
  }
  const bool beyond_training = positions > hp.n_ctx_train || options.run.rope.type != cm::RopeScalingType::none;
  if (beyond_training) {
    crisp_cli::finish_progress_line();
    if (options.run.rope.type == cm::RopeScalingType::none) {
      std::fprintf(stderr,
                   "crisp: warning: up to %lld positions, past the model's trained context of %lld and "
                   "without RoPE scaling: expect degraded output (see --rope-scaling)\n",
                   static_cast<long long>(positions), static_cast<long long>(hp.n_ctx_train));
    } else {
      std::fprintf(stderr,
                   "crisp: warning: RoPE scaling %s x%.3g — beyond the model's training (trained context %lld); "
                   "answers are not what the model was trained to give\n",
                   cm::to_string(options.run.rope.type), options.run.rope.factor,
                   static_cast<long long>(hp.n_ctx_train));
    }
  }
  if (!args.quiet) {
    std::fprintf(stderr, "crisp: %lld prompt tokens, policy %s, %s matmul kernel\n",
                 static_cast<long long>(prompt.size()), options.run.attention.preset.c_str(),
                 cm::matmul_kernel_name());
  }

  const cm::GenerateResult result = cm::generate(model, tokenizer, prompt, options, [](const std::string& piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  const cm::PrefillResult& pre = result.prefill;
  const int threads = pre.threads;
  const double decode_rate = result.tokens.size() > 1 && result.decode_seconds > 0.0
                                 ? static_cast<double>(result.tokens.size() - 1) / result.decode_seconds
                                 : 0.0;
  std::printf("\n\n--- crisp run: %s, %lld prompt tokens, %lld generated (%s)\n", hp.architecture.c_str(),
              static_cast<long long>(prompt.size()), static_cast<long long>(result.tokens.size()),
              result.stopped_at_end ? "end of generation" : "--max-new-tokens reached");
  std::printf("time to first token  %.3f s (prefill %.3f s, of which attention %.3f s; prefill CPU time "
              "%.3f s on %d threads)\n",
              result.time_to_first_token, pre.seconds, pre.attention_seconds, pre.cpu_seconds, threads);
  std::printf("prefill attention    policy %s, density %.4f (mean of %lld layers), VS share %.3f\n",
              options.run.attention.preset.c_str(), pre.density, static_cast<long long>(hp.n_layer),
              pre.vs_share);
  std::printf("decode               %.2f tokens/s (dense attention over the KV cache)\n", decode_rate);
  if (beyond_training) {
    std::printf("rope                 %s x%.3g: BEYOND THE MODEL'S TRAINING (trained context %lld)\n",
                cm::to_string(options.run.rope.type), options.run.rope.factor, static_cast<long long>(hp.n_ctx_train));
  }

  if (!args.json_path.empty()) {
    nlohmann::json out = {
        {"model", args.model_path},
        {"policy", options.run.attention.preset},
        {"config", options.run.attention.to_key_values()},
        {"prompt_tokens", prompt.size()},
        {"generated_tokens", result.tokens.size()},
        {"stopped_at_end", result.stopped_at_end},
        {"answer", result.text},
        {"time_to_first_token_s", result.time_to_first_token},
        {"prefill_s", pre.seconds},
        {"prefill_attention_s", pre.attention_seconds},
        {"prefill_cpu_s", pre.cpu_seconds},
        {"threads", threads},
        {"density", pre.density},
        {"vs_share", pre.vs_share},
        {"layer_density", pre.layer_density},
        {"decode_tokens_per_s", decode_rate},
        {"rope_scaling", cm::to_string(options.run.rope.type)},
        {"rope_factor", options.run.rope.type == cm::RopeScalingType::none ? 1.0 : options.run.rope.factor},
        {"beyond_training", beyond_training},
    };
    crisp_cli::write_text_file("--json", args.json_path, out.dump(1) + "\n");
  }
}

}  // namespace

void register_run_command(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  args->model_path = crisp::model::default_model_path();
  CLI::App* sub = app.add_subcommand(
      "run", "Answer a prompt with a Llama-family GGUF model (SmolLM2-135M-Instruct by default), the "
             "prefill attention through a crisp policy; prints the answer, time to first token, "
             "prefill attention time and density");
  sub->add_option("--model", args->model_path,
                  "GGUF model file (default: $CRISP_MODEL_PATH or the cache of scripts/fetch_model.sh)")
      ->capture_default_str();
  auto* prompt = sub->add_option("--prompt", args->prompt, "Prompt text");
  auto* prompt_file = sub->add_option("--prompt-file", args->prompt_file, "Read the prompt from this file");
  prompt->excludes(prompt_file);
  sub->add_flag("--chat", args->chat, "Wrap the prompt as a user message in the model's chat template");
  sub->add_option("--system", args->system, "System message (with --chat)");
  crisp_cli::add_policy_options(*sub, args->policy);
  sub->add_option("--max-new-tokens", args->max_new_tokens, "Most tokens to generate")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("--rope-scaling", args->rope_scaling,
                  "RoPE scaling for contexts past the trained one: none, linear, ntk, yarn "
                  "(any but none is beyond the model's training)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "linear", "ntk", "yarn"}));
  sub->add_option("--rope-factor", args->rope_factor,
                  "RoPE scaling factor (default: the smallest that fits prompt + new tokens in the "
                  "trained context)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--backend", args->backend, "Compute backend")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--json", args->json_path, "Also write the answer and timings as JSON here");
  sub->add_flag("--quiet", args->quiet, "No progress lines on stderr");
  sub->callback([args, prompt, prompt_file] {
    if (prompt->count() == 0 && prompt_file->count() == 0) {
      throw crisp::Error("--prompt", "missing", "--prompt TEXT or --prompt-file FILE");
    }
    run(*args);
  });
}
