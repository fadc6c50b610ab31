// tools/eval_splits.h — --split / --splits of `crisp eval niah` and `crisp eval pareto`.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "default_paths.h"
#include "eval/splits.h"

#ifndef CRISP_SOURCE_DIR
#define CRISP_SOURCE_DIR ""
#endif

namespace crisp_cli {

// The splits file of --splits, else eval/splits.json of the source tree this binary was built
// from (or next to the binary): never a path relative to the current directory.
inline crisp::eval::EvalSplits load_eval_splits(const std::string& splits_option) {
  const std::string path = splits_option.empty() ? crisp::eval::default_splits_path(CRISP_SOURCE_DIR) : splits_option;
  return crisp::eval::load_splits(path, "--splits");
}

// --split (tuning | test, which excludes --depths, --seeds and --seed: the split sets them) and
// --splits FILE.
inline void add_split_options(CLI::App* sub, std::string* split, std::string* splits_path, CLI::Option* depths,
                              CLI::Option* seeds, CLI::Option* seed) {
  sub->add_option("--split", *split,
                  "Samples of a fixed split of eval/splits.json: tuning (choose rules and knobs here) or test (the "
                  "verdict); sets --seed, --seeds, --depths and the niah_prose documents")
      ->check(CLI::IsMember({"tuning", "test"}))
      ->excludes(depths)
      ->excludes(seeds)
      ->excludes(seed);
  sub->add_option("--splits", *splits_path, "The splits file of --split (default: eval/splits.json of the source tree)");
}

// With --split: loads the splits file and sets seed, seeds and depths from the split; returns the
// splits (for the prose haystack), or null without --split.
inline std::unique_ptr<crisp::eval::EvalSplits> apply_niah_split(const std::string& split, const std::string& splits_option,
                                                                 uint64_t* seed, int64_t* seeds, std::vector<double>* depths) {
  if (split.empty()) return nullptr;
  auto splits = std::make_unique<crisp::eval::EvalSplits>(load_eval_splits(splits_option));
  const crisp::eval::NiahSplit& chosen = splits->niah_split(split, "--split");
  *seed = chosen.seed;
  *seeds = chosen.seeds;
  *depths = chosen.depths;
  return splits;
}


// Where the NIAH grid's options of one subcommand land (crisp eval niah and crisp eval pareto share
// the grid, so its options are registered here once).
struct NiahGridTargets {
  std::vector<std::string>* tasks;
  std::vector<int64_t>* lengths;
  std::vector<double>* depths;
  int64_t* seeds;
  uint64_t* seed;
  std::string* split;
  std::string* splits_path;
  std::string* prose_path;
  int64_t* max_new_tokens;
  std::string* rope_scaling;
};

// --tasks, --lengths, --depths, --seeds, --seed, --split, --splits, --prose, --max-new-tokens,
// --rope-scaling.
inline void add_niah_grid_options(CLI::App* sub, const NiahGridTargets& t) {
  sub->add_option("--tasks", *t.tasks,
                  "Tasks: niah_single, niah_multikey, niah_all_needles, passkey, kv_retrieval, niah_prose")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--lengths", *t.lengths, "Token budgets: prompt (chat template included) + --max-new-tokens <= length")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(int64_t{64}, int64_t{1} << 22));
  CLI::Option* depths =
      sub->add_option("--depths", *t.depths, "Depths of the asked needle, fractions of the haystack in [0, 1]")
          ->delimiter(',')
          ->capture_default_str();
  CLI::Option* seeds =
      sub->add_option("--seeds", *t.seeds, "Samples per (task, length, depth), seeds --seed, --seed+1, ...")
          ->capture_default_str()
          ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  CLI::Option* seed = sub->add_option("--seed", *t.seed, "First seed")->capture_default_str();
  add_split_options(sub, t.split, t.splits_path, depths, seeds, seed);
  add_prose_option(sub, t.prose_path, "long_qa_prompts.json, the real-prose haystack of niah_prose");
  sub->add_option("--max-new-tokens", *t.max_new_tokens,
                  "Most greedy tokens per answer (default per task: niah 32, passkey 16, kv_retrieval 48); "
                  "generation stops earlier once the score is decided")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  sub->add_option("--rope-scaling", *t.rope_scaling,
                  "RoPE scaling: auto (YaRN with the smallest integer factor for lengths past the trained context, "
                  "none below), none, linear, ntk, yarn; any scaling is beyond the model's training and flagged")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "none", "linear", "ntk", "yarn"}));
}

}  // namespace crisp_cli
