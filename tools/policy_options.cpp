// tools/policy_options.cpp — --policy / --set / --block / --precision / --threads, shared by
// `crisp plan` and `crisp attend`.
#include <string>
#include <vector>

#include "commands.h"
#include "input_checks.h"
#include "validators.h"

namespace crisp_cli {
namespace {

// The --set help names every key Config::set accepts (Config::parameter_names), so the list cannot
// fall behind the parameter table.
std::string set_help() {
  std::string text = "Override one parameter, key=value (repeatable), with the spec's names: ";
  const std::vector<std::string> names = crisp::Config::parameter_names();
  for (std::size_t i = 0; i < names.size(); ++i) text += (i ? ", " : "") + names[i];
  return text;
}

}  // namespace

void add_policy_options(CLI::App& sub, PolicyOptions& options) {
  sub.add_option("--policy", options.policy,
                 "Preset to start from: crisp, flexprefill, minference or dense")
      ->capture_default_str();
  sub.add_option("--set", options.sets, set_help())
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
  crisp::Config config;
  try {
    config = crisp::Config::from_preset(options.policy);
  } catch (const crisp::Error& e) {  // "preset: ...": the option the user typed is --policy
    throw renamed_error(e, {{"preset", "--policy"}});
  }
  for (const std::string& assignment : options.sets) config.set(assignment);
  // --block is a shorthand of --set block_size=...; it is applied last so it wins.
  if (!options.block_size.empty()) {
    try {
      config.set("block_size", options.block_size);
    } catch (const crisp::Error& e) {
      throw renamed_error(e, {{"block_size", "--block"}});
    }
  }
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

}  // namespace crisp_cli
