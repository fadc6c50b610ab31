// crisp/npy.h — reading and writing NumPy .npy files (format versions 1.0-3.0, little-endian,
// C order). Used by the `crisp` command; exposed because users feed the library from NumPy.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "crisp/tensor.h"

namespace crisp {

struct NpyArray {
  DType dtype = DType::f32;  // f32, f16 (read: '<f4', '<f2'; also '<f8' as f64)
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;  // C-order data

  // A CPU view of a non-empty array of rank `rank` (3: [heads, tokens, dim], 2: [heads, tokens];
  // 0: either). Throws crisp::Error naming `argument` otherwise.
  TensorView view(const std::string& argument, int rank = 0);
};

// Throws crisp::Error naming `path` if the file is missing, truncated, corrupt, Fortran-ordered,
// big-endian or of an unsupported dtype.
NpyArray read_npy(const std::string& path);

// Writes float32 ('<f4') or float64 ('<f8') data of the given shape. Throws crisp::Error naming
// `path` on I/O failure.
void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape);
void write_npy(const std::string& path, const double* data, const std::vector<int64_t>& shape);

}  // namespace crisp
