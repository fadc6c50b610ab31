// integrations/llama.cpp/crisp_llama_eval.cpp — crisp-llama-eval: crisp's NIAH evaluation and
// frontier harness on llama.cpp (any model llama.cpp loads: SmolLM2, Gemma 3, ...), built by
// scripts/llama_cpp.sh against the patched libllama / ggml (docs/llama_cpp.md).
//
//   crisp-llama-eval niah   --model M.gguf --lengths 4096 --split tuning --json out.json
//   crisp-llama-eval pareto --model M.gguf --sweep "crisp:alpha=0.5,1" --json out.json
//   crisp-llama-eval capture --model M.gguf --qa-index 0 --max-tokens 4096 --out DIR
//
// Samples, scoring, splits, sweeps and the resumable JSON are crisp's own (src/eval); only the
// model is llama.cpp's: its tokenizer counts the haystack, its chat template (or a completion-style
// prompt for a base model) frames it, llama_decode runs the prompt in ubatches (chunked prefill)
// with flash attention on, so every policy but `llama_fa` goes through crisp's hook, and its
// greedy sampler answers. The policy is installed and its density read through the entry points
// every hooked backend registers (ggml_backend_reg_get_proc_address, docs/llama_cpp.md).
// `capture` runs one dense prefill per prompt and writes each layer's post-RoPE Q/K/V as seen by
// llama.cpp's attention op, through its eval callback (crisp_llama_capture.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "crisp/config.h"
#include "crisp/error.h"
#include "crisp_llama_capture.h"
#include "default_paths.h"
#include "io_util.h"
#include "validators.h"
#include "eval/frontier_file.h"
#include "eval/niah.h"
#include "eval/splits.h"
#include "eval/sweep.h"
#include "ggml-backend.h"
#include "llama.h"

namespace {

namespace ce = crisp::eval;
using nlohmann::json;

constexpr const char* kTool = "crisp-llama-eval";
// The reference point computed by llama.cpp's own flash-attention kernel (sparse prefill off).
constexpr const char* kLlamaFa = "llama_fa";
// llama.cpp's attention without flash attention (KQ matmul, softmax, KQV): how far two of
// llama.cpp's own kernels are apart calibrates the tolerance of dense == llama_fa.
constexpr const char* kLlamaNoFa = "llama_nofa";

// ---------------------------------------------------------------- crisp's hook, via the registry

using SetFn = bool (*)(const char*, const char* const*, int, char*, size_t);
using StatsFn = void (*)(int64_t*, int64_t*, int64_t*, int64_t*);
using ResetFn = void (*)();

struct HookStats {
  std::optional<int64_t> handled, declined, kept_blocks, causal_blocks;
};

// Every registered backend's setter and statistics ("ggml_backend_set_sparse_prefill", ...). A
// backend that registers no statistics leaves the counters unknown (density null, never guessed).
class SparsePrefillHook {
 public:
  explicit SparsePrefillHook(bool uses_gpu) {
    for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
      ggml_backend_reg_t reg = ggml_backend_reg_get(i);
      const bool gpu = is_gpu_reg(reg);
      auto set = reinterpret_cast<SetFn>(ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_sparse_prefill"));
      auto stats = reinterpret_cast<StatsFn>(ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_sparse_prefill_stats"));
      auto reset = reinterpret_cast<ResetFn>(ggml_backend_reg_get_proc_address(reg, "ggml_backend_reset_sparse_prefill_stats"));
      if (set != nullptr) setters_.push_back(set);
      if (stats != nullptr) stats_.push_back(stats);
      if (reset != nullptr) resets_.push_back(reset);
      if (gpu && uses_gpu && set == nullptr) {
        throw crisp::Error("--ngl", std::string("offloads layers to backend '") + ggml_backend_reg_name(reg) +
                                        "', which has no crisp hook (no ggml_backend_set_sparse_prefill in the registry)",
                           "--ngl 0, or a llama.cpp build whose GPU backend carries crisp's hook");
      }
    }
    if (setters_.empty()) {
      throw crisp::Error("llama.cpp", "this build has no crisp hook (no ggml_backend_set_sparse_prefill)",
                         "llama.cpp built by scripts/llama_cpp.sh with crisp.patch");
    }
  }

  // Installs `policy` (a preset, or "off") with `settings` ("key=value") on every hooked backend.
  void set(const std::string& policy, const std::vector<std::string>& settings) {
    std::vector<const char*> raw;
    for (const std::string& s : settings) raw.push_back(s.c_str());
    for (SetFn set : setters_) {
      char error[512] = "";
      if (!set(policy.c_str(), raw.data(), static_cast<int>(raw.size()), error, sizeof error)) {
        throw crisp::Error("policy " + policy, error, "a policy and settings crisp accepts");
      }
    }
  }

  void reset() {
    for (ResetFn reset : resets_) reset();
  }

  // Counters since the last reset(), summed over the backends that report them (unknown unless
  // every backend with statistics can also reset them).
  HookStats read() const {
    HookStats out;
    if (!stats_.empty() && resets_.size() == stats_.size()) {
      int64_t h = 0, d = 0, k = 0, c = 0;
      for (StatsFn stats : stats_) {
        int64_t h1 = 0, d1 = 0, k1 = 0, c1 = 0;
        stats(&h1, &d1, &k1, &c1);
        h += h1, d += d1, k += k1, c += c1;
      }
      out.handled = h, out.declined = d, out.kept_blocks = k, out.causal_blocks = c;
    }
    return out;
  }

 private:
  static bool is_gpu_reg(ggml_backend_reg_t reg) {
    for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); ++i) {
      const auto type = ggml_backend_dev_type(ggml_backend_reg_dev_get(reg, i));
      if (type == GGML_BACKEND_DEVICE_TYPE_GPU) return true;
    }
    return false;
  }
  std::vector<SetFn> setters_;
  std::vector<StatsFn> stats_;
  std::vector<ResetFn> resets_;
};

// ---------------------------------------------------------------- the model

