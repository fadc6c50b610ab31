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
  // ascending, unique, each <= r, always containing 0 and r.
  std::vector<int32_t> row_ptr;
  std::vector<int32_t> col;
  // nnz / (N (N+1) / 2)
  double density = 1.0;
};

struct SequencePlan {
  int64_t token_offset = 0;  // first token of the sequence in the batch
  int64_t n = 0;             // tokens
  int32_t num_blocks = 0;    // N = ceil(n / B)
  std::vector<HeadPlan> heads;  // one per query head
};

struct Plan {
  Config config;
  int block_size = 128;
  int64_t num_q_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  double softmax_scale = 0.0;  // the resolved scale
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
