// crisp/tensor.h — non-owning tensor views and variable-length batches.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace crisp {

enum class DType { f32, f16, bf16, f64 };
enum class Device { cpu, cuda };

const char* to_string(DType dtype);
const char* to_string(Device device);
std::size_t dtype_size(DType dtype);

// A strided view of a rank-2 or rank-3 tensor. Strides are in elements, not bytes.
//  - Q, O:   [Hq,  tokens, d]
//  - K, V:   [Hkv, tokens, d]       (tokens: of the keys; with paged K/V, of the page pool)
//  - LSE:    [Hq,  tokens]           (rank 2, float32)
// `tokens` is the total token count of the batch (see SeqLens). Any strides are accepted, so
// both [heads, tokens, d] and [tokens, heads, d] memory layouts are views of the same shape.
// The last dimension must have stride 1 on the CUDA backend.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int rank = 3;
  std::array<int64_t, 3> shape{0, 0, 0};
  std::array<int64_t, 3> stride{0, 0, 0};

  // Row-major [heads, tokens, dim].
  static TensorView contiguous(void* data, DType dtype, int64_t heads, int64_t tokens, int64_t dim,
                               Device device = Device::cpu);
  // Row-major [heads, tokens] (used for LSE).
  static TensorView contiguous2d(void* data, DType dtype, int64_t heads, int64_t tokens,
                                 Device device = Device::cpu);

  int64_t heads() const { return shape[0]; }
  int64_t tokens() const { return shape[1]; }
  int64_t dim() const { return rank == 3 ? shape[2] : 1; }
  int64_t numel() const { return shape[0] * shape[1] * (rank == 3 ? shape[2] : 1); }
  // Element offset of (h, t, x).
  int64_t offset(int64_t h, int64_t t, int64_t x = 0) const {
    return h * stride[0] + t * stride[1] + (rank == 3 ? x * stride[2] : 0);
  }
};

// Cumulative sequence offsets of a variable-length batch, as FlashAttention's varlen API:
// sequence s occupies tokens [cu_seqlens[s], cu_seqlens[s+1]) of the views. Empty means one
// sequence spanning every token.
using SeqLens = std::vector<int64_t>;

// Paged K/V, as vLLM and FlashInfer lay it out (their "NHD" layout). K and V are then views of
// the whole page pool: [Hkv, num_pages * page_size, d], pool token `p * page_size + j` being row
// j of page p (a vLLM cache [num_pages, page_size, Hkv, d] is the view with strides
// {d, Hkv * d, 1}). Key position t of sequence s lives in pool token
// `data[s * max_pages_per_sequence + t / page_size] * page_size + t % page_size`: pages in any
// order, shared between sequences or not. Only the rows the batch reads are its input: other pages
// may hold anything (they are neither read nor checked). The table lives on the device of the
// tensors and must stay valid until the last attention run that uses it.
struct BlockTable {
  const int32_t* data = nullptr;       // [num_sequences, max_pages_per_sequence] page ids, row-major
  Device device = Device::cpu;         // where `data` lives (the device of k and v)
  int64_t max_pages_per_sequence = 0;  // the row stride of `data`
  int64_t page_size = 0;               // tokens per page, a multiple of 16; 0: no table (K/V contiguous)

  bool empty() const { return page_size == 0; }
};

// The sequences of one call. Sequence s has n_k keys (its whole context so far, a KV cache
// included) and n_q <= n_k queries: the LAST n_q of its n_k positions (bottom-right causal
// alignment, FlashAttention's convention for n_q < n_k), so query i of the sequence sits at
// position n_k - n_q + i and sees keys 0 .. n_k - n_q + i. A whole prompt is n_q == n_k; a
// chunk of a chunked prefill is n_q < n_k over the KV of every earlier chunk; n_q = 1 is a
// decode step.
//  - cu_seqlens_q: queries of sequence s are rows [cu_seqlens_q[s], cu_seqlens_q[s+1]) of q (and
//    of out and lse). Empty: one sequence holding every query row.
//  - cu_seqlens_k: keys of sequence s are positions [0, cu_seqlens_k[s+1] - cu_seqlens_k[s]); with
//    contiguous K/V they are rows [cu_seqlens_k[s], cu_seqlens_k[s+1]) of k and v. Empty: the
//    same as cu_seqlens_q (queries and keys are the same positions).
//  - block_table: empty for contiguous K/V, else paged K/V (see BlockTable).
struct Batch {
  SeqLens cu_seqlens_q;
  SeqLens cu_seqlens_k;
  BlockTable block_table;

  Batch() = default;
  // Whole prompts (n_q == n_k for every sequence), contiguous K/V: what a cu_seqlens list meant
  // before chunks existed, so `crisp::plan(q, k, config, cu_seqlens)` keeps working.
  Batch(SeqLens cu_seqlens) : cu_seqlens_q(std::move(cu_seqlens)) {}  // NOLINT(google-explicit-constructor)
  Batch(std::initializer_list<int64_t> cu_seqlens) : cu_seqlens_q(cu_seqlens) {}
  Batch(SeqLens q, SeqLens k, BlockTable table = {})
      : cu_seqlens_q(std::move(q)), cu_seqlens_k(std::move(k)), block_table(table) {}

  // True when every sequence is a whole prompt over contiguous K/V (cu_seqlens_k empty or equal).
  bool whole_prompts() const {
    return block_table.empty() && (cu_seqlens_k.empty() || cu_seqlens_k == cu_seqlens_q);
  }

  // The key count of the longest sequence (cu_seqlens_k, or cu_seqlens_q for whole prompts); 0 for
  // an empty list. Config::for_keys reads it (the short-prompt block size).
  int64_t longest_keys() const {
    const SeqLens& cu = cu_seqlens_k.empty() ? cu_seqlens_q : cu_seqlens_k;
    int64_t longest = 0;
    for (size_t s = 0; s + 1 < cu.size(); ++s) {
      const int64_t keys = cu[s + 1] - cu[s];
      if (keys > longest) longest = keys;
    }
    return longest;
  }
};

}  // namespace crisp
