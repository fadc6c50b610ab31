// tests/chunk_util.h — inputs of the chunked-prefill and paged K/V tests (spec §11), shared by the
// CPU suite (tests/test_chunked.cpp) and the GPU suite (tests/gpu/test_gpu_chunked.cpp): chunks cut
// from structured prompts, the same keys laid out in a shuffled vLLM-style page pool, and
// NaN-poisoned outputs.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "crisp/crisp.h"
#include "crisp/workload.h"
#include "test_util.h"

namespace crisp_test {

// One sequence of a call: the first n_k positions of prompt `prompt` as its keys, and its last
// n_q positions (n_k - n_q .. n_k - 1) as its queries.
struct ChunkSeq {
  int prompt = 0;
  int64_t n_k = 0, n_q = 0;
};

// The shape of a planned sequence (§11), for comparing two plans' sequences at once.
inline std::array<int64_t, 6> shape_of(const crisp::SequencePlan& sp) {
  return {sp.q_offset, sp.n_q, sp.kv_offset, sp.n_k, sp.num_blocks, sp.first_row};
}

inline std::string describe(const std::vector<ChunkSeq>& seqs) {
  std::ostringstream os;
  for (const ChunkSeq& s : seqs) os << " [prompt " << s.prompt << ": n_q " << s.n_q << " of n_k " << s.n_k << "]";
  return os.str();
}

// The inputs of one call: q [Hq, cu_q.back(), d] and contiguous k, v [Hkv, cu_k.back(), d]
// (each sequence its own copy of its keys), cut from a structured workload of whole prompts.
struct Chunks {
  int64_t hq = 0, hkv = 0, d = 0;
  std::vector<ChunkSeq> seqs;
  crisp::Workload prompts;
  crisp::SeqLens cu_q{0}, cu_k{0};
  std::vector<float> q, k, v;

  int64_t q_tokens() const { return cu_q.back(); }
  int64_t kv_tokens() const { return cu_k.back(); }
  crisp::Batch batch(crisp::BlockTable table = {}) const { return crisp::Batch(cu_q, cu_k, table); }
  crisp::TensorView q_view() { return crisp::TensorView::contiguous(q.data(), crisp::DType::f32, hq, q_tokens(), d); }
  crisp::TensorView k_view() { return crisp::TensorView::contiguous(k.data(), crisp::DType::f32, hkv, kv_tokens(), d); }
  crisp::TensorView v_view() { return crisp::TensorView::contiguous(v.data(), crisp::DType::f32, hkv, kv_tokens(), d); }
  // Key j of prompt p, head h: a row of the workload.
  const float* prompt_row(const std::vector<float>& x, int64_t h, int prompt, int64_t j) const {
    return x.data() + (h * prompts.total_tokens + prompts.cu_seqlens[prompt] + j) * d;
  }
};

inline Chunks make_chunks(uint64_t seed, std::vector<int64_t> prompt_lens, std::vector<ChunkSeq> seqs, int64_t hq = 4,
                          int64_t hkv = 2, int64_t d = 32) {
  Chunks c;
  c.hq = hq;
  c.hkv = hkv;
  c.d = d;
  c.seqs = seqs;
  c.prompts = crisp::make_workload(workload_spec(hq, hkv, d, std::move(prompt_lens), seed));
  for (const ChunkSeq& s : seqs) {
    c.cu_q.push_back(c.cu_q.back() + s.n_q);
    c.cu_k.push_back(c.cu_k.back() + s.n_k);
  }
  c.q.resize(static_cast<size_t>(hq * c.q_tokens() * d));
  c.k.resize(static_cast<size_t>(hkv * c.kv_tokens() * d));
  c.v.resize(c.k.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    const ChunkSeq& seq = seqs[s];
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t i = 0; i < seq.n_q; ++i)
        std::copy_n(c.prompt_row(c.prompts.q, h, seq.prompt, seq.n_k - seq.n_q + i), d,
                    c.q.data() + (h * c.q_tokens() + c.cu_q[s] + i) * d);
    for (int64_t h = 0; h < hkv; ++h)
      for (int64_t j = 0; j < seq.n_k; ++j) {
        std::copy_n(c.prompt_row(c.prompts.k, h, seq.prompt, j), d, c.k.data() + (h * c.kv_tokens() + c.cu_k[s] + j) * d);
        std::copy_n(c.prompt_row(c.prompts.v, h, seq.prompt, j), d, c.v.data() + (h * c.kv_tokens() + c.cu_k[s] + j) * d);
      }
  }
  return c;
}

// The keys of a Chunks in a page pool, vLLM's cache layout [num_pages, page_size, Hkv, d] seen as
// the view [Hkv, num_pages * page_size, d] with strides {d, Hkv * d, 1}. Each prompt owns the pages
// of its positions; every sequence of a prompt reads the first pages of that prompt (so sequences
// of one prompt share pages). Page ids are shuffled, spare pages hold noise no sequence reads, and
// table entries past a sequence's last page are -1 (never read).
struct PagedPool {
  int64_t hkv = 0, d = 0, page_size = 0, num_pages = 0, max_pages = 0;
  std::vector<float> k, v;
  std::vector<int32_t> table;  // [sequences, max_pages]

