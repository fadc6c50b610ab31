// tools/commands.h — the subcommands of the `crisp` command and the helpers they share.
//
// Each subcommand lives in its own tools/cmd_*.cpp and registers itself on the CLI11 app through
// one register_*_command() function called from tools/main.cpp. A subcommand reports failure by
// throwing: crisp::Error for bad input (main prints "crisp: error: <message>" and exits 2) or
// crisp_cli::CommandFailure for anything else that must stop the run with a given exit code.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "crisp/crisp.h"

// Registration of each subcommand (called once from main, in the order shown by --help).
void register_demo_command(CLI::App& app);
void register_plan_command(CLI::App& app);
void register_attend_command(CLI::App& app);
void register_gen_command(CLI::App& app);
// `crisp eval` (tools/cmd_eval.cpp) and its `eval fidelity` subcommand (tools/cmd_fidelity.cpp).
void register_eval_command(CLI::App& app);
void register_eval_fidelity(CLI::App& eval);
// `crisp eval pareto` (tools/cmd_pareto.cpp): the accuracy / recall against density frontier of knob sweeps.
void register_eval_pareto(CLI::App& eval);
// Owned by the CUDA backend (tools/cmd_bench.cpp).
void register_bench_command(CLI::App& app);

namespace crisp_cli {

// Exit status of every error the command reports (bad arguments, unreadable inputs, library
// errors). A crash would give 134/139 instead, which the CLI tests treat as a failure.
constexpr int kExitError = 2;

// A failure that is not a crisp::Error (e.g. a subcommand not available in this build). main()
// prints "crisp: error: <message>" and exits with `code`.
class CommandFailure : public std::runtime_error {
 public:
  explicit CommandFailure(const std::string& message, int code = kExitError)
      : std::runtime_error(message), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

// Options shared by `plan` and `attend`: the policy and its parameter overrides.
struct PolicyOptions {
  std::string policy = "crisp";
  std::vector<std::string> sets;  // "key=value", applied in order
  std::string block_size;         // --block as given; empty = the preset's (128)
  std::string precision = "f32";
  int threads = 0;
};

// Adds --policy, --set, --block, --precision, --threads to a subcommand.
void add_policy_options(CLI::App& sub, PolicyOptions& options);

// The Config of --policy with every --set applied and --block set; validated. Throws crisp::Error.
crisp::Config make_config(const PolicyOptions& options);

// The Config of a policy named on the command line as "PRESET" or "PRESET:KEY=VALUE[:KEY=VALUE...]"
// (e.g. "crisp:routing=cstruct_rel:rho=2.2"): the preset with each assignment applied in order,
// validated. Errors name `argument` (e.g. "--policies") and the offending part. Throws crisp::Error.
crisp::Config config_of_policy_spec(const std::string& spec, const std::string& argument);

// Options of the CPU backend from --precision and --threads.
crisp::Options make_run_options(const PolicyOptions& options);

}  // namespace crisp_cli
