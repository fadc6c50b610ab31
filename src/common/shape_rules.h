// src/common/shape_rules.h — the shape rules every backend, the model runner and the tools share:
// which block sizes exist, which head dims the CUDA kernels are compiled for, and the softmax
// scale a Config resolves to. Each rule is written here once; errors quote the *_expected text.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "crisp/limits.h"

namespace crisp {
namespace shape_rules {

// Spec §1: the block size B of every plan and kernel.
constexpr bool valid_block_size(int64_t block_size) { return block_size == 64 || block_size == 128; }
constexpr const char* kBlockSizeExpected = "64 or 128";

// The most tokens of one call (crisp/limits.h).
using crisp::kMaxTokens;
static_assert(kMaxTokens == std::numeric_limits<int32_t>::max(), "plans index tokens with int32");
constexpr const char* kMaxTokensExpected = "at most 2147483647 tokens (plans index tokens with int32)";

// The most blocks of a whole prompt: a head's CSR indexes the causal blocks of its rows with
// int32, and N (N + 1) / 2 <= 2^31 - 1 for N <= 65535 (the device planner reserves that triangle for
// every sequence, chunks and decode steps included).
constexpr int64_t kMaxPromptBlocks = 65535;

// The head dims the CUDA attention kernels (portable and Hopper) are instantiated for.
constexpr bool cuda_head_dim_supported(int64_t head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 256;
}
constexpr const char* kCudaHeadDimExpected = "64, 128 or 256 on the CUDA backend";

// Kernel::automatic's choice between the CUDA kernels where both can run: the Hopper kernel from
// this much causal work in one call — query heads x the keys each launched query row sees (summed
// over the rows) x head dim — the portable kernel below.
// NOTE: tuning constant. The Hopper kernel has a fixed cost per call (tensor maps, the persistent
// work counter, a wave of mostly idle CTAs) that the portable kernel does not, but the portable
// kernel is slow per FLOP at d = 256, so the choice is by work, not by rows: at 2^35 every dense
// and crisp point of the measured crossover (d 64 / 128 / 256, 2k-32k tokens) runs on its faster
// kernel or a tie (bench/RESULTS.md, "Portable or Hopper kernel on small calls" and "Session 22").
constexpr double kHopperMinCausalWork = 34359738368.0;  // 2^35
constexpr bool automatic_prefers_hopper(double causal_work) { return causal_work >= kHopperMinCausalWork; }

// The keys a sequence's queries see in all: its n_q queries are the last of its n_k positions
// (bottom-right causal), so query j of n_q sees n_k - n_q + j + 1 keys. In double: the products
// of a long batch pass int64 long before they lose precision that matters to a threshold.
constexpr double causal_key_pairs(int64_t n_q, int64_t n_k) {
  return static_cast<double>(n_q) * static_cast<double>(n_k - n_q) +
         static_cast<double>(n_q) * static_cast<double>(n_q + 1) / 2.0;
}

// The same over a batch's offsets (cu_k empty: whole prompts). Never throws: offsets that do not
// increase count as empty sequences, keys fewer than queries as many keys as queries.
inline double causal_key_pairs(const std::vector<int64_t>& cu_q, const std::vector<int64_t>& cu_k) {
  const std::vector<int64_t>& keys = cu_k.empty() ? cu_q : cu_k;
  double pairs = 0.0;
  for (size_t s = 0; s + 1 < cu_q.size() && s + 1 < keys.size(); ++s) {
    const int64_t n_q = std::max<int64_t>(0, cu_q[s + 1] - cu_q[s]);
    pairs += causal_key_pairs(n_q, std::max<int64_t>(n_q, keys[s + 1] - keys[s]));
  }
  return pairs;
}

// Spec §6: the softmax scale s: the configured one, or 1/sqrt(d) when it is 0.
inline double resolve_softmax_scale(double configured, int64_t head_dim) {
  return configured > 0.0 ? configured : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

}  // namespace shape_rules
}  // namespace crisp
