// tools/policy_options.cpp — --policy / --set / --block / --precision / --threads, shared by
// `crisp plan` and `crisp attend`.
#include <string>

#include "commands.h"
#include "validators.h"

namespace crisp_cli {

void add_policy_options(CLI::App& sub, PolicyOptions& options) {
  sub.add_option("--policy", options.policy,
                 "Preset to start from: crisp, flexprefill, minference or dense")
      ->capture_default_str();
  sub.add_option("--set", options.sets,
                 "Override one parameter, key=value (repeatable), with the spec's names: "
                 "routing, tau_proxy, rho, tau, w_sink, w_local, vs_budget, alpha, gamma, "
                 "vertical_tokens, slash_tokens, pe_gamma, slash_cover, min_budget, max_budget, "
                 "dense_below, softmax_scale, block_size")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  sub.add_option("--block", options.block_size, "Block size B: 64 or 128 (default: the preset's, 128)")
      ->type_name("INT");
  sub.add_option("--precision", options.precision,
                 "CPU arithmetic: f32 (fp32 compute, fp64 sums) or f64 (the fp64 reference)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "f64"}));
  sub.add_option("--threads", options.threads, "CPU threads (0 = all hardware threads)")
      ->capture_default_str()
      ->check(crisp_cli::kNonNegativeInteger);
}

crisp::Config make_config(const PolicyOptions& options) {
  crisp::Config config = crisp::Config::from_preset(options.policy);
  for (const std::string& assignment : options.sets) config.set(assignment);
  // --block is a shorthand of --set block_size=...; it is applied last so it wins.
  if (!options.block_size.empty()) config.set("block_size", options.block_size);
  config.validate();
  return config;
}

crisp::Options make_run_options(const PolicyOptions& options) {
  crisp::Options run;
  run.precision = options.precision == "f64" ? crisp::Precision::f64 : crisp::Precision::f32;
  run.num_threads = options.threads;
  return run;
}

}  // namespace crisp_cli