struct Args {
  std::string model_path;
  int ngl = 0;
  std::string prompt_style = "auto";
  int64_t ubatch = 0;  // 0: llama.cpp's default
  int threads = 0;
  std::vector<std::string> tasks{"niah_single", "niah_multikey", "passkey", "niah_prose"};
  std::vector<int64_t> lengths{2048};
  std::vector<double> depths{0.1, 0.5, 0.9};
  int64_t seeds = 1;
  uint64_t seed = 0;
  std::string split, splits_path, prose_path;
  int64_t max_new_tokens = 0;
  std::vector<std::string> policies;
  std::vector<std::string> sweeps, sweep_files;
  std::string json_path;
  std::string dump_samples;  // JSONL: one line per sample (prompt ids, text, expected, scoring)
  bool dry_run = false;      // with dump_samples: generate and tokenise only
  int64_t stop_after = 0;
  bool quiet = false;
};

void quiet_log(ggml_log_level level, const char* text, void* /*user*/) {
  if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
}

class LlamaRunner {
 public:
  explicit LlamaRunner(const Args& args) : args_(args) {
    llama_model_params params = llama_model_default_params();
    params.n_gpu_layers = args.ngl;
    model_ = llama_model_load_from_file(args.model_path.c_str(), params);
    if (model_ == nullptr) throw crisp::Error("--model", "llama.cpp cannot load '" + args.model_path + "'", "a GGUF model file");
    vocab_ = llama_model_get_vocab(model_);
    const char* tmpl = llama_model_chat_template(model_, nullptr);
    if (tmpl != nullptr) template_ = tmpl;
    if (args.prompt_style == "auto") {
      chat_ = !template_.empty();
    } else {
      chat_ = args.prompt_style == "chat";
      if (chat_ && template_.empty()) {
        throw crisp::Error("--prompt-style", "is chat but '" + args.model_path + "' has no chat template", "completion");
      }
    }
  }
  ~LlamaRunner() {
    if (context_ != nullptr) llama_free(context_);
    if (model_ != nullptr) llama_model_free(model_);
  }
  LlamaRunner(const LlamaRunner&) = delete;
  LlamaRunner& operator=(const LlamaRunner&) = delete;

  bool chat() const { return chat_; }
  int64_t n_ctx_train() const { return llama_model_n_ctx_train(model_); }

  // The text the model reads: the chat template around the user message then the answer prefix,
  // or (completion style, for base models) the user message, a newline and the answer prefix.
  std::string prompt_text(const std::string& user, const std::string& answer_prefix) const {
    if (!chat_) return answer_prefix.empty() ? user : user + "\n" + answer_prefix;
    const llama_chat_message message{"user", user.c_str()};
    std::vector<char> buffer(user.size() * 2 + 1024);
    int32_t n = llama_chat_apply_template(template_.c_str(), &message, 1, true, buffer.data(), static_cast<int32_t>(buffer.size()));
    if (n > static_cast<int32_t>(buffer.size())) {
      buffer.resize(static_cast<size_t>(n) + 1);
      n = llama_chat_apply_template(template_.c_str(), &message, 1, true, buffer.data(), static_cast<int32_t>(buffer.size()));
    }
    if (n < 0) throw crisp::Error("--prompt-style", "llama.cpp cannot apply the model's chat template", "completion");
    return std::string(buffer.data(), static_cast<size_t>(n)) + answer_prefix;
  }

  // special: read control-token text (the chat template's) as control tokens; off for raw text.
  std::vector<llama_token> tokenize(const std::string& text, bool special = true) const {
    std::vector<llama_token> tokens(text.size() + 8);
    int32_t n = llama_tokenize(vocab_, text.data(), static_cast<int32_t>(text.size()), tokens.data(),
                               static_cast<int32_t>(tokens.size()), true, special);
    if (n < 0) {
      tokens.resize(static_cast<size_t>(-n));
      n = llama_tokenize(vocab_, text.data(), static_cast<int32_t>(text.size()), tokens.data(),
                         static_cast<int32_t>(tokens.size()), true, special);
    }
    tokens.resize(static_cast<size_t>(std::max(0, n)));
    // A template that writes the BOS text itself, on a vocabulary that adds one: keep one.
    const llama_token bos = llama_vocab_bos(vocab_);
    if (tokens.size() >= 2 && tokens[0] == bos && tokens[1] == bos) tokens.erase(tokens.begin());
    return tokens;
  }

  struct Answer {
    std::string output, stop;
    int64_t generated = 0;
    double ttft_s = 0;
    HookStats stats;
    std::vector<float> first_logits;  // the prompt's last-token logits (the first answer token's)
  };

  // Greedy answer to `prompt` under whatever policy is installed, stopped once the score is
  // decided (crisp's niah_score_decided), at an end-of-generation token or after max_new tokens.
  // flash: llama.cpp's flash-attention op (where crisp's hook sits) or its plain attention.
  Answer answer(const ce::NiahSample& sample, std::vector<llama_token> prompt, int64_t max_new, bool flash,
                SparsePrefillHook& hook) {
    ensure_context(static_cast<int64_t>(prompt.size()) + max_new, flash);
    llama_memory_clear(llama_get_memory(context_), true);
    Answer a;
    hook.reset();
    const auto start = std::chrono::steady_clock::now();
    if (llama_decode(context_, llama_batch_get_one(prompt.data(), static_cast<int32_t>(prompt.size()))) != 0) {
      throw crisp::Error("llama_decode", "failed on a prompt of " + std::to_string(prompt.size()) + " tokens",
                         "a context that holds the prompt");
    }
    llama_token next = llama_sampler_sample(sampler_.get(), context_, -1);
    const float* logits = llama_get_logits_ith(context_, -1);
    a.first_logits.assign(logits, logits + llama_vocab_n_tokens(vocab_));
    a.ttft_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    a.stats = hook.read();
    a.stop = "max_new_tokens";
    while (true) {
      if (llama_vocab_is_eog(vocab_, next)) {
        a.stop = "end";
        break;
      }
      a.output += piece(next);
      ++a.generated;
      if (ce::niah_score_decided(sample, a.output)) {
        a.stop = "decided";
        break;
      }
      if (a.generated >= max_new) break;
      if (llama_decode(context_, llama_batch_get_one(&next, 1)) != 0) {
        throw crisp::Error("llama_decode", "failed on a decode step", "a context with room for max_new_tokens");
      }
      next = llama_sampler_sample(sampler_.get(), context_, -1);
    }
    return a;
  }

