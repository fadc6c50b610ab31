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

// Spec §6: the softmax scale s: the configured one, or 1/sqrt(d) when it is 0.
inline double resolve_softmax_scale(double configured, int64_t head_dim) {
  return configured > 0.0 ? configured : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

}  // namespace shape_rules
}  // namespace crisp
