// src/model/model_path.h — where the cached model file is looked for (the same lookup as
// scripts/fetch_model.sh, which fetches it).
#pragma once
#include <string>

namespace crisp {
namespace model {

// File name of the project's model: SmolLM2-135M-Instruct as a Q4_1 GGUF.
constexpr const char* kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";

// The default model path:
//   $CRISP_MODEL_PATH if set; else $CRISP_MODEL_DIR/<file> if set; else the first existing
//   .cache/model/<file> in the running executable's directory or a parent of it (up to 4 levels: a
//   build directory inside the repository finds the repository's cache); else "" (none found).
//   The working directory plays no part.
std::string default_model_path();

}  // namespace model
}  // namespace crisp
