// src/plan/plan_layout.h — where each (sequence, head) of a batch keeps its plan inside flat,
// fixed-capacity buffers. Used by the CUDA planner (which writes them on the device with no host
// round-trip, so plan + attend can be captured in a CUDA graph), by the CUDA attention kernels
// (which read them), and by the host code that converts them to/from crisp::Plan.
//
// Capacity is the causal worst case (N (N+1) / 2 columns per head), so no size is ever read back
// before the kernels run. At 512k tokens, B = 128 and 32 heads this is ~1.07 GB of int32 columns.
#pragma once
#include <cmath>
#include <cstdint>

#include "plan/rules.h"

namespace crisp {
namespace layout {

// Per-sequence bases, computed on the host from cu_seqlens (sequence lengths are host-known
// shapes, like tensor shapes) and copied to the device once per batch shape.
struct SequenceBases {
  int64_t token_offset;   // first QUERY row of the sequence in q / out / lse (cu_seqlens_q[s])
  int64_t n;              // keys, n_k: the queries sit at positions n - n_q .. n - 1 (spec §11)
  int64_t n_q;            // queries (n_q == n for a whole prompt)
  int64_t kv_offset;      // first key of the sequence (cu_seqlens_k[s]): a row of k / v unless paged
  int32_t first_row;      // (n - n_q) / B: rows before it hold no query and stay empty
  int32_t num_blocks;     // N
  int64_t block_base;     // sum of N over earlier sequences (for [slot][N] arrays: slot base = block_base*H + h*N)
  int64_t row_ptr_base;   // sum of (N+1) over earlier sequences
  int64_t col_base;       // sum of N(N+1)/2 over earlier sequences
};

// Slot of (sequence s, query head h): s * H + h.
CRISP_HD int64_t slot(int64_t s, int64_t h, int64_t num_heads) { return s * num_heads + h; }
// Start of the [N]-sized arrays (vertical/slash flags, pooled masses) of (s, h).
CRISP_HD int64_t block_array_offset(const SequenceBases& b, int64_t h, int64_t num_heads) {
  return b.block_base * num_heads + h * b.num_blocks;
}
// Start of the [N+1] row_ptr of (s, h).
CRISP_HD int64_t row_ptr_offset(const SequenceBases& b, int64_t h, int64_t num_heads) {
  return b.row_ptr_base * num_heads + h * (b.num_blocks + 1);
}
// Start of the column capacity of (s, h). row_ptr values are relative to this start.
CRISP_HD int64_t col_offset(const SequenceBases& b, int64_t h, int64_t num_heads) {
  return b.col_base * num_heads + h * rules::causal_blocks(b.num_blocks);
}

// Tiles of the lower triangle of a `tiles` x `tiles` grid, row by row: row r holds columns 0..r,
// tile t = r (r + 1) / 2 + c. The CUDA planner launches one block per tile of the block-causal
// triangle (the PE logits), and decodes its tile with triangle_tile.
CRISP_HD int64_t triangle_tiles(int64_t tiles) { return tiles * (tiles + 1) / 2; }
// The row of tile t, from an estimate within a few rows of it (either side).
CRISP_HD int64_t triangle_row_from(int64_t t, int64_t estimate) {
  int64_t r = estimate < 0 ? 0 : estimate;
  while (r > 0 && triangle_tiles(r) > t) --r;
  while (triangle_tiles(r + 1) <= t) ++r;
  return r;
}
CRISP_HD void triangle_tile(int64_t t, int32_t& row, int32_t& col) {
  // The square root gives the row up to its rounding; triangle_row_from corrects that.
  const int64_t r = triangle_row_from(t, static_cast<int64_t>((sqrt(8.0 * static_cast<double>(t) + 1.0) - 1.0) / 2.0));
  row = static_cast<int32_t>(r);
  col = static_cast<int32_t>(t - triangle_tiles(r));
}

}  // namespace layout
}  // namespace crisp