  int64_t ubatch() const { return context_ != nullptr ? llama_n_ubatch(context_) : 0; }
  const llama_model* model() const { return model_; }

 private:
  std::string piece(llama_token token) const {
    char buffer[256];
    const int32_t n = llama_token_to_piece(vocab_, token, buffer, sizeof buffer, 0, false);
    return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : std::string();
  }

  // One context per size (length + max_new_tokens); flash attention on (crisp's hook sits in its
  // op), the whole prompt in one llama_decode, split by llama.cpp into ubatches.
  void ensure_context(int64_t n_ctx, bool flash) {
    if (context_ != nullptr && context_size_ >= n_ctx && context_flash_ == flash) return;
    if (context_ != nullptr) llama_free(context_);
    llama_context_params params = llama_context_default_params();
    params.n_ctx = static_cast<uint32_t>(n_ctx);
    params.n_batch = static_cast<uint32_t>(n_ctx);
    if (args_.ubatch > 0) params.n_ubatch = static_cast<uint32_t>(std::min(args_.ubatch, n_ctx));
    params.n_seq_max = 1;
    params.flash_attn = flash;
    params.no_perf = true;
    if (args_.threads > 0) params.n_threads = params.n_threads_batch = args_.threads;
    context_ = llama_init_from_model(model_, params);
    if (context_ == nullptr) throw crisp::Error("context", "llama.cpp cannot make a context of " + std::to_string(n_ctx) + " tokens", "less memory");
    context_size_ = n_ctx;
    context_flash_ = flash;
  }

  const Args& args_;
  llama_model* model_ = nullptr;
  const llama_vocab* vocab_ = nullptr;
  llama_context* context_ = nullptr;
  int64_t context_size_ = 0;
  bool context_flash_ = true;
  std::string template_;
  bool chat_ = false;
  std::unique_ptr<llama_sampler, void (*)(llama_sampler*)> sampler_{llama_sampler_init_greedy(), llama_sampler_free};
};

// ---------------------------------------------------------------- the frontier

// Points: dense first, then llama.cpp's own kernels when asked (llama_fa, llama_nofa; their
// config: the dense preset, the attention they compute), the policies and every sweep point.
std::vector<ce::FrontierPoint> make_points(const Args& args) {
  std::vector<ce::Sweep> sweeps;
  std::vector<ce::FrontierPoint> references;  // llama.cpp's own kernels
  for (const std::string& name : args.policies) {
    if (name == kLlamaFa || name == kLlamaNoFa) {
      ce::FrontierPoint reference;
      reference.name = reference.policy = name;
      reference.config = crisp::Config::from_preset(ce::kDensePoint);
      references.push_back(reference);
    } else {
      ce::Sweep sweep = ce::parse_sweep(name, "--policies");
      for (const auto& [key, values] : sweep.knobs) {
        if (values.size() != 1) throw crisp::Error("--policies", "'" + name + "' lists several values of " + key, "one value per knob (use --sweep)");
      }
      sweeps.push_back(std::move(sweep));
    }
  }
  for (const std::string& text : args.sweeps) sweeps.push_back(ce::parse_sweep(text, "--sweep"));
  for (const std::string& path : args.sweep_files) {
    for (ce::Sweep& s : ce::load_sweep_file(path, "--sweep-file")) sweeps.push_back(std::move(s));
  }
  sweeps.insert(sweeps.begin(), ce::Sweep{ce::kDensePoint, {}});
  std::vector<ce::FrontierPoint> points = ce::expand_sweeps(sweeps, "--sweep");
  points.insert(points.begin() + 1, references.begin(), references.end());
  return points;
}

// --splits, else eval/splits.json of the source tree this binary was built from.
ce::EvalSplits load_eval_splits(const std::string& given) {
  return ce::load_splits(given.empty() ? ce::default_splits_path(CRISP_SOURCE_DIR) : given, "--splits");
}

int64_t argmax(const std::vector<float>& v) { return std::max_element(v.begin(), v.end()) - v.begin(); }

json optional_json(const std::optional<int64_t>& v) { return v ? json(*v) : json(nullptr); }

void print_table(const json& doc) {
  std::printf("%7s  %-44s %6s %6s %8s %5s\n", "length", "point", "acc", "kept", "density", "n");
  std::vector<json> rows(doc.at("rows").begin(), doc.at("rows").end());
  std::stable_sort(rows.begin(), rows.end(),
                   [](const json& a, const json& b) { return a.at("length").get<int64_t>() < b.at("length").get<int64_t>(); });
  for (const json& r : rows) {
    char kept[16] = "-", density[16] = "null";
    if (!r.at("kept_of_dense").is_null()) std::snprintf(kept, sizeof kept, "%.3f", r.at("kept_of_dense").get<double>());
    if (!r.at("mean_density").is_null()) std::snprintf(density, sizeof density, "%.4f", r.at("mean_density").get<double>());
    std::printf("%7lld  %-44s %6.3f %6s %8s %5lld\n", static_cast<long long>(r.at("length").get<int64_t>()),
                r.at("point").get<std::string>().c_str(), r.at("accuracy").get<double>(), kept, density,
                static_cast<long long>(r.at("samples").get<int64_t>()));
  }
  std::printf("acc: accuracy; kept: of the samples dense (crisp) answers, the share the point answers too; density: "
              "kept / causal blocks of the ops crisp computed (null: the build does not report it).\n");
}

