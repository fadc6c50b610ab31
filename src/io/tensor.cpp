// src/io/tensor.cpp — names and sizes of dtypes/devices, and contiguous views.
#include <cstddef>
#include <cstdint>
#include <string>

#include "crisp/error.h"
#include "crisp/tensor.h"

namespace crisp {

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f64: return "f64";
  }
  return "unknown";
}

const char* to_string(Device device) {
  switch (device) {
    case Device::cpu: return "cpu";
    case Device::cuda: return "cuda";
  }
  return "unknown";
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::f64: return 8;
  }
  return 0;
}

namespace {
void check_extent(const char* name, int64_t value) {
  if (value < 0) throw Error(name, "negative extent " + std::to_string(value), "a size >= 0");
}
}  // namespace

TensorView TensorView::contiguous(void* data, DType dtype, int64_t heads, int64_t tokens, int64_t dim,
                                  Device device) {
  check_extent("heads", heads);
  check_extent("tokens", tokens);
  check_extent("dim", dim);
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.rank = 3;
  v.shape = {heads, tokens, dim};
  int64_t head_stride = 0;
  if (__builtin_mul_overflow(tokens, dim, &head_stride))
    throw Error("tokens", "times dim (" + std::to_string(tokens) + " x " + std::to_string(dim) + ") overflows int64",
                "a head of fewer than 2^63 elements");
  v.stride = {head_stride, dim, 1};
  return v;
}

TensorView TensorView::contiguous2d(void* data, DType dtype, int64_t heads, int64_t tokens, Device device) {
  check_extent("heads", heads);
  check_extent("tokens", tokens);
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.rank = 2;
  // The third extent is unused at rank 2 (dim() reports 1); kept at 1 so products stay meaningful.
  v.shape = {heads, tokens, 1};
  v.stride = {tokens, 1, 1};
  return v;
}

}  // namespace crisp
