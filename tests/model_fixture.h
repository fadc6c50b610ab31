// tests/model_fixture.h — where the tests find the real model file (SmolLM2-135M-Instruct Q4_1
// GGUF): $CRISP_MODEL_PATH, else $CRISP_MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf, else
// <repo>/.cache/model/SmolLM2-135M-Instruct.Q4_1.gguf — the lookup of scripts/fetch_model.sh.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>

namespace crisp_test {

// The repository root, from this header's own path (tests/model_fixture.h).
inline std::filesystem::path repo_root() {
  return std::filesystem::path(__FILE__).parent_path().parent_path();
}

// The model file's path, or "" when it is not there.
inline std::string real_model_path() {
  std::filesystem::path p;
  if (const char* env = std::getenv("CRISP_MODEL_PATH"); env && *env) {
    p = env;
  } else if (const char* dir = std::getenv("CRISP_MODEL_DIR"); dir && *dir) {
    p = std::filesystem::path(dir) / "SmolLM2-135M-Instruct.Q4_1.gguf";
  } else {
    p = repo_root() / ".cache/model/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  std::error_code ec;
  return std::filesystem::is_regular_file(p, ec) ? p.string() : std::string();
}

}  // namespace crisp_test

// Skips the current test, naming the script that fetches the model, when the file is absent.
#define CRISP_REQUIRE_REAL_MODEL(path_var)                                                   \
  const std::string path_var = crisp_test::real_model_path();                                \
  if (path_var.empty()) {                                                                    \
    GTEST_SKIP() << "SmolLM2-135M-Instruct.Q4_1.gguf not found (looked at "                  \
                    "$CRISP_MODEL_PATH, $CRISP_MODEL_DIR, <repo>/.cache/model); run "        \
                    "scripts/fetch_model.sh to fetch it";                                    \
  }
