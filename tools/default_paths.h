// tools/default_paths.h — the defaults of --prose and --qa-file. Each default is a rule
// that does not depend on the working directory; --help prints the rule, not a path of this machine.
#pragma once
#include <filesystem>
#include <string>

#include <CLI/CLI.hpp>

#include "crisp/error.h"

namespace crisp_cli {

// The project's data directory: $CRISP_DATA_DIR, else data/ of the source tree the command was
// built from (CRISP_SOURCE_DIR, set by CMakeLists.txt; data/README.md says what it holds).
inline constexpr const char* kDataDirRule = "$CRISP_DATA_DIR/<file>, else data/<file> of the source tree";

inline std::filesystem::path data_dir() {
  if (const char* dir = std::getenv("CRISP_DATA_DIR"); dir != nullptr && *dir != '\0') return dir;
  return std::filesystem::path(CRISP_SOURCE_DIR) / "data";
}

// `given` if the option was given; else `file` in data_dir(), which must exist.
inline std::string data_file_or_default(const std::string& option, const std::string& given, const char* file) {
  if (!given.empty()) return given;
  const std::filesystem::path path = data_dir() / file;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw crisp::Error(option, std::string("not given, and its default ") + path.string() + " does not exist",
                       option + " <path to " + file + ">, or CRISP_DATA_DIR=<the directory holding it>");
  return path.string();
}

// The project's real long-context QA prompts (a list of {prompt, answer}).
inline constexpr const char* kQaPromptsFile = "long_qa_prompts.json";

// --prose of `crisp-llama-eval niah|pareto`: its default is kQaPromptsFile in data_dir().
inline CLI::Option* add_prose_option(CLI::App* sub, std::string* path, const std::string& help) {
  return sub->add_option("--prose", *path, help)->default_str(std::string(kDataDirRule) + " (<file>: " + kQaPromptsFile + ")");
}

}  // namespace crisp_cli
