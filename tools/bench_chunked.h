// tools/bench_chunked.h — `crisp bench --chunks C1,C2,...`: a prompt prefilled in chunks over its
// growing KV cache (spec §11), as a serving engine runs it, against the one-shot prefill of the
// same prompt; with --page-sizes, the same runs over a paged K/V (shuffled pages, vLLM layout)
// against contiguous K/V, every layout timed in the same interleaved rounds.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "crisp/options.h"

struct ChunkedBenchArgs {
  std::vector<int64_t> seq;
  std::vector<int64_t> chunks;      // chunk sizes (tokens)
  std::vector<int64_t> page_sizes;  // 0: contiguous only
  std::vector<std::string> presets;
  std::vector<std::string> kernels;  // names of tools/cmd_bench.cpp's --kernels
  int64_t heads = 32, kv_heads = 8, dim = 128;
  int block = 128;
  int reps = 5, warmup = 2;
  uint64_t seed = 0;
  double diffuse_share = 0.25;
  // Also contiguous K/V token-major, [n, Hkv, d] (the paged pool's memory order without pages),
  // beside head-major [Hkv, n, d]: separates what the paged runs pay for vLLM's order from the
  // pages (every layout is timed in the same interleaved rounds).
  bool kv_token_major = false;
  // Also time the chunks' plans alone and their attention alone (plan_ms, attend_ms): the total's
  // parts, each measured on its own (the sum need not equal the total, which overlaps nothing but
  // pays every launch in one stream).
  bool split_times = false;
  // Paged runs, each page size once per entry: the pool's pages shuffled (true), or in order
  // (false: logical page i at pool page i).
  std::vector<bool> page_orders_shuffled{true};
  std::string json_path;
  bool quiet = false;
};

// The kernel options of a --kernels name of crisp bench (tools/cmd_bench.cpp); throws crisp::Error
// naming "--kernels" for an unknown name.
const crisp::CudaOptions& bench_kernel_options(const std::string& kernel);

// Throws crisp_cli::CommandFailure when the build has no CUDA or no device is visible.
void run_chunked_bench(const ChunkedBenchArgs& args);
