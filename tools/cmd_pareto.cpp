// tools/cmd_pareto.cpp — `crisp eval pareto`: the frontier of knob sweeps against density.
//
// Each --sweep names a preset and lists of knob values; every point of their cartesian product runs
// (src/eval/sweep.h). On captures (--captures, written by `crisp-llama-eval capture`): density,
// recall, recall of the top-mass blocks and output error of every head. On the structured synthetic
// workload (--structured): density, needle blocks kept, output error. One resumable JSON
// (src/eval/frontier.h); a table on stdout. The frontier on a real model's NIAH answers is
// `crisp-llama-eval pareto` (llama.cpp).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "eval/frontier.h"
#include "eval/structured_frontier.h"
#include "eval/splits.h"
#include "eval/sweep.h"
#include "io_util.h"
#include "progress.h"
#include "validators.h"

namespace {

namespace ce = crisp::eval;
using nlohmann::json;

struct ParetoArgs {
  std::vector<std::string> sweeps;
  std::vector<std::string> sweep_files;
  std::vector<std::string> captures;
  double top_mass_share = 0.9;
  bool structured = false;
  std::vector<std::string> workload_settings;
  // NOTE: 256 queries measure the output error well at the default lengths (2k-8k) and cheaply;
  // unless given, shorter --lengths use all of their queries.
  int64_t error_queries = 256;
  bool error_queries_given = false;
  std::vector<int64_t> lengths{2048, 4096, 8192};
  int64_t seeds = 1;
  uint64_t seed = 0;
  std::string split, splits_path;
  int threads = 0;
  std::string json_path;
  int64_t stop_after = 0;
  bool quiet = false;
};

std::vector<ce::FrontierPoint> sweep_points(const ParetoArgs& args) {
  std::vector<ce::Sweep> sweeps;
  for (const std::string& text : args.sweeps) sweeps.push_back(ce::parse_sweep(text, "--sweep"));
  for (const std::string& path : args.sweep_files) {
    for (ce::Sweep& s : ce::load_sweep_file(path, "--sweep-file")) sweeps.push_back(std::move(s));
  }
  if (sweeps.empty()) {
    throw crisp::Error("--sweep", "none given", "at least one --sweep (e.g. crisp:alpha=0.5,1,2) or --sweep-file");
  }
  // The points of both kinds together: named by the options the sweeps came from.
  const std::string argument = args.sweep_files.empty() ? "--sweep" : args.sweeps.empty() ? "--sweep-file" : "--sweep, --sweep-file";
  return ce::expand_sweeps(sweeps, argument);
}

void print_structured_table(const json& doc) {
  std::printf("%7s  %-44s %8s %8s %8s %9s %9s %8s %8s %8s\n", "tokens", "point", "density", "needles", "ndl min",
              "rel err", "err max", "d struct", "d noloc", "d diff");
  std::vector<json> rows(doc.at("rows").begin(), doc.at("rows").end());
  std::stable_sort(rows.begin(), rows.end(),
                   [](const json& a, const json& b) { return a.at("length").get<int64_t>() < b.at("length").get<int64_t>(); });
  auto cell = [](const json& v, const char* format) {
    char text[32] = "-";
    if (!v.is_null()) std::snprintf(text, sizeof text, format, v.get<double>());
    return std::string(text);
  };
  for (const json& r : rows) {
    std::printf("%7lld  %-44s %8s %8s %8s %9s %9s %8s %8s %8s\n", static_cast<long long>(r.at("length").get<int64_t>()),
                r.at("point").get<std::string>().c_str(), cell(r.at("density_mean"), "%.4f").c_str(),
                cell(r.at("needles_kept_mean"), "%.4f").c_str(), cell(r.at("needles_kept_min"), "%.4f").c_str(),
                cell(r.at("rel_error_mean"), "%.5f").c_str(), cell(r.at("rel_error_max"), "%.5f").c_str(),
                cell(r.at("density_structured"), "%.4f").c_str(), cell(r.at("density_no_local"), "%.4f").c_str(),
                cell(r.at("density_diffuse"), "%.4f").c_str());
  }
  std::printf("needles: share of (query block, needle block) pairs kept, mean over the heads that retrieve needles "
              "(min: the worst head); rel err: output error of the last queries against dense; d struct / d noloc / "
              "d diff: density of the structured heads, of those without local structure, of the diffuse ones; all "
              "averaged over the workloads (seeds).\n");
}

void print_captures_table(const json& doc) {
  std::printf("%7s  %-44s %8s %8s %8s %8s %8s %9s\n", "tokens", "point", "density", "recall", "rec min", "top90",
              "top min", "rel err");
  std::vector<json> rows(doc.at("rows").begin(), doc.at("rows").end());
  std::stable_sort(rows.begin(), rows.end(),
                   [](const json& a, const json& b) { return a.at("length").get<int64_t>() < b.at("length").get<int64_t>(); });
  for (const json& r : rows) {
    std::printf("%7lld  %-44s %8.4f %8.5f %8.5f %8.5f %8.5f %9.5f\n", static_cast<long long>(r.at("length").get<int64_t>()),
                r.at("point").get<std::string>().c_str(), r.at("density_mean").get<double>(), r.at("recall_mean").get<double>(),
                r.at("recall_min").get<double>(), r.at("top_mass_recall_mean").get<double>(),
                r.at("top_mass_recall_min").get<double>(), r.at("rel_error_mean").get<double>());
  }
  std::printf("recall: mean share of each query's true attention mass kept (min: the worst query); top90: share "
              "of the blocks that hold the top 90%% of each query-block row's true mass that are kept; rel err: "
              "relative output error against dense; all averaged over heads and layers.\n");
}

void run_pareto(const ParetoArgs& given) {
  ParetoArgs args = given;
  // --json is this command's own (resumable) output; an input file given as --json would be overwritten.
  std::vector<std::pair<std::string, std::string>> inputs = {{"--splits", args.splits_path}};
  for (const std::string& path : args.sweep_files) inputs.push_back({"--sweep-file", path});
  crisp_cli::require_outputs_not_inputs({{"--json", args.json_path}}, inputs);
  crisp_cli::require_not_capture_file("--json", args.json_path, args.captures);
  const std::vector<ce::FrontierPoint> points = sweep_points(args);
  ce::FrontierHooks hooks;
  if (!args.quiet) {
    hooks.progress = [](const std::string& line) {
      crisp_cli::finish_progress_line();
      std::fprintf(stderr, "crisp: %s\n", line.c_str());
    };
  }
  const bool captures = !args.captures.empty();
  if (args.structured && captures)
    throw crisp::Error("--structured", "is given with --captures", "one source: --captures or --structured");
  if (!args.structured && !captures) {
    throw crisp::Error("--captures", "missing",
                       "--captures DIR... (crisp-llama-eval capture) or --structured; the frontier on a model's NIAH "
                       "answers is `crisp-llama-eval pareto`");
  }
  if (args.structured) {
    ce::StructuredFrontierSettings s;
    for (const std::string& setting : args.workload_settings) crisp::set_workload_field(s.workload, setting, "--workload-set");
    s.lengths = args.lengths;
    if (!args.split.empty()) {
      // --splits, else eval/splits.json of the source tree this binary was built from.
      const std::string path = args.splits_path.empty() ? ce::default_splits_path(CRISP_SOURCE_DIR) : args.splits_path;
      s.seeds = ce::load_splits(path, "--splits").structured_split(args.split, "--split");
    } else {
      // --seed .. --seed + --seeds - 1, without wrapping past 2^64 - 1 to seed 0.
      if (args.seed > std::numeric_limits<uint64_t>::max() - static_cast<uint64_t>(args.seeds - 1))
        throw crisp::Error("--seed", std::to_string(args.seed) + " with --seeds " + std::to_string(args.seeds) +
                                         " runs past the largest seed, 2^64 - 1",
                           "--seed + --seeds - 1 <= " + std::to_string(std::numeric_limits<uint64_t>::max()));
      for (int64_t i = 0; i < args.seeds; ++i) s.seeds.push_back(args.seed + static_cast<uint64_t>(i));
    }
    const int64_t shortest = *std::min_element(args.lengths.begin(), args.lengths.end());
    if (args.error_queries_given && args.error_queries > shortest)
      throw crisp::Error("--error-queries", "is " + std::to_string(args.error_queries) + " but --lengths has " +
                                                std::to_string(shortest),
                         "at most the shortest length's tokens");
    s.error_queries = args.error_queries_given ? args.error_queries : std::min(args.error_queries, shortest);
    s.options.num_threads = args.threads;
    s.stop_after = args.stop_after;
    json settings = {{"mode", "structured"},     {"workload_set", args.workload_settings},
                     {"lengths", s.lengths},      {"seeds", s.seeds},
                     {"split", args.split.empty() ? json(nullptr) : json(args.split)},
                     {"error_queries", s.error_queries}};
    ce::FrontierFile file = ce::FrontierFile::open(args.json_path, settings, "--json");
    const int64_t computed = ce::run_structured_frontier(s, points, file, hooks);
    print_structured_table(file.document());
    std::printf("%s: %lld workloads computed in this run; %s\n", args.json_path.c_str(), static_cast<long long>(computed),
                file.document().at("complete").get<bool>() ? "complete" : "INCOMPLETE (re-run to resume)");
    return;
  }
  json settings = {{"mode", "captures"}, {"captures", args.captures}, {"top_mass_share", args.top_mass_share}};
  ce::FrontierFile file = ce::FrontierFile::open(args.json_path, settings, "--json");
  ce::CaptureFrontierSettings s;
  s.captures = args.captures;
  s.top_mass_share = args.top_mass_share;
  s.options.num_threads = args.threads;
  s.stop_after = args.stop_after;
  const int64_t computed = ce::run_capture_frontier(s, points, file, hooks);
  print_captures_table(file.document());
  const json& runs = file.document().at("runs");
  std::printf("%s: %lld layers computed in this run, %lld (point, layer) pairs found done before it; %s\n",
              args.json_path.c_str(), static_cast<long long>(computed), static_cast<long long>(runs.back().at("found").get<int64_t>()),
              file.document().at("complete").get<bool>() ? "complete" : "INCOMPLETE (re-run to resume)");
}

}  // namespace

