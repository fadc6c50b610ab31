// src/cpu/cpu_checks.cpp — input scans of the CPU backend.
#include <cmath>
#include <vector>

#include "backend.h"
#include "cpu/cpu_common.h"

namespace crisp {
namespace detail {

int64_t cpu_first_nonfinite(const TensorView& view) {
  const int64_t heads = view.heads(), tokens = view.tokens(), dim = view.dim();
  std::vector<double> row(static_cast<size_t>(dim));
  // Sequential on purpose: the first bad index in (h, t, x) order is reported, and the scan is
  // memory-bound anyway.
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t t = 0; t < tokens; ++t) {
      cpu::load_row(view, h, t, dim, row.data());
      for (int64_t x = 0; x < dim; ++x)
        if (!std::isfinite(row[x])) return (h * tokens + t) * dim + x;
    }
  }
  return -1;
}

}  // namespace detail
}  // namespace crisp
