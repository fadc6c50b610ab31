// tools/cmd_pareto.cpp — `crisp eval pareto`: the frontier of knob sweeps against density.
//
// Each --sweep names a preset and lists of knob values; every point of their cartesian product runs
// (src/eval/sweep.h). On a real model (default): NIAH samples per length, accuracy and the share of
// dense's correct answers kept. On captures (--captures): density, recall, recall of the top-mass
// blocks and output error of every head. One resumable JSON (src/eval/frontier.h); a table on stdout.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "eval/frontier.h"
#include "eval/structured_frontier.h"
#include "eval/niah.h"
#include "eval/splits.h"
#include "eval/sweep.h"
#include "eval_splits.h"
#include "model/llama.h"
#include "default_paths.h"
#include "model_loading.h"
#include "progress.h"
#include "validators.h"

namespace {

namespace ce = crisp::eval;
namespace cm = crisp::model;
using nlohmann::json;

struct ParetoArgs {
  std::vector<std::string> sweeps;
  std::vector<std::string> sweep_files;
  std::vector<std::string> captures;
  double top_mass_share = 0.9;
  bool structured = false;
  std::vector<std::string> workload_settings;
  int64_t error_queries = 256;
  std::string model_path;
  std::vector<std::string> tasks{"niah_single", "niah_multikey", "passkey", "niah_prose"};
  std::vector<int64_t> lengths{2048, 4096, 8192};
  std::vector<double> depths{0.1, 0.5, 0.9};
  int64_t seeds = 1;
  uint64_t seed = 0;
  std::string split, splits_path;
  std::string prose_path;
  int64_t max_new_tokens = 0;
  std::string rope_scaling = "auto";
  int threads = 0;
  std::string backend = "cpu";
  std::string cuda_attention = "f16";
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
  return ce::expand_sweeps(sweeps, "--sweep");
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

void print_table(const json& doc, bool captures) {
  if (captures) {
    std::printf("%7s  %-44s %8s %8s %8s %8s %8s %9s\n", "tokens", "point", "density", "recall", "rec min", "top90",
                "top min", "rel err");
  } else {
    std::printf("%7s  %-44s %6s %6s %8s %5s\n", "length", "point", "acc", "kept", "density", "n");
  }
  std::vector<json> rows(doc.at("rows").begin(), doc.at("rows").end());
  std::stable_sort(rows.begin(), rows.end(),
                   [](const json& a, const json& b) { return a.at("length").get<int64_t>() < b.at("length").get<int64_t>(); });
  for (const json& r : rows) {
    const std::string point = r.at("point").get<std::string>();
    if (captures) {
      std::printf("%7lld  %-44s %8.4f %8.5f %8.5f %8.5f %8.5f %9.5f\n", static_cast<long long>(r.at("length").get<int64_t>()),
                  point.c_str(), r.at("density_mean").get<double>(), r.at("recall_mean").get<double>(),
                  r.at("recall_min").get<double>(), r.at("top_mass_recall_mean").get<double>(),
                  r.at("top_mass_recall_min").get<double>(), r.at("rel_error_mean").get<double>());
    } else {
      char kept[16] = "-";
      if (!r.at("kept_of_dense").is_null()) std::snprintf(kept, sizeof kept, "%.3f", r.at("kept_of_dense").get<double>());
      std::printf("%7lld  %-44s %6.3f %6s %8.4f %5lld\n", static_cast<long long>(r.at("length").get<int64_t>()),
                  point.c_str(), r.at("accuracy").get<double>(), kept, r.at("mean_density").get<double>(),
                  static_cast<long long>(r.at("samples").get<int64_t>()));
    }
  }
  if (captures) {
    std::printf("recall: mean share of each query's true attention mass kept (min: the worst query); top90: share "
                "of the blocks that hold the top 90%% of each query-block row's true mass that are kept; rel err: "
                "relative output error against dense; all averaged over heads and layers.\n");
  } else {
    std::printf("acc: accuracy; kept: of the samples dense answers, the share the point answers too; density: mean "
                "prefill density (kept causal blocks, mean over layers).\n");
  }
}

void run_pareto(const ParetoArgs& given) {
  ParetoArgs args = given;
  const std::vector<ce::FrontierPoint> points = sweep_points(args);
  crisp_cli::Progress progress(!args.quiet);
  ce::FrontierHooks hooks;
  if (!args.quiet) {
    hooks.progress = [](const std::string& line) {
      crisp_cli::finish_progress_line();
      std::fprintf(stderr, "crisp: %s\n", line.c_str());
    };
  }
  const bool captures = !args.captures.empty();
  int64_t computed = 0;
  std::unique_ptr<ce::FrontierFile> file;
  if (args.structured && captures)
    throw crisp::Error("--structured", "is given with --captures", "one source: the model, --captures or --structured");
  if (args.structured) {
    ce::StructuredFrontierSettings s;
    for (const std::string& setting : args.workload_settings) crisp::set_workload_field(s.workload, setting, "--workload-set");
    s.lengths = args.lengths;
    if (!args.split.empty()) {
      s.seeds = crisp_cli::load_eval_splits(args.splits_path).structured_split(args.split, "--split");
    } else {
      for (int64_t i = 0; i < args.seeds; ++i) s.seeds.push_back(args.seed + static_cast<uint64_t>(i));
    }
    s.error_queries = args.error_queries;
    s.options.num_threads = args.threads;
    s.stop_after = args.stop_after;
    json settings = {{"mode", "structured"},     {"workload_set", args.workload_settings},
                     {"lengths", s.lengths},      {"seeds", s.seeds},
                     {"split", args.split.empty() ? json(nullptr) : json(args.split)},
                     {"error_queries", s.error_queries}};
    file = std::make_unique<ce::FrontierFile>(ce::FrontierFile::open(args.json_path, settings, "--json"));
    computed = ce::run_structured_frontier(s, points, *file, hooks);
    print_structured_table(file->document());
    std::printf("%s: %lld workloads computed in this run; %s\n", args.json_path.c_str(), static_cast<long long>(computed),
                file->document().at("complete").get<bool>() ? "complete" : "INCOMPLETE (re-run to resume)");
    return;
  }
  if (captures) {
    json settings = {{"mode", "captures"}, {"captures", args.captures}, {"top_mass_share", args.top_mass_share}};
    file = std::make_unique<ce::FrontierFile>(ce::FrontierFile::open(args.json_path, settings, "--json"));
    ce::CaptureFrontierSettings s;
    s.captures = args.captures;
    s.top_mass_share = args.top_mass_share;
    s.options.num_threads = args.threads;
    s.stop_after = args.stop_after;
    computed = ce::run_capture_frontier(s, points, *file, hooks);
  } else {
    const std::unique_ptr<ce::EvalSplits> splits =
        crisp_cli::apply_niah_split(args.split, args.splits_path, &args.seed, &args.seeds, &args.depths);
    ce::NiahFrontierSettings frontier;
    ce::NiahGridSettings& s = frontier.samples;
    for (const std::string& name : args.tasks) s.tasks.push_back(ce::parse_niah_task(name, "--tasks"));
    for (double depth : args.depths) {
      if (!(depth >= 0.0 && depth <= 1.0)) throw crisp::Error("--depths", "has " + std::to_string(depth), "fractions in [0, 1]");
    }
    s.lengths = args.lengths;
    s.depths = args.depths;
    s.seeds = args.seeds;
    s.seed = args.seed;
    s.max_new_tokens = args.max_new_tokens;
    s.rope_scaling = args.rope_scaling;
    frontier.stop_after = args.stop_after;
    s.run.threads = args.threads;
    s.run.backend = cm::parse_model_backend(args.backend, "--backend");
    s.run.cuda_attention = cm::parse_cuda_prefill_attention(args.cuda_attention);
    cm::require_model_backend(s.run.backend, "--backend");
    std::vector<std::string> prose;
    const bool with_prose = std::find(s.tasks.begin(), s.tasks.end(), ce::NiahTask::prose) != s.tasks.end();
    const std::string prose_path =
        with_prose ? crisp_cli::data_file_or_default("--prose", args.prose_path, crisp_cli::kQaPromptsFile) : "";
    const std::string model_path = crisp_cli::model_or_default(args.model_path);
    if (with_prose) {
      const auto documents = ce::load_qa_documents(prose_path, "--prose");
      prose = splits ? ce::split_prose_paragraphs(documents, *splits, args.split, "--split")
                     : ce::all_prose_paragraphs(documents);
    }
    json task_names = json::array();
    for (ce::NiahTask t : s.tasks) task_names.push_back(ce::to_string(t));
    const json settings = {{"mode", "niah"},
                           {"model", std::filesystem::path(model_path).filename().string()},
                           {"tasks", task_names},
                           {"lengths", s.lengths},
                           {"depths", s.depths},
                           {"seeds", s.seeds},
                           {"base_seed", s.seed},
                           {"split", args.split.empty() ? json(nullptr) : json(args.split)},
                           {"prose", with_prose ? json(std::filesystem::path(prose_path).filename().string())
                                                : json(nullptr)},
                           {"max_new_tokens", s.max_new_tokens},
                           {"rope_scaling", s.rope_scaling},
                           {"backend", args.backend},
                           {"cuda_attention", s.run.backend == cm::ModelBackend::cuda ? args.cuda_attention : ""},
                           {"decoding", "greedy"},
                           {"chat_template", true}};
    file = std::make_unique<ce::FrontierFile>(ce::FrontierFile::open(args.json_path, settings, "--json"));
    const crisp_cli::LoadedModel loaded = crisp_cli::load_model(model_path, progress);
    if (s.run.backend != cm::ModelBackend::cpu) {
      progress.begin("warming up the " + args.backend + " backend");
      cm::warm_up_backend(loaded.model, s.run);
      progress.done();
    }
    computed = ce::run_niah_frontier(loaded.model, loaded.tokenizer, frontier, points, prose, *file, hooks);
  }
  print_table(file->document(), captures);
  const json& runs = file->document().at("runs");
  std::printf("%s: %lld %s computed in this run, %lld (point, %s) pairs found done before it; %s\n",
              args.json_path.c_str(), static_cast<long long>(computed), captures ? "layers" : "samples",
              static_cast<long long>(runs.back().at("found").get<int64_t>()), captures ? "layer" : "sample",
              file->document().at("complete").get<bool>() ? "complete" : "INCOMPLETE (re-run to resume)");
}

}  // namespace

void register_eval_pareto(CLI::App& eval) {
  auto args = std::make_shared<ParetoArgs>();
  CLI::App* sub = eval.add_subcommand(
      "pareto",
      "The frontier of knob sweeps against density: on a real model, NIAH accuracy and the share of dense's correct "
      "answers kept per length; with --captures, recall, recall of the top-mass blocks and output error per head. "
      "One resumable JSON (re-run with the same --json to continue), a table on stdout");
  sub->add_option("--sweep", args->sweeps,
                  "A sweep: POLICY or POLICY:KNOB=V1,V2[;KNOB=V1,...] (cartesian product; any knob of "
                  "`crisp plan --set`), e.g. \"crisp:alpha=0.5,1,2;rho=1.5,2.2\"; repeatable. dense is always run")
      ->take_all();
  sub->add_option("--sweep-file", args->sweep_files,
                  "JSON list of sweeps: strings as --sweep, or {\"policy\": P, \"knobs\": {\"KNOB\": [values]}}");
  sub->add_option("--json", args->json_path, "The frontier JSON: written after each sample; resumed when it exists")
      ->required();
  sub->add_option("--captures", args->captures, "Capture directories of 'crisp capture': measure on them instead of the model")
      ->expected(1, -1);
  sub->add_option("--top-mass-share", args->top_mass_share,
                  "Captures: the top-mass blocks of a query-block row are the fewest heaviest ones holding this share "
                  "of its true mass")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1.0));
  CLI::Option* structured =
      sub->add_flag("--structured", args->structured,
                    "Measure on the structured synthetic workload (docs/workload.md) instead of the model: density, "
                    "needle blocks kept, output error of the last queries; seeds from --split (eval/splits.json "
                    "'structured') or --seed/--seeds, one sequence per --lengths entry");
  sub->add_option("--workload-set", args->workload_settings,
                  "Structured: a workload field, FIELD=VALUE (e.g. background_scale=2, no_local_head_share=0.5, "
                  "num_q_heads=8); repeatable")
      ->needs(structured);
  sub->add_option("--error-queries", args->error_queries,
                  "Structured: the output error is measured over the last this many queries")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->needs(structured);
  crisp_cli::add_model_option(sub, &args->model_path);
  crisp_cli::add_niah_grid_options(sub, {&args->tasks, &args->lengths, &args->depths, &args->seeds, &args->seed,
                                          &args->split, &args->splits_path, &args->prose_path, &args->max_new_tokens,
                                          &args->rope_scaling});
  crisp_cli::add_threads_option(*sub, args->threads);
  crisp_cli::add_model_backend_options(sub, &args->backend, &args->cuda_attention,
                                       "Model backend: cpu, or cuda (a CUDA build on a GPU machine)");
  sub->add_option("--stop-after", args->stop_after,
                  "Stop after this many samples (captures: layers) computed in this run; re-run to resume")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  sub->add_flag("--quiet", args->quiet, "No progress lines on stderr");
  sub->callback([args] { run_pareto(*args); });
}
