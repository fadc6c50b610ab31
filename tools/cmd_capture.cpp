// tools/cmd_capture.cpp — `crisp capture`: the post-RoPE Q/K/V of a real model's prefill, as .npy.
//
// Runs the prompt through the model with dense attention (the model's own maps) and writes, for
// every chosen layer, layer_LL_q.npy [n_head, n, d], layer_LL_k.npy and layer_LL_v.npy
// [n_head_kv, n, d] (float32), plus meta.json (model, prompt source, token ids, layers, shapes).
// `crisp eval fidelity` reads such directories.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "crisp/npy.h"
#include "io_util.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "default_paths.h"
#include "model/tokenizer.h"
#include "model_loading.h"
#include "progress.h"
#include "validators.h"

namespace {

namespace fs = std::filesystem;

struct CaptureArgs {
  std::string model_path;
  std::string prompt_file;
  int64_t qa_index = -1;
  std::string qa_file;  // empty: the default (default_paths.h)
  int64_t max_tokens = 0;  // 0: the whole prompt
  bool chat = false;
  std::string layers = "all";
  std::string out_dir;
  int threads = 0;
  std::string backend = "cpu";
  std::string cuda_attention = "f16";
  bool quiet = false;
};

// "all" or a comma-separated list of layer indices in [0, n_layer).
std::vector<int64_t> parse_layers(const std::string& text, int64_t n_layer) {
  std::vector<int64_t> layers;
  if (text == "all") {
    for (int64_t l = 0; l < n_layer; ++l) layers.push_back(l);
    return layers;
  }
  const std::string expected = "'all' or comma-separated layer indices in [0, " + std::to_string(n_layer) + ")";
  std::stringstream items(text);
  std::string item;
  std::vector<char> seen(static_cast<size_t>(n_layer), 0);
  while (std::getline(items, item, ',')) {
    std::size_t used = 0;
    long long value = -1;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || value < 0 || value >= n_layer)
      throw crisp::Error("--layers", "'" + item + "' is not a layer of this model", expected);
    if (!seen[value]) layers.push_back(value);
    seen[value] = 1;
  }
  if (layers.empty()) throw crisp::Error("--layers", "is empty", expected);
  return layers;
}

std::string layer_file(int64_t layer, const char* which) {
  char name[64];
  std::snprintf(name, sizeof(name), "layer_%02lld_%s.npy", static_cast<long long>(layer), which);
  return name;
}

