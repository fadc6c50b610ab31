// src/cpu/cpu_attention.cpp — block-sparse causal attention on the CPU (§6 of the spec).
//
// One work item per (sequence, query head, query block r): the block's queries are scored
// against each listed key block in ascending order with an online softmax (running max m, running
// sum l, rescaled accumulator), exactly as a FlashAttention kernel, so O and LSE match the dense
// softmax restricted to the listed blocks. The causal mask matters only on the diagonal block, a
// sliding window's (§12) only on the row's first two listed blocks.
// Q, K, V are packed once into contiguous buffers of the compute type (any input dtype and
// strides); K block-transposed so Q·K^T is a run of broadcast-multiply-adds.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend.h"
#include "cpu/cpu_common.h"
#include "plan/rules.h"

namespace crisp {
namespace cpu {
namespace {

template <typename T>
struct AttendInputs {
  const PackedRows<T>& q;
  const PackedKeys<T>& keys;
  const PackedRows<T>& v;
  const Plan& plan;
  const BlockIndex& index;
  const TensorView& out;
  const TensorView& lse;
  int64_t group;
};

// Per-thread scratch of one query block.
template <typename T>
struct Scratch {
  std::vector<T> q_tile, scores, acc, row_max, row_sum;
};

// Attention of query block r of head h of sequence s; writes out and lse of the block's rows.
template <typename T>
CRISP_CPU_INLINE void attend_block_impl(const AttendInputs<T>& in, int64_t s, int64_t h, int32_t r,
                                        Scratch<T>& scratch) {
  const int B = in.plan.block_size;
  const SequencePlan& sp = in.plan.sequences[s];
  const HeadPlan& head = sp.heads[h];
  const int64_t n = sp.n_k;
  // §11: the block's queries start at position row_begin (later than rB in a chunk's first block);
  // position p is query row q_offset + p - first_position.
  const int64_t row_begin = rules::row_query_begin(r, B, n, sp.n_q);
  const int64_t first_position = rules::first_query_position(n, sp.n_q);
  const int64_t q_row0 = sp.q_offset + row_begin - first_position;
  const int skipped = static_cast<int>(row_begin - rules::block_begin(r, B));  // rows of block r before the first query
  const int rows = static_cast<int>(rules::block_end(r, B, n) - row_begin);
  const int rows_pad = static_cast<int>(round_up(rows, kRowBlock));
  const int64_t dpad = in.q.dpad;
  const int64_t g = h / in.group;
  const T scale = static_cast<T>(in.plan.softmax_scale);
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const int64_t window = in.plan.config.window;

  scratch.q_tile.assign(static_cast<size_t>(rows_pad * dpad), T(0));
  std::copy(in.q.row(h, q_row0), in.q.row(h, q_row0) + rows * dpad, scratch.q_tile.data());
  scratch.scores.assign(static_cast<size_t>(rows_pad) * B, T(0));
  scratch.acc.assign(static_cast<size_t>(rows_pad * dpad), T(0));
  scratch.row_max.assign(static_cast<size_t>(rows), kNegInf);
  scratch.row_sum.assign(static_cast<size_t>(rows), T(0));
  T* scores = scratch.scores.data();
  T* acc = scratch.acc.data();

  for (int32_t e = head.row_ptr[r]; e < head.row_ptr[r + 1]; ++e) {
    const int32_t c = head.col[e];
    const int64_t col_begin = rules::block_begin(c, B);
    const int cols = static_cast<int>(rules::block_end(c, B, n) - col_begin);
    qk_tile(scratch.q_tile.data(), rows_pad, in.keys.tile(g, in.index.first_block[s] + c), dpad, B, scores, B);
    for (int i = 0; i < rows; ++i) {
      T* row = scores + static_cast<int64_t>(i) * B;
      // Keys first <= j < limit are visible: the whole block, or j <= skipped + i on the diagonal
      // block, and from the window's first key on (§12; 0 without a window).
      const int limit = c == r ? skipped + i + 1 : cols;
      const int64_t window_first = rules::window_first_key(row_begin + i, window) - col_begin;
      const int first = static_cast<int>(std::min<int64_t>(std::max<int64_t>(window_first, 0), limit));
      for (int j = 0; j < first; ++j) row[j] = T(0);
      if (first == limit) {  // nothing of this block in the row's window: no update
        for (int j = limit; j < B; ++j) row[j] = T(0);
        continue;
      }
      // The scores are scaled once and stored, so each exponent below is a stored score minus the
      // largest of them: never positive. (Scaling in both loops let the compiler fuse the second
      // into an fma, whose unrounded product could exceed the max: exponents up to +88, Inf sums.)
      T block_max = kNegInf;
#pragma omp simd reduction(max : block_max)
      for (int j = first; j < limit; ++j) {
        row[j] *= scale;
        block_max = std::max(block_max, row[j]);
      }
      const T new_max = std::max(scratch.row_max[i], block_max);
      const T correction = fast_exp(scratch.row_max[i] - new_max);  // exp(-inf) = 0 on the first block
      T block_sum = 0;
#pragma omp simd reduction(+ : block_sum)
      for (int j = first; j < limit; ++j) {
        const T p = fast_exp(row[j] - new_max);
        row[j] = p;
        block_sum += p;
      }
      for (int j = limit; j < B; ++j) row[j] = T(0);
      scratch.row_sum[i] = scratch.row_sum[i] * correction + block_sum;
      scratch.row_max[i] = new_max;
      T* acc_row = acc + i * dpad;
#pragma omp simd
      for (int64_t x = 0; x < dpad; ++x) acc_row[x] *= correction;
    }
    pv_tile(scores, B, rows_pad, in.v.row(g, sp.kv_offset + col_begin), cols, dpad, acc);
  }

  // Every row has its diagonal block (check_well_formed guarantees it), so row_sum > 0.
  const int64_t d = in.plan.head_dim;
  for (int i = 0; i < rows; ++i) {
    const T inv = T(1) / scratch.row_sum[i];
    T* acc_row = acc + i * dpad;
    for (int64_t x = 0; x < d; ++x) acc_row[x] *= inv;
    const int64_t token = q_row0 + i;
    store_row(in.out, h, token, d, acc_row);
    const double lse = static_cast<double>(scratch.row_max[i]) + std::log(static_cast<double>(scratch.row_sum[i]));
    store_row(in.lse, h, token, 1, &lse);
  }
}

CRISP_CPU_CLONES void attend_block(const AttendInputs<float>& in, int64_t s, int64_t h, int32_t r,
                                   Scratch<float>& scratch) {
  attend_block_impl(in, s, h, r, scratch);
}
CRISP_CPU_CLONES void attend_block(const AttendInputs<double>& in, int64_t s, int64_t h, int32_t r,
                                   Scratch<double>& scratch) {
  attend_block_impl(in, s, h, r, scratch);
}

template <typename T>
void attend_all(const TensorView& q, const TensorView& k, const TensorView& v, const Plan& plan,
                const BlockTable& block_table, const TensorView& out, const TensorView& lse, const Options& options) {
  const int threads = thread_count(options);
  SeqLens cu_k;
  cu_k.push_back(0);
  for (const SequencePlan& sp : plan.sequences) cu_k.push_back(sp.kv_offset + sp.n_k);
  const BlockIndex index(cu_k, plan.block_size);
  // The first key block any row lists, per sequence (a row's first column is its smallest): a
  // sliding window's band in a long prompt leaves most keys unread, and they are not packed.
  std::vector<int64_t> first_read(plan.sequences.size(), 0);
  for (size_t s = 0; s < plan.sequences.size(); ++s) {
    const SequencePlan& sp = plan.sequences[s];
    int64_t first = sp.n_k;
    for (const HeadPlan& head : sp.heads)
      for (int32_t r = sp.first_row; r < sp.num_blocks; ++r)
        if (head.row_ptr[r + 1] > head.row_ptr[r])
          first = std::min<int64_t>(first, static_cast<int64_t>(head.col[static_cast<size_t>(head.row_ptr[r])]) * plan.block_size);
    first_read[s] = first < sp.n_k ? first : 0;
  }
  const KeyRows key_rows{cu_k, block_table, first_read};
  const PackedRows<T> q_rows = pack_rows<T>(q, threads);
  const PackedKeys<T> keys = pack_keys<T>(k, cu_k, index, key_rows, threads);
  const PackedRows<T> v_rows = pack_key_rows<T>(v, key_rows, threads);
  const AttendInputs<T> inputs{q_rows, keys, v_rows, plan, index, out, lse, q.heads() / k.heads()};

  // Work items (s, h, r), the longest rows (largest r, most blocks) first for load balance.
  struct Item {
    int64_t s, h;
    int32_t r;
  };
  std::vector<Item> items;
  for (int64_t s = 0; s < static_cast<int64_t>(plan.sequences.size()); ++s)
    for (int64_t h = 0; h < q.heads(); ++h)
      for (int32_t r = plan.sequences[s].first_row; r < plan.sequences[s].num_blocks; ++r) items.push_back({s, h, r});
  std::stable_sort(items.begin(), items.end(), [&](const Item& a, const Item& b) {
    const HeadPlan& ha = plan.sequences[a.s].heads[a.h];
    const HeadPlan& hb = plan.sequences[b.s].heads[b.h];
    return ha.row_ptr[a.r + 1] - ha.row_ptr[a.r] > hb.row_ptr[b.r + 1] - hb.row_ptr[b.r];
  });
  std::vector<Scratch<T>> scratch(static_cast<size_t>(std::max(threads, 1)));
  parallel_for(static_cast<int64_t>(items.size()), threads, [&](int64_t i) {
#if defined(_OPENMP)
    Scratch<T>& mine = scratch[omp_get_thread_num()];
#else
    Scratch<T>& mine = scratch[0];
#endif
    attend_block(inputs, items[i].s, items[i].h, items[i].r, mine);
  });
}

}  // namespace
}  // namespace cpu

namespace detail {

void cpu_attend(const TensorView& q, const TensorView& k, const TensorView& v, const Plan& plan,
                const BlockTable& block_table, const TensorView& out, const TensorView& lse, const Options& options) {
  if (options.precision == Precision::f64) {
    cpu::attend_all<double>(q, k, v, plan, block_table, out, lse, options);
  } else {
    cpu::attend_all<float>(q, k, v, plan, block_table, out, lse, options);
  }
}

}  // namespace detail
}  // namespace crisp
