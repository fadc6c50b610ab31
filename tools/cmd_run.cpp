// tools/cmd_run.cpp — `crisp run`: a Llama-family GGUF model (SmolLM2-135M-Instruct by default)
// answers a prompt, with the prefill attention going through a crisp policy; prints the answer,
// the time to first token, the prefill attention time and the attention density.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "io_util.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/matmul.h"
#include "default_paths.h"
#include "plan_json.h"
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
  bool chat = false;     // --chat: the chat template, required (an error when the model has none)
  bool no_chat = false;  // --no-chat: the raw prompt even for a model with a chat template
  crisp_cli::PolicyOptions policy;
  int64_t max_new_tokens = 128;
  std::string rope_scaling = "none";
  double rope_factor = 0.0;  // 0: the smallest factor that fits the run in the trained context
  std::string backend = "cpu";
  std::string cuda_attention = "f16";
  std::string check_logits;          // reference JSON (scripts/ref_logits.py): compare, no generation
  double logits_tolerance = 1e-4;    // max |Δ| / std of the last position's logits
  double min_argmax_agreement = 0.99;
  std::string json_path;
  bool quiet = false;
};

// NOTE: tolerances. The defaults are the CPU model test's (tests/test_llama.cpp): both sides
// dequantise the same bytes to the same float32 weights and differ only in float32 rounding, so
// max |Δ| <= 1e-4 · std(logits) at the last position and >= 99% argmax agreement over positions.
// The CUDA backend with --cuda-attention f32-reference is held to the same numbers; with f16
// (crisp's kernel on float16 Q/K/V) the attention inputs and output are rounded to 11 bits, and
// scripts/gpu_model_eval.sh reports that deviation with its own, stated tolerance.
void check_logits(const RunArgs& args, const crisp::model::RunOptions& run_options) {
  namespace cm = crisp::model;
  using nlohmann::json;
  std::ifstream in(args.check_logits, std::ios::binary);
  if (!in) throw crisp::Error("--check-logits", "cannot open '" + args.check_logits + "'", "a reference JSON file");
  json ref;
  try {
    in >> ref;
  } catch (const json::exception& e) {
    throw crisp::Error("--check-logits", "'" + args.check_logits + "' is not JSON (" + e.what() + ")",
                       "the output of scripts/ref_logits.py");
  }
  for (const char* key : {"token_ids", "last_logits", "argmax", "last_std"}) {
    if (!ref.contains(key)) {
      throw crisp::Error("--check-logits", std::string("has no '") + key + "'", "the output of scripts/ref_logits.py");
    }
  }
  std::vector<int32_t> ids, ref_argmax;
  std::vector<double> ref_last;
  double ref_std = 0.0;
  try {
    ids = ref.at("token_ids").get<std::vector<int32_t>>();
    ref_last = ref.at("last_logits").get<std::vector<double>>();
    ref_argmax = ref.at("argmax").get<std::vector<int32_t>>();
    ref_std = ref.at("last_std").get<double>();
  } catch (const json::exception& e) {
    throw crisp::Error("--check-logits", "'" + args.check_logits + "' has a field of the wrong type (" + e.what() + ")",
                       "token_ids and argmax lists of integers, last_logits a list of numbers, last_std a number");
  }
  if (ids.empty() || ref_argmax.size() != ids.size()) {
    throw crisp::Error("--check-logits", "token_ids and argmax differ in length or are empty",
                       "one argmax per token");
  }

  crisp_cli::Progress progress(!args.quiet);
  const crisp_cli::LoadedModel loaded = crisp_cli::load_model(args.model_path, progress);
  const cm::LlamaModel& model = loaded.model;
  const int64_t vocab = model.hparams().n_vocab;
  if (static_cast<int64_t>(ref_last.size()) != vocab) {
    throw crisp::Error("--check-logits", "has " + std::to_string(ref_last.size()) + " last_logits",
                       std::to_string(vocab) + " (the model's vocabulary)");
  }
  cm::warm_up_backend(model, run_options);  // the weight upload stays out of the prefill time
  cm::LlamaContext context(model, static_cast<int64_t>(ids.size()), run_options);
  const cm::PrefillResult result = context.prefill(ids, /*all_logits=*/true);
  const float* last = result.logits.data() + (ids.size() - 1) * vocab;
  double max_abs = 0.0;
  for (int64_t i = 0; i < vocab; ++i) max_abs = std::max(max_abs, std::fabs(last[i] - ref_last[i]));
  const double rel = max_abs / ref_std;
  size_t agree = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    agree += cm::argmax(result.logits.data() + t * vocab, vocab) == ref_argmax[t];
  }
  const double agreement = static_cast<double>(agree) / static_cast<double>(ids.size());
  const bool pass = rel <= args.logits_tolerance && agreement >= args.min_argmax_agreement;
  const std::string attention_label =
      run_options.backend == cm::ModelBackend::cuda ? " (" + args.cuda_attention + " attention)" : "";
  std::printf("logits check, backend %s%s, policy %s, %zu tokens vs %s\n", cm::to_string(run_options.backend),
              attention_label.c_str(), run_options.attention.preset.c_str(), ids.size(),
              ref.value("reference", std::string("the reference")).c_str());
  std::printf("  last position: max|diff| = %.4g, / std %.4f = %.3g (tolerance %.1e)\n", max_abs, ref_std, rel,
              args.logits_tolerance);
  std::printf("  argmax agreement %zu / %zu = %.4f (at least %.2f)\n", agree, ids.size(), agreement,
              args.min_argmax_agreement);
  std::printf("  prefill %.3f s, attention %.4f s, density %.4f\n", result.seconds, result.attention_seconds,
              result.density);
  std::printf("  %s\n", pass ? "PASS" : "FAIL");
  if (!args.json_path.empty()) {
    const json out = {{"check", "logits"},
                      {"reference_file", args.check_logits},
                      {"reference", ref.value("reference", std::string())},
                      {"backend", cm::to_string(run_options.backend)},
                      {"device", cm::model_backend_device(run_options.backend)},
                      {"cuda_attention", run_options.backend == cm::ModelBackend::cuda ? args.cuda_attention : ""},
                      {"policy", run_options.attention.preset},
                      {"tokens", ids.size()},
                      {"max_abs_diff", max_abs},
                      {"last_std", ref_std},
                      {"rel_diff", rel},
                      {"tolerance", args.logits_tolerance},
                      {"argmax_agreement", agreement},
                      {"min_argmax_agreement", args.min_argmax_agreement},
                      {"prefill_s", result.seconds},
                      {"prefill_attention_s", result.attention_seconds},
                      {"density", result.density},
                      {"pass", pass}};
    // Generated text may hold invalid UTF-8 (a token that ends inside a character): U+FFFD in the JSON.
    crisp_cli::write_text_file("--json", args.json_path,
                               out.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  }
  if (!pass) {
    throw crisp_cli::CommandFailure("logits check failed: " + std::to_string(rel) + " relative, agreement " +
                                        std::to_string(agreement),
                                    1);
  }
}

