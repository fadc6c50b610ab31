// src/common/kv_rows.h — where key position j of a sequence lives in the K/V views (spec §11),
// written once for every backend: contiguous K/V hold it at row kv_offset + j; paged K/V (a
// crisp::BlockTable, vLLM / FlashInfer "NHD" pages) at row page * page_size + j % page_size of
// the page pool, page = the sequence's table row at j / page_size.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define CRISP_KV_HD __host__ __device__ __forceinline__
#else
#define CRISP_KV_HD inline
#endif

namespace crisp {
namespace kv_rows {

// A page's index and row for a key position, as a shift and a mask where the page size is a power
// of two (`shift` = log2 of the size: 16 and every other size vLLM and FlashInfer use), a division
// otherwise (`shift` < 0, e.g. pages of 48). The Hopper kernel's producer computes both for every
// box of every key tile, on warps that share their schedulers with consumer warps; a 32-bit
// division by a runtime value is about 20 instructions there.
CRISP_KV_HD int32_t page_shift(int64_t page_size) {
  if (page_size <= 0 || (page_size & (page_size - 1)) != 0) return -1;
  int32_t shift = 0;
  while ((int64_t{1} << shift) < page_size) ++shift;
  return shift;
}
// position >= 0; shift = page_shift(page_size).
CRISP_KV_HD int32_t page_of(int32_t position, int32_t page_size, int32_t shift) {
  return shift >= 0 ? position >> shift : position / page_size;
}
CRISP_KV_HD int32_t row_in_page(int32_t position, int32_t page_size, int32_t shift) {
  return shift >= 0 ? position & (page_size - 1) : position % page_size;
}

// Paged K/V: the pool row of key position j on pool page `page` (the table's entry at j / page_size).
CRISP_KV_HD int64_t paged_row(int32_t page, int64_t page_size, int64_t j) {
  return static_cast<int64_t>(page) * page_size + j % page_size;
}

// table_row: the sequence's row of the block table, or null for contiguous K/V.
CRISP_KV_HD int64_t key_row(int64_t kv_offset, const int32_t* table_row, int64_t page_size, int64_t j) {
  if (table_row == nullptr) return kv_offset + j;
  return paged_row(table_row[j / page_size], page_size, j);
}

}  // namespace kv_rows
}  // namespace crisp
