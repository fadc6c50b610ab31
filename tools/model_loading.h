// tools/model_loading.h — loading a GGUF model for the commands that run one (run, capture,
// eval niah): the file is read once for the tokenizer and the weights, with a progress line.
#pragma once
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

}  // namespace crisp_cli
