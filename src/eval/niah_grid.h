// src/eval/niah_grid.h — the NIAH grid of `crisp eval niah`: every sample of tasks x lengths x
// depths x seeds answered under every policy, tallied per (task, length, policy). The caller sees
// each step through hooks (progress lines, sample dumps, the JSON) and prints the table.
//
//   NiahGrid grid(settings, policies);               // dense first when present
//   grid.run(model, tokenizer, prose, hooks);
//   for (const auto& [key, cell] : grid.cells()) ...
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "crisp/config.h"
#include "eval/niah.h"
#include "eval/niah_run.h"
#include "model/llama.h"
#include "model/tokenizer.h"

namespace crisp {
namespace eval {

struct NiahGridSettings {
  std::vector<NiahTask> tasks;
  std::vector<int64_t> lengths;
  std::vector<double> depths;
  int64_t seeds = 1;
  uint64_t seed = 0;
  int64_t max_new_tokens = 0;  // 0: per task (default_max_new_tokens)
  bool answer_prefix = true;
  std::string rope_scaling = "auto";
  model::RunOptions run;       // backend, threads, CUDA attention; attention and RoPE set per run
  bool dry_run = false;        // generate and tokenise only
};

struct NiahPolicy {
  std::string name;  // as given (a preset or PRESET:key=value...)
  Config config;
};

// One (task, length, policy) row.
struct NiahCell {
  int64_t samples = 0, correct = 0, dense_correct = 0, both_correct = 0;
  double density_sum = 0.0, ttft_sum = 0.0, prompt_tokens_sum = 0.0;
};

struct NiahGridHooks {
  // A (task, length) begins, with its RoPE choice (e.g. to warn beyond training).
  std::function<void(NiahTask, int64_t length, const RopeChoice&)> on_length;
  // A sample was generated (index counts from 1 up to total_samples()).
  std::function<void(int64_t index, const PreparedSample&, const RopeChoice&)> on_sample;
  // A policy answered it.
  std::function<void(int64_t index, const PreparedSample&, const NiahPolicy&, const NiahOutcome&)> on_outcome;
  // Every policy answered it (or, in a dry run, it was generated).
  std::function<void(int64_t index, const PreparedSample&)> on_sample_done;
};

class NiahGrid {
 public:
  // Policies with a repeated name run once; "dense" is moved first (every other row is read
  // against its answers).
  NiahGrid(NiahGridSettings settings, std::vector<NiahPolicy> policies);

  void run(const model::LlamaModel& model, const model::Tokenizer& tokenizer, const std::vector<std::string>& prose,
           const NiahGridHooks& hooks);

  const std::vector<NiahPolicy>& policies() const { return policies_; }
  bool have_dense() const { return !policies_.empty() && policies_.front().name == "dense"; }
  int64_t total_samples() const;
  // (task, length, policy index) -> row; filled as the grid runs.
  const std::map<std::tuple<int, int64_t, std::size_t>, NiahCell>& cells() const { return cells_; }
  // The RoPE choice of each length run so far.
  const std::map<int64_t, RopeChoice>& ropes() const { return ropes_; }

 private:
  NiahGridSettings settings_;
  std::vector<NiahPolicy> policies_;
  std::map<std::tuple<int, int64_t, std::size_t>, NiahCell> cells_;
  std::map<int64_t, RopeChoice> ropes_;
};

}  // namespace eval
}  // namespace crisp
