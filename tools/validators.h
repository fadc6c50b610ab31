// tools/validators.h — integer checks for CLI11 options with short, readable failure messages
// (CLI11's PositiveNumber / NonNegativeNumber print the whole double range when they fail).
#pragma once
#include <exception>
#include <limits>
#include <string>

#include <CLI/CLI.hpp>

#include "crisp/crisp.h"

namespace crisp_cli {

// Accepts a whole decimal integer in [minimum, maximum].
inline CLI::Validator integer_in_range(long long minimum, long long maximum, const std::string& what,
                                       const std::string& description) {
  return CLI::Validator(
      [minimum, maximum, what](std::string& input) -> std::string {
        std::size_t used = 0;
        try {
          const long long value = std::stoll(input, &used);
          if (value >= minimum && value <= maximum && used == input.size()) return "";
        } catch (const std::exception&) {
        }
        return "'" + input + "' is not " + what;
      },
      description);
}

// Accepts a whole decimal integer >= minimum.
inline CLI::Validator integer_at_least(long long minimum, const std::string& what) {
  return integer_in_range(minimum, std::numeric_limits<long long>::max(), what,
                          what == "a positive integer" ? "POSITIVE" : "NON-NEGATIVE");
}

inline const CLI::Validator kPositiveInteger = integer_at_least(1, "a positive integer");
inline const CLI::Validator kNonNegativeInteger = integer_at_least(0, "a non-negative integer");

// --threads of every command: 0 (all hardware threads) up to crisp::kMaxThreads.
inline CLI::Option* add_threads_option(CLI::App& sub, int& threads) {
  return sub.add_option("--threads", threads, "CPU threads (0 = all hardware threads)")
      ->capture_default_str()
      ->check(integer_in_range(0, crisp::kMaxThreads,
                               "0 (all hardware threads) or a thread count up to " +
                                   std::to_string(crisp::kMaxThreads),
                               "0.." + std::to_string(crisp::kMaxThreads)));
}

}  // namespace crisp_cli
