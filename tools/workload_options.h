// tools/workload_options.h — the workload options shared by `crisp demo` and `crisp gen`.
#pragma once
#include <cstdint>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>

#include "crisp/error.h"
#include "crisp/workload.h"
#include "input_checks.h"  // renamed_error
#include "validators.h"

namespace crisp_cli {

struct WorkloadOptions {
  int64_t seq = 0;
  int64_t heads_q = 8;
  int64_t heads_kv = 2;
  int64_t dim = 128;
  uint64_t seed = 0;
};

inline void add_workload_options(CLI::App& sub, WorkloadOptions& options) {
  sub.add_option("--seq", options.seq,
                 "Sequence length n (tokens; more than the " + std::to_string(crisp::WorkloadSpec{}.needles) +
                     " planted needles)")
      ->capture_default_str()
      ->check(kPositiveInteger);
  sub.add_option("--heads-q", options.heads_q, "Query heads Hq")
      ->capture_default_str()
      ->check(kPositiveInteger);
  sub.add_option("--heads-kv", options.heads_kv, "KV heads Hkv (Hq must be a multiple)")
      ->capture_default_str()
      ->check(kPositiveInteger);
  sub.add_option("--dim", options.dim,
                 "Head dimension d (" + std::to_string(crisp::kWorkloadMinHeadDim) + " to " +
                     std::to_string(crisp::kWorkloadMaxHeadDim) + ")")
      ->capture_default_str()
      ->check(kPositiveInteger);
  sub.add_option("--seed", options.seed, "Seed of the synthetic workload")
      ->capture_default_str();  // uint64_t: require_decimal_numbers refuses -1, which CLI11 would wrap
}

// The structured workload of crisp/workload.h with these shapes; the structural knobs keep their
// documented defaults (docs/workload.md). make_workload() validates the result.
inline crisp::WorkloadSpec make_workload_spec(const WorkloadOptions& options) {
  crisp::WorkloadSpec spec;
  spec.num_q_heads = options.heads_q;
  spec.num_kv_heads = options.heads_kv;
  spec.head_dim = options.dim;
  spec.seq_lens = {options.seq};
  spec.seed = options.seed;
  return spec;
}

// The workload's checks (crisp::check_workload, the rules make_workload applies) before any work,
// each error under the option that set the field: workload.needles is a --seq too short for the
// planted needles, workload.seq_lens a --seq too large, and so on. Throws crisp::Error.
inline void check_workload_options(const WorkloadOptions& options) {
  try {
    crisp::check_workload(make_workload_spec(options));
  } catch (const crisp::Error& e) {
    throw renamed_error(e, {{"workload.seq_lens", "--seq"},
                            {"workload.needles", "--seq"},
                            {"workload.head_dim", "--dim"},
                            {"workload.num_q_heads", "--heads-q"},
                            {"workload.num_kv_heads", "--heads-kv"}});
  }
}

}  // namespace crisp_cli
