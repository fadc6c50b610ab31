// crisp/plan.h — the sparse layout chosen for every (sequence, query head): the format shared by
// every backend, so a plan made on one can be checked or run on another.
#pragma once
#include <cstdint>
#include <limits>
#include <vector>

#include "crisp/config.h"

namespace crisp {

struct HeadPlan {
  Route route = Route::dense;
  // §2 statistics of the proxy map (NaN where not computed, e.g. dense or short sequences).
  double c_struct = std::numeric_limits<double>::quiet_NaN();
  double jsd = std::numeric_limits<double>::quiet_NaN();
  // Vertical key blocks and slash distance-blocks kept on the VS side, ascending, anchors
  // (vertical 0, slash 0) included. For PE heads: the anchors plus min_budget blocks.
  std::vector<int32_t> vertical;
  std::vector<int32_t> slash;
  // CSR over query blocks: key blocks of query block r are col[row_ptr[r] .. row_ptr[r+1]),
  // ascending, unique, each <= r. Blocks are numbered by position (block r covers positions
  // [rB, (r+1)B) of the sequence's n_k), so a chunk's rows are rows of the whole prompt's grid:
  // the rows r < first_row hold no query of this call and are empty; every row r >= first_row
  // contains 0 and r.
  std::vector<int32_t> row_ptr;
  std::vector<int32_t> col;
  // nnz / (the causal blocks of rows first_row .. N-1); N (N+1) / 2 for a whole prompt.
  double density = 1.0;
};

// One sequence of a Batch (crisp/tensor.h): n_q queries, the last n_q of its n_k positions.
struct SequencePlan {
  int64_t q_offset = 0;    // first query row of the sequence in q (and out, lse): cu_seqlens_q[s]
  int64_t n_q = 0;         // queries
  int64_t kv_offset = 0;   // first key of the sequence: cu_seqlens_k[s] (a row of k and v unless paged)
  int64_t n_k = 0;         // keys; the queries sit at positions n_k - n_q .. n_k - 1
  int32_t num_blocks = 0;  // N = ceil(n_k / B): key blocks, and the rows of every head's CSR
  int32_t first_row = 0;   // (n_k - n_q) / B: the block of the first query; 0 for a whole prompt
  std::vector<HeadPlan> heads;  // one per query head
};

struct Plan {
  Config config;
  int block_size = 128;
  int64_t num_q_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  double softmax_scale = 0.0;  // the resolved scale
  // The page size of the paged K/V the plan was made over (0: contiguous K/V). attend refuses such
  // a plan without a block table: the page pool read as contiguous K/V would be other keys.
  int64_t page_size = 0;
  std::vector<SequencePlan> sequences;

  // Mean density over (sequence, head), weighted by each one's causal block count.
  double density() const;
  // Share of (sequence, head) pairs routed VS (dense heads excluded from the denominator; 0 if none).
  double vs_share() const;
  // Checks the CSR invariants of every head (anchors, sortedness, bounds, row_ptr monotone).
  // Throws crisp::Error describing the first violation.
  void check_well_formed() const;
};

}  // namespace crisp
