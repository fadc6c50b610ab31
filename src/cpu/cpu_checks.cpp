// src/cpu/cpu_checks.cpp — input scans of the CPU backend.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "backend.h"
#include "cpu/cpu_common.h"

namespace crisp {
namespace detail {

CpuValueScan cpu_scan_values(const TensorView& view, int num_threads) {
  const int64_t heads = view.heads(), tokens = view.tokens(), dim = view.dim();
  // NOTE: 1024 rows per work item: large enough that scheduling costs nothing next to the scan.
  constexpr int64_t kRowsPerItem = 1024;
  const int64_t chunks = (tokens + kRowsPerItem - 1) / kRowsPerItem;
  // Each chunk reports its first bad flat index; the smallest over all chunks is the first one in
  // (h, t, x) order, whatever the thread count. Each chunk keeps its own largest |value|.
  std::atomic<int64_t> first_bad{-1};
  std::vector<double> chunk_max_abs(static_cast<size_t>(heads * chunks), 0.0);
  cpu::parallel_for(heads * chunks, cpu::thread_count(num_threads), [&](int64_t item) {
    const int64_t h = item / chunks;
    const int64_t begin = (item % chunks) * kRowsPerItem;
    const int64_t end = std::min(begin + kRowsPerItem, tokens);
    std::vector<double> row(static_cast<size_t>(dim));  // f64 values beyond float range must not read as Inf
    double max_abs = 0.0;
    for (int64_t t = begin; t < end; ++t) {
      int64_t bad_x = -1;
      cpu::load_row(view, h, t, dim, row.data());
      for (int64_t x = 0; x < dim; ++x) {
        if (!std::isfinite(row[x])) {
          bad_x = x;
          break;
        }
        max_abs = std::max(max_abs, std::fabs(row[x]));
      }
      if (bad_x >= 0) {
        const int64_t flat = (h * tokens + t) * dim + bad_x;
        int64_t seen = first_bad.load();
        while ((seen < 0 || flat < seen) && !first_bad.compare_exchange_weak(seen, flat)) {
        }
        return;  // later rows of this chunk have larger indices
      }
    }
    chunk_max_abs[static_cast<size_t>(item)] = max_abs;
  });
  CpuValueScan scan;
  scan.first_nonfinite = first_bad.load();
  for (double m : chunk_max_abs) scan.max_abs = std::max(scan.max_abs, m);
  return scan;
}

}  // namespace detail
}  // namespace crisp