void run_capture(const CaptureArgs& args) {
  namespace cm = crisp::model;
  const cm::ModelBackend backend = cm::parse_model_backend(args.backend, "--backend");
  cm::require_model_backend(backend, "--backend");
  const cm::CudaPrefillAttention cuda_attention = cm::parse_cuda_prefill_attention(args.cuda_attention);
  std::string text;
  nlohmann::json source;
  if (!args.prompt_file.empty()) {
    text = crisp_cli::read_text_file("--prompt-file", args.prompt_file);
    source = {{"kind", "prompt_file"}, {"path", args.prompt_file}};
  } else {
    nlohmann::json prompts;
    try {
      prompts = nlohmann::json::parse(crisp_cli::read_text_file("--qa-file", args.qa_file));
    } catch (const nlohmann::json::exception& e) {
      throw crisp::Error("--qa-file", std::string("is not valid JSON: ") + e.what(), "a JSON list of {prompt, answer}");
    }
    if (!prompts.is_array() || args.qa_index >= static_cast<int64_t>(prompts.size()) ||
        !prompts[args.qa_index].contains("prompt") || !prompts[args.qa_index]["prompt"].is_string())
      throw crisp::Error("--qa-index", std::to_string(args.qa_index) + " is not a prompt of " + args.qa_file,
                         "an index in [0, " + std::to_string(prompts.is_array() ? prompts.size() : 0) + ")");
    text = prompts[args.qa_index]["prompt"].get<std::string>();
    source = {{"kind", "qa_prompt"}, {"path", args.qa_file}, {"index", args.qa_index}};
  }
  if (text.empty()) throw crisp::Error("--prompt-file", "is empty", "some text");

  crisp_cli::Progress progress(!args.quiet);
  const crisp_cli::LoadedModel loaded = crisp_cli::load_model(args.model_path, progress);
  const cm::Tokenizer& tokenizer = loaded.tokenizer;
  const cm::LlamaModel& model = loaded.model;
  const cm::LlamaHparams& hp = model.hparams();

  std::string prompt_text = text;
  if (args.chat) prompt_text = tokenizer.apply_chat_template({{"user", text}}, true);
  std::vector<int32_t> tokens = tokenizer.encode(prompt_text);
  const int64_t prompt_tokens = static_cast<int64_t>(tokens.size());
  // A slice is the prompt's first max_tokens tokens: real prose, the question at the end cut off.
  if (args.max_tokens > 0 && prompt_tokens > args.max_tokens) tokens.resize(static_cast<size_t>(args.max_tokens));
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) throw crisp::Error("--prompt-file", "encodes to no tokens", "some text");
  if (n > hp.n_ctx_train) {
    crisp_cli::finish_progress_line();
    std::fprintf(stderr,
                 "crisp: warning: %lld tokens, past the model's trained context of %lld (no RoPE scaling): "
                 "the maps are not those of the trained model (see --max-tokens)\n",
                 static_cast<long long>(n), static_cast<long long>(hp.n_ctx_train));
  }
  const std::vector<int64_t> layers = parse_layers(args.layers, hp.n_layer);
  std::vector<char> wanted(static_cast<size_t>(hp.n_layer), 0);
  for (int64_t l : layers) wanted[l] = 1;

  std::error_code ec;
  fs::create_directories(args.out_dir, ec);
  if (ec || !fs::is_directory(args.out_dir))
    throw crisp::Error("--out", "cannot create directory '" + args.out_dir + "'", "a writable directory");

  // Each layer is written as soon as the runner produces it, so memory stays at one layer.
  std::vector<float> buffer;
  auto write_view = [&](const crisp::TensorView& v, const std::string& path) {
    buffer.resize(static_cast<size_t>(v.numel()));
    const float* src = static_cast<const float*>(v.data);
    for (int64_t h = 0; h < v.heads(); ++h)
      for (int64_t t = 0; t < v.tokens(); ++t)
        for (int64_t x = 0; x < v.dim(); ++x) buffer[(h * v.tokens() + t) * v.dim() + x] = src[v.offset(h, t, x)];
    crisp::write_npy(path, buffer.data(), {v.heads(), v.tokens(), v.dim()});
  };
  const cm::QkvObserver observer = [&](int64_t layer, const crisp::TensorView& q, const crisp::TensorView& k,
                                       const crisp::TensorView& v) {
    if (!wanted[layer]) return;
    if (q.dtype != crisp::DType::f32 || k.dtype != crisp::DType::f32 || v.dtype != crisp::DType::f32)
      throw crisp_cli::CommandFailure("capture: the runner's Q/K/V are not float32");
    write_view(q, (fs::path(args.out_dir) / layer_file(layer, "q")).string());
    write_view(k, (fs::path(args.out_dir) / layer_file(layer, "k")).string());
    write_view(v, (fs::path(args.out_dir) / layer_file(layer, "v")).string());
  };

  cm::RunOptions options;  // dense attention: the model's own maps
  options.threads = args.threads;
  options.backend = backend;
  options.cuda_attention = cuda_attention;
  progress.begin("prefill of " + std::to_string(n) + " tokens, capturing " + std::to_string(layers.size()) +
                 " layers");
  cm::LlamaContext context(model, n, options);
  const cm::PrefillResult result = context.prefill(tokens, false, observer);
  progress.done();

  nlohmann::json files = nlohmann::json::array();
  for (int64_t l : layers)
    files.push_back({{"layer", l}, {"q", layer_file(l, "q")}, {"k", layer_file(l, "k")}, {"v", layer_file(l, "v")}});
  const nlohmann::json meta = {
      {"model", args.model_path},
      {"architecture", hp.architecture},
      {"source", source},
      {"chat_template", args.chat},
      {"prompt_tokens", prompt_tokens},
      {"tokens", n},
      {"sliced", n < prompt_tokens},
      {"n_layer", hp.n_layer},
      {"n_head", hp.n_head},
      {"n_head_kv", hp.n_head_kv},
      {"head_dim", hp.head_dim},
      {"n_ctx_train", hp.n_ctx_train},
      {"beyond_training", result.beyond_training},
      {"attention", "dense"},
      {"backend", cm::to_string(backend)},
      {"cuda_attention", backend == cm::ModelBackend::cuda ? args.cuda_attention : ""},
      {"layers", layers},
      {"files", files},
      {"token_ids", tokens},
  };
  // Paths given on the command line need not be UTF-8: U+FFFD in the JSON rather than an abort.
  crisp_cli::write_text_file("--out", (fs::path(args.out_dir) / "meta.json").string(),
                             meta.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  std::printf("capture: %lld tokens (of %lld), %zu layers of Q [%lld, %lld, %lld] and K/V [%lld, %lld, %lld] -> %s\n",
              static_cast<long long>(n), static_cast<long long>(prompt_tokens), layers.size(),
              static_cast<long long>(hp.n_head), static_cast<long long>(n), static_cast<long long>(hp.head_dim),
              static_cast<long long>(hp.n_head_kv), static_cast<long long>(n), static_cast<long long>(hp.head_dim),
              args.out_dir.c_str());
}

}  // namespace

