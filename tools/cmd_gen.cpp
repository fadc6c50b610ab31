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
  // The four files all or none (a k.npy that is a directory left a new q.npy beside old k/v).
  crisp_cli::OutputFiles files;
  const auto write_tensor = [&](const char* name, const std::vector<float>& x, int64_t heads) {
    files.write("--out-dir", (dir / name).string(), [&](const std::string& target) {
      crisp::write_npy(target, x.data(), {heads, w.total_tokens, s.head_dim});
    });
  };
  write_tensor("q.npy", w.q, s.num_q_heads);
  write_tensor("k.npy", w.k, s.num_kv_heads);
  write_tensor("v.npy", w.v, s.num_kv_heads);

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
  files.write("--out-dir", (dir / "workload.json").string(),
              [&](const std::string& target) { crisp_cli::write_text_file("--out-dir", target, meta.dump(1) + "\n"); });
  files.commit();
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
