// src/plan/plan.cpp — summary statistics and the structural check of crisp::Plan, and the dense
// head (plan/dense_head.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "crisp/error.h"
#include "crisp/plan.h"
#include "plan/dense_head.h"
#include "plan/rules.h"

namespace crisp {

double Plan::density() const {
  // Weighted by causal block count: the share of causal blocks computed over the whole batch.
  double computed = 0.0;
  double causal = 0.0;
  for (const SequencePlan& seq : sequences) {
    const double blocks = static_cast<double>(rules::causal_blocks_of_rows(seq.first_row, seq.num_blocks));
    for (const HeadPlan& head : seq.heads) {
      computed += head.density * blocks;
      causal += blocks;
    }
  }
  return causal > 0.0 ? computed / causal : 0.0;
}

double Plan::vs_share() const {
  int64_t vs = 0;
  int64_t routed = 0;
  for (const SequencePlan& seq : sequences) {
    for (const HeadPlan& head : seq.heads) {
      if (head.route == Route::dense) continue;
      ++routed;
      if (head.route == Route::vs) ++vs;
    }
  }
  return routed > 0 ? static_cast<double>(vs) / static_cast<double>(routed) : 0.0;
}

namespace {

[[noreturn]] void fail(size_t s, size_t h, const std::string& what) {
  throw Error("plan", "sequence " + std::to_string(s) + ", head " + std::to_string(h) + ": " + what,
              "a well-formed plan (CSR rows ascending, unique, within [0, r] and the window, containing 0 and r)");
}

// Block indices of a VS/PE side set: ascending, unique, in [0, N), anchor 0 present.
void check_side_set(const std::vector<int32_t>& set, const char* name, int32_t N, size_t s, size_t h) {
  if (set.empty() || set.front() != 0) fail(s, h, std::string(name) + " set lacks its anchor 0");
  for (size_t i = 0; i < set.size(); ++i) {
    if (set[i] < 0 || set[i] >= N)
      fail(s, h, std::string(name) + " block " + std::to_string(set[i]) + " outside [0, " + std::to_string(N) + ")");
    if (i > 0 && set[i] <= set[i - 1])
      fail(s, h, std::string(name) + " set not ascending and unique at index " + std::to_string(i));
  }
}

}  // namespace

void Plan::check_well_formed() const {
  if (block_size <= 0) throw Error("plan", "block_size " + std::to_string(block_size) + " is not positive", "64 or 128");
  const int32_t cover = rules::code_of(config.slash_cover);
  for (size_t s = 0; s < sequences.size(); ++s) {
    const SequencePlan& seq = sequences[s];
    if (seq.n_k < 0 || seq.num_blocks != rules::num_blocks(seq.n_k, block_size))
      throw Error("plan",
                  "sequence " + std::to_string(s) + ": num_blocks " + std::to_string(seq.num_blocks) +
                      " does not match n_k = " + std::to_string(seq.n_k) + " at block size " + std::to_string(block_size),
                  "num_blocks = ceil(n_k / block_size)");
    if (seq.n_q < 1 || seq.n_q > seq.n_k || seq.first_row != rules::first_query_block(seq.n_k, seq.n_q, block_size))
      throw Error("plan",
                  "sequence " + std::to_string(s) + ": n_q = " + std::to_string(seq.n_q) + ", n_k = " +
                      std::to_string(seq.n_k) + ", first_row = " + std::to_string(seq.first_row),
                  "1 <= n_q <= n_k and first_row = (n_k - n_q) / block_size");
    if (static_cast<int64_t>(seq.heads.size()) != num_q_heads)
      throw Error("plan",
                  "sequence " + std::to_string(s) + " has " + std::to_string(seq.heads.size()) + " heads",
                  std::to_string(num_q_heads) + " (num_q_heads)");
    const int32_t N = seq.num_blocks;
    for (size_t h = 0; h < seq.heads.size(); ++h) {
      const HeadPlan& head = seq.heads[h];
      const std::vector<int32_t>& rp = head.row_ptr;
      const std::vector<int32_t>& col = head.col;
      if (rp.size() != static_cast<size_t>(N) + 1)
        fail(s, h, "row_ptr has " + std::to_string(rp.size()) + " entries, expected N+1 = " + std::to_string(N + 1));
      if (rp[0] != 0) fail(s, h, "row_ptr[0] = " + std::to_string(rp[0]) + ", expected 0");
      if (static_cast<size_t>(rp[N]) != col.size())
        fail(s, h, "row_ptr[N] = " + std::to_string(rp[N]) + " but col has " + std::to_string(col.size()) + " entries");

      // Flags of the side sets, to check the layout contains what the head selected (§5).
      std::vector<char> vflag(static_cast<size_t>(N), 0), sflag(static_cast<size_t>(N), 0);
      if (head.route == Route::dense) {
        if (!head.vertical.empty() || !head.slash.empty()) fail(s, h, "dense head with non-empty vertical/slash sets");
      } else if (N > 0) {
        check_side_set(head.vertical, "vertical", N, s, h);
        check_side_set(head.slash, "slash", N, s, h);
        for (int32_t b : head.vertical) vflag[static_cast<size_t>(b)] = 1;
        for (int32_t c : head.slash) sflag[static_cast<size_t>(c)] = 1;
      }

      std::vector<char> in_row(static_cast<size_t>(N), 0);
      for (int32_t r = 0; r < N; ++r) {
        const int32_t begin = rp[static_cast<size_t>(r)];
        const int32_t end = rp[static_cast<size_t>(r) + 1];
        const std::string row = "row " + std::to_string(r) + ": ";
        if (end < begin || begin < 0 || static_cast<size_t>(end) > col.size())
          fail(s, h, row + "row_ptr not monotone or out of bounds");
        if (r < seq.first_row) {
          if (end != begin) fail(s, h, row + "lists blocks but holds no query (first_row = " + std::to_string(seq.first_row) + ")");
          continue;
        }
        if (end == begin) fail(s, h, row + "empty row");
        // §12: with a window no block before the row's first visible one (the kernels mask only the
        // window's edge, the first two listed blocks); the sink anchor only where the window reaches it.
        const int32_t first_kb = rules::window_first_block(r, block_size, seq.n_k, seq.n_q, config.window);
        for (int32_t i = begin; i < end; ++i) {
          const int32_t c = col[static_cast<size_t>(i)];
          if (c < 0 || c > r) fail(s, h, row + "column " + std::to_string(c) + " outside [0, r]");
          if (c < first_kb)
            fail(s, h, row + "column " + std::to_string(c) + " lies wholly outside the window of " +
                           std::to_string(config.window) + " tokens (first visible block " + std::to_string(first_kb) + ")");
          if (i > begin && c <= col[static_cast<size_t>(i) - 1])
            fail(s, h, row + "columns not ascending and unique at column " + std::to_string(c));
        }
        if (first_kb == 0 && col[static_cast<size_t>(begin)] != 0) fail(s, h, row + "lacks the sink anchor block 0");
        if (col[static_cast<size_t>(end) - 1] != r) fail(s, h, row + "lacks its diagonal block r");

        // Every block the head's own sets imply must be present (a dense head: every block).
        std::fill(in_row.begin(), in_row.begin() + r + 1, 0);
        for (int32_t i = begin; i < end; ++i) in_row[static_cast<size_t>(col[static_cast<size_t>(i)])] = 1;
        for (int32_t kb = first_kb; kb <= r; ++kb) {
          if (in_row[static_cast<size_t>(kb)]) continue;
          if (head.route == Route::dense)
            fail(s, h, row + "dense head lacks causal block " + std::to_string(kb));
          if (vflag[static_cast<size_t>(kb)])
            fail(s, h, row + "lacks block " + std::to_string(kb) + " of its vertical set");
          if (rules::covered_by_slash(r, kb, sflag, cover))
            fail(s, h, row + "lacks block " + std::to_string(kb) + " reached by its slash set");
        }
      }

      if (N > 0) {
        const double expected = rules::density_of_rows(static_cast<int64_t>(col.size()), seq.first_row, N);
        if (!(std::fabs(head.density - expected) <= 1e-12))
          fail(s, h, "density " + std::to_string(head.density) + " differs from nnz / (causal blocks of its rows) = " +
                         std::to_string(expected));
      }
    }
  }
}

namespace detail {

HeadPlan make_dense_head(const SequencePlan& shape, int32_t block_size, int64_t window) {
  const int32_t num_blocks = shape.num_blocks, first_row = shape.first_row;
  HeadPlan head;
  head.route = Route::dense;
  head.c_struct = std::numeric_limits<double>::quiet_NaN();
  head.jsd = std::numeric_limits<double>::quiet_NaN();
  head.row_ptr.assign(static_cast<size_t>(num_blocks) + 1, 0);
  if (window == 0) head.col.reserve(static_cast<size_t>(rules::causal_blocks_of_rows(first_row, num_blocks)));
  for (int32_t r = first_row; r < num_blocks; ++r) {
    for (int32_t c = rules::window_first_block(r, block_size, shape.n_k, shape.n_q, window); c <= r; ++c)
      head.col.push_back(c);
    head.row_ptr[r + 1] = static_cast<int32_t>(head.col.size());
  }
  head.density = num_blocks > 0 ? rules::density_of_rows(static_cast<int64_t>(head.col.size()), first_row, num_blocks) : 1.0;
  return head;
}

}  // namespace detail

}  // namespace crisp
