// src/plan/shard_copy.h — host copy of one context-parallel shard's tokens out of a full-length
// row-major [heads, n, d] array, in the shard's local token order (CpShard::ranges). Used where a
// whole sequence is at hand and a rank's slice is needed: the CPU and GPU tests of context
// parallelism and `crisp bench --gpus N`.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "crisp/context_parallel.h"

namespace crisp {
namespace partition {

template <typename T>
std::vector<T> copy_shard_tokens(const std::vector<T>& full, int64_t heads, int64_t n, int64_t d,
                                 const CpShard& shard) {
  std::vector<T> out(static_cast<std::size_t>(heads * shard.local_tokens * d));
  for (int64_t h = 0; h < heads; ++h)
    for (const CpRange& r : shard.ranges)
      std::memcpy(&out[static_cast<std::size_t>((h * shard.local_tokens + r.local_token) * d)],
                  &full[static_cast<std::size_t>((h * n + r.token_begin) * d)],
                  static_cast<std::size_t>((r.token_end - r.token_begin) * d) * sizeof(T));
  return out;
}

}  // namespace partition
}  // namespace crisp
