// tools/cmd_bench.cpp — placeholder registered in builds without the CUDA backend's benchmark.
// The CUDA backend replaces this file with the real `crisp bench` (issue 3).
#include "commands.h"

void register_bench_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("bench", "GPU benchmark of every preset (needs the CUDA backend)");
  sub->callback([] {
    throw crisp_cli::CommandFailure("crisp bench needs the CUDA backend; not available in this build");
  });
}
