// tools/workload_options.h — the workload options shared by `crisp demo` and `crisp gen`.
#pragma once
#include <cstdint>

#include <CLI/CLI.hpp>

#include "crisp/workload.h"
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
  sub.add_option("--seq", options.seq, "Sequence length n (tokens)")
      ->capture_default_str()
      ->check(kPositiveInteger);
  sub.add_option("--heads-q", options.heads_q, "Query heads Hq")
      ->capture_default_str()
      ->check(kPositiveInteger);
  sub.add_option("--heads-kv", options.heads_kv, "KV heads Hkv (Hq must be a multiple)")
      ->capture_default_str()
      ->check(kPositiveInteger);
  sub.add_option("--dim", options.dim, "Head dimension d (at most 256)")
      ->capture_default_str()
      ->check(kPositiveInteger);
  sub.add_option("--seed", options.seed, "Seed of the synthetic workload")
      ->capture_default_str()
      ->check(crisp_cli::kNonNegativeInteger);  // CLI11 would wrap -1 to 2^64 - 1
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

}  // namespace crisp_cli
