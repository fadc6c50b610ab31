// tools/eval_splits.h — --split / --splits of `crisp eval niah` and `crisp eval pareto`.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

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

}  // namespace crisp_cli
