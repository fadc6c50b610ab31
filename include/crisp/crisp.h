// crisp/crisp.h — the public entry points. Include this one header.
//
//   crisp::Config cfg = crisp::Config::from_preset("crisp");
//   crisp::Plan plan  = crisp::plan(q, k, cfg);            // per head: route, layout, density
//   crisp::attend(q, k, v, plan, out, lse);                  // block-sparse attention
//   // or both at once: crisp::prefill(q, k, v, cfg, out, lse);
//   // or plan once, run many times, on either backend: crisp::Attention (crisp/attention.h)
//
// A chunk of a chunked prefill (queries over a KV prefix, paged or not) is a crisp::Batch
// (crisp/tensor.h): crisp::prefill(q_chunk, k_cache, v_cache, cfg, out, lse,
// crisp::Batch{{0, n_q}, {0, n_k}}) attends the n_q queries at positions n_k - n_q .. n_k - 1.
//
// Backends: the device of the views picks it (Device::cpu; Device::cuda with the CUDA backend, see
// crisp/cuda.h), or options.backend names it (crisp/options.h). All views of one call must be on
// one device.
#pragma once
#include <cstdint>
#include <vector>

#include "crisp/attention.h"
#include "crisp/config.h"
#include "crisp/error.h"
#include "crisp/limits.h"
#include "crisp/options.h"
#include "crisp/plan.h"
#include "crisp/tensor.h"

namespace crisp {

// Validates the inputs (shapes, dtypes, head counts, d <= 256, finite values, the batch) and
// builds the plan of every (sequence, query head). Throws crisp::Error on bad input.
//   q: [Hq, q_tokens, d]; k: [Hkv, kv_tokens, d]; Hq % Hkv == 0.
//   batch: the sequences (crisp/tensor.h); cu_seqlens converts to a batch of whole prompts, and
//   the default is one whole prompt (q_tokens == kv_tokens).
Plan plan(const TensorView& q, const TensorView& k, const Config& config, const Batch& batch = {},
          const Options& options = {});

// The shape checks of plan / prefill alone — the views, head counts and head dims, the token
// bounds, the batch and its block table — without reading a value or planning, so a caller can
// check its inputs before it allocates outputs. `v` may be null (planning only). Throws
// crisp::Error naming the argument ("q", "k", "v", "cu_seqlens", "batch.block_table", ...).
void check_inputs(const TensorView& q, const TensorView& k, const TensorView* v = nullptr, const Batch& batch = {});

// Block-sparse causal attention following `plan` (§6, §11).
//   out: [Hq, q_tokens, d] f32/f16/bf16/f64; lse: [Hq, q_tokens] f32 or f64 (natural log).
//   block_table: the paged K/V of the planned batch (the same table, or one mapping the same
//   positions to the same keys); empty for contiguous K/V, and required for a plan made over
//   paged K/V (Plan::page_size > 0): a page pool passed without its table reads other keys. (One
//   way on purpose: a plan made over contiguous K/V may run over pages holding the same keys.)
//   out may be q itself; otherwise out and lse share no memory with q, k, v (refused where both
//   views are dense) or each other (their byte spans must be apart), and each gives every index
//   its own element (no stride 0 over an extent > 1; each stride larger than the farthest offset
//   of the smaller ones, as in a dense, padded or permuted tensor).
//   On the CPU, results beyond out's or lse's dtype (e.g. v above 65504 into an f16 out) are refused.
//   A call whose working memory does not fit is refused as a crisp::Error too.
// Every element of out and lse is written.
void attend(const TensorView& q, const TensorView& k, const TensorView& v, const Plan& plan,
            const TensorView& out, const TensorView& lse, const Options& options = {},
            const BlockTable& block_table = {});

// plan() then attend(); returns the plan.
Plan prefill(const TensorView& q, const TensorView& k, const TensorView& v, const Config& config,
             const TensorView& out, const TensorView& lse, const Batch& batch = {}, const Options& options = {});

// The plan of dense causal attention (every block c <= r of the rows holding queries) for the
// given shapes: used for the dense preset and as the baseline of every comparison. The batch
// must list its sequences (an empty cu_seqlens_q has no token count to take).
Plan dense_plan(int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, const Batch& batch,
                int block_size = 128, double softmax_scale = 0.0);

// Spec §10: the plan a kernel runs when it packs each GQA group (the query heads sharing one kv
// head) into one tile: every head's layout replaced by the union of its group's layouts (a
// superset, so never less accurate). Its density() is the density such a kernel computes; route,
// statistics and the VS choices of each head are kept. The CUDA backend runs it in place of the
// plan under options.cuda.gqa_packing = pack (crisp/options.h); the Plan that prefill() returns stays the
// planned one. Throws crisp::Error("plan", ...) for a plan whose kv heads do not divide its query
// heads or that is not well formed.
Plan gqa_union(const Plan& plan);

// Comparison of a sparse run against the dense run of the same inputs (§9).
struct HeadMetrics {
  double recall_mean = 1.0;   // mean over queries of exp(LSE_sparse - LSE_dense)
  double recall_min = 1.0;    // minimum over queries
  double rel_error = 0.0;     // ||O_sparse - O_dense||_F / ||O_dense||_F
};
// out/lse views of a sparse and a dense run (CPU views); one entry per (sequence, query head) in
// plan order.
std::vector<HeadMetrics> compare(const TensorView& out_sparse, const TensorView& lse_sparse,
                                 const TensorView& out_dense, const TensorView& lse_dense,
                                 const SeqLens& cu_seqlens = {});

}  // namespace crisp
