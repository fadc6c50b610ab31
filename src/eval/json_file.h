// src/eval/json_file.h — the input files of the evaluation commands (JSON documents, capture
// directories): the checks every such input needs, in one place, each failure a crisp::Error
// naming the argument the file came from.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace crisp {
namespace eval {

// Refuses `path` unless it can be read as a file: a missing path or a directory is named as such (a
// directory opened as a stream failed later with a library message). Pipes are read (`<(...)`,
// /dev/stdin). `expected` says what the argument should name.
void require_readable_file(const std::string& path, const std::string& argument, const std::string& expected);

// The JSON document at `path`, after require_readable_file; invalid JSON is a crisp::Error too.
nlohmann::json read_json_file(const std::string& path, const std::string& argument, const std::string& expected);

// A capture directory of `crisp-llama-eval capture`: its meta.json and the layers it lists, checked
// (a layer index is an integer in [0, 2^31), listed once; q, k and v are file names).
struct CaptureLayer {
  int64_t layer = 0;
  std::string q, k, v;  // paths: the directory joined with meta.json's names
};
struct Capture {
  nlohmann::json meta;
  std::vector<CaptureLayer> layers;
};
Capture read_capture(const std::string& dir, const std::string& argument);

}  // namespace eval
}  // namespace crisp