void run(const Args& given, bool niah_defaults) {
  Args args = given;
  if (niah_defaults && args.policies.empty() && args.sweeps.empty() && args.sweep_files.empty()) {
    args.policies = {"crisp", "flexprefill", "minference"};
  }
  if (!niah_defaults && args.sweeps.empty() && args.sweep_files.empty() && args.policies.empty()) {
    throw crisp::Error("--sweep", "none given", "at least one --sweep (e.g. crisp:alpha=0.5,1,2), --sweep-file or --policies");
  }
  const std::vector<ce::FrontierPoint> points = make_points(args);
  std::unique_ptr<ce::EvalSplits> splits;
  if (!args.split.empty()) {
    splits = std::make_unique<ce::EvalSplits>(load_eval_splits(args.splits_path));
    const ce::NiahSplit& chosen = splits->niah_split(args.split, "--split");
    args.seed = chosen.seed;
    args.seeds = chosen.seeds;
    args.depths = chosen.depths;
  }
  // The model first: it is always given, so its error must not hide behind a default that is absent.
  if (!std::filesystem::exists(args.model_path)) throw crisp::Error("--model", "'" + args.model_path + "' does not exist", "a GGUF file");
  // The options' combinations next, before any default file is resolved (the --prose default may be
  // absent on a machine without the data, and must not hide these errors either).
  if (args.dry_run && args.dump_samples.empty()) {
    throw crisp::Error("--dry-run", "is given without --dump-samples: it would write nothing", "--dump-samples FILE");
  }
  if (!args.dry_run && args.json_path.empty()) throw crisp::Error("--json", "missing", "--json FILE (or --dry-run --dump-samples FILE)");
  std::vector<ce::NiahTask> tasks;
  for (const std::string& name : args.tasks) tasks.push_back(ce::parse_niah_task(name, "--tasks"));
  for (double depth : args.depths) {
    if (!(depth >= 0.0 && depth <= 1.0)) throw crisp::Error("--depths", "has " + std::to_string(depth), "fractions in [0, 1]");
  }
  const bool with_prose = std::find(tasks.begin(), tasks.end(), ce::NiahTask::prose) != tasks.end();
  std::vector<std::string> prose;
  std::string prose_path;
  if (with_prose) {
    prose_path = crisp_cli::data_file_or_default("--prose", args.prose_path, crisp_cli::kQaPromptsFile);
    const auto documents = ce::load_qa_documents(prose_path, "--prose");
    prose = splits ? ce::split_prose_paragraphs(documents, *splits, args.split, "--split") : ce::all_prose_paragraphs(documents);
  }

  std::ofstream dump;
  if (!args.dump_samples.empty()) {
    dump.open(args.dump_samples);
    if (!dump) throw crisp::Error("--dump-samples", "cannot write '" + args.dump_samples + "'", "a writable path");
  }

  llama_log_set(quiet_log, nullptr);
  llama_backend_init();
  std::unique_ptr<SparsePrefillHook> hook;  // a dry run computes no attention
  if (!args.dry_run) hook = std::make_unique<SparsePrefillHook>(args.ngl > 0);
  LlamaRunner runner(args);

  json task_names = json::array();
  for (ce::NiahTask t : tasks) task_names.push_back(ce::to_string(t));
  const json settings = {{"mode", "niah"},
                         {"engine", "llama.cpp"},
                         {"model", std::filesystem::path(args.model_path).filename().string()},
                         {"tasks", task_names},
                         {"lengths", args.lengths},
                         {"depths", args.depths},
                         {"seeds", args.seeds},
                         {"base_seed", args.seed},
                         {"split", args.split.empty() ? json(nullptr) : json(args.split)},
                         {"prose", with_prose ? json(std::filesystem::path(prose_path).filename().string()) : json(nullptr)},
                         {"max_new_tokens", args.max_new_tokens},
                         {"prompt_style", runner.chat() ? "chat" : "completion"},
                         {"ubatch", args.ubatch > 0 ? json(args.ubatch) : json("llama.cpp default")},
                         {"gpu_layers", args.ngl},
                         {"decoding", "greedy"}};
  std::optional<ce::FrontierFile> file;
  if (!args.dry_run) {
    file.emplace(ce::FrontierFile::open(args.json_path, settings, "--json"));
    for (const ce::FrontierPoint& p : points) file->add_point(p);
    file->begin_run();
  }

  const ce::PromptTokenCounter count = [&runner](const std::string& user, const std::string& prefix) {
    return static_cast<int64_t>(runner.tokenize(runner.prompt_text(user, prefix)).size());
  };
  const int64_t total = static_cast<int64_t>(args.lengths.size() * tasks.size() * args.depths.size()) * args.seeds;
  int64_t index = 0, computed = 0;
  const auto start = std::chrono::steady_clock::now();
  bool complete = true;
  for (int64_t length : args.lengths) {
    if (length > runner.n_ctx_train() && !args.quiet) {
      std::fprintf(stderr, "%s: warning: length %lld is past the model's trained context (%lld)\n", kTool,
                   static_cast<long long>(length), static_cast<long long>(runner.n_ctx_train()));
    }
    for (ce::NiahTask task : tasks) {
      for (double depth : args.depths) {
        for (int64_t replicate = 0; replicate < args.seeds && complete; ++replicate) {
          ++index;
          const uint64_t seed = args.seed + static_cast<uint64_t>(replicate);
          const std::string id = ce::niah_sample_id(task, length, depth, seed);
          std::vector<const ce::FrontierPoint*> pending;
          for (const ce::FrontierPoint& p : points) {
            if (file && !file->has(p.name, id)) pending.push_back(&p);
          }
          if (pending.empty() && !dump.is_open()) continue;
          if (!pending.empty() && args.stop_after > 0 && computed >= args.stop_after) {
            complete = false;
            break;
          }
          ce::NiahSpec spec;
          spec.task = task;
          spec.length = length;
          spec.depth = depth;
          spec.seed = seed;
          const int64_t max_new = args.max_new_tokens > 0 ? args.max_new_tokens : ce::default_max_new_tokens(task);
          spec.reserved_tokens = max_new;
          const ce::NiahSample sample = ce::make_niah_sample(spec, count, prose);
          const std::string chat_prompt = runner.prompt_text(sample.user_message, sample.answer_prefix);
          const std::vector<llama_token> prompt = runner.tokenize(chat_prompt);
          if (dump.is_open()) {  // all another runner needs to answer the sample and score it
            const json line = {{"id", id}, {"task", ce::to_string(task)}, {"length", length}, {"depth", depth},
                               {"seed", seed}, {"needle_depth", sample.needle_depth}, {"expected", sample.expected},
                               {"scoring", ce::to_string(sample.scoring)}, {"max_new_tokens", max_new},
                               {"answer_prefix", sample.answer_prefix}, {"prompt_ids", prompt},
                               {"prompt_text", sample.user_message}, {"chat_prompt", chat_prompt},
                               {"beyond_training", length > runner.n_ctx_train()}};
            dump << line.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
            if (!dump) throw crisp::Error("--dump-samples", "cannot write '" + args.dump_samples + "'", "a writable path");
          }
          if (pending.empty()) continue;
          std::vector<float> dense_logits;  // dense's first-token logits, when dense ran in this run
          for (const ce::FrontierPoint* p : pending) {
            std::vector<std::string> knobs;
            for (const auto& [key, value] : p->knobs) knobs.push_back(key + "=" + value);
            const bool reference = p->name == kLlamaFa || p->name == kLlamaNoFa;
            hook->set(reference ? "off" : p->policy, knobs);
            const LlamaRunner::Answer a = runner.answer(sample, prompt, max_new, p->name != kLlamaNoFa, *hook);
            json density = nullptr;
            if (reference) {
              density = 1.0;  // llama.cpp's kernels compute every causal block
            } else if (a.stats.causal_blocks && *a.stats.causal_blocks > 0) {
              density = static_cast<double>(*a.stats.kept_blocks) / static_cast<double>(*a.stats.causal_blocks);
            }
            if (!reference && a.stats.handled && *a.stats.handled == 0) {
              std::fprintf(stderr, "%s: warning: %s on %s: crisp computed no attention op (all fell back)\n", kTool,
                           p->name.c_str(), id.c_str());
            }
            const bool correct = ce::score_niah_output(sample, a.output);
            // How far the point's first-token logits are from dense's (through crisp): the
            // tolerance of llama_fa == dense, and how much a sparse point moves the answer.
            json logit_diff = nullptr;
            if (p->name == ce::kDensePoint) {
              dense_logits = a.first_logits;
            } else if (dense_logits.size() == a.first_logits.size()) {
              float diff = 0;
              for (size_t v = 0; v < dense_logits.size(); ++v) diff = std::max(diff, std::abs(dense_logits[v] - a.first_logits[v]));
              logit_diff = diff;
            }
            file->record(p->name, id,
                        {{"task", ce::to_string(task)}, {"length", length}, {"depth", depth}, {"seed", seed},
                         {"prompt_tokens", prompt.size()}, {"correct", correct}, {"density", density},
                         {"crisp_ops", optional_json(a.stats.handled)}, {"fallback_ops", optional_json(a.stats.declined)},
                         {"kept_blocks", optional_json(a.stats.kept_blocks)},
                         {"causal_blocks", optional_json(a.stats.causal_blocks)}, {"ttft_s", a.ttft_s},
                         {"output", a.output}, {"stop", a.stop}, {"generated_tokens", a.generated},
                         {"first_token", a.first_logits.empty() ? json(nullptr) : json(argmax(a.first_logits))},
                         {"first_logits_max_abs_diff_vs_dense", logit_diff},
                         {"beyond_training", length > runner.n_ctx_train()}});
            if (!args.quiet) {
              std::fprintf(stderr, "%s: [%lld/%lld] %s %-32s %s density %s ttft %.2f s (%.0f s)\n", kTool,
                           static_cast<long long>(index), static_cast<long long>(total), id.c_str(), p->name.c_str(),
                           correct ? "ok  " : "MISS", density.dump().c_str(), a.ttft_s,
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
            }
          }
          ++computed;
          file->checkpoint();
        }
      }
    }
  }
  if (!file) {
    std::printf("dry run: %lld samples written to %s, no prompt run\n", static_cast<long long>(index), args.dump_samples.c_str());
    return;
  }
  file->finish(complete);
  print_table(file->document());
  std::printf("%s: %lld samples computed in this run, %lld (point, sample) pairs found done before it; %s\n",
              args.json_path.c_str(), static_cast<long long>(computed),
              static_cast<long long>(file->document().at("runs").back().at("found").get<int64_t>()),
              complete ? "complete" : "INCOMPLETE (re-run to resume)");
}

void add_options(CLI::App* sub, Args* a) {
  sub->add_option("--model", a->model_path, "GGUF model file (any model llama.cpp loads)")->required();
  sub->add_option("--json", a->json_path, "The frontier JSON: written after each sample; resumed when it exists (required unless --dry-run)");
  sub->add_option("--dump-samples", a->dump_samples,
                  "Also write every sample as one JSON line here (id, task, length, depth, seed, prompt_ids, prompt_text, "
                  "answer_prefix, chat_prompt, expected, scoring, max_new_tokens; the input of eval/hf_niah.py)");
  sub->add_flag("--dry-run", a->dry_run, "With --dump-samples: generate and tokenise the samples only (no prompt runs)");
  sub->add_option("--ngl", a->ngl, "Layers offloaded to the GPU (llama.cpp's -ngl; a CUDA build)")->capture_default_str()->check(CLI::Range(0, 1000));
  sub->add_option("--prompt-style", a->prompt_style,
                  "chat (the GGUF's chat template), completion (user message, newline, answer prefix: base models) "
                  "or auto (chat when the GGUF has a template)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "chat", "completion"}));
  sub->add_option("--ubatch", a->ubatch, "Prompt tokens per llama.cpp ubatch (default llama.cpp's; smaller ubatches are chunked prefill)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 22));
  sub->add_option("--threads", a->threads, "CPU threads (default llama.cpp's)")->check(CLI::Range(1, 1024));
  sub->add_option("--tasks", a->tasks, "Tasks: niah_single, niah_multikey, niah_all_needles, passkey, kv_retrieval, niah_prose")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--lengths", a->lengths, "Token budgets (the model's tokens): prompt + --max-new-tokens <= length")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(int64_t{64}, int64_t{1} << 22));
  CLI::Option* depths = sub->add_option("--depths", a->depths, "Depths of the asked needle in [0, 1]")->delimiter(',')->capture_default_str();
  CLI::Option* seeds = sub->add_option("--seeds", a->seeds, "Samples per (task, length, depth)")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1000}));
  CLI::Option* seed = sub->add_option("--seed", a->seed, "First seed")->capture_default_str();
  sub->add_option("--split", a->split, "Samples of eval/splits.json: tuning or test (sets --seed, --seeds, --depths, the prose)")
      ->check(CLI::IsMember({"tuning", "test"}))
      ->excludes(depths)
      ->excludes(seeds)
      ->excludes(seed);
  sub->add_option("--splits", a->splits_path, "The splits file of --split (default: eval/splits.json of the source tree)");
  crisp_cli::add_prose_option(sub, &a->prose_path, "long_qa_prompts.json, the real-prose haystack of niah_prose");
  sub->add_option("--max-new-tokens", a->max_new_tokens, "Most greedy tokens per answer (default per task)")->check(CLI::Range(int64_t{1}, int64_t{4096}));
  sub->add_option("--policies", a->policies,
                  "Points: presets (crisp, flexprefill, minference, dense) or PRESET:KNOB=V; llama_fa (llama.cpp's own "
                  "flash attention) and llama_nofa (its attention without flash attention); dense always runs first")
      ->delimiter(',');
  sub->add_option("--sweep", a->sweeps, "A sweep as `crisp eval pareto --sweep`: POLICY:KNOB=V1,V2[;KNOB=...]")->take_all();
  sub->add_option("--sweep-file", a->sweep_files, "JSON list of sweeps (as `crisp eval pareto --sweep-file`)");
  sub->add_option("--stop-after", a->stop_after, "Stop after this many samples computed in this run; re-run to resume")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  sub->add_flag("--quiet", a->quiet, "No progress lines on stderr");
}

// ---------------------------------------------------------------- capture

struct CaptureArgs {
  std::string model_path;
  std::string prompt_file;
  int64_t qa_index = -1;
  std::string qa_file;  // empty: the default (default_paths.h)
  std::string split, splits_path;
  int64_t max_tokens = 0;  // 0: the whole prompt
  bool chat = false;
  std::string layers = "all";
  std::string out_dir;
  int threads = 0;
  int ngl = 0;
  std::string cache_type_k = "f16", cache_type_v = "f16";
  bool with_output = false;
  bool quiet = false;
};

// One prompt to capture into one directory.
struct CaptureItem {
  std::string text;
  json source;
  int64_t max_tokens = 0;
  std::string out_dir;
};

// The KV cache types a capture may run with (the captured K/V are the cache's values).
const std::map<std::string, ggml_type>& cache_types() {
  static const std::map<std::string, ggml_type> types{
      {"f32", GGML_TYPE_F32}, {"f16", GGML_TYPE_F16}, {"bf16", GGML_TYPE_BF16}, {"q8_0", GGML_TYPE_Q8_0}};
  return types;
}

// "all" or a comma-separated list of layer indices in [0, n_layer): wanted[l].
std::vector<char> parse_layers(const std::string& text, int64_t n_layer) {
  std::vector<char> wanted(static_cast<size_t>(n_layer), text == "all" ? 1 : 0);
  if (text == "all") return wanted;
  const std::string expected = "'all' or comma-separated layer indices in [0, " + std::to_string(n_layer) + ")";
  std::stringstream items(text);
  std::string item;
  bool any = false;
  while (std::getline(items, item, ',')) {
    std::size_t used = 0;
    long long value = -1;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || value < 0 || value >= n_layer) {
      throw crisp::Error("--layers", "'" + item + "' is not a layer of this model", expected);
    }
    wanted[static_cast<size_t>(value)] = 1;
    any = true;
  }
  if (!any) throw crisp::Error("--layers", "is empty", expected);
  return wanted;
}

