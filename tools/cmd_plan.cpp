// tools/cmd_plan.cpp — `crisp plan`: the sparse layout of .npy inputs, as JSON.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "commands.h"
#include "crisp/npy.h"
#include "input_checks.h"
#include "io_util.h"
#include "plan_json.h"

namespace {

struct PlanArgs {
  crisp_cli::PolicyOptions policy;
  std::string q_path;
  std::string k_path;
  std::string json_path;
};

void run_plan(const PlanArgs& args) {
  crisp_cli::require_outputs_not_inputs({{"--json", args.json_path}}, {{"--q", args.q_path}, {"--k", args.k_path}});
  crisp_cli::require_writable("--json", args.json_path);
  const crisp::Config config = crisp_cli::make_config(args.policy);
  crisp::NpyArray q = crisp_cli::read_input("--q", args.q_path);
  crisp::NpyArray k = crisp_cli::read_input("--k", args.k_path);
  const std::string q_argument = "--q " + args.q_path, k_argument = "--k " + args.k_path;
  const crisp::TensorView q_view = q.view(q_argument, 3);
  const crisp::TensorView k_view = k.view(k_argument, 3);
  const crisp::Batch batch = crisp_cli::one_sequence(q_view, q_argument, k_view, k_argument);

  crisp::Plan plan;
  try {
    plan = crisp::plan(q_view, k_view, config, batch, crisp_cli::make_run_options(args.policy));
  } catch (const crisp::Error& e) {  // the value checks name the library's arguments
    throw crisp_cli::renamed_error(e, {{"q", q_argument}, {"k", k_argument}});
  }
  crisp_cli::write_text_file("--json", args.json_path, crisp_cli::plan_to_json(plan).dump(1) + "\n");

  // With the JSON on standard output the summary goes to stderr, so stdout stays one JSON document.
  std::FILE* summary = crisp_cli::is_stdout_path(args.json_path) ? stderr : stdout;
  std::fprintf(summary, "plan: policy %s, %lld query heads, n_q = %lld of n_k = %lld, B = %d: density %.4f, VS share %.2f -> %s\n",
              config.preset.c_str(), static_cast<long long>(plan.num_q_heads),
              static_cast<long long>(plan.sequences.front().n_q), static_cast<long long>(plan.sequences.front().n_k),
              plan.block_size, plan.density(),
              plan.vs_share(), args.json_path.c_str());
}

}  // namespace

void register_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* sub = app.add_subcommand(
      "plan", "Plan the sparse layout of one sequence (.npy inputs) and write it as JSON");
  sub->add_option("--q", args->q_path, "Queries, .npy float32/float16/float64 [Hq, n_q, d] (the last n_q positions)")->required();
  sub->add_option("--k", args->k_path, "Keys, .npy float32/float16/float64 [Hkv, n_k, d], n_k >= n_q")->required();
  sub->add_option("--json", args->json_path, "Output JSON file ('-': standard output)")->required();
  crisp_cli::add_policy_options(*sub, args->policy);
  sub->callback([args] { run_plan(*args); });
}
