// tools/bench_context_parallel.h — `crisp bench --gpus N` (N > 1): context-parallel prefill over
// N GPUs of one process (one thread per GPU, ncclCommInitAll) against the single-GPU run of the
// same inputs: time per layer and equality of O / LSE.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

// The heads a bench run of length n uses: --heads / --kv-heads, or from --quarter-heads-from on a
// quarter of them (at least one kv head). Shared by `crisp bench` and `crisp bench --gpus N`; the
// command checks up front that the quartered heads are valid (>= 1 query head, a GQA multiple).
struct BenchHeads {
  int64_t q = 0, kv = 0;
  bool quartered = false;
};
inline BenchHeads bench_heads(int64_t n, int64_t heads, int64_t kv_heads, int64_t quarter_heads_from) {
  if (n < quarter_heads_from) return {heads, kv_heads, false};
  return {heads / 4, kv_heads / 4 > 1 ? kv_heads / 4 : 1, true};
}

struct ContextParallelBenchArgs {
  int gpus = 2;
  std::vector<std::string> partitions = {"zigzag"};
  std::vector<int64_t> seq;
  std::vector<std::string> presets;
  int64_t heads = 32, kv_heads = 8, dim = 128;
  int block = 128;
  int reps = 5, warmup = 2;
  int64_t quarter_heads_from = 524288;
  uint64_t seed = 0;
  std::string json_path;
  bool quiet = false;
};

// Throws crisp_cli::CommandFailure when the build has no CUDA/NCCL or fewer GPUs are visible.
void run_context_parallel_bench(const ContextParallelBenchArgs& args);
