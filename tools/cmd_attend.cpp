// tools/cmd_attend.cpp — `crisp attend`: plan + block-sparse attention of .npy inputs.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "crisp/npy.h"
#include "input_checks.h"
#include "io_util.h"
#include "plan_json.h"

namespace {

struct AttendArgs {
  crisp_cli::PolicyOptions policy;
  std::string q_path;
  std::string k_path;
  std::string v_path;
  std::string out_path;
  std::string lse_path;
  std::string json_path;  // optional: the plan that was run
};

void run_attend(const AttendArgs& args) {
  // Outputs first: a clash or an unwritable path fails before the work, not after it. O and LSE are
  // binary .npy files: written to named files only (a '-' would have made a file named '-').
  crisp_cli::require_file_output("--out", args.out_path, "the .npy output O");
  crisp_cli::require_file_output("--lse", args.lse_path, "the .npy output LSE");
  crisp_cli::require_distinct_outputs({{"--out", args.out_path}, {"--lse", args.lse_path}, {"--json", args.json_path}});
  crisp_cli::require_outputs_not_inputs({{"--out", args.out_path}, {"--lse", args.lse_path}, {"--json", args.json_path}},
                                        {{"--q", args.q_path}, {"--k", args.k_path}, {"--v", args.v_path}});
  crisp_cli::require_writable("--out", args.out_path);
  crisp_cli::require_writable("--lse", args.lse_path);
  crisp_cli::require_writable("--json", args.json_path);
  const crisp::Config config = crisp_cli::make_config(args.policy);
  crisp::NpyArray q = crisp::read_npy(args.q_path);
  crisp::NpyArray k = crisp::read_npy(args.k_path);
  crisp::NpyArray v = crisp::read_npy(args.v_path);
  const std::string q_argument = "--q " + args.q_path, k_argument = "--k " + args.k_path,
                    v_argument = "--v " + args.v_path;
  const crisp::TensorView q_view = q.view(q_argument);
  const crisp::TensorView k_view = k.view(k_argument);
  const crisp::TensorView v_view = v.view(v_argument);
  // The shapes before the outputs are allocated: an empty or mismatched input is named as such,
  // not reported as an allocation failure.
  const crisp::Batch batch = crisp_cli::one_sequence(q_view, q_argument, k_view, k_argument, &v_view, v_argument);

  // q's extents are valid and its elements are in memory: O is as many floats, LSE fewer.
  const int64_t heads = q_view.heads(), tokens = q_view.tokens(), dim = q_view.dim();
  std::vector<float> out(static_cast<std::size_t>(heads * tokens * dim));
  std::vector<float> lse(static_cast<std::size_t>(heads * tokens));
  const crisp::Plan plan = crisp::prefill(
      q_view, k_view, v_view, config,
      crisp::TensorView::contiguous(out.data(), crisp::DType::f32, heads, tokens, dim),
      crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, heads, tokens), batch,
      crisp_cli::make_run_options(args.policy));

  crisp::write_npy(args.out_path, out.data(), {heads, tokens, dim});
  crisp::write_npy(args.lse_path, lse.data(), {heads, tokens});
  if (!args.json_path.empty()) {
    crisp_cli::write_text_file("--json", args.json_path, crisp_cli::plan_to_json(plan).dump(1) + "\n");
  }
  // With the plan's JSON on standard output the summary goes to stderr, so stdout stays one JSON
  // document (as `crisp plan` does).
  std::FILE* summary = crisp_cli::is_stdout_path(args.json_path) ? stderr : stdout;
  std::fprintf(summary, "attend: policy %s, %lld query heads, n_q = %lld of n_k = %lld: density %.4f -> %s, %s\n",
               config.preset.c_str(), static_cast<long long>(heads), static_cast<long long>(tokens),
               static_cast<long long>(k_view.tokens()), plan.density(), args.out_path.c_str(), args.lse_path.c_str());
}

}  // namespace

void register_attend_command(CLI::App& app) {
  auto args = std::make_shared<AttendArgs>();
  CLI::App* sub = app.add_subcommand(
      "attend",
      "Plan and run block-sparse causal attention on one sequence (.npy in, .npy out); with n_q < n_k the "
      "queries are the last n_q positions (a chunk over a KV prefix, bottom-right causal)");
  sub->add_option("--q", args->q_path, "Queries, .npy float32/float16 [Hq, n_q, d]")->required();
  sub->add_option("--k", args->k_path, "Keys, .npy float32/float16 [Hkv, n_k, d], n_k >= n_q")->required();
  sub->add_option("--v", args->v_path, "Values, .npy float32/float16 [Hkv, n_k, d]")->required();
  sub->add_option("--out", args->out_path, "Output O, .npy float32 [Hq, n_q, d] (a file; not standard output)")->required();
  sub->add_option("--lse", args->lse_path, "Output LSE (natural log), .npy float32 [Hq, n_q] (a file; not standard output)")
      ->required();
  sub->add_option("--json", args->json_path, "Also write the plan that was run as JSON ('-': standard output, the summary then on stderr)");
  crisp_cli::add_policy_options(*sub, args->policy);
  sub->callback([args] { run_attend(*args); });
}
