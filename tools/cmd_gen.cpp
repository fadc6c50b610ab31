// tools/cmd_gen.cpp — `crisp gen`: the structured synthetic workload as .npy files, so that
// `crisp plan` / `crisp attend` (or NumPy code) can be tried without model captures.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "crisp/npy.h"
#include "crisp/workload.h"
#include "io_util.h"
#include "workload_options.h"

namespace {

struct GenArgs {
  crisp_cli::WorkloadOptions workload;
  std::string out_dir;
};

void run_gen(const GenArgs& args) {
  crisp_cli::check_workload_options(args.workload);
  // q.npy, k.npy and v.npy are binary files of a directory: no standard output here either.
  crisp_cli::require_file_output("--out-dir", args.out_dir, "the .npy outputs (a directory)");
  std::error_code ec;
  std::filesystem::create_directories(args.out_dir, ec);
  if (ec) {
    throw crisp::Error("--out-dir", "cannot create '" + args.out_dir + "' (" + ec.message() + ")",
                       "a writable directory");
  }
  crisp::Workload w = crisp::make_workload(crisp_cli::make_workload_spec(args.workload));
  const auto& s = w.spec;
  const std::filesystem::path dir(args.out_dir);
  crisp::write_npy((dir / "q.npy").string(), w.q.data(), {s.num_q_heads, w.total_tokens, s.head_dim});
  crisp::write_npy((dir / "k.npy").string(), w.k.data(), {s.num_kv_heads, w.total_tokens, s.head_dim});
  crisp::write_npy((dir / "v.npy").string(), w.v.data(), {s.num_kv_heads, w.total_tokens, s.head_dim});

  // What the workload planted, for checking a plan against it.
  nlohmann::json meta = {
      {"n", w.total_tokens},
      {"num_q_heads", s.num_q_heads},
      {"num_kv_heads", s.num_kv_heads},
      {"head_dim", s.head_dim},
      {"seed", s.seed},
      {"needle_positions_per_kv_head", w.needle_positions},
      {"head_is_diffuse", w.head_is_diffuse},
  };
  crisp_cli::write_text_file("--out-dir", (dir / "workload.json").string(), meta.dump(1) + "\n");
  std::printf("gen: n = %lld, Hq = %lld, Hkv = %lld, d = %lld -> %s/{q,k,v}.npy, workload.json\n",
              static_cast<long long>(w.total_tokens), static_cast<long long>(s.num_q_heads),
              static_cast<long long>(s.num_kv_heads), static_cast<long long>(s.head_dim),
              args.out_dir.c_str());
}

}  // namespace

void register_gen_command(CLI::App& app) {
  auto args = std::make_shared<GenArgs>();
  args->workload.seq = 4096;
  CLI::App* sub = app.add_subcommand(
      "gen", "Write the structured synthetic workload as q.npy, k.npy, v.npy (+ workload.json)");
  crisp_cli::add_workload_options(*sub, args->workload);
  sub->add_option("--out-dir", args->out_dir, "Directory to write into (created if missing)")
      ->required();
  sub->callback([args] { run_gen(*args); });
}
