// crisp/tensor.h — non-owning tensor views and variable-length batches.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace crisp {

enum class DType { f32, f16, bf16, f64 };
enum class Device { cpu, cuda };

const char* to_string(DType dtype);
const char* to_string(Device device);
std::size_t dtype_size(DType dtype);

// A strided view of a rank-2 or rank-3 tensor. Strides are in elements, not bytes.
//  - Q, O:   [Hq,  tokens, d]
//  - K, V:   [Hkv, tokens, d]
//  - LSE:    [Hq,  tokens]           (rank 2, float32)
// `tokens` is the total token count of the batch (see SeqLens). Any strides are accepted, so
// both [heads, tokens, d] and [tokens, heads, d] memory layouts are views of the same shape.
// The last dimension must have stride 1 on the CUDA backend.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int rank = 3;
  std::array<int64_t, 3> shape{0, 0, 0};
  std::array<int64_t, 3> stride{0, 0, 0};

  // Row-major [heads, tokens, dim].
  static TensorView contiguous(void* data, DType dtype, int64_t heads, int64_t tokens, int64_t dim,
                               Device device = Device::cpu);
  // Row-major [heads, tokens] (used for LSE).
  static TensorView contiguous2d(void* data, DType dtype, int64_t heads, int64_t tokens,
                                 Device device = Device::cpu);

  int64_t heads() const { return shape[0]; }
  int64_t tokens() const { return shape[1]; }
  int64_t dim() const { return rank == 3 ? shape[2] : 1; }
  int64_t numel() const { return shape[0] * shape[1] * (rank == 3 ? shape[2] : 1); }
  // Element offset of (h, t, x).
  int64_t offset(int64_t h, int64_t t, int64_t x = 0) const {
    return h * stride[0] + t * stride[1] + (rank == 3 ? x * stride[2] : 0);
  }
};

// Cumulative sequence offsets of a variable-length batch, as FlashAttention's varlen API:
// sequence s occupies tokens [cu_seqlens[s], cu_seqlens[s+1]) of the views. Empty means one
// sequence spanning every token. Each sequence is an independent causal prefill.
using SeqLens = std::vector<int64_t>;

}  // namespace crisp