std::string qa_prompt(const json& prompts, int64_t index, const std::string& option, const std::string& path) {
  if (!prompts.is_array() || index < 0 || index >= static_cast<int64_t>(prompts.size()) || !prompts[index].is_object() ||
      !prompts[index].contains("prompt") || !prompts[index]["prompt"].is_string()) {
    throw crisp::Error(option, std::to_string(index) + " is not a prompt of " + path,
                       "an index in [0, " + std::to_string(prompts.is_array() ? prompts.size() : 0) + ") of a list of {prompt, answer}");
  }
  return prompts[index]["prompt"].get<std::string>();
}

std::vector<CaptureItem> capture_items(const CaptureArgs& args) {
  namespace fs = std::filesystem;
  std::vector<CaptureItem> items;
  if (!args.prompt_file.empty()) {
    items.push_back({crisp_cli::read_text_file("--prompt-file", args.prompt_file), {{"kind", "prompt_file"}, {"path", args.prompt_file}},
                     args.max_tokens, args.out_dir});
    if (items.back().text.empty()) throw crisp::Error("--prompt-file", "is empty", "some text");
    return items;
  }
  const std::string qa_path = crisp_cli::data_file_or_default("--qa-file", args.qa_file, crisp_cli::kQaPromptsFile);
  json prompts;
  try {
    prompts = json::parse(crisp_cli::read_text_file("--qa-file", qa_path));
  } catch (const json::exception& e) {
    throw crisp::Error("--qa-file", std::string("is not valid JSON: ") + e.what(), "a JSON list of {prompt, answer}");
  }
  auto add = [&](int64_t index, int64_t max_tokens, const std::string& out, const std::string& option) {
    items.push_back({qa_prompt(prompts, index, option, qa_path), {{"kind", "qa_prompt"}, {"path", qa_path}, {"index", index}},
                     max_tokens, out});
  };
  if (!args.split.empty()) {
    const ce::EvalSplits splits = load_eval_splits(args.splits_path);
    for (const ce::CaptureItem& c : splits.capture_split(args.split, "--split")) {
      const std::string name = "qa" + std::to_string(c.qa_index) + "_" + std::to_string(c.max_tokens);
      add(c.qa_index, c.max_tokens, (fs::path(args.out_dir) / name).string(), "--split " + args.split);
    }
  } else {
    add(args.qa_index, args.max_tokens, args.out_dir, "--qa-index");
  }
  return items;
}

