// tools/bench_context_parallel.h — `crisp bench --gpus N` (N > 1): context-parallel prefill over
// N GPUs of one process (one thread per GPU, ncclCommInitAll) against the single-GPU run of the
// same inputs: time per layer and equality of O / LSE.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

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
