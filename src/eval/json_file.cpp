// src/eval/json_file.cpp — see json_file.h.
#include "eval/json_file.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "crisp/error.h"

namespace crisp {
namespace eval {

namespace fs = std::filesystem;
using nlohmann::json;

void require_readable_file(const std::string& path, const std::string& argument, const std::string& expected) {
  if (path.empty()) throw Error(argument, "is an empty path", expected);
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    throw Error(argument, "cannot read '" + path + "' (" + ec.message() + ")", expected);
  if (!fs::exists(status)) throw Error(argument, "cannot open '" + path + "' (no such file)", expected);
  if (fs::is_directory(status)) throw Error(argument, "'" + path + "' is a directory", expected);
}

json read_json_file(const std::string& path, const std::string& argument, const std::string& expected) {
  require_readable_file(path, argument, expected);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(argument, "cannot open '" + path + "'", expected);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw Error(argument, "'" + path + "' is not JSON (" + e.what() + ")", expected);
  }
}

Capture read_capture(const std::string& dir, const std::string& argument) {
  const std::string expected = "a directory written by 'crisp-llama-eval capture' (meta.json and its .npy files)";
  const std::string meta_path = (fs::path(dir) / "meta.json").string();
  Capture capture;
  capture.meta = read_json_file(meta_path, argument, expected);
  const json& files = capture.meta.is_object() && capture.meta.contains("files") ? capture.meta["files"] : json();
  if (!files.is_array()) throw Error(argument, "'" + meta_path + "' lacks a files list", expected);
  std::set<int64_t> seen;
  for (std::size_t i = 0; i < files.size(); ++i) {
    const json& f = files[i];
    const std::string where = "'" + meta_path + "' files[" + std::to_string(i) + "]";
    if (!f.is_object()) throw Error(argument, where + " is not an object", expected);
    // An integer, not a float read as one (1.5 was layer 1) or a count beyond int64 (2^70 was
    // recorded as -2^63).
    if (!f.contains("layer") || !f["layer"].is_number_integer() ||
        (f["layer"].is_number_unsigned() && f["layer"].get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) ||
        f["layer"].get<int64_t>() < 0 || f["layer"].get<int64_t>() > std::numeric_limits<int32_t>::max())
      throw Error(argument, where + " has layer " + (f.contains("layer") ? f["layer"].dump() : std::string("(none)")),
                  "a layer index: an integer in [0, 2^31)");
    CaptureLayer layer;
    layer.layer = f["layer"].get<int64_t>();
    if (!seen.insert(layer.layer).second)
      throw Error(argument, where + " lists layer " + std::to_string(layer.layer) + " again", "each layer once");
    for (const auto& [key, path] : {std::pair<const char*, std::string*>{"q", &layer.q}, {"k", &layer.k}, {"v", &layer.v}}) {
      if (!f.contains(key) || !f[key].is_string() || f[key].get<std::string>().empty())
        throw Error(argument, where + " has no file name '" + key + "'", expected);
      *path = (fs::path(dir) / f[key].get<std::string>()).string();
    }
    capture.layers.push_back(std::move(layer));
  }
  return capture;
}

}  // namespace eval
}  // namespace crisp
