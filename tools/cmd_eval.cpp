// tools/cmd_eval.cpp — `crisp eval`: evaluations of attention policies on a real model.
//
//   crisp eval niah      needle-in-a-haystack (RULER / InfiniteBench forms, src/eval/niah.h)
//   crisp eval fidelity  per-layer attention fidelity on real maps (tools/cmd_fidelity.cpp)
//
// `eval niah` generates every sample from a seed, runs it once per policy with greedy decoding,
// scores the generated text as the official suites do, and prints one row per (task, length,
// policy): accuracy, dense's accuracy on the same samples, the share of dense's correct samples
// the policy also gets right, mean prefill density and mean time to first token.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "eval/niah.h"
#include "eval/niah_grid.h"
#include "eval/niah_run.h"
#include "eval/splits.h"
#include "eval_splits.h"
#include "io_util.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/matmul.h"
#include "default_paths.h"
#include "plan_json.h"
#include "model/tokenizer.h"
#include "model_loading.h"
#include "progress.h"
#include "validators.h"

namespace {

namespace ce = crisp::eval;
namespace cm = crisp::model;
using nlohmann::json;

struct NiahArgs {
  std::string model_path;
  std::vector<std::string> tasks;
  std::vector<int64_t> lengths{2048, 4096, 8192};
  std::vector<double> depths{0.1, 0.5, 0.9};
  int64_t seeds = 1;
  uint64_t seed = 0;
  std::vector<std::string> policies{"dense", "crisp", "flexprefill", "minference"};
  int64_t max_new_tokens = 0;  // 0: per task (eval::default_max_new_tokens)
  bool no_answer_prefix = false;
  std::string rope_scaling = "auto";
  std::string prose_path;
  std::string split;        // "tuning" or "test": seed, seeds, depths and prose from the splits file
  std::string splits_path;  // the splits file (default: eval/splits.json of the source tree)
  std::string json_path;
  int threads = 0;
  std::string backend = "cpu";
  std::string cuda_attention = "f16";
  std::string dump_samples;  // JSONL: one line per sample (prompt ids, text, expected, scoring)
  std::string score_path;    // JSONL of outputs to score (no model run)
  bool dry_run = false;
  bool quiet = false;
};

// The niah_prose haystack: every document of the QA file, or with --split only the documents of
// the split's prompts (the test split without those any other split's prompts share).
std::vector<std::string> load_prose(const NiahArgs& args, const ce::EvalSplits* splits) {
  const std::vector<std::vector<std::string>> documents =
      ce::load_qa_documents(crisp_cli::data_file_or_default("--prose", args.prose_path, crisp_cli::kQaPromptsFile), "--prose");
  if (splits == nullptr) return ce::all_prose_paragraphs(documents);
  return ce::split_prose_paragraphs(documents, *splits, args.split, "--split");
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return text;
}

std::string cpu_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const std::size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

std::string format_ratio(double value, bool present) {
  if (!present) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", value);
  return text;
}

void score_outputs(const NiahArgs& args);

using NiahCells = std::map<std::tuple<int, int64_t, std::size_t>, ce::NiahCell>;
using NiahRopes = std::map<int64_t, ce::RopeChoice>;

// The grid's settings from the arguments, each checked (the policies apart: niah_policies).
ce::NiahGridSettings niah_grid_settings(const NiahArgs& args) {
  ce::NiahGridSettings settings;
  settings.run.backend = cm::parse_model_backend(args.backend, "--backend");
  if (!args.dry_run) cm::require_model_backend(settings.run.backend, "--backend");
  settings.run.cuda_attention = cm::parse_cuda_prefill_attention(args.cuda_attention);
  if (args.tasks.empty()) {
    settings.tasks = ce::all_niah_tasks();
  } else {
    for (const std::string& name : args.tasks) settings.tasks.push_back(ce::parse_niah_task(name, "--tasks"));
  }
  for (double depth : args.depths) {
    if (!(depth >= 0.0 && depth <= 1.0)) {
      throw crisp::Error("--depths", "has " + std::to_string(depth), "fractions in [0, 1]");
    }
  }
  settings.lengths = args.lengths;
  settings.depths = args.depths;
  settings.seeds = args.seeds;
  settings.seed = args.seed;
  settings.max_new_tokens = args.max_new_tokens;
  settings.answer_prefix = !args.no_answer_prefix;
  settings.rope_scaling = args.rope_scaling;
  settings.run.threads = args.threads;
  settings.dry_run = args.dry_run;
  return settings;
}

std::vector<ce::NiahPolicy> niah_policies(const NiahArgs& args) {
  std::vector<ce::NiahPolicy> policies;
  for (const std::string& name : args.policies) {
    policies.push_back({name, crisp_cli::config_of_policy_spec(name, "--policies")});
  }
  return policies;
}

// What the grid's hooks fill as it runs: the JSON document, the grid's rows and RoPE choices
// copied after each sample, the sample dump and the record of the sample being run.
struct NiahRecorder {
  json out;
  std::vector<std::string> policies;  // the grid's, dense first when given
  bool have_dense = false;
  NiahCells cells;
  NiahRopes ropes;
  std::ofstream dump;
  json record;
};

// The document before any sample: machine, model, settings and each policy's configuration.
json niah_document_head(const NiahArgs& args, const ce::NiahGridSettings& settings, const ce::NiahGrid& grid,
                        const cm::LlamaModel& model) {
  const cm::ModelBackend backend = settings.run.backend;
  json out;
  out["suite"] = "niah";
  out["date_utc"] = utc_now();
  out["machine"] = {{"cpu", cpu_name()},
                    {"hardware_threads", std::thread::hardware_concurrency()},
                    {"matmul_kernel", backend == cm::ModelBackend::cuda ? "cublas_sgemm_fp32"
                                                                        : cm::matmul_kernel_name()},
                    {"backend", cm::to_string(backend)},
                    {"device", args.dry_run ? "" : cm::model_backend_device(backend)},
                    {"cuda_attention", backend == cm::ModelBackend::cuda ? args.cuda_attention : ""}};
  if (!args.dry_run && backend != cm::ModelBackend::cpu) {
    // Weights upload and first launches before any sample, so the first TTFT is not inflated.
    cm::RunOptions warm;
    warm.backend = backend;
    warm.cuda_attention = settings.run.cuda_attention;
    out["machine"]["warm_up_s"] = cm::warm_up_backend(model, warm);
  }
  std::vector<std::string> policies;
  for (const ce::NiahPolicy& p : grid.policies()) policies.push_back(p.name);
  out["model"] = std::filesystem::path(args.model_path).filename().string();
  out["settings"] = {{"tasks", json::array()},
                     {"lengths", args.lengths},
                     {"depths", args.depths},
                     {"seeds", args.seeds},
                     {"base_seed", args.seed},
                     {"split", args.split.empty() ? json(nullptr) : json(args.split)},
                     {"policies", policies},
                     {"max_new_tokens", args.max_new_tokens},
                     {"answer_prefix", !args.no_answer_prefix},
                     {"rope_scaling", args.rope_scaling},
                     {"threads", args.threads},
                     {"chat_template", true},
                     {"decoding", "greedy"}};
  for (ce::NiahTask task : settings.tasks) out["settings"]["tasks"].push_back(ce::to_string(task));
  for (const ce::NiahPolicy& p : grid.policies()) {
    out["policy_configs"][p.name] = crisp_cli::config_to_json(p.config);
  }
  out["samples"] = json::array();
  return out;
}

// One row per (task, length, policy), read against dense's row of the same (task, length).
json niah_rows(NiahRecorder& rec) {
  json rows = json::array();
  for (const auto& [key, cell] : rec.cells) {
    const auto& [task_index, length, p] = key;
    const ce::NiahCell& dense = rec.cells[{task_index, length, 0}];
    const bool dense_known = rec.have_dense && dense.samples > 0;
    const double dense_acc = dense_known ? static_cast<double>(dense.correct) / dense.samples : 0.0;
    json row = {{"task", ce::to_string(static_cast<ce::NiahTask>(task_index))},
                {"length", length},
                {"policy", rec.policies[p]},
                {"samples", cell.samples},
                {"correct", cell.correct},
                {"accuracy", cell.samples ? static_cast<double>(cell.correct) / cell.samples : 0.0},
                {"mean_density", cell.samples ? cell.density_sum / cell.samples : 0.0},
                {"mean_ttft_s", cell.samples ? cell.ttft_sum / cell.samples : 0.0},
                {"mean_prompt_tokens", cell.samples ? cell.prompt_tokens_sum / cell.samples : 0.0},
                {"rope", rec.ropes.count(length) ? rec.ropes[length].label : "none"},
                {"beyond_training", rec.ropes.count(length) ? rec.ropes[length].beyond_training : false}};
    if (dense_known) {
      row["dense_accuracy"] = dense_acc;
      row["dense_fails"] = dense.correct == 0;
      row["kept_of_dense"] = cell.dense_correct ? json(static_cast<double>(cell.both_correct) / cell.dense_correct)
                                                : json(nullptr);
    }
    rows.push_back(row);
  }
  return rows;
}

// Rewritten after every sample (complete: false), so an interrupted run keeps what it measured.
void write_niah_json(const std::string& json_path, bool complete, NiahRecorder& rec) {
  if (json_path.empty()) return;
  rec.out["rows"] = niah_rows(rec);
  rec.out["complete"] = complete;
  // Generated text may hold invalid UTF-8 (a token that ends inside a character): U+FFFD in the JSON.
  crisp_cli::write_text_file("--json", json_path,
                             rec.out.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

// What the dump line and the document's record of a sample share (json objects keep their keys sorted).
json sample_fields(const ce::PreparedSample& prepared) {
  const ce::NiahSample& sample = prepared.sample;
  const ce::NiahSpec& spec = sample.spec;
  return {{"id", prepared.id},
          {"task", ce::to_string(spec.task)},
          {"length", spec.length},
          {"depth", spec.depth},
          {"seed", spec.seed},
          {"needle_depth", sample.needle_depth},
          {"expected", sample.expected},
          {"scoring", ce::to_string(sample.scoring)},
          {"max_new_tokens", prepared.max_new_tokens},
          {"answer_prefix", sample.answer_prefix}};
}

// One line of --dump-samples: all another runner needs to answer the sample and score it.
json sample_dump_line(const ce::PreparedSample& prepared, const ce::RopeChoice& rope) {
  json line = sample_fields(prepared);
  line["prompt_ids"] = prepared.prompt;
  line["prompt_text"] = prepared.sample.user_message;
  line["chat_prompt"] = prepared.chat_prompt;
  line["rope_scaling"] = cm::to_string(rope.scaling.type);
  line["rope_factor"] = rope.scaling.type == cm::RopeScalingType::none ? 1.0 : rope.scaling.factor;
  line["beyond_training"] = rope.beyond_training;
  return line;
}

// The sample's entry of the document's "samples"; each policy's outcome is added under "outcomes".
json sample_record(const ce::PreparedSample& prepared) {
  json record = sample_fields(prepared);
  record["prompt_tokens"] = prepared.prompt.size();
  record["haystack_units"] = prepared.sample.haystack_units;
  record["outcomes"] = json::object();
  return record;
}

json outcome_record(const ce::NiahOutcome& o) {
  return {{"output", o.output},
          {"correct", o.correct},
          {"density", o.density},
          {"ttft_s", o.ttft_s},
          {"prefill_attention_s", o.prefill_attention_s},
          {"generated_tokens", o.generated_tokens},
          {"stop", o.stop}};
}

void print_outcome_progress(int64_t index, int64_t total, const ce::PreparedSample& prepared,
                            const ce::NiahPolicy& policy, const ce::NiahOutcome& o, double elapsed_s) {
  std::string shown = o.output.substr(0, 48);
  std::replace(shown.begin(), shown.end(), '\n', ' ');
  const ce::NiahSpec& spec = prepared.sample.spec;
  std::fprintf(stderr,
               "crisp: [%lld/%lld] %s %zu d=%.2f seed=%llu %-11s %s density %.3f ttft %.2f s (%.0f s) expected %s "
               "got \"%s\"\n",
               static_cast<long long>(index), static_cast<long long>(total), ce::to_string(spec.task),
               prepared.prompt.size(), spec.depth, static_cast<unsigned long long>(spec.seed), policy.name.c_str(),
               o.correct ? "ok  " : "MISS", o.density, o.ttft_s, elapsed_s, prepared.sample.expected.c_str(),
               shown.c_str());
}

void print_dry_run_progress(int64_t index, int64_t total, const ce::PreparedSample& prepared) {
  std::fprintf(stderr, "crisp: [%lld/%lld] %s length %lld: %zu prompt tokens, %lld units, needle at %.3f\n",
               static_cast<long long>(index), static_cast<long long>(total),
               ce::to_string(prepared.sample.spec.task), static_cast<long long>(prepared.sample.spec.length),
               prepared.prompt.size(), static_cast<long long>(prepared.sample.haystack_units),
               prepared.sample.needle_depth);
}

// The hooks: progress on stderr, the sample dump, and the document rewritten after each sample.
// They hold references to args, grid and rec, which must outlive the grid's run.
ce::NiahGridHooks niah_hooks(const NiahArgs& args, const ce::NiahGrid& grid, int64_t trained_context,
                             NiahRecorder& rec) {
  const int64_t total = grid.total_samples();
  const auto start = std::chrono::steady_clock::now();
  ce::NiahGridHooks hooks;
  hooks.on_length = [&args, trained_context](ce::NiahTask task, int64_t length, const ce::RopeChoice& rope) {
    if (!rope.beyond_training || args.quiet) return;
    crisp_cli::finish_progress_line();
    std::fprintf(stderr,
                 "crisp: warning: %s at %lld tokens, RoPE %s — BEYOND THE MODEL'S TRAINING (trained context %lld)\n",
                 ce::to_string(task), static_cast<long long>(length), rope.label.c_str(),
                 static_cast<long long>(trained_context));
  };
  hooks.on_sample = [&args, &rec](int64_t, const ce::PreparedSample& prepared, const ce::RopeChoice& rope) {
    if (rec.dump.is_open()) {
      rec.dump << sample_dump_line(prepared, rope).dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
      if (!rec.dump) throw crisp::Error("--dump-samples", "writing '" + args.dump_samples + "' failed", "a writable path");
    }
    rec.record = sample_record(prepared);
  };
  hooks.on_outcome = [&args, &rec, total, start](int64_t index, const ce::PreparedSample& prepared,
                                                 const ce::NiahPolicy& policy, const ce::NiahOutcome& o) {
    rec.record["outcomes"][policy.name] = outcome_record(o);
    if (args.quiet) return;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    print_outcome_progress(index, total, prepared, policy, o, elapsed);
  };
  hooks.on_sample_done = [&args, &grid, &rec, total](int64_t index, const ce::PreparedSample& prepared) {
    if (args.dry_run && !args.quiet) print_dry_run_progress(index, total, prepared);
    rec.out["samples"].push_back(rec.record);
    rec.cells = grid.cells();
    rec.ropes = grid.ropes();
    write_niah_json(args.json_path, false, rec);
  };
  return hooks;
}

// Totals per (length, policy index): all tasks pooled.
std::map<std::pair<int64_t, std::size_t>, ce::NiahCell> pooled_over_tasks(const NiahCells& cells) {
  std::map<std::pair<int64_t, std::size_t>, ce::NiahCell> totals;
  for (const auto& [key, cell] : cells) {
    ce::NiahCell& t = totals[{std::get<1>(key), std::get<2>(key)}];
    t.samples += cell.samples;
    t.correct += cell.correct;
    t.dense_correct += cell.dense_correct;
    t.both_correct += cell.both_correct;
    t.density_sum += cell.density_sum;
    t.ttft_sum += cell.ttft_sum;
  }
  return totals;
}

void print_niah_table(const NiahArgs& args, cm::ModelBackend backend, NiahRecorder& rec) {
  const std::vector<std::string>& policies = rec.policies;
  const bool have_dense = rec.have_dense;
  const std::string backend_label = backend == cm::ModelBackend::cuda
                                        ? "CUDA, cuBLAS fp32 matmuls, " + args.cuda_attention + " attention"
                                        : std::string("CPU, ") + cm::matmul_kernel_name() + " matmuls";
  std::printf("NIAH on %s (%s), greedy, %s new tokens at most, %zu depth(s) x %lld seed(s) per cell\n",
              rec.out["model"].get<std::string>().c_str(), backend_label.c_str(),
              args.max_new_tokens > 0 ? std::to_string(args.max_new_tokens).c_str() : "per-task (niah 32, passkey 16, kv 48)",
              args.depths.size(), static_cast<long long>(args.seeds));
  std::printf("%-17s %6s  %-11s %5s %6s %6s %8s %8s %4s  %s\n", "task", "length", "policy", "acc", "dense", "kept",
              "density", "TTFT s", "n", "note");
  for (const auto& [key, cell] : rec.cells) {
    const auto& [task_index, length, p] = key;
    const ce::NiahCell& dense = rec.cells[{task_index, length, 0}];
    const bool dense_known = have_dense && dense.samples > 0;
    std::string note;
    if (dense_known && dense.correct == 0) note = "DENSE FAILS: measures nothing";
    else if (dense_known && dense.correct < dense.samples) note = "dense partial";
    const ce::RopeChoice& rope = rec.ropes[length];
    if (rope.beyond_training) note += std::string(note.empty() ? "" : "; ") + "beyond training (" + rope.label + ")";
    std::printf("%-17s %6lld  %-11s %5s %6s %6s %8.3f %8.2f %4lld  %s\n",
                ce::to_string(static_cast<ce::NiahTask>(task_index)), static_cast<long long>(length),
                policies[p].c_str(), format_ratio(static_cast<double>(cell.correct) / cell.samples, true).c_str(),
                format_ratio(dense_known ? static_cast<double>(dense.correct) / dense.samples : 0.0, dense_known).c_str(),
                format_ratio(cell.dense_correct ? static_cast<double>(cell.both_correct) / cell.dense_correct : 0.0,
                             dense_known && p != 0 && cell.dense_correct > 0)
                    .c_str(),
                cell.density_sum / cell.samples, cell.ttft_sum / cell.samples, static_cast<long long>(cell.samples),
                note.c_str());
  }
  std::map<std::pair<int64_t, std::size_t>, ce::NiahCell> totals = pooled_over_tasks(rec.cells);
  for (const auto& [key, t] : totals) {
    const ce::NiahCell& dense = totals[{key.first, 0}];
    std::printf("%-17s %6lld  %-11s %5s %6s %6s %8.3f %8.2f %4lld\n", "all tasks", static_cast<long long>(key.first),
                policies[key.second].c_str(), format_ratio(static_cast<double>(t.correct) / t.samples, true).c_str(),
                format_ratio(have_dense ? static_cast<double>(dense.correct) / dense.samples : 0.0, have_dense).c_str(),
                format_ratio(t.dense_correct ? static_cast<double>(t.both_correct) / t.dense_correct : 0.0,
                             have_dense && key.second != 0 && t.dense_correct > 0)
                    .c_str(),
                t.density_sum / t.samples, t.ttft_sum / t.samples, static_cast<long long>(t.samples));
  }
  std::printf("acc: the policy's accuracy; dense: dense attention's accuracy on the same samples; kept: of the "
              "samples dense answers, the share the policy answers too; density: mean prefill attention density "
              "(kept causal blocks, mean over layers); TTFT: mean time to first token.\n");
  if (!args.json_path.empty()) std::printf("json: %s\n", args.json_path.c_str());
}

void run_niah(const NiahArgs& given) {
  if (!given.score_path.empty()) {
    score_outputs(given);
    return;
  }
  NiahArgs args = given;
  const std::unique_ptr<ce::EvalSplits> splits =
      crisp_cli::apply_niah_split(args.split, args.splits_path, &args.seed, &args.seeds, &args.depths);
  // ---- arguments, all checked before the model loads
  const ce::NiahGridSettings settings = niah_grid_settings(args);
  ce::NiahGrid grid(settings, niah_policies(args));
  std::vector<std::string> prose;
  if (std::find(settings.tasks.begin(), settings.tasks.end(), ce::NiahTask::prose) != settings.tasks.end()) {
    prose = load_prose(args, splits.get());
  }

  // ---- model
  crisp_cli::Progress progress(!args.quiet);
  const crisp_cli::LoadedModel loaded = crisp_cli::load_model(args.model_path, progress);

  // ---- run, the JSON document rewritten after each sample
  NiahRecorder rec;
  for (const ce::NiahPolicy& p : grid.policies()) rec.policies.push_back(p.name);
  rec.have_dense = grid.have_dense();
  rec.out = niah_document_head(args, settings, grid, loaded.model);
  if (!args.dump_samples.empty()) {
    rec.dump.open(args.dump_samples, std::ios::binary | std::ios::trunc);
    if (!rec.dump) throw crisp::Error("--dump-samples", "cannot write '" + args.dump_samples + "'", "a writable path");
  }
  grid.run(loaded.model, loaded.tokenizer, prose, niah_hooks(args, grid, loaded.model.hparams().n_ctx_train, rec));
  rec.cells = grid.cells();
  rec.ropes = grid.ropes();
  write_niah_json(args.json_path, true, rec);
  if (args.dry_run) {
    std::printf("dry run: %lld samples generated, no model run\n", static_cast<long long>(grid.total_samples()));
    return;
  }
  print_niah_table(args, settings.run.backend, rec);
}

// `--score FILE`: outputs produced elsewhere (e.g. the transformers run of scripts/hf_niah.py on
// samples from --dump-samples), scored with the official rules of src/eval/niah.h. One JSON object
// per line: id, policy, output, task, expected (scoring, length, depth, density, ttft_s optional).
void score_outputs(const NiahArgs& args) {
  std::ifstream in(args.score_path, std::ios::binary);
  if (!in) throw crisp::Error("--score", "cannot open '" + args.score_path + "'", "a JSONL file of outputs");
  struct Scored {
    std::string id, task, policy, output;
    int64_t length = 0;
    bool correct = false;
    bool has_density = false, has_ttft = false;
    double density = 0.0, ttft = 0.0;
  };
  std::vector<Scored> scored;
  std::vector<std::string> policies;  // dense first, then in order of appearance
  std::set<std::pair<std::string, std::string>> seen;
  std::map<std::pair<std::string, std::string>, bool> correct_of;  // (id, policy)
  std::string line;
  int64_t line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = args.score_path + ":" + std::to_string(line_number);
    json item;
    try {
      item = json::parse(line);
    } catch (const json::exception& e) {
      throw crisp::Error("--score", where + " is not JSON (" + e.what() + ")", "one JSON object per line");
    }
    for (const char* key : {"id", "policy", "output", "task", "expected"}) {
      if (!item.contains(key) || !item[key].is_string()) {
        throw crisp::Error("--score", where + " has no string '" + key + "'",
                           "id, policy, output, task, expected (strings) on every line");
      }
    }
    Scored r;
    r.id = item["id"].get<std::string>();
    r.policy = item["policy"].get<std::string>();
    r.output = item["output"].get<std::string>();
    r.task = item["task"].get<std::string>();
    ce::NiahSample sample;
    sample.spec.task = ce::parse_niah_task(r.task, "--score (" + where + ")");
    sample.expected = item["expected"].get<std::string>();
    sample.scoring = item.contains("scoring") ? ce::parse_niah_scoring(item["scoring"].get<std::string>(), "--score (" + where + ")")
                                              : ce::niah_task_scoring(sample.spec.task);
    if (item.contains("length") && item["length"].is_number_integer()) r.length = item["length"].get<int64_t>();
    if (item.contains("density") && item["density"].is_number()) {
      r.has_density = true;
      r.density = item["density"].get<double>();
    }
    if (item.contains("ttft_s") && item["ttft_s"].is_number()) {
      r.has_ttft = true;
      r.ttft = item["ttft_s"].get<double>();
    }
    if (!seen.insert({r.id, r.policy}).second) {
      throw crisp::Error("--score", where + " repeats sample '" + r.id + "' for policy '" + r.policy + "'",
                         "one line per (id, policy)");
    }
    r.correct = ce::score_niah_output(sample, r.output);
    correct_of[{r.id, r.policy}] = r.correct;
    if (std::find(policies.begin(), policies.end(), r.policy) == policies.end()) policies.push_back(r.policy);
    scored.push_back(std::move(r));
  }
  if (scored.empty()) throw crisp::Error("--score", "'" + args.score_path + "' holds no outputs", "at least one line");
  // The baseline the other rows are read against: dense attention, named "dense" by crisp and
  // "sdpa" by the transformers script (eval/hf_niah.py); the first of the two present.
  std::string baseline = "dense";
  if (std::find(policies.begin(), policies.end(), baseline) == policies.end() &&
      std::find(policies.begin(), policies.end(), "sdpa") != policies.end()) {
    baseline = "sdpa";
  }
  const auto dense_it = std::find(policies.begin(), policies.end(), baseline);
  const bool have_dense = dense_it != policies.end();
  if (have_dense) std::rotate(policies.begin(), dense_it, dense_it + 1);

  struct Row {
    int64_t samples = 0, correct = 0, dense_known = 0, dense_correct = 0, both_correct = 0;
    int64_t with_density = 0, with_ttft = 0;
    double density_sum = 0.0, ttft_sum = 0.0;
  };
  std::map<std::tuple<std::string, int64_t, std::size_t>, Row> rows;
  for (const Scored& r : scored) {
    const std::size_t p = static_cast<std::size_t>(std::find(policies.begin(), policies.end(), r.policy) - policies.begin());
    Row& row = rows[{r.task, r.length, p}];
    ++row.samples;
    row.correct += r.correct;
    const auto dense = correct_of.find({r.id, baseline});
    if (dense != correct_of.end()) {
      ++row.dense_known;
      row.dense_correct += dense->second;
      row.both_correct += dense->second && r.correct;
    }
    if (r.has_density) {
      ++row.with_density;
      row.density_sum += r.density;
    }
    if (r.has_ttft) {
      ++row.with_ttft;
      row.ttft_sum += r.ttft;
    }
  }

  std::printf("NIAH scores of %s (%zu outputs; official scoring of src/eval/niah.h)\n", args.score_path.c_str(),
              scored.size());
  std::printf("%-17s %6s  %-14s %5s %6s %6s %8s %8s %4s  %s\n", "task", "length", "policy", "acc",
              baseline.c_str(), "kept",
              "density", "TTFT s", "n", "note");
  json out_rows = json::array();
  for (const auto& [key, row] : rows) {
    const auto& [task, length, p] = key;
    const double acc = static_cast<double>(row.correct) / static_cast<double>(row.samples);
    const bool dense_known = row.dense_known > 0;
    const double dense_acc = dense_known ? static_cast<double>(row.dense_correct) / row.dense_known : 0.0;
    const bool kept_known = dense_known && policies[p] != baseline && row.dense_correct > 0;
    const double kept = kept_known ? static_cast<double>(row.both_correct) / row.dense_correct : 0.0;
    std::string note;
    if (dense_known && row.dense_correct == 0) note = "BASELINE FAILS: measures nothing";
    else if (dense_known && row.dense_correct < row.dense_known) note = "dense partial";
    char density_text[32] = "-", ttft_text[32] = "-";
    if (row.with_density) std::snprintf(density_text, sizeof density_text, "%.3f", row.density_sum / row.with_density);
    if (row.with_ttft) std::snprintf(ttft_text, sizeof ttft_text, "%.2f", row.ttft_sum / row.with_ttft);
    std::printf("%-17s %6lld  %-14s %5s %6s %6s %8s %8s %4lld  %s\n", task.c_str(), static_cast<long long>(length),
                policies[p].c_str(), format_ratio(acc, true).c_str(), format_ratio(dense_acc, dense_known).c_str(),
                format_ratio(kept, kept_known).c_str(), density_text, ttft_text, static_cast<long long>(row.samples),
                note.c_str());
    json jr = {{"task", task}, {"length", length}, {"policy", policies[p]}, {"samples", row.samples},
               {"correct", row.correct}, {"accuracy", acc}};
    if (dense_known) {
      jr["dense_accuracy"] = dense_acc;
      jr["dense_fails"] = row.dense_correct == 0;
      jr["kept_of_dense"] = kept_known ? json(kept) : json(nullptr);
    }
    if (row.with_density) jr["mean_density"] = row.density_sum / row.with_density;
    if (row.with_ttft) jr["mean_ttft_s"] = row.ttft_sum / row.with_ttft;
    out_rows.push_back(jr);
  }
  std::printf("acc: accuracy; %s: the baseline's (dense attention's) accuracy on the same sample ids; kept: of the "
              "samples the baseline answers, the share the policy answers too; density / TTFT: means of the values "
              "the file gives.\n",
              baseline.c_str());
  if (!args.json_path.empty()) {
    json samples = json::array();
    for (const Scored& r : scored) {
      samples.push_back({{"id", r.id}, {"policy", r.policy}, {"task", r.task}, {"length", r.length},
                         {"correct", r.correct}, {"output", r.output}});
    }
    const json out = {{"suite", "niah_score"}, {"date_utc", utc_now()}, {"source", args.score_path},
                      {"baseline", have_dense ? json(baseline) : json(nullptr)},
                      {"policies", policies},  {"rows", out_rows},      {"samples", samples}};
    // Generated text may hold invalid UTF-8 (a token that ends inside a character): U+FFFD in the JSON.
    crisp_cli::write_text_file("--json", args.json_path,
                               out.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    std::printf("json: %s\n", args.json_path.c_str());
  }
}

void register_eval_niah(CLI::App& eval) {
  auto args = std::make_shared<NiahArgs>();
  CLI::App* sub = eval.add_subcommand(
      "niah",
      "Needle-in-a-haystack accuracy per attention policy: RULER niah_single / niah_multikey / all-needles, "
      "InfiniteBench passkey / kv_retrieval, and needles in real prose, generated from a seed at token-budgeted "
      "lengths and depths; greedy decoding, official scoring (substring match, first integer, word match)");
  crisp_cli::add_model_option(sub, &args->model_path);
  crisp_cli::add_niah_grid_options(sub, {&args->tasks, &args->lengths, &args->depths, &args->seeds, &args->seed,
                                          &args->split, &args->splits_path, &args->prose_path, &args->max_new_tokens,
                                          &args->rope_scaling});
  sub->add_option("--policies", args->policies, "Attention policies, comma-separated: presets, or a preset with overrides as "
                  "PRESET:key=value[:key=value...] (e.g. crisp:routing=cstruct_rel:rho=2.2); dense is run first")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_flag("--no-answer-prefix", args->no_answer_prefix,
                "Do not start the assistant turn with the task's answer prefix (RULER's \"The special magic number "
                "for K ... is\")");
  sub->add_option("--json", args->json_path, "Write settings, rows and every sample's outputs as JSON here "
                                             "(rewritten after each sample)");
  crisp_cli::add_threads_option(*sub, args->threads);
  crisp_cli::add_model_backend_options(sub, &args->backend, &args->cuda_attention,
                                       "Model backend: cpu, or cuda (a CUDA build on a GPU machine)");
  sub->add_option("--dump-samples", args->dump_samples,
                  "Also write every sample as one JSON line here (id, task, length, depth, seed, prompt_ids, "
                  "prompt_text, answer_prefix, chat_prompt, expected, scoring, max_new_tokens, rope); with "
                  "--dry-run no model runs");
  sub->add_option("--score", args->score_path,
                  "Score outputs made elsewhere instead of running the model: a JSONL file, one "
                  "{id, policy, output, task, expected, ...} per line; prints the table, --json writes it");
  sub->add_flag("--dry-run", args->dry_run, "Generate and tokenise the samples only (no model run)");
  sub->add_flag("--quiet", args->quiet, "No progress lines on stderr");
  sub->callback([args] {
    if (args->score_path.empty()) args->model_path = crisp_cli::model_or_default(args->model_path);  // --score runs no model
    run_niah(*args);
  });
}

}  // namespace

void register_eval_command(CLI::App& app) {
  CLI::App* eval = app.add_subcommand("eval", "Evaluate attention policies on a real model: niah, fidelity, pareto");
  eval->require_subcommand(1);
  register_eval_niah(*eval);
  register_eval_fidelity(*eval);
  register_eval_pareto(*eval);
}
