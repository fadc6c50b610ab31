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

// Output rows of `T` (float with --precision f32, double with f64), written as .npy.
template <typename T>
struct Outputs {
  std::vector<T> out, lse;
  Outputs(int64_t heads, int64_t tokens, int64_t dim)
      : out(static_cast<std::size_t>(heads * tokens * dim)), lse(static_cast<std::size_t>(heads * tokens)) {}
};

// Runs the attention into T outputs and writes them (and the plan's JSON) as the command's outputs:
// all of them or, when one cannot be written, none.
template <typename T>
crisp::Plan attend_and_write(const AttendArgs& args, const crisp::Config& config, const crisp::TensorView& q,
                             const crisp::TensorView& k, const crisp::TensorView& v, const crisp::Batch& batch,
                             const std::string& q_argument, const std::string& k_argument,
                             const std::string& v_argument) {
  const int64_t heads = q.heads(), tokens = q.tokens(), dim = q.dim();
  const crisp::DType dtype = sizeof(T) == sizeof(double) ? crisp::DType::f64 : crisp::DType::f32;
  Outputs<T> o(heads, tokens, dim);
  crisp::Plan plan;
  try {
    plan = crisp::prefill(q, k, v, config, crisp::TensorView::contiguous(o.out.data(), dtype, heads, tokens, dim),
                          crisp::TensorView::contiguous2d(o.lse.data(), dtype, heads, tokens), batch,
                          crisp_cli::make_run_options(args.policy));
  } catch (const crisp::Error& e) {  // the value checks name the library's arguments
    throw crisp_cli::renamed_error(e, {{"q", q_argument},
                                       {"k", k_argument},
                                       {"v", v_argument},
                                       {"out", "--out " + args.out_path},
                                       {"lse", "--lse " + args.lse_path}});
  }
  // All of them or none: a failed write leaves the outputs as they were (io_util.h, OutputFiles).
  crisp_cli::OutputFiles files;
  files.write("--out", args.out_path, [&](const std::string& target) { crisp::write_npy(target, o.out.data(), {heads, tokens, dim}); });
  files.write("--lse", args.lse_path, [&](const std::string& target) { crisp::write_npy(target, o.lse.data(), {heads, tokens}); });
  if (!args.json_path.empty())
    files.write("--json", args.json_path, [&](const std::string& target) {
      crisp_cli::write_text_file("--json", target, crisp_cli::plan_to_json(plan).dump(1) + "\n");
    });
  files.commit();
  return plan;
}

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
  crisp::NpyArray q = crisp_cli::read_input("--q", args.q_path);
  crisp::NpyArray k = crisp_cli::read_input("--k", args.k_path);
  crisp::NpyArray v = crisp_cli::read_input("--v", args.v_path);
  const std::string q_argument = "--q " + args.q_path, k_argument = "--k " + args.k_path,
                    v_argument = "--v " + args.v_path;
  const crisp::TensorView q_view = q.view(q_argument, 3);
  const crisp::TensorView k_view = k.view(k_argument, 3);
  const crisp::TensorView v_view = v.view(v_argument, 3);
  // The shapes before the outputs are allocated: an empty or mismatched input is named as such,
  // not reported as an allocation failure.
  const crisp::Batch batch = crisp_cli::one_sequence(q_view, q_argument, k_view, k_argument, &v_view, v_argument);

  // q's extents are valid and its elements are in memory: O is as many values, LSE fewer. With
  // --precision f64 (the float64 reference) they are written as float64.
  const bool f64 = args.policy.precision == "f64";
  const crisp::Plan plan =
      f64 ? attend_and_write<double>(args, config, q_view, k_view, v_view, batch, q_argument, k_argument, v_argument)
          : attend_and_write<float>(args, config, q_view, k_view, v_view, batch, q_argument, k_argument, v_argument);
  // With the plan's JSON on standard output the summary goes to stderr, so stdout stays one JSON
  // document (as `crisp plan` does).
  std::FILE* summary = crisp_cli::is_stdout_path(args.json_path) ? stderr : stdout;
  std::fprintf(summary, "attend: policy %s, %lld query heads, n_q = %lld of n_k = %lld: density %.4f -> %s, %s\n",
               config.preset.c_str(), static_cast<long long>(q_view.heads()), static_cast<long long>(q_view.tokens()),
               static_cast<long long>(k_view.tokens()), plan.density(), args.out_path.c_str(), args.lse_path.c_str());
}

}  // namespace

void register_attend_command(CLI::App& app) {
  auto args = std::make_shared<AttendArgs>();
  CLI::App* sub = app.add_subcommand(
      "attend",
      "Plan and run block-sparse causal attention on one sequence (.npy in, .npy out); with n_q < n_k the "
      "queries are the last n_q positions (a chunk over a KV prefix, bottom-right causal)");
  sub->add_option("--q", args->q_path, "Queries, .npy float32/float16/float64 [Hq, n_q, d]")->required();
  sub->add_option("--k", args->k_path, "Keys, .npy float32/float16/float64 [Hkv, n_k, d], n_k >= n_q")->required();
  sub->add_option("--v", args->v_path, "Values, .npy float32/float16/float64 [Hkv, n_k, d]")->required();
  sub->add_option("--out", args->out_path,
                  "Output O, .npy [Hq, n_q, d], float32 (float64 with --precision f64; a file, not standard output)")
      ->required();
  sub->add_option("--lse", args->lse_path,
                  "Output LSE (natural log), .npy [Hq, n_q], float32 (float64 with --precision f64; a file, not "
                  "standard output)")
      ->required();
  sub->add_option("--json", args->json_path, "Also write the plan that was run as JSON ('-': standard output, the summary then on stderr)");
  crisp_cli::add_policy_options(*sub, args->policy);
  sub->callback([args] { run_attend(*args); });
}