void run(const RunArgs& args, bool cuda_attention_given) {
  namespace cm = crisp::model;
  // Every argument check that needs no model comes before the (seconds-long) model load.
  crisp_cli::require_writable("--json", args.json_path);
  const cm::ModelBackend backend = cm::parse_model_backend(args.backend, "--backend");
  cm::require_model_backend(backend, "--backend");
  const cm::CudaPrefillAttention cuda_attention = cm::parse_cuda_prefill_attention(args.cuda_attention);
  if (cuda_attention_given && backend != cm::ModelBackend::cuda) {
    throw crisp::Error("--cuda-attention", "applies to the CUDA backend only", "--backend cuda");
  }
  if (!args.check_logits.empty()) {
    cm::RunOptions run_options;
    run_options.attention = crisp_cli::make_config(args.policy);
    run_options.attention_precision = crisp_cli::make_run_options(args.policy).precision;
    run_options.threads = args.policy.threads;
    run_options.backend = backend;
    run_options.cuda_attention = cuda_attention;
    check_logits(args, run_options);
    return;
  }
  const cm::RopeScalingType rope_type = cm::parse_rope_scaling(args.rope_scaling);
  if (rope_type == cm::RopeScalingType::none && args.rope_factor > 0.0) {
    throw crisp::Error("--rope-factor", "needs a --rope-scaling method", "--rope-scaling linear|ntk|yarn");
  }
  if (rope_type != cm::RopeScalingType::none && args.rope_factor > 0.0 && args.rope_factor < 1.0) {
    throw crisp::Error("--rope-factor", "is " + std::to_string(args.rope_factor), "a factor >= 1");
  }
  if (!args.system.empty() && args.no_chat) throw crisp::Error("--system", "needs the chat template", "no --no-chat with --system");
  const crisp::Config attention = crisp_cli::make_config(args.policy);
  const std::string text = args.prompt_file.empty() ? args.prompt : crisp_cli::read_text_file("--prompt-file", args.prompt_file);
  if (text.empty()) throw crisp::Error("--prompt", "is empty", "some text to answer");

  crisp_cli::Progress progress(!args.quiet);
  const crisp_cli::LoadedModel loaded = crisp_cli::load_model(args.model_path, progress);
  const cm::Tokenizer& tokenizer = loaded.tokenizer;
  const cm::LlamaModel& model = loaded.model;
  const cm::LlamaHparams& hp = model.hparams();

  // An instruct model answers only in its chat format: the template applies unless --no-chat.
  const bool use_chat = !args.no_chat && (args.chat || !args.system.empty() || tokenizer.has_chat_template());
  std::string prompt_text = text;
  if (use_chat) {
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
  options.run.backend = backend;
  options.run.cuda_attention = cuda_attention;
  options.run.rope.type = rope_type;
  const int64_t positions = static_cast<int64_t>(prompt.size()) + args.max_new_tokens;
  if (rope_type != cm::RopeScalingType::none) {
    options.run.rope.factor =
        args.rope_factor > 0.0 ? args.rope_factor
                               : std::max(1.0, std::ceil(static_cast<double>(positions) / hp.n_ctx_train));
  }
  // Past the trained context without RoPE scaling the model's output is meaningless: refused.
  if (rope_type == cm::RopeScalingType::none && positions > hp.n_ctx_train) {
    throw crisp::Error("--rope-scaling",
                       "is none, but the prompt's " + std::to_string(prompt.size()) + " tokens + --max-new-tokens " +
                           std::to_string(args.max_new_tokens) + " = " + std::to_string(positions) +
                           " positions exceed the model's trained context of " + std::to_string(hp.n_ctx_train),
                       "a shorter prompt, a smaller --max-new-tokens, or --rope-scaling linear|ntk|yarn");
  }
  cm::require_kv_cache_fits(hp, positions, cm::physical_memory_bytes(), "--max-new-tokens");
  const bool beyond_training = options.run.rope.type != cm::RopeScalingType::none;
  if (beyond_training) {
    crisp_cli::finish_progress_line();
    std::fprintf(stderr,
                 "crisp: warning: RoPE scaling %s x%.3g — beyond the model's training (trained context %lld); "
                 "answers are not what the model was trained to give\n",
                 cm::to_string(options.run.rope.type), options.run.rope.factor, static_cast<long long>(hp.n_ctx_train));
  }
  if (!args.quiet) {
    std::fprintf(stderr, "crisp: %lld prompt tokens, policy %s, backend %s (%s)\n",
                 static_cast<long long>(prompt.size()), options.run.attention.preset.c_str(), cm::to_string(backend),
                 backend == cm::ModelBackend::cuda ? ("cuBLAS fp32 matmuls, " + args.cuda_attention + " attention").c_str()
                                                   : (std::string(cm::matmul_kernel_name()) + " matmul kernel").c_str());
  }

  // CUDA: weights upload and first kernel launches before the clock of time-to-first-token starts,
  // as the CPU's weights are ready in memory once loaded.
  const double warm_up_s = cm::warm_up_backend(model, options.run);
  if (backend == cm::ModelBackend::cuda && !args.quiet) {
    std::fprintf(stderr, "crisp: %s ready in %.2f s (weights uploaded, kernels warmed up)\n",
                 cm::model_backend_device(backend).c_str(), warm_up_s);
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
  if (backend == cm::ModelBackend::cuda) {
    std::printf("time to first token  %.3f s (prefill %.3f s, of which attention %.4f s by CUDA events; backend "
                "cuda, %s attention)\n",
                result.time_to_first_token, pre.seconds, pre.attention_seconds, args.cuda_attention.c_str());
  } else {
    std::printf("time to first token  %.3f s (prefill %.3f s, of which attention %.3f s; prefill CPU time "
                "%.3f s on %d threads)\n",
                result.time_to_first_token, pre.seconds, pre.attention_seconds, pre.cpu_seconds, threads);
  }
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
        {"config", crisp_cli::config_to_json(options.run.attention)},
        {"prompt_tokens", prompt.size()},
        {"generated_tokens", result.tokens.size()},
        {"stopped_at_end", result.stopped_at_end},
        {"answer", result.text},
        {"time_to_first_token_s", result.time_to_first_token},
        {"prefill_s", pre.seconds},
        {"prefill_attention_s", pre.attention_seconds},
        {"prefill_cpu_s", pre.cpu_seconds},
        {"threads", threads},
        {"backend", cm::to_string(backend)},
        {"device", cm::model_backend_device(backend)},
        {"warm_up_s", warm_up_s},
        {"cuda_attention", backend == cm::ModelBackend::cuda ? args.cuda_attention : ""},
        {"density", pre.density},
        {"vs_share", pre.vs_share},
        {"layer_density", pre.layer_density},
        {"decode_tokens_per_s", decode_rate},
        {"rope_scaling", cm::to_string(options.run.rope.type)},
        {"rope_factor", options.run.rope.type == cm::RopeScalingType::none ? 1.0 : options.run.rope.factor},
        {"beyond_training", beyond_training},
    };
    // Generated text may hold invalid UTF-8 (a token that ends inside a character): U+FFFD in the JSON.
    crisp_cli::write_text_file("--json", args.json_path,
                               out.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  }
}

}  // namespace

