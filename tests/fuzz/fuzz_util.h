// tests/fuzz/fuzz_util.h — what the file-reading harnesses share: the input written to a file of
// this process (the readers take paths), and the one rule every harness checks: bad input ends in
// crisp::Error naming the file or argument, anything else (another exception, a crash, a sanitizer
// report) is a finding.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "crisp/error.h"

namespace crisp_fuzz {

// A path of this process under $TMPDIR (or /tmp), overwritten by every input.
inline const std::string& scratch_path(const char* extension) {
  static const std::string path = [&] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir && *dir ? dir : "/tmp") + "/crisp-fuzz-" + std::to_string(::getpid()) + extension;
  }();
  return path;
}

inline void write_scratch(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    std::perror(path.c_str());
    std::abort();
  }
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
}

// Removes the scratch file when the process ends normally.
struct ScratchCleanup {
  std::string path;
  ~ScratchCleanup() { std::remove(path.c_str()); }
};

// A refusal must say what it refused: an empty message is a finding too.
inline void check_error(const crisp::Error& e) {
  if (std::string(e.what()).empty()) {
    std::fprintf(stderr, "crisp-fuzz: crisp::Error with an empty message\n");
    std::abort();
  }
}

}  // namespace crisp_fuzz