void register_eval_pareto(CLI::App& eval) {
  auto args = std::make_shared<ParetoArgs>();
  CLI::App* sub = eval.add_subcommand(
      "pareto",
      "The frontier of knob sweeps against density: on captures (--captures), recall, recall of the top-mass blocks "
      "and output error per head; on the structured workload (--structured), needle blocks kept and output error. "
      "One resumable JSON (re-run with the same --json to continue), a table on stdout. On a real model's NIAH "
      "answers: crisp-llama-eval pareto (llama.cpp)");
  sub->add_option("--sweep", args->sweeps,
                  "A sweep: POLICY or POLICY:KNOB=V1,V2[;KNOB=V1,...] (cartesian product; any knob of "
                  "`crisp plan --set`), e.g. \"crisp:alpha=0.5,1,2;rho=1.5,2.2\"; repeatable. dense is always run")
      ->take_all();
  sub->add_option("--sweep-file", args->sweep_files,
                  "JSON list of sweeps: strings as --sweep, or {\"policy\": P, \"knobs\": {\"KNOB\": [values]}}");
  sub->add_option("--json", args->json_path, "The frontier JSON: written after each sample; resumed when it exists")
      ->required();
  sub->add_option("--captures", args->captures, "Capture directories of `crisp-llama-eval capture`: measure on them")
      ->expected(1, -1);
  sub->add_option("--top-mass-share", args->top_mass_share,
                  "Captures: the top-mass blocks of a query-block row are the fewest heaviest ones holding this share "
                  "of its true mass")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1.0));
  CLI::Option* structured =
      sub->add_flag("--structured", args->structured,
                    "Measure on the structured synthetic workload (docs/workload.md) instead: density, "
                    "needle blocks kept, output error of the last queries; seeds from --split (eval/splits.json "
                    "'structured') or --seed/--seeds, one sequence per --lengths entry");
  sub->add_option("--workload-set", args->workload_settings,
                  "Structured: a workload field, FIELD=VALUE (e.g. background_scale=2, no_local_head_share=0.5, "
                  "num_q_heads=8); repeatable")
      ->needs(structured);
  CLI::Option* error_queries_option = sub->add_option("--error-queries", args->error_queries,
                  "Structured: the output error is measured over the last this many queries")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->needs(structured);
  sub->add_option("--lengths", args->lengths, "Structured: one sequence of each length (tokens)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(int64_t{64}, int64_t{1} << 22))
      ->needs(structured);
  CLI::Option* seeds = sub->add_option("--seeds", args->seeds, "Structured: workloads, seeds --seed, --seed+1, ...")
                           ->capture_default_str()
                           ->check(CLI::Range(int64_t{1}, int64_t{1000}))
                           ->needs(structured);
  CLI::Option* seed = sub->add_option("--seed", args->seed, "Structured: the first seed")
                          ->capture_default_str()  // uint64_t: require_decimal_numbers refuses -1
                          ->needs(structured);
  sub->add_option("--split", args->split, "Structured: the workload seeds of a split of eval/splits.json (tuning or test)")
      ->check(CLI::IsMember({"tuning", "test"}))
      ->excludes(seeds)
      ->excludes(seed)
      ->needs(structured);
  sub->add_option("--splits", args->splits_path, "The splits file of --split (default: eval/splits.json of the source tree)");
  crisp_cli::add_threads_option(*sub, args->threads);
  sub->add_option("--stop-after", args->stop_after,
                  "Stop after this many layers (structured: workloads) computed in this run; re-run to resume")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  sub->add_flag("--quiet", args->quiet, "No progress lines on stderr");
  sub->callback([args, error_queries_option] {
    args->error_queries_given = error_queries_option->count() > 0;
    run_pareto(*args);
  });
}