void register_capture_command(CLI::App& app) {
  auto args = std::make_shared<CaptureArgs>();
  CLI::App* sub = app.add_subcommand(
      "capture", "Run a prompt through the model (dense prefill) and dump the post-RoPE Q/K/V of chosen "
                 "layers as .npy [heads, n, d] float32, with meta.json (input of 'crisp eval fidelity')");
  crisp_cli::add_model_option(sub, &args->model_path);
  auto* prompt_file = sub->add_option("--prompt-file", args->prompt_file, "Read the prompt from this file");
  auto* qa_index = sub->add_option("--qa-index", args->qa_index,
                                   "Use prompt I of --qa-file (the project's real long-context QA prompts)")
                       ->check(crisp_cli::kNonNegativeInteger);
  prompt_file->excludes(qa_index);
  sub->add_option("--qa-file", args->qa_file, "The QA prompts (JSON list of {prompt, answer})")
      ->default_str(std::string(crisp_cli::kDataDirRule) + " (<file>: " + crisp_cli::kQaPromptsFile + ")");
  sub->add_option("--max-tokens", args->max_tokens,
                  "Keep only the prompt's first N tokens (a slice of real prose; 0 = the whole prompt)")
      ->capture_default_str()
      ->check(crisp_cli::kNonNegativeInteger);
  sub->add_flag("--chat", args->chat, "Wrap the prompt as a user message in the model's chat template");
  sub->add_option("--layers", args->layers, "Layers to dump: 'all' or a list such as 0,5,29")->capture_default_str();
  sub->add_option("--out", args->out_dir, "Output directory (created if missing)")->required();
  crisp_cli::add_threads_option(*sub, args->threads);
  crisp_cli::add_model_backend_options(sub, &args->backend, &args->cuda_attention,
                                       "Model backend: cpu, or cuda (a CUDA build on a GPU machine; the layers "
                                       "before a captured one then run with --cuda-attention)");
  sub->add_flag("--quiet", args->quiet, "No progress lines on stderr");
  sub->callback([args, prompt_file, qa_index] {
    if (prompt_file->count() == 0 && qa_index->count() == 0)
      throw crisp::Error("--prompt-file", "missing", "--prompt-file FILE or --qa-index I");
    if (prompt_file->count() == 0) args->qa_file = crisp_cli::data_file_or_default("--qa-file", args->qa_file, crisp_cli::kQaPromptsFile);
    args->model_path = crisp_cli::model_or_default(args->model_path);
    run_capture(*args);
  });
}
