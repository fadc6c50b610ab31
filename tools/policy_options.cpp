// tools/policy_options.cpp — --policy / --set / --block / --precision / --threads, shared by
// `crisp plan` and `crisp attend`.
#include <string>
#include <vector>

#include "commands.h"
#include "validators.h"

namespace crisp_cli {

void add_policy_options(CLI::App& sub, PolicyOptions& options) {
  sub.add_option("--policy", options.policy,
                 "Preset to start from: crisp, flexprefill, minference or dense")
      ->capture_default_str();
  sub.add_option("--set", options.sets,
                 "Override one parameter, key=value (repeatable), with the spec's names: "
                 "routing, tau_proxy, rho, tau, w_sink, w_local, vs_budget, alpha, vs_floor, "
                 "uniform_alpha, uniform_floor_blocks, uniform_floor_slash_blocks, proxy_last_rows, gamma, vertical_tokens, slash_tokens, pe_rule, pe_gamma, pe_alpha, "
                 "slash_cover, min_budget, max_budget, "
                 "dense_below, softmax_scale, block_size, fine_blocks_below")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  sub.add_option("--block", options.block_size, "Block size B: 64 or 128 (default: the preset's, 128)")
      ->type_name("INT");
  sub.add_option("--precision", options.precision,
                 "CPU arithmetic: f32 (fp32 compute, fp64 sums) or f64 (the fp64 reference)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "f64"}));
  crisp_cli::add_threads_option(sub, options.threads);
}

crisp::Config make_config(const PolicyOptions& options) {
  crisp::Config config = crisp::Config::from_preset(options.policy);
  for (const std::string& assignment : options.sets) config.set(assignment);
  // --block is a shorthand of --set block_size=...; it is applied last so it wins.
  if (!options.block_size.empty()) config.set("block_size", options.block_size);
  config.validate();
  return config;
}

crisp::Config config_of_policy_spec(const std::string& spec, const std::string& argument) {
  // ':' separates the overrides (not ','): list options such as --policies split on commas.
  const std::string form = "PRESET or PRESET:key=value[:key=value...]";
  std::vector<std::string> parts;
  for (std::size_t begin = 0;;) {
    const std::size_t colon = spec.find(':', begin);
    parts.push_back(spec.substr(begin, colon == std::string::npos ? std::string::npos : colon - begin));
    if (colon == std::string::npos) break;
    begin = colon + 1;
  }
  crisp::Config config;
  try {
    config = crisp::Config::from_preset(parts.front());
  } catch (const crisp::Error&) {
    std::string names;
    for (const std::string& name : crisp::Config::preset_names()) names += (names.empty() ? "" : ", ") + name;
    throw crisp::Error(argument, "unknown policy '" + parts.front() + "' in '" + spec + "'",
                       form + ", the preset among " + names);
  }
  for (std::size_t i = 1; i < parts.size(); ++i) {
    if (parts[i].empty()) throw crisp::Error(argument, "'" + spec + "' has an empty override", form);
    try {
      config.set(parts[i]);
    } catch (const crisp::Error& e) {
      throw crisp::Error(argument, "'" + spec + "': " + e.what(), form);
    }
  }
  try {
    config.validate();
  } catch (const crisp::Error& e) {
    throw crisp::Error(argument, "'" + spec + "': " + e.what(), form);
  }
  return config;
}

crisp::Options make_run_options(const PolicyOptions& options) {
  crisp::Options run;
  run.precision = options.precision == "f64" ? crisp::Precision::f64 : crisp::Precision::f32;
  run.num_threads = options.threads;
  return run;
}

crisp::Batch one_sequence(const crisp::TensorView& q, const crisp::TensorView& k) {
  if (q.tokens() == k.tokens()) return crisp::Batch{};
  if (q.tokens() > k.tokens())
    throw crisp::Error("--q", "holds " + std::to_string(q.tokens()) + " positions but --k only " +
                                  std::to_string(k.tokens()),
                       "n_q <= n_k: the queries are the last n_q of the keys' positions");
  return crisp::Batch({0, q.tokens()}, {0, k.tokens()});
}

}  // namespace crisp_cli
