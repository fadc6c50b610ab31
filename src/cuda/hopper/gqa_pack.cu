// src/cuda/hopper/gqa_pack.cu — the union layout and the work order of a launch that packs GQA
// groups (see gqa_pack.h).
#include "cuda/hopper/gqa_pack.h"

#include <algorithm>
#include <limits>

#include "cuda/cuda_check.h"
#include "cuda/work_order.h"
#include "plan/plan_layout.h"

namespace crisp {
namespace cuda_detail {
namespace hopper {

namespace {

// NOTE: 4 warps (one union row each) per CTA, grid-stride: the pass reads the plan's columns once
// (tens of microseconds at 128k tokens).
constexpr int kUnionWarps = 4;
constexpr int kMaxUnionCtas = 2048;

// Union row j of the batch: sequence s holds rows [Hkv * block_base_s, Hkv * (block_base_s + N_s)),
// its row j' = j - Hkv * block_base_s is kv head j' % Hkv, query block j' / Hkv. One warp per row:
// the columns of the group's g rows set bits of a bitmap over key blocks 0..r in shared memory
// (atomicOr: heads overlap), then the set bits are written in ascending order (a warp prefix sum of
// the per-word counts gives each lane its output position).
__global__ void gqa_union_kernel(const DevicePlanView view, int32_t group, int64_t num_rows, int32_t words_per_warp,
                                 int32_t* union_col, int32_t* union_len) {
  extern __shared__ uint32_t bitmaps[];
  uint32_t* bits = bitmaps + (threadIdx.x / 32) * words_per_warp;
  const int lane = threadIdx.x % 32;
  const int64_t Hq = view.num_heads, Hkv = Hq / group, S = view.num_sequences;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kUnionWarps + threadIdx.x / 32; j < num_rows;
       j += static_cast<int64_t>(gridDim.x) * kUnionWarps) {
    int64_t lo = 0, hi = S - 1;  // the last sequence whose first row is at or before j
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (view.seqs[mid].block_base * Hkv <= j) lo = mid;
      else hi = mid - 1;
    }
    const layout::SequenceBases b = view.seqs[lo];
    const int64_t local = j - b.block_base * Hkv;
    const int64_t kv = local % Hkv;
    const int32_t r = static_cast<int32_t>(local / Hkv);
    if (r < b.first_row) {  // a chunk's rows without queries (spec §11): empty in every head
      if (lane == 0) union_len[layout::block_array_offset(b, kv, Hkv) + r] = 0;
      continue;
    }
    const int32_t words = r / 32 + 1;
    for (int32_t w = lane; w < words; w += 32) bits[w] = 0u;
    __syncwarp();
    for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
      const int32_t* row_ptr = view.row_ptr + layout::row_ptr_offset(b, h, Hq);
      const int32_t* cols = view.col + layout::col_offset(b, h, Hq);
      for (int32_t e = row_ptr[r] + lane; e < row_ptr[r + 1]; e += 32) {
        const int32_t c = cols[e];
        atomicOr(&bits[c >> 5], 1u << (c & 31));
      }
    }
    __syncwarp();
    int32_t* out = union_col + layout::col_offset(b, kv, Hkv) + layout::triangle_tiles(r);
    int32_t written = 0;
    for (int32_t base = 0; base < words; base += 32) {
      const int32_t w = base + lane;
      uint32_t word = w < words ? bits[w] : 0u;
      const int32_t count = __popc(word);
      int32_t inclusive = count;
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const int32_t t = __shfl_up_sync(0xffffffffu, inclusive, offset);
        if (lane >= offset) inclusive += t;
      }
      int32_t pos = written + inclusive - count;
      while (word != 0u) {
        out[pos++] = w * 32 + (__ffs(static_cast<int>(word)) - 1);
        word &= word - 1u;
      }
      written += __shfl_sync(0xffffffffu, inclusive, 31);
    }
    if (lane == 0) union_len[layout::block_array_offset(b, kv, Hkv) + r] = written;
    __syncwarp();  // every lane is done with the bitmap before the next row clears it
  }
}

constexpr std::size_t align256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

bool gqa_pack_applies(int block_size, int64_t group, bool row_subset, int64_t num_work_items) {
  return block_size == 128 && (group == 2 || group == 4 || group == 8 || group == 16) && !row_subset &&
         num_work_items > 0 && num_work_items <= std::numeric_limits<int32_t>::max();
}

namespace {

// The buffers of one packed launch, each 256-byte aligned, in this order: union columns, union
// lengths, the work order, then the sort's keys in and out, its items in and cub's scratch.
struct PackedBytes {
  std::size_t col, len, order, keys, items, temp, total;
};
PackedBytes packed_bytes(std::size_t col_entries, std::size_t len_entries, int64_t rows) {
  PackedBytes b{};
  const std::size_t n = static_cast<std::size_t>(rows);
  b.col = align256(col_entries * 4);
  b.len = align256(len_entries * 4);
  b.order = align256(n * 4);
  b.keys = align256(n * 8);
  b.items = align256(n * 4);
  b.temp = work_order_temp_bytes(rows);
  b.total = b.col + b.len + b.order + 2 * b.keys + b.items + align256(b.temp);
  return b;
}

}  // namespace

// Sorted items: Hq x sum of N (sorted_rows; the view.num_work_items real rows first); union rows:
// Hkv x sum of N; union columns: Hkv x the causal blocks of every sequence.
PackedGqaLayout::PackedGqaLayout(const DevicePlanView& view, int group, cudaStream_t stream)
    : col_entries_(static_cast<std::size_t>(view.num_heads / group * view.causal_blocks)),
      len_entries_(static_cast<std::size_t>(view.num_heads / group * view.total_blocks)),
      storage_(packed_bytes(col_entries_, len_entries_, sorted_rows(view)).total, stream) {
  const PackedBytes b = packed_bytes(col_entries_, len_entries_, sorted_rows(view));
  char* p = storage_.data();
  col_ = reinterpret_cast<int32_t*>(p);
  p += b.col;
  len_ = reinterpret_cast<int32_t*>(p);
  p += b.len;
  order_ = reinterpret_cast<int32_t*>(p);
  p += b.order;
  WorkOrderScratch scratch{};
  scratch.keys_in = reinterpret_cast<uint64_t*>(p);
  p += b.keys;
  scratch.keys_out = reinterpret_cast<uint64_t*>(p);
  p += b.keys;
  scratch.items_in = reinterpret_cast<int32_t*>(p);
  p += b.items;
  scratch.temp = p;
  scratch.temp_bytes = b.temp;

  const int64_t union_rows = static_cast<int64_t>(len_entries_);
  const int32_t words_per_warp = (view.max_num_blocks + 31) / 32;
  const std::size_t smem = static_cast<std::size_t>(kUnionWarps) * words_per_warp * 4;
  if (smem > 48 * 1024)
    CRISP_CUDA_CHECK(cudaFuncSetAttribute(gqa_union_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
  const int64_t ctas = std::min<int64_t>((union_rows + kUnionWarps - 1) / kUnionWarps, kMaxUnionCtas);
  gqa_union_kernel<<<static_cast<unsigned>(ctas), kUnionWarps * 32, smem, stream>>>(view, group, union_rows,
                                                                                    words_per_warp, col_, len_);
  CRISP_CUDA_CHECK_LAUNCH("gqa_union_kernel");
  build_union_work_order(view, len_, group, scratch, order_, stream);
}

}  // namespace hopper
}  // namespace cuda_detail
}  // namespace crisp
