// src/plan/dense_head.h — the dense head: the one place that lists every causal block of a
// sequence's rows (within a sliding window), for dense_plan, the dense preset and short sequences.
#pragma once
#include <cstdint>

#include "crisp/plan.h"

namespace crisp {
namespace detail {

// The dense head of a sequence of shape `shape` (n_k, n_q, num_blocks, first_row): route dense, every
// causal block of rows first_row .. N-1 within the window (§12; 0 = none), earlier rows empty,
// c_struct/jsd NaN, density 1 without a window (defined in src/plan/plan.cpp).
HeadPlan make_dense_head(const SequencePlan& shape, int32_t block_size, int64_t window);

}  // namespace detail
}  // namespace crisp