  crisp::BlockTable block_table() const {
    crisp::BlockTable t;
    t.data = table.data();
    t.max_pages_per_sequence = max_pages;
    t.page_size = page_size;
    return t;
  }
  crisp::TensorView view(std::vector<float>& x) {
    return crisp::TensorView{x.data(), crisp::DType::f32, crisp::Device::cpu, 3, {hkv, num_pages * page_size, d},
                             {d, hkv * d, 1}};
  }
  crisp::TensorView k_view() { return view(k); }
  crisp::TensorView v_view() { return view(v); }
};

// NOTE: three spare pages: enough that the pool holds pages no sequence reads, few enough to stay small.
constexpr int64_t kSparePages = 3;

inline PagedPool make_pool(const Chunks& c, int64_t page_size, uint64_t seed) {
  PagedPool pool;
  pool.hkv = c.hkv;
  pool.d = c.d;
  pool.page_size = page_size;
  const int64_t num_prompts = static_cast<int64_t>(c.prompts.cu_seqlens.size()) - 1;
  std::vector<int64_t> first_page(static_cast<size_t>(num_prompts) + 1, 0);  // of each prompt, before shuffling
  for (int64_t p = 0; p < num_prompts; ++p) {
    const int64_t len = c.prompts.cu_seqlens[p + 1] - c.prompts.cu_seqlens[p];
    first_page[p + 1] = first_page[p] + (len + page_size - 1) / page_size;
  }
  pool.num_pages = first_page.back() + kSparePages;
  std::vector<int32_t> page_id(static_cast<size_t>(pool.num_pages));
  std::iota(page_id.begin(), page_id.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(page_id.begin(), page_id.end(), rng);

  const size_t pool_size = static_cast<size_t>(pool.num_pages * page_size * c.hkv * c.d);
  pool.k = gaussian(seed + 1, pool_size);
  pool.v = gaussian(seed + 2, pool_size);
  for (int64_t p = 0; p < num_prompts; ++p) {
    const int64_t len = c.prompts.cu_seqlens[p + 1] - c.prompts.cu_seqlens[p];
    for (int64_t j = 0; j < len; ++j) {
      const int64_t page = page_id[static_cast<size_t>(first_page[p] + j / page_size)];
      for (int64_t h = 0; h < c.hkv; ++h) {
        const int64_t at = ((page * page_size + j % page_size) * c.hkv + h) * c.d;
        std::copy_n(c.prompt_row(c.prompts.k, h, static_cast<int>(p), j), c.d, pool.k.data() + at);
        std::copy_n(c.prompt_row(c.prompts.v, h, static_cast<int>(p), j), c.d, pool.v.data() + at);
      }
    }
  }
  for (const ChunkSeq& s : c.seqs) pool.max_pages = std::max(pool.max_pages, (s.n_k + page_size - 1) / page_size);
  pool.max_pages += 1;  // a column no sequence reads
  pool.table.assign(static_cast<size_t>(c.seqs.size() * pool.max_pages), -1);
  for (size_t s = 0; s < c.seqs.size(); ++s)
    for (int64_t i = 0; i < (c.seqs[s].n_k + page_size - 1) / page_size; ++i)
      pool.table[s * pool.max_pages + i] = page_id[static_cast<size_t>(first_page[c.seqs[s].prompt] + i)];
  return pool;
}

// Output buffers of one call, every element NaN before the run, so an element left unwritten shows.
struct Outputs {
  crisp::DType dtype = crisp::DType::f64;
  int64_t heads = 0, tokens = 0, dim = 0;
  std::vector<double> out64, lse64;
  std::vector<float> out32, lse32;

  Outputs(crisp::DType dt, int64_t h, int64_t t, int64_t d) : dtype(dt), heads(h), tokens(t), dim(d) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    if (dt == crisp::DType::f64) {
      out64.assign(static_cast<size_t>(h * t * d), nan);
      lse64.assign(static_cast<size_t>(h * t), nan);
    } else {
      out32.assign(static_cast<size_t>(h * t * d), static_cast<float>(nan));
      lse32.assign(static_cast<size_t>(h * t), static_cast<float>(nan));
    }
  }
  bool f64() const { return dtype == crisp::DType::f64; }
  crisp::TensorView out() {
    return crisp::TensorView::contiguous(f64() ? static_cast<void*>(out64.data()) : out32.data(), dtype, heads, tokens, dim);
  }
  crisp::TensorView lse() {
    return crisp::TensorView::contiguous2d(f64() ? static_cast<void*>(lse64.data()) : lse32.data(), dtype, heads, tokens);
  }
  double out_at(size_t i) const { return f64() ? out64[i] : out32[i]; }
  double lse_at(size_t i) const { return f64() ? lse64[i] : lse32[i]; }
  size_t out_size() const { return static_cast<size_t>(heads * tokens * dim); }
  size_t lse_size() const { return static_cast<size_t>(heads * tokens); }
  // Bit-identical to another run's outputs. (memcmp, not ==, so that NaN bits compare too; never
  // on an empty vector, whose data() may be null: UBSan's nonnull check.)
  bool same_bits(const Outputs& o) const {
    return dtype == o.dtype && out64 == o.out64 && lse64 == o.lse64 && same_float_bits(out32, o.out32) &&
           same_float_bits(lse32, o.lse32);
  }
  static bool same_float_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  }
};

}  // namespace crisp_test