// crisp's sparse prefill off on every backend that carries the hook: the capture is llama.cpp's own
// dense attention (the model's maps). A build without the hook computes that already.
void sparse_prefill_off() {
  for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
    ggml_backend_reg_t reg = ggml_backend_reg_get(i);
    auto set = reinterpret_cast<SetFn>(ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_sparse_prefill"));
    char error[512] = "";
    if (set != nullptr && !set("off", nullptr, 0, error, sizeof error)) {
      throw crisp::Error("llama.cpp", std::string("backend ") + ggml_backend_reg_name(reg) + " refused to turn sparse prefill off: " + error);
    }
  }
}

std::string model_meta(const llama_model* model, const char* key) {
  char value[256] = "";
  return llama_model_meta_val_str(model, key, value, sizeof value) >= 0 ? value : "";
}

void capture_one(const CaptureArgs& args, const LlamaRunner& runner, const CaptureItem& item) {
  namespace fs = std::filesystem;
  const llama_model* model = runner.model();
  std::vector<llama_token> tokens = runner.tokenize(runner.prompt_text(item.text, ""), args.chat);
  const int64_t prompt_tokens = static_cast<int64_t>(tokens.size());
  // A slice is the prompt's first max_tokens tokens: real prose, the question at the end cut off.
  if (item.max_tokens > 0 && prompt_tokens > item.max_tokens) tokens.resize(static_cast<size_t>(item.max_tokens));
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) throw crisp::Error("--prompt-file", "encodes to no tokens", "some text");
  const int64_t n_layer = llama_model_n_layer(model), n_ctx_train = llama_model_n_ctx_train(model);
  if (n > n_ctx_train) {
    std::fprintf(stderr, "%s: warning: %lld tokens, past the model's trained context of %lld: the maps are not those of the "
                 "trained model (see --max-tokens)\n", kTool, static_cast<long long>(n), static_cast<long long>(n_ctx_train));
  }
  const std::vector<char> wanted = parse_layers(args.layers, n_layer);
  std::error_code ec;
  fs::create_directories(item.out_dir, ec);
  if (ec || !fs::is_directory(item.out_dir)) throw crisp::Error("--out", "cannot create directory '" + item.out_dir + "'", "a writable directory");

  crisp_llama::AttentionCapture capture(item.out_dir, wanted, n, args.with_output);
  llama_context_params params = llama_context_default_params();
  params.n_ctx = static_cast<uint32_t>(n);
  params.n_batch = params.n_ubatch = static_cast<uint32_t>(n);  // one ubatch: each layer's op holds every query
  params.n_seq_max = 1;
  params.flash_attn = true;  // the op the callback observes
  params.swa_full = true;    // a sliding-window layer's cache holds the whole prompt too
  params.no_perf = true;
  params.type_k = cache_types().at(args.cache_type_k);
  params.type_v = cache_types().at(args.cache_type_v);
  params.cb_eval = crisp_llama::AttentionCapture::callback;
  params.cb_eval_user_data = &capture;
  if (args.threads > 0) params.n_threads = params.n_threads_batch = args.threads;
  std::unique_ptr<llama_context, void (*)(llama_context*)> context(llama_init_from_model(const_cast<llama_model*>(model), params), llama_free);
  if (context == nullptr) throw crisp::Error("context", "llama.cpp cannot make a context of " + std::to_string(n) + " tokens", "less memory");
  if (!args.quiet) std::fprintf(stderr, "%s: prefill of %lld tokens into %s\n", kTool, static_cast<long long>(n), item.out_dir.c_str());
  const int32_t status = llama_decode(context.get(), llama_batch_get_one(tokens.data(), static_cast<int32_t>(n)));
  capture.finish(n_layer);  // the callback's refusal first: it is why a decode stopped
  if (status != 0) throw crisp::Error("llama_decode", "returned " + std::to_string(status) + " on the prompt of " + std::to_string(n) + " tokens", "0");

  json files = json::array(), layers = json::array(), window_layers = json::array();
  std::optional<int64_t> window;
  int64_t head_dim = 0;
  for (const auto& [l, c] : capture.layers()) {
    if (c.window) {
      window_layers.push_back(l);
      window = c.window;
    }
    if (!c.written) continue;
    head_dim = c.head_dim;
    layers.push_back(l);
    json f = {{"layer", l}, {"q", crisp_llama::AttentionCapture::layer_file(l, "q")}, {"k", crisp_llama::AttentionCapture::layer_file(l, "k")},
              {"v", crisp_llama::AttentionCapture::layer_file(l, "v")}, {"kq_scale", c.kq_scale},
              {"window", c.window ? json(*c.window) : json(nullptr)}};
    if (args.with_output) f["o"] = crisp_llama::AttentionCapture::layer_file(l, "o");
    files.push_back(f);
  }
  const json meta = {
      {"model", args.model_path},
      {"engine", "llama.cpp"},
      {"architecture", model_meta(model, "general.architecture")},
      {"source", item.source},
      {"chat_template", args.chat},
      {"prompt_tokens", prompt_tokens},
      {"tokens", n},
      {"sliced", n < prompt_tokens},
      {"n_layer", n_layer},
      {"n_head", llama_model_n_head(model)},
      {"n_head_kv", llama_model_n_head_kv(model)},
      {"head_dim", head_dim},
      {"n_ctx_train", n_ctx_train},
      {"beyond_training", n > n_ctx_train},
      {"attention", "dense"},
      {"gpu_layers", args.ngl},
      {"cache_type_k", args.cache_type_k},
      {"cache_type_v", args.cache_type_v},
      // Layers whose mask lets a query see only the last `size` keys (Gemma 3's local layers); the
      // captured q/k/v are those of the model, the mask is not in the .npy files.
      {"sliding_window", window ? json{{"size", *window}, {"layers", window_layers}} : json(nullptr)},
      {"layers", layers},
      {"files", files},
      {"token_ids", tokens},
  };
  // Paths given on the command line need not be UTF-8: U+FFFD in the JSON rather than an abort.
  crisp_cli::write_text_file("--out", (fs::path(item.out_dir) / "meta.json").string(),
                             meta.dump(1, ' ', false, json::error_handler_t::replace) + "\n");
  std::printf("capture: %lld tokens (of %lld), %zu layers of Q [%lld, %lld, %lld] and K/V [%lld, %lld, %lld] -> %s\n",
              static_cast<long long>(n), static_cast<long long>(prompt_tokens), layers.size(),
              static_cast<long long>(llama_model_n_head(model)), static_cast<long long>(n), static_cast<long long>(head_dim),
              static_cast<long long>(llama_model_n_head_kv(model)), static_cast<long long>(n), static_cast<long long>(head_dim),
              item.out_dir.c_str());
}

