// tools/validators.h — integer checks for CLI11 options with short, readable failure messages
// (CLI11's PositiveNumber / NonNegativeNumber print the whole double range when they fail).
#pragma once
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

namespace crisp_cli {

// Accepts a whole decimal integer >= minimum.
inline CLI::Validator integer_at_least(long long minimum, const std::string& what) {
  return CLI::Validator(
      [minimum, what](std::string& input) -> std::string {
        std::size_t used = 0;
        try {
          if (std::stoll(input, &used) >= minimum && used == input.size()) return "";
        } catch (const std::exception&) {
        }
        return "'" + input + "' is not " + what;
      },
      what == "a positive integer" ? "POSITIVE" : "NON-NEGATIVE");
}

inline const CLI::Validator kPositiveInteger = integer_at_least(1, "a positive integer");
inline const CLI::Validator kNonNegativeInteger = integer_at_least(0, "a non-negative integer");

}  // namespace crisp_cli
