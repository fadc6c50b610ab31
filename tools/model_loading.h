// tools/model_loading.h — loading a GGUF model for the commands that run one (run, capture,
// eval niah): the file is read once for the tokenizer and the weights, with a progress line.
#pragma once
#include <CLI/CLI.hpp>

#include <string>

#include "model/gguf.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "progress.h"

namespace crisp_cli {

struct LoadedModel {
  crisp::model::Tokenizer tokenizer;
  crisp::model::LlamaModel model;  // float32 copies of the weights: the file can be closed after
};

inline LoadedModel load_model(const std::string& path, Progress& progress) {
  progress.begin("loading " + path);
  const crisp::model::GgufFile file(path);
  LoadedModel loaded{crisp::model::Tokenizer(file), crisp::model::LlamaModel(file)};
  progress.done();
  return loaded;
}

// --backend (cpu | cuda) and --cuda-attention (f16 | f32-reference) of the commands that run the
// model; `backend_help` says what the backend choice means for the command. Returns the
// --cuda-attention option (`crisp run` checks whether it was given).
inline CLI::Option* add_model_backend_options(CLI::App* sub, std::string* backend, std::string* cuda_attention,
                                              const std::string& backend_help) {
  sub->add_option("--backend", *backend, backend_help)->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  return sub
      ->add_option("--cuda-attention", *cuda_attention,
                   "CUDA prefill attention: f16 (crisp's kernel on float16 Q/K/V) or f32-reference (a float32 "
                   "kernel following the same plan: exact, slow past a few thousand tokens)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f16", "f32-reference"}));
}

}  // namespace crisp_cli