void run_capture(const CaptureArgs& args) {
  if (!std::filesystem::exists(args.model_path)) throw crisp::Error("--model", "'" + args.model_path + "' does not exist", "a GGUF file");
  const std::vector<CaptureItem> items = capture_items(args);
  llama_log_set(quiet_log, nullptr);
  llama_backend_init();
  sparse_prefill_off();
  Args model_args;
  model_args.model_path = args.model_path;
  model_args.ngl = args.ngl;
  model_args.prompt_style = args.chat ? "chat" : "completion";
  const LlamaRunner runner(model_args);
  for (const CaptureItem& item : items) {
    if (!args.split.empty() && std::filesystem::exists(std::filesystem::path(item.out_dir) / "meta.json")) {
      std::printf("capture: %s exists, kept\n", item.out_dir.c_str());
      continue;
    }
    capture_one(args, runner, item);
  }
}

void add_capture_options(CLI::App* sub, CaptureArgs* a) {
  sub->add_option("--model", a->model_path, "GGUF model file (any model llama.cpp loads)")->required();
  CLI::Option* prompt_file = sub->add_option("--prompt-file", a->prompt_file, "Read the prompt from this file");
  CLI::Option* qa_index = sub->add_option("--qa-index", a->qa_index, "Use prompt I of --qa-file (the project's real long-context QA prompts)")
                              ->check(CLI::NonNegativeNumber);
  CLI::Option* split = sub->add_option("--split", a->split,
                                       "Capture every prompt of this captures split of eval/splits.json (tuning or test), "
                                       "each into OUT/qa<I>_<N> (one that exists is kept)")
                           ->check(CLI::IsMember({"tuning", "test"}));
  prompt_file->excludes(qa_index)->excludes(split);
  qa_index->excludes(split);
  sub->add_option("--qa-file", a->qa_file, "The QA prompts (JSON list of {prompt, answer})")
      ->default_str(std::string(crisp_cli::kDataDirRule) + " (<file>: " + crisp_cli::kQaPromptsFile + ")");
  sub->add_option("--splits", a->splits_path, "The splits file of --split (default: eval/splits.json of the source tree)");
  sub->add_option("--max-tokens", a->max_tokens, "Keep only the prompt's first N tokens (a slice of real prose; 0 = the whole prompt)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber)
      ->excludes(split);
  sub->add_flag("--chat", a->chat, "Wrap the prompt as a user message in the model's chat template");
  sub->add_option("--layers", a->layers, "Layers to dump: 'all' or a list such as 0,5,29")->capture_default_str();
  sub->add_option("--out", a->out_dir, "Output directory (created if missing)")->required();
  sub->add_option("--threads", a->threads, "CPU threads (default llama.cpp's)")->check(CLI::Range(1, 1024));
  sub->add_option("--ngl", a->ngl, "Layers offloaded to the GPU (llama.cpp's -ngl; a CUDA build)")->capture_default_str()->check(CLI::Range(0, 1000));
  std::vector<std::string> type_names;
  for (const auto& [name, type] : cache_types()) type_names.push_back(name);
  sub->add_option("--cache-type-k", a->cache_type_k, "KV cache type of K (the captured K are its values)")->capture_default_str()->check(CLI::IsMember(type_names));
  sub->add_option("--cache-type-v", a->cache_type_v, "KV cache type of V")->capture_default_str()->check(CLI::IsMember(type_names));
  sub->add_flag("--with-output", a->with_output, "Also write layer_LL_o.npy [n_head, n, d]: llama.cpp's attention output of the layer");
  sub->add_flag("--quiet", a->quiet, "No progress lines on stderr");
  sub->callback([a, prompt_file, qa_index, split] {
    if (prompt_file->count() == 0 && qa_index->count() == 0 && split->count() == 0) {
      throw crisp::Error("--prompt-file", "missing", "--prompt-file FILE, --qa-index I or --split tuning|test");
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"crisp's NIAH evaluation and frontier harness on llama.cpp (docs/evaluation.md, On llama.cpp)", kTool};
  app.require_subcommand(1);
  Args niah_args, pareto_args;
  CLI::App* niah = app.add_subcommand("niah", "NIAH accuracy and density of policies (default: dense, crisp, flexprefill, minference)");
  add_options(niah, &niah_args);
  CLI::App* pareto = app.add_subcommand("pareto", "The frontier of knob sweeps (--sweep) against density, as `crisp eval pareto`");
  add_options(pareto, &pareto_args);
  CaptureArgs capture_args;
  CLI::App* capture = app.add_subcommand(
      "capture", "Run a prompt through the model (llama.cpp's dense prefill) and dump the post-RoPE Q/K/V of chosen layers as "
                 ".npy [heads, n, d] float32, with meta.json (input of `crisp eval fidelity` and `crisp eval pareto --captures`)");
  add_capture_options(capture, &capture_args);
  // The numbers and paths of the command line, read as `crisp`'s are (tools/validators.h): decimal
  // only ('010' is ten, not octal eight), nothing beyond 64 bits, no empty path.
  crisp_cli::require_decimal_numbers(app);
  crisp_cli::require_nonempty_paths(app);
  try {
    app.parse(argc, argv);
    if (niah->parsed()) run(niah_args, true);
    if (pareto->parsed()) run(pareto_args, false);
    if (capture->parsed()) run_capture(capture_args);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "%s: error: %s\n", kTool, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", kTool, e.what());
    return 2;
  }
  return 0;
}
