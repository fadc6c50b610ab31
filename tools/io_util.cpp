// tools/io_util.cpp — see io_util.h.
#include "io_util.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "crisp/error.h"
#include "eval/json_file.h"
#include "input_checks.h"

namespace crisp_cli {

std::string read_text_file(const std::string& argument, const std::string& path) {
  crisp::eval::require_readable_file(path, argument, "a readable file");
  std::ifstream file(path, std::ios::binary);
  if (!file) throw crisp::Error(argument, "cannot open '" + path + "'", "a readable file");
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

void write_text_file(const std::string& argument, const std::string& path, const std::string& text) {
  if (path == "-") {
    std::cout.write(text.data(), static_cast<std::streamsize>(text.size()));
    std::cout.flush();
    if (!std::cout) throw crisp::Error(argument, "failed writing to standard output", "a writable standard output");
    return;
  }
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) throw crisp::Error(argument, "cannot open '" + path + "' for writing", "a writable path");
  file.write(text.data(), static_cast<std::streamsize>(text.size()));
  file.close();
  if (!file) throw crisp::Error(argument, "failed writing '" + path + "'", "a writable path with free space");
}

bool is_stdout_path(const std::string& path) { return path == "-" || path == "/dev/stdout"; }

void require_writable(const std::string& argument, const std::string& path) {
  if (path.empty() || is_stdout_path(path)) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw crisp::Error(argument, "'" + path + "' is a directory", "a file path");
  if (fs::exists(path, ec)) {
    if (::access(path.c_str(), W_OK) != 0)
      throw crisp::Error(argument, "cannot write '" + path + "': " + std::strerror(errno), "a writable path");
    return;
  }
  const fs::path parent = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  if (!fs::is_directory(parent, ec))
    throw crisp::Error(argument,
                       "directory '" + parent.string() + "' of '" + path + "' " +
                           (fs::exists(parent, ec) ? "is not a directory" : "does not exist"),
                       "a path in an existing directory");
  if (::access(parent.c_str(), W_OK) != 0)
    throw crisp::Error(argument, "cannot create '" + path + "': " + std::strerror(errno), "a writable path");
}

bool same_file(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  if (a == b) return true;
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) {
    const bool equivalent = fs::equivalent(a, b, ec);
    if (!ec) return equivalent;
  }
  // One of them does not exist (yet): the same path once made absolute and normalized. Symbolic
  // links of an existing directory part are resolved too (weakly_canonical).
  const auto normal = [](const std::string& p) {
    std::error_code error;
    fs::path resolved = fs::weakly_canonical(fs::absolute(p, error), error);
    if (error) resolved = fs::absolute(p, error);
    return resolved.lexically_normal();
  };
  return normal(a) == normal(b);
}

void require_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      const std::string& a = outputs[j].second;
      const std::string& b = outputs[i].second;
      if (a.empty() || b.empty()) continue;
      if (same_file(a, b))
        throw crisp::Error(outputs[i].first, "'" + b + "' is also the " + outputs[j].first + " file",
                           "a different path from " + outputs[j].first + " (one output would overwrite the other)");
    }
  }
}

void require_outputs_not_inputs(const std::vector<std::pair<std::string, std::string>>& outputs,
                                const std::vector<std::pair<std::string, std::string>>& inputs) {
  for (const auto& [output_argument, output] : outputs) {
    if (output.empty() || is_stdout_path(output)) continue;
    for (const auto& [input_argument, input] : inputs) {
      if (input.empty()) continue;
      if (same_file(output, input))
        throw crisp::Error(output_argument, "'" + output + "' is the " + input_argument + " input file",
                           "a path other than the inputs' (writing it would overwrite " + input_argument + ")");
    }
  }
}

void require_file_output(const std::string& argument, const std::string& path, const std::string& what) {
  if (is_stdout_path(path))
    throw crisp::Error(argument, "'" + path + "' (standard output) is not supported for " + what,
                       path == "-" ? "a path (./- for one named '-')" : "a path");
}

void require_not_capture_file(const std::string& argument, const std::string& path,
                              const std::vector<std::string>& captures) {
  std::vector<std::pair<std::string, std::string>> inputs;
  for (const std::string& dir : captures) {
    inputs.push_back({"--captures", (std::filesystem::path(dir) / "meta.json").string()});
    for (const crisp::eval::CaptureLayer& layer : crisp::eval::read_capture(dir, "--captures").layers)
      for (const std::string* file : {&layer.q, &layer.k, &layer.v}) inputs.push_back({"--captures", *file});
  }
  require_outputs_not_inputs({{argument, path}}, inputs);
}

OutputFiles::~OutputFiles() {
  for (const auto& [temporary, output] : pending_) {
    std::error_code ec;
    std::filesystem::remove(temporary, ec);  // not committed: the outputs stay as they were
  }
}

void OutputFiles::write(const std::string& argument, const std::string& path,
                        const std::function<void(const std::string&)>& write) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  const fs::path parent = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  const bool in_place = is_stdout_path(path) || (fs::exists(status) && !fs::is_regular_file(status)) ||
                        ::access(parent.c_str(), W_OK) != 0;
  const std::string target = in_place ? path : path + ".crisp-partial";
  try {
    write(target);
  } catch (const crisp::Error& e) {
    if (!in_place) fs::remove(target, ec);
    throw renamed_error(e, {{e.argument().c_str(), argument + " " + path}});  // the output, not its temporary
  }
  if (!in_place) pending_.push_back({target, path});
}

void OutputFiles::commit() {
  while (!pending_.empty()) {
    const auto [temporary, output] = pending_.front();
    std::error_code ec;
    std::filesystem::rename(temporary, output, ec);
    if (ec) throw crisp::Error(output, "cannot be replaced (" + ec.message() + ")", "a writable path");
    pending_.erase(pending_.begin());
  }
}

}  // namespace crisp_cli
