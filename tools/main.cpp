// tools/main.cpp — the `crisp` command: demo, plan, attend, gen (and bench with the CUDA backend).
//
// Exit status: 0 on success (and for --help / --version), 2 for every error: bad command-line
// arguments (CLI11 parse errors are mapped to 2 as well, not CLI11's own codes), unreadable or
// invalid inputs, invalid parameters. Errors are printed as "crisp: error: <message>" on stderr.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <new>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "crisp/error.h"
#include "io/printable.h"
#include "progress.h"
#include "validators.h"

namespace {

int report(const std::string& message, int code) {
  std::fflush(stdout);
  crisp_cli::finish_progress_line();
  std::cerr << "crisp: error: " << crisp::printable(message) << "\n";
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "crisp: cliff-aware input-adaptive sparse prefill attention (CRISP) and its baselines "
      "(FlexPrefill, MInference-style, dense) on long-context inputs."};
  app.name("crisp");
  app.set_version_flag("--version", "crisp 0.1.0");
  app.require_subcommand(1);
  app.footer("Run 'crisp <command> --help' for the options of one command. Errors exit with status 2.");

  register_demo_command(app);
  register_plan_command(app);
  register_attend_command(app);
  register_gen_command(app);
  register_eval_command(app);
  register_bench_command(app);
  crisp_cli::require_decimal_numbers(app);
  crisp_cli::require_nonempty_paths(app);

  // An unknown command: named, with the commands there are (CLI11 would only say that an
  // argument was not expected).
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) {
      known = known || sub->check_name(argv[1]);
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known)
      return report(std::string("unknown command '") + argv[1] + "'; expected one of " + names + " (see --help)",
                    crisp_cli::kExitError);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& success) {
    return app.exit(success);  // --help, --version: printed on stdout, status 0
  } catch (const CLI::ParseError& parse_error) {
    return report(std::string(parse_error.what()) + " (see --help)", crisp_cli::kExitError);
  } catch (const crisp::Error& error) {
    return report(error.what(), crisp_cli::kExitError);
  } catch (const crisp_cli::CommandFailure& failure) {
    return report(failure.what(), failure.code());
  } catch (const std::bad_alloc&) {
    return report("out of memory (inputs too large for this machine?)", crisp_cli::kExitError);
  } catch (const nlohmann::json::exception& malformed) {
    // A JSON input of the wrong shape that a command did not check field by field.
    return report(std::string("a JSON input does not have the expected fields or types: ") + malformed.what(),
                  crisp_cli::kExitError);
  } catch (const std::exception& unexpected) {
    // Not a documented failure mode: still a clean message and status 2 rather than an abort.
    return report(std::string("internal error: ") + unexpected.what(), crisp_cli::kExitError);
  }
  // A table or summary that could not be written (a full disk, a closed pipe) is a failure too.
  std::cout.flush();
  if (std::fflush(stdout) != 0 || std::ferror(stdout) || !std::cout)
    return report("failed writing to standard output", crisp_cli::kExitError);
  return 0;
}
