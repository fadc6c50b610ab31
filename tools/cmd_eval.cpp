// tools/cmd_eval.cpp — `crisp eval`: evaluations of attention policies.
//
//   crisp eval niah --score  NIAH outputs made elsewhere, scored by the official rules (src/eval/niah.h)
//   crisp eval fidelity      per-layer attention fidelity on captured real maps (tools/cmd_fidelity.cpp)
//   crisp eval pareto        knob sweeps against density on captures or the structured workload
//                            (tools/cmd_pareto.cpp)
//
// NIAH on a real model (samples, greedy answers, the table) runs on llama.cpp: `crisp-llama-eval
// niah` (integrations/llama.cpp/crisp_llama_eval.cpp). `eval niah --score` prints one row per
// (task, length, policy) of outputs made by another runner (e.g. eval/hf_niah.py, transformers):
// accuracy, the baseline's accuracy on the same samples, the share of the baseline's correct
// samples the policy also gets right, mean density and mean time to first token.
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "eval/json_file.h"
#include "eval/niah.h"
#include "io_util.h"

namespace {

namespace ce = crisp::eval;
using nlohmann::json;

struct NiahArgs {
  std::string score_path;  // JSONL of outputs to score
  std::string json_path;
};

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return text;
}

std::string format_ratio(double value, bool present) {
  if (!present) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", value);
  return text;
}

// `--score FILE`: outputs produced elsewhere (e.g. the transformers run of eval/hf_niah.py on
// samples from --dump-samples), scored with the official rules of src/eval/niah.h. One JSON object
// per line: id, policy, output, task, expected (scoring, length, depth, density, ttft_s optional).
void score_outputs(const NiahArgs& args) {
  crisp_cli::require_outputs_not_inputs({{"--json", args.json_path}}, {{"--score", args.score_path}});
  crisp_cli::require_writable("--json", args.json_path);
  crisp::eval::require_readable_file(args.score_path, "--score", "a JSONL file of outputs");
  std::ifstream in(args.score_path, std::ios::binary);
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
  std::map<std::string, std::pair<std::string, int64_t>> sample_of;   // id -> (task, length)
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
    for (const auto& [key, value] : {std::pair<const char*, const std::string*>{"id", &r.id}, {"policy", &r.policy},
                                     {"expected", &item["expected"].get_ref<const std::string&>()}})
      if (value->empty()) throw crisp::Error("--score", where + " has an empty '" + key + "'", "a non-empty " + std::string(key));
    // The optional fields, when present, are of their kind: a value of another type or range was
    // dropped or averaged into the table without a word.
    const auto optional_number = [&](const char* key, double low, double high, const std::string& range) {
      if (!item.contains(key)) return false;
      if (!item[key].is_number() || !(item[key].get<double>() >= low && item[key].get<double>() <= high))
        throw crisp::Error("--score", where + " has " + key + " " + item[key].dump(), std::string(key) + " " + range);
      return true;
    };
    if (item.contains("length") && (!item["length"].is_number_integer() || item["length"].get<int64_t>() < 1))
      throw crisp::Error("--score", where + " has length " + item["length"].dump(), "length a positive integer (tokens)");
    ce::NiahSample sample;
    sample.spec.task = ce::parse_niah_task(r.task, "--score (" + where + ")");
    sample.expected = item["expected"].get<std::string>();
    sample.scoring = item.contains("scoring") ? ce::parse_niah_scoring(item["scoring"].get<std::string>(), "--score (" + where + ")")
                                              : ce::niah_task_scoring(sample.spec.task);
    if (item.contains("length")) r.length = item["length"].get<int64_t>();
    if (optional_number("density", 0.0, 1.0, "in [0, 1]")) {
      r.has_density = true;
      r.density = item["density"].get<double>();
    }
    if (optional_number("ttft_s", 0.0, std::numeric_limits<double>::max(), ">= 0 (seconds)")) {
      r.has_ttft = true;
      r.ttft = item["ttft_s"].get<double>();
    }
    if (!seen.insert({r.id, r.policy}).second) {
      throw crisp::Error("--score", where + " repeats sample '" + r.id + "' for policy '" + r.policy + "'",
                         "one line per (id, policy)");
    }
    // One sample is one prompt: every policy's line of an id names the same task and length (else
    // a row would be read against another prompt's baseline).
    const auto [first, inserted] = sample_of.emplace(r.id, std::make_pair(r.task, r.length));
    if (!inserted && first->second != std::make_pair(r.task, r.length))
      throw crisp::Error("--score",
                         where + " gives sample '" + r.id + "' task " + r.task + ", length " + std::to_string(r.length) +
                             " where an earlier line gave " + first->second.first + ", length " +
                             std::to_string(first->second.second),
                         "one task and length per sample id");
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
      "Score needle-in-a-haystack outputs made elsewhere (e.g. eval/hf_niah.py) with the official rules: RULER "
      "substring match, InfiniteBench first integer and word match. The samples and the model's answers on "
      "llama.cpp: crisp-llama-eval niah");
  sub->add_option("--score", args->score_path,
                  "The outputs to score: a JSONL file, one {id, policy, output, task, expected, ...} per line; prints "
                  "the table, --json writes it")
      ->required();
  sub->add_option("--json", args->json_path, "Write the rows and every scored output as JSON here");
  sub->callback([args] { score_outputs(*args); });
}

}  // namespace

void register_eval_command(CLI::App& app) {
  CLI::App* eval = app.add_subcommand("eval", "Evaluate attention policies: niah --score, fidelity, pareto");
  eval->require_subcommand(1);
  register_eval_niah(*eval);
  register_eval_fidelity(*eval);
  register_eval_pareto(*eval);
}
