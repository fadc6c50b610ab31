// tools/validators.h — integer checks for CLI11 options with short, readable failure messages
// (CLI11's PositiveNumber / NonNegativeNumber print the whole double range when they fail).
#pragma once
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
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

// Refuses an empty path ("--json ''" would otherwise mean "no file" for an optional output, and
// name nothing in the error of a required one).
inline const CLI::Validator kNonEmptyPath(
    [](std::string& input) -> std::string { return input.empty() ? "is an empty path; expected a file path" : ""; },
    "PATH");

// Puts kNonEmptyPath on every path option of `app` and its commands that names a file or directory
// (an empty --json meant "no file" for some commands and failed after the work for others).
inline void require_nonempty_paths(CLI::App& app) {
  static const char* const kPathOptions[] = {"--json", "--out-dir", "--captures", "--score", "--splits", "--sweep-file",
                                             "--q", "--k", "--v", "--out", "--lse"};
  for (CLI::Option* option : app.get_options())
    for (const char* name : kPathOptions)
      if (option->check_lname(name + 2)) option->check(kNonEmptyPath);
  for (CLI::App* sub : app.get_subcommands({})) require_nonempty_paths(*sub);
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

// Numbers on the command line are decimal only. CLI11 converts integers with strtoll(..., 0), so
// '0x100' would be 256 and '010' would be 8, and floats with strtold, which reads hex floats; it
// also clamps an integer beyond 64 bits to the largest one without a word. This transform is put
// first on every numeric option of every command (require_decimal_numbers): it refuses what is
// not a decimal number, or is beyond 64 bits (signed, or unsigned for `unsigned_integer`), or is a
// float beyond double's range, and strips leading zeros so that '010' means ten.
enum class NumberKind { integer, unsigned_integer, real };
inline CLI::Validator decimal_number(NumberKind kind) {
  const bool integer = kind != NumberKind::real;
  return CLI::Validator(
      [kind, integer](std::string& input) -> std::string {
        std::size_t i = (input.size() > 1 && (input[0] == '-' || input[0] == '+')) ? 1 : 0;
        const std::size_t digits_start = i;
        const auto digits = [&] {
          const std::size_t from = i;
          while (i < input.size() && std::isdigit(static_cast<unsigned char>(input[i]))) ++i;
          return i - from;
        };
        std::size_t mantissa_digits = digits();
        if (!integer) {
          if (i < input.size() && input[i] == '.') {
            ++i;
            mantissa_digits += digits();
          }
          if (mantissa_digits > 0 && i < input.size() && (input[i] == 'e' || input[i] == 'E')) {
            ++i;
            if (i < input.size() && (input[i] == '-' || input[i] == '+')) ++i;
            if (digits() == 0) mantissa_digits = 0;
          }
        }
        if (mantissa_digits == 0 || i != input.size())
          return "'" + input + "' is not a decimal number" + (integer ? " (an integer such as 256)" : " (such as 1.5)");
        // Leading zeros: '010' is ten, not octal eight.
        std::size_t first = digits_start;
        while (first + 1 < input.size() && input[first] == '0' && std::isdigit(static_cast<unsigned char>(input[first + 1])))
          ++first;
        input.erase(digits_start, first - digits_start);
        errno = 0;
        char* end = nullptr;
        if (kind == NumberKind::integer) {
          (void)std::strtoll(input.c_str(), &end, 10);
          if (errno == ERANGE) return "'" + input + "' is out of range (beyond 64-bit integers)";
        } else if (kind == NumberKind::unsigned_integer) {
          // strtoull reads "-1" as 2^64 - 1 without an error
          if (input[0] == '-') return "'" + input + "' is not a non-negative integer";
          (void)std::strtoull(input.c_str(), &end, 10);
          if (errno == ERANGE) return "'" + input + "' is out of range (beyond 2^64 - 1)";
        } else if (!std::isfinite(std::strtod(input.c_str(), &end))) {
          return "'" + input + "' is out of range (beyond double's)";
        }
        return "";
      },
      "");
}

// Puts decimal_number first on every integer and floating-point option of `app` and its commands:
// a transform (CLI11's check() would discard its stripping of leading zeros, and it must run
// before the options' own checks, which convert with base 0 too).
inline void require_decimal_numbers(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    if (type.rfind("UINT", 0) == 0)
      option->transform(decimal_number(NumberKind::unsigned_integer));
    else if (type.rfind("INT", 0) == 0)
      option->transform(decimal_number(NumberKind::integer));
    else if (type.rfind("FLOAT", 0) == 0)
      option->transform(decimal_number(NumberKind::real));
  }
  for (CLI::App* sub : app.get_subcommands({})) require_decimal_numbers(*sub);
}

}  // namespace crisp_cli
