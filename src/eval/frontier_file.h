// src/eval/frontier_file.h — the resumable JSON document of the frontier harness (`crisp eval
// pareto`, and crisp-llama-eval on llama.cpp): per point, the result of each unit (a NIAH sample or
// a captured layer) keyed by its id, the settings it was made with, and a summary per point and
// length. Model independent: whichever engine computes the units records them here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/sweep.h"

namespace crisp {
namespace eval {

// The point every other one is read against (kept_of_dense); every runner runs it first.
inline constexpr const char* kDensePoint = "dense";

// The per-point record of one sample (NIAH) or one captured layer (captures), keyed by its id.
class FrontierFile {
 public:
  // A new document, or the one at `path` if it exists and was made with equal `settings`; a file
  // with other settings (or not such a document) throws crisp::Error naming `argument`. An empty
  // path keeps everything in memory.
  static FrontierFile open(const std::string& path, const nlohmann::json& settings, const std::string& argument);

  // Adds a point (or finds it: its knobs and config are re-recorded).
  void add_point(const FrontierPoint& point);
  bool has(const std::string& point, const std::string& unit) const;
  void record(const std::string& point, const std::string& unit, const nlohmann::json& result);
  // Rewrites the file atomically (temporary file + rename); no-op without a path.
  void save();

  // Per point and length, from the recorded units: NIAH — samples, correct, accuracy,
  // dense_correct, kept_of_dense (share of the samples dense answers that the point answers too;
  // null when dense answers none), mean_density (null when a unit's density is null: not
  // measured); captures — heads, density_mean, recall_mean, recall_min, top_mass_recall (mean
  // and min), rel_error (mean and max). Sets "rows".
  void summarize();
  // Structured workloads (settings mode "structured", src/eval/structured_frontier.h): per point and
  // length, means over the workloads of density, vs_share, needles_kept_mean, rel_error_mean and the
  // per-kind densities; needles_kept_min and rel_error_max over them. Called by summarize().
  void summarize_structured();
  // Per run: computed and skipped units (appended to "runs" by begin_run / counted by record).
  void begin_run();
  int64_t computed_this_run() const { return computed_; }

  // Whether every unit of the run's grid is in the file ("complete" in the JSON).
  void mark_complete(bool complete) { doc_["complete"] = complete; }
  // What every runner does after a unit (checkpoint) and when it stops (finish): the rows
  // recomputed and the file rewritten, so an interrupted run loses at most the unit in progress.
  void checkpoint() {
    summarize();
    save();
  }
  void finish(bool complete) {
    mark_complete(complete);
    checkpoint();
  }
  const nlohmann::json& document() const { return doc_; }
  const std::string& path() const { return path_; }

 private:
  nlohmann::json* find_point(const std::string& name);
  const nlohmann::json* find_point(const std::string& name) const;
  std::string path_, argument_;
  nlohmann::json doc_;
  int64_t computed_ = 0;
};

}  // namespace eval
}  // namespace crisp
