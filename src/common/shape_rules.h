// src/common/shape_rules.h — the shape rules every backend, the model runner and the tools share:
// which block sizes exist, which head dims the CUDA kernels are compiled for, and the softmax
// scale a Config resolves to. Each rule is written here once; errors quote the *_expected text.
#pragma once
#include <cmath>
#include <cstdint>

namespace crisp {
namespace shape_rules {

// Spec §1: the block size B of every plan and kernel.
constexpr bool valid_block_size(int64_t block_size) { return block_size == 64 || block_size == 128; }
constexpr const char* kBlockSizeExpected = "64 or 128";

// The head dims the CUDA attention kernels (portable and Hopper) are instantiated for.
constexpr bool cuda_head_dim_supported(int64_t head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 256;
}
constexpr const char* kCudaHeadDimExpected = "64, 128 or 256 on the CUDA backend";

// Kernel::automatic's choice between the CUDA kernels where both can run: the Hopper kernel from
// this many query rows (query tokens x query heads) of one call, the portable kernel below.
// NOTE: on the H200 the Hopper kernel's fixed cost per call (tensor maps, the persistent work
// counter's allocation, a wave of mostly idle CTAs) outweighs its faster tiles on small calls:
// at 8k tokens x 9 heads (73,728 rows, SmolLM2 in llama.cpp) the portable kernel took 39-74 us
// against 84-104 us at densities 0.06-0.2 (equal at 0.375), and Gemma 3's global layers at 8k
// x 4 heads (d 256) took 1.0 ms a call on it against 3.1 ms on Hopper (bench/RESULTS.md,
// "Session 11"). 2^17 is above both measured shapes and below the 32-head shapes the Hopper
// kernel was tuned on (8k x 32 = 2^18); the crossover between them is not measured yet.
constexpr int64_t kHopperMinQueryRows = int64_t{1} << 17;
constexpr bool automatic_prefers_hopper(int64_t query_rows) { return query_rows >= kHopperMinQueryRows; }

// Spec §6: the softmax scale s: the configured one, or 1/sqrt(d) when it is 0.
inline double resolve_softmax_scale(double configured, int64_t head_dim) {
  return configured > 0.0 ? configured : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

}  // namespace shape_rules
}  // namespace crisp
