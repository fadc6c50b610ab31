// src/model/model_path.cpp — the default model path (see model_path.h).
#include "model/model_path.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace crisp {
namespace model {

std::string default_model_path() {
  namespace fs = std::filesystem;
  if (const char* path = std::getenv("CRISP_MODEL_PATH"); path && *path) return path;
  if (const char* dir = std::getenv("CRISP_MODEL_DIR"); dir && *dir) return (fs::path(dir) / kDefaultModelFile).string();
  const fs::path relative = fs::path(".cache") / "model" / kDefaultModelFile;
  std::error_code ec;
  // /proc/self/exe: Linux; elsewhere the search simply finds nothing.
  fs::path dir = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    dir = dir.parent_path();
    for (int up = 0; up <= 4 && !dir.empty(); ++up, dir = dir.parent_path()) {
      const fs::path candidate = dir / relative;
      if (fs::exists(candidate, ec)) return candidate.string();
      if (dir == dir.parent_path()) break;
    }
  }
  return "";  // none found
}

}  // namespace model
}  // namespace crisp
