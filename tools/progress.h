// tools/progress.h — progress lines on stderr for the long steps of the `crisp` command.
//
// stdout carries the results (tables, JSON paths) and stays clean for pipes; stderr says what is
// running and how long each step took, so a user of a slow machine sees the demo is alive.
#pragma once
#include <chrono>
#include <cstdio>
#include <string>

namespace crisp_cli {

// True while a "crisp: <step> ..." line waits for its time: an error reported meanwhile starts
// on a new line (see finish_progress_line).
inline bool progress_line_open = false;

// Ends an unfinished progress line so that what follows starts on a line of its own.
inline void finish_progress_line() {
  if (!progress_line_open) return;
  std::fputc('\n', stderr);
  progress_line_open = false;
}

class Progress {
 public:
  explicit Progress(bool enabled) : enabled_(enabled) {}

  // Announces a step: "crisp: <what> ..." (no newline until done()).
  void begin(const std::string& what) {
    start_ = std::chrono::steady_clock::now();
    if (!enabled_) return;
    std::fprintf(stderr, "crisp: %s ...", what.c_str());
    std::fflush(stderr);
    progress_line_open = true;
  }

  // Ends the step begun last, printing its wall time; returns that time in milliseconds.
  double done() {
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
    if (enabled_) {
      std::fprintf(stderr, " %.1f s\n", ms / 1000.0);
      std::fflush(stderr);
      progress_line_open = false;
    }
    return ms;
  }

  // A line of its own (e.g. the backend chosen).
  void note(const std::string& text) const {
    if (!enabled_) return;
    finish_progress_line();
    std::fprintf(stderr, "crisp: %s\n", text.c_str());
    std::fflush(stderr);
  }

 private:
  bool enabled_;
  std::chrono::steady_clock::time_point start_{};
};

// Wall-clock milliseconds of one call.
template <typename F>
double time_ms(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace crisp_cli
