// src/cpu/cpu_checks.cpp — input scans of the CPU backend.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "backend.h"
#include "cpu/cpu_common.h"

namespace crisp {
namespace detail {

int64_t cpu_first_nonfinite(const TensorView& view, int num_threads) {
  const int64_t heads = view.heads(), tokens = view.tokens(), dim = view.dim();
  // NOTE: 1024 rows per work item: large enough that scheduling costs nothing next to the scan.
  constexpr int64_t kRowsPerItem = 1024;
  const int64_t chunks = (tokens + kRowsPerItem - 1) / kRowsPerItem;
  // Each chunk reports its first bad flat index; the smallest over all chunks is the first one in
  // (h, t, x) order, whatever the thread count.
  std::atomic<int64_t> first_bad{-1};
  cpu::parallel_for(heads * chunks, cpu::thread_count(num_threads), [&](int64_t item) {
    const int64_t h = item / chunks;
    const int64_t begin = (item % chunks) * kRowsPerItem;
    const int64_t end = std::min(begin + kRowsPerItem, tokens);
    std::vector<float> row(static_cast<size_t>(dim));
    std::vector<double> row64;
    for (int64_t t = begin; t < end; ++t) {
      int64_t bad_x = -1;
      if (view.dtype == DType::f64) {  // f64 values beyond float range must not read as Inf
        row64.resize(static_cast<size_t>(dim));
        cpu::load_row(view, h, t, dim, row64.data());
        for (int64_t x = 0; x < dim && bad_x < 0; ++x)
          if (!std::isfinite(row64[x])) bad_x = x;
      } else {
        cpu::load_row(view, h, t, dim, row.data());
        for (int64_t x = 0; x < dim && bad_x < 0; ++x)
          if (!std::isfinite(row[x])) bad_x = x;
      }
      if (bad_x >= 0) {
        const int64_t flat = (h * tokens + t) * dim + bad_x;
        int64_t seen = first_bad.load();
        while ((seen < 0 || flat < seen) && !first_bad.compare_exchange_weak(seen, flat)) {
        }
        return;  // later rows of this chunk have larger indices
      }
    }
  });
  return first_bad.load();
}

}  // namespace detail
}  // namespace crisp
