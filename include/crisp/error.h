// crisp/error.h — the one error type of the library.
#pragma once
#include <stdexcept>
#include <string>

namespace crisp {

// Every invalid argument, unreadable file or unsupported configuration is reported as a
// crisp::Error. what() reads "<argument>: <problem>; expected <what was expected>", so the caller
// sees which argument was wrong and what would have been accepted.
class Error : public std::runtime_error {
 public:
  Error(std::string argument, const std::string& problem, const std::string& expected = "")
      : std::runtime_error(format(argument, problem, expected)), argument_(std::move(argument)) {}

  // The name of the offending argument ("q", "config.alpha", "--set", "Q.npy", ...).
  const std::string& argument() const noexcept { return argument_; }
  // what() without the leading "<argument>: ": "<problem>; expected <...>" (for a caller that
  // names the argument itself, as a command-line parser does).
  std::string reason() const { return std::string(what()).substr(argument_.size() + 2); }

 private:
  static std::string format(const std::string& argument, const std::string& problem,
                            const std::string& expected) {
    std::string msg = argument + ": " + problem;
    if (!expected.empty()) msg += "; expected " + expected;
    return msg;
  }
  std::string argument_;
};

}  // namespace crisp