void register_run_command(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* sub = app.add_subcommand(
      "run", "Answer a prompt with a Llama-family GGUF model (SmolLM2-135M-Instruct by default), the "
             "prefill attention through a crisp policy; prints the answer, time to first token, "
             "prefill attention time and density");
  crisp_cli::add_model_option(sub, &args->model_path);
  auto* prompt = sub->add_option("--prompt", args->prompt, "Prompt text");
  auto* prompt_file = sub->add_option("--prompt-file", args->prompt_file, "Read the prompt from this file");
  prompt->excludes(prompt_file);
  auto* chat = sub->add_flag("--chat", args->chat,
                             "Wrap the prompt as a user message in the model's chat template (the default when the "
                             "model has one)");
  sub->add_flag("--no-chat", args->no_chat, "Give the prompt as it is, without the chat template")->excludes(chat);
  sub->add_option("--system", args->system, "System message (in the chat template)");
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
  auto* cuda_attention = crisp_cli::add_model_backend_options(
      sub, &args->backend, &args->cuda_attention, "Compute backend: cpu, or cuda (a CUDA build on a GPU machine)");
  auto* check = sub->add_option("--check-logits", args->check_logits,
                                "Instead of answering: run the reference prompt of this JSON (scripts/ref_logits.py) "
                                "and compare every position's logits with it; exit 1 outside the tolerance");
  sub->add_option("--logits-tolerance", args->logits_tolerance,
                  "--check-logits: most max|diff| / std of the last position's logits")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("--min-argmax-agreement", args->min_argmax_agreement,
                  "--check-logits: least share of positions whose argmax matches the reference")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--json", args->json_path, "Also write the answer and timings as JSON here");
  sub->add_flag("--quiet", args->quiet, "No progress lines on stderr");
  check->excludes(prompt)->excludes(prompt_file);
  sub->callback([args, prompt, prompt_file, check, cuda_attention] {
    args->model_path = crisp_cli::model_or_default(args->model_path);
    if (prompt->count() == 0 && prompt_file->count() == 0 && check->count() == 0) {
      throw crisp::Error("--prompt", "missing", "--prompt TEXT or --prompt-file FILE (or --check-logits FILE)");
    }
    run(*args, cuda_attention->count() > 0);
  });
}
