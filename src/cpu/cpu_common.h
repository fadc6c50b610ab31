// src/cpu/cpu_common.h — shared pieces of the CPU backend: strided element I/O for every dtype,
// packing of Q/K/V into contiguous compute buffers, OpenMP helpers and the register-blocked
// micro-kernels of the planner and the attention.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <vector>

#include "common/fast_exp.h"
#include "common/half.h"
#include "common/kv_rows.h"
#include "crisp/crisp.h"
#include "crisp/tensor.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace crisp {
namespace cpu {

// NOTE: the head dimension of every packed buffer is padded with zeros to a multiple of this, so
// the micro-kernels need no remainder loops (zeros change no dot product).
constexpr int64_t kDimAlign = 16;
// NOTE: query rows are processed eight at a time by the micro-kernels (register blocking:
// 8 x 16 float accumulators = 8 AVX-512 registers, enough FMA chains in flight).
constexpr int kRowBlock = 8;
// NOTE: 16 columns (one AVX-512 float vector, two AVX2 vectors) per register tile.
constexpr int kColBlock = 16;

inline int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// Threads for a call: num_threads, or every hardware thread when 0.
inline int thread_count(int num_threads) {
#if defined(_OPENMP)
  return num_threads > 0 ? num_threads : omp_get_max_threads();
#else
  (void)num_threads;
  return 1;
#endif
}
inline int thread_count(const Options& options) { return thread_count(options.num_threads); }

// Runs body(i) for i in [0, count) on `threads` threads with dynamic scheduling. An exception
// thrown by any iteration is rethrown on the calling thread after the loop (an exception may
// not leave an OpenMP region).
template <typename Body>
void parallel_for(int64_t count, int threads, Body&& body) {
  std::exception_ptr failure;
  std::mutex failure_mutex;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < count; ++i) {
    try {
      body(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

// ---------------------------------------------------------------- strided element I/O
// Converts `count` elements of the view starting at (h, t, 0) (stride view.stride[2]) into dst.
template <typename T>
void load_row(const TensorView& view, int64_t h, int64_t t, int64_t count, T* dst) {
  const int64_t base = view.offset(h, t, 0);
  const int64_t step = view.rank == 3 ? view.stride[2] : 1;
  switch (view.dtype) {
    case DType::f32: {
      const float* src = static_cast<const float*>(view.data) + base;
      for (int64_t x = 0; x < count; ++x) dst[x] = static_cast<T>(src[x * step]);
      break;
    }
    case DType::f64: {
      const double* src = static_cast<const double*>(view.data) + base;
      for (int64_t x = 0; x < count; ++x) dst[x] = static_cast<T>(src[x * step]);
      break;
    }
    case DType::f16: {
      const uint16_t* src = static_cast<const uint16_t*>(view.data) + base;
      for (int64_t x = 0; x < count; ++x) dst[x] = static_cast<T>(half::f16_to_float(src[x * step]));
      break;
    }
    case DType::bf16: {
      const uint16_t* src = static_cast<const uint16_t*>(view.data) + base;
      for (int64_t x = 0; x < count; ++x) dst[x] = static_cast<T>(half::bf16_to_float(src[x * step]));
      break;
    }
  }
}

// Writes `count` values to the view starting at (h, t, 0), converting to its dtype.
template <typename T>
void store_row(const TensorView& view, int64_t h, int64_t t, int64_t count, const T* src) {
  const int64_t base = view.offset(h, t, 0);
  const int64_t step = view.rank == 3 ? view.stride[2] : 1;
  switch (view.dtype) {
    case DType::f32: {
      float* dst = static_cast<float*>(view.data) + base;
      for (int64_t x = 0; x < count; ++x) dst[x * step] = static_cast<float>(src[x]);
      break;
    }
    case DType::f64: {
      double* dst = static_cast<double*>(view.data) + base;
      for (int64_t x = 0; x < count; ++x) dst[x * step] = static_cast<double>(src[x]);
      break;
    }
    case DType::f16: {
      uint16_t* dst = static_cast<uint16_t*>(view.data) + base;
      for (int64_t x = 0; x < count; ++x) dst[x * step] = half::float_to_f16(static_cast<float>(src[x]));
      break;
    }
    case DType::bf16: {
      uint16_t* dst = static_cast<uint16_t*>(view.data) + base;
      for (int64_t x = 0; x < count; ++x) dst[x * step] = half::float_to_bf16(static_cast<float>(src[x]));
      break;
    }
  }
}

// ---------------------------------------------------------------- packed buffers
// Where each sequence's key blocks start in a packed [heads][total blocks] array.
struct BlockIndex {
  std::vector<int64_t> first_block;  // per sequence: sum of N over earlier sequences
  int64_t total_blocks = 0;
  int block = 128;
  BlockIndex(const SeqLens& cu, int block_size) : block(block_size) {
    const size_t sequences = cu.size() - 1;
    first_block.resize(sequences);
    for (size_t s = 0; s < sequences; ++s) {
      first_block[s] = total_blocks;
      total_blocks += (cu[s + 1] - cu[s] + block_size - 1) / block_size;
    }
  }
};

// K packed block-transposed: for kv head g, sequence s, key block c, a [dpad][B] tile whose
// column j is key c*B + j of the sequence (zero beyond the sequence end). The transposed tile
// turns Q·K^T into broadcast-multiply-adds along contiguous key columns (no horizontal sums).
template <typename T>
struct PackedKeys {
  std::vector<T> data;
  int64_t dpad = 0;
  int block = 128;
  int64_t total_blocks = 0;
  const T* tile(int64_t g, int64_t global_block) const {
    return data.data() + ((g * total_blocks + global_block) * dpad) * block;
  }
};

// The K/V row of key position j of sequence s (src/common/kv_rows.h): contiguous rows from
// cu_k[s], or through the block table (a host table: the API checked its page ids).
struct KeyRows {
  const SeqLens& cu_k;
  const BlockTable& table;
  // Per sequence, the first key position any row of the plan lists (a sliding window's band starts
  // late in a long prompt): the keys before it are never read, so they are not packed (left zero).
  // Empty: every key from 0.
  std::vector<int64_t> first_read = {};
  int64_t first_read_of(int64_t s) const { return first_read.empty() ? 0 : first_read[static_cast<size_t>(s)]; }
  bool skips_keys() const {
    for (int64_t f : first_read)
      if (f > 0) return true;
    return false;
  }
  int64_t operator()(int64_t s, int64_t j) const {
    const int32_t* table_row = table.empty() ? nullptr : table.data + s * table.max_pages_per_sequence;
    return kv_rows::key_row(cu_k[s], table_row, table.page_size, j);
  }
};

// K packed per sequence and key block; cu holds the key offsets (cu_seqlens_k).
template <typename T>
PackedKeys<T> pack_keys(const TensorView& k, const SeqLens& cu, const BlockIndex& index, const KeyRows& rows,
                        int threads) {
  PackedKeys<T> packed;
  const int64_t d = k.dim();
  packed.dpad = round_up(d, kDimAlign);
  packed.block = index.block;
  packed.total_blocks = index.total_blocks;
  const int B = index.block;
  packed.data.assign(static_cast<size_t>(k.heads() * index.total_blocks * packed.dpad * B), T(0));
  const int64_t sequences = static_cast<int64_t>(cu.size()) - 1;
  // One work item per (kv head, sequence, block).
  std::vector<std::pair<int64_t, int32_t>> items;  // (sequence, block)
  for (int64_t s = 0; s < sequences; ++s) {
    const int64_t N = (cu[s + 1] - cu[s] + B - 1) / B;
    for (int64_t c = rows.first_read_of(s) / B; c < N; ++c) items.emplace_back(s, static_cast<int32_t>(c));
  }
  const int64_t per_head = static_cast<int64_t>(items.size());
  parallel_for(k.heads() * per_head, threads, [&](int64_t i) {
    const int64_t g = i / per_head;
    const int64_t s = items[i % per_head].first;
    const int32_t c = items[i % per_head].second;
    const int64_t begin = static_cast<int64_t>(c) * B;
    const int64_t end = std::min(begin + B, cu[s + 1] - cu[s]);
    T* tile = packed.data.data() + ((g * packed.total_blocks + index.first_block[s] + c) * packed.dpad) * B;
    std::vector<T> row(static_cast<size_t>(d));
    for (int64_t t = begin; t < end; ++t) {
      load_row(k, g, rows(s, t), d, row.data());
      const int64_t j = t - begin;
      for (int64_t x = 0; x < d; ++x) tile[x * B + j] = row[x];
    }
  });
  return packed;
}

// A view packed row-major: [heads][tokens][dpad], zero padded in the head dimension.
template <typename T>
struct PackedRows {
  std::vector<T> data;
  int64_t tokens = 0;
  int64_t dpad = 0;
  const T* row(int64_t h, int64_t t) const { return data.data() + (h * tokens + t) * dpad; }
};

template <typename T>
PackedRows<T> pack_rows(const TensorView& view, int threads) {
  PackedRows<T> packed;
  packed.tokens = view.tokens();
  packed.dpad = round_up(view.dim(), kDimAlign);
  packed.data.assign(static_cast<size_t>(view.heads() * packed.tokens * packed.dpad), T(0));
  // NOTE: 256 rows per work item keeps the scheduling overhead negligible.
  constexpr int64_t kRowsPerItem = 256;
  const int64_t chunks = (packed.tokens + kRowsPerItem - 1) / kRowsPerItem;
  parallel_for(view.heads() * chunks, threads, [&](int64_t i) {
    const int64_t h = i / chunks;
    const int64_t begin = (i % chunks) * kRowsPerItem;
    const int64_t end = std::min(begin + kRowsPerItem, packed.tokens);
    for (int64_t t = begin; t < end; ++t)
      load_row(view, h, t, view.dim(), packed.data.data() + (h * packed.tokens + t) * packed.dpad);
  });
  return packed;
}

// V (or K) packed in the sequences' key order: [heads][cu_k.back()][dpad], row cu_k[s] + j holding
// key position j of sequence s. Contiguous K/V is packed as it lies; paged K/V is gathered; keys
// before a sequence's first read one (KeyRows::first_read) are left zero.
template <typename T>
PackedRows<T> pack_key_rows(const TensorView& view, const KeyRows& rows, int threads) {
  if (rows.table.empty() && !rows.skips_keys()) return pack_rows<T>(view, threads);
  PackedRows<T> packed;
  const SeqLens& cu = rows.cu_k;
  packed.tokens = cu.back();
  packed.dpad = round_up(view.dim(), kDimAlign);
  packed.data.assign(static_cast<size_t>(view.heads() * packed.tokens * packed.dpad), T(0));
  const int64_t sequences = static_cast<int64_t>(cu.size()) - 1;
  parallel_for(view.heads() * sequences, threads, [&](int64_t i) {
    const int64_t h = i / sequences, s = i % sequences;
    for (int64_t j = rows.first_read_of(s); j < cu[s + 1] - cu[s]; ++j)
      load_row(view, h, rows(s, j), view.dim(), packed.data.data() + (h * packed.tokens + cu[s] + j) * packed.dpad);
  });
  return packed;
}

// ---------------------------------------------------------------- micro-kernels
// S[i][j] = sum_x Q[i][x] * Kt[x][j] for i < rows_pad (a multiple of kRowBlock) and j < B (a
// multiple of kColBlock). q has leading dimension dpad; kt is a [dpad][B] tile; s has leading
// dimension lds. Raw dot products: the caller applies the softmax scale. kRowBlock x kColBlock
// accumulators stay in registers (8 AVX-512 vectors: enough independent FMA chains to hide the
// FMA latency); each K vector loaded is used kRowBlock times.
template <typename T>
CRISP_CPU_INLINE void qk_tile(const T* q, int rows_pad, const T* kt, int64_t dpad, int B, T* s,
                              int64_t lds) {
  for (int i0 = 0; i0 < rows_pad; i0 += kRowBlock) {
    const T* qb = q + static_cast<int64_t>(i0) * dpad;
    for (int j0 = 0; j0 < B; j0 += kColBlock) {
      T a[kRowBlock][kColBlock] = {};
      for (int64_t x = 0; x < dpad; ++x) {
        const T* k = kt + x * B + j0;
        for (int r = 0; r < kRowBlock; ++r) {
          const T b = qb[r * dpad + x];
#pragma omp simd
          for (int j = 0; j < kColBlock; ++j) a[r][j] += b * k[j];
        }
      }
      for (int r = 0; r < kRowBlock; ++r) {
        T* out = s + (i0 + r) * lds + j0;
#pragma omp simd
        for (int j = 0; j < kColBlock; ++j) out[j] = a[r][j];
      }
    }
  }
}

// acc[i][x] += sum_{j < cols} P[i][j] * V[j][x] for i < rows_pad, x < dpad (a multiple of
// kColBlock). p has leading dimension ldp; v rows are dpad apart; acc has leading dimension dpad.
template <typename T>
CRISP_CPU_INLINE void pv_tile(const T* p, int ldp, int rows_pad, const T* v, int cols, int64_t dpad,
                              T* acc) {
  for (int i0 = 0; i0 < rows_pad; i0 += kRowBlock) {
    const T* pb = p + static_cast<int64_t>(i0) * ldp;
    for (int64_t x0 = 0; x0 < dpad; x0 += kColBlock) {
      T a[kRowBlock][kColBlock];
      for (int r = 0; r < kRowBlock; ++r) {
        const T* o = acc + (i0 + r) * dpad + x0;
#pragma omp simd
        for (int x = 0; x < kColBlock; ++x) a[r][x] = o[x];
      }
      for (int j = 0; j < cols; ++j) {
        const T* vr = v + j * dpad + x0;
        for (int r = 0; r < kRowBlock; ++r) {
          const T b = pb[r * ldp + j];
#pragma omp simd
          for (int x = 0; x < kColBlock; ++x) a[r][x] += b * vr[x];
        }
      }
      for (int r = 0; r < kRowBlock; ++r) {
        T* o = acc + (i0 + r) * dpad + x0;
#pragma omp simd
        for (int x = 0; x < kColBlock; ++x) o[x] = a[r][x];
      }
    }
  }
}

}  // namespace cpu
}  // namespace crisp
