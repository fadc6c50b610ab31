// tests/gpu/test_gpu_attention_chunked.cpp — both CUDA attention kernels on plans of chunks
// (queries over a KV prefix, spec §11) and on paged K/V, against the CPU float64 reference on the
// same plan and the same (bf16/fp16-rounded) inputs: n_q of 1, below a block, one block, unaligned
// and n_k, varlen batches mixing them, contiguous K/V and page pools (pages in order or shuffled,
// unused pool rows NaN so a wrong page read shows; page sizes 16 to 256 and two that are no power
// of two), the Hopper kernel with GQA packing off and on
// (where it applies); outputs NaN-poisoned so every element must be written. Plus the work order of
// a chunk plan and the argument checks of the block table. Every test skips itself without a CUDA
// device (and the Hopper runs without an sm_90 device with sm_90a code).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/kv_rows.h"
#include "crisp/crisp.h"
#include "crisp/cuda.h"
#include "crisp/workload.h"
#include "cuda/device_plan_internal.h"
#include "gpu/gpu_test_util.h"
#include "plan/rules.h"

namespace {

using crisp_gpu_test::DeviceBuffer;

#define SKIP_WITHOUT_GPU() \
  if (!crisp::cuda::available()) GTEST_SKIP() << "no CUDA device"

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

constexpr auto bf16 = crisp::DType::bf16;
constexpr auto f16 = crisp::DType::f16;

enum class Layout { dense, crisp_plan, random };

struct Chunk {
  int64_t n_q, n_k;  // the last n_q of n_k positions are queries
};

struct Case {
  std::string name;
  crisp::DType dtype;
  int64_t head_dim;
  int block_size;
  int64_t num_q_heads, num_kv_heads;
  std::vector<Chunk> chunks;
  Layout layout;
  double random_density;  // share of the off-anchor causal blocks kept (Layout::random)
  int64_t page_size;      // 0: contiguous K/V
  bool shuffled_pages;
  uint64_t seed;
  bool nhd_pool = false;  // the pool as vLLM's [pages, page_size, Hkv, d] (k/v strides {d, Hkv d, 1})
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

// A case's inputs: the whole prompts' k/v (every key position) and the chunks' queries, rounded to
// the dtype, the batch and the plan.
struct Prepared {
  crisp_gpu_test::RoundedInputs in;  // q/k/v of every position [H, key tokens, d]
  std::vector<uint16_t> q_bits;      // the chunks' queries [Hq, query tokens, d]
  std::vector<float> q;
  int64_t q_tokens = 0;
  crisp::Batch batch;
  crisp::Plan plan;
};

Prepared prepare(const Case& c) {
  Prepared p;
  std::vector<int64_t> lens;
  for (const Chunk& ch : c.chunks) lens.push_back(ch.n_k);
  crisp::WorkloadSpec spec = crisp_test::workload_spec(c.num_q_heads, c.num_kv_heads, c.head_dim, lens, c.seed);
  spec.needles = std::min<int64_t>(spec.needles, *std::min_element(lens.begin(), lens.end()) - 1);
  const crisp::Workload w = crisp::make_workload(spec);
  p.in = crisp_gpu_test::round_inputs(w, c.dtype);
  const int64_t Hq = c.num_q_heads, d = c.head_dim, T = p.in.tokens;
  p.batch.cu_seqlens_q = {0};
  p.batch.cu_seqlens_k = w.cu_seqlens;
  for (const Chunk& ch : c.chunks) p.batch.cu_seqlens_q.push_back(p.batch.cu_seqlens_q.back() + ch.n_q);
  p.q_tokens = p.batch.cu_seqlens_q.back();
  p.q_bits.resize(static_cast<std::size_t>(Hq * p.q_tokens * d));
  p.q.resize(p.q_bits.size());
  for (int64_t h = 0; h < Hq; ++h)
    for (std::size_t s = 0; s < c.chunks.size(); ++s)
      for (int64_t i = 0; i < c.chunks[s].n_q; ++i) {
        const int64_t from = (h * T + w.cu_seqlens[s + 1] - c.chunks[s].n_q + i) * d;
        const int64_t to = (h * p.q_tokens + p.batch.cu_seqlens_q[s] + i) * d;
        std::copy_n(p.in.q_bits.begin() + from, d, p.q_bits.begin() + to);
        std::copy_n(p.in.q.begin() + from, d, p.q.begin() + to);
      }
  const crisp::Plan dense = crisp::dense_plan(Hq, c.num_kv_heads, d, p.batch, c.block_size);
  if (c.layout == Layout::dense) {
    p.plan = dense;
  } else if (c.layout == Layout::crisp_plan) {
    crisp::Config cfg = crisp::Config::from_preset("crisp");
    cfg.block_size = c.block_size;
    p.plan = crisp::plan(crisp::TensorView::contiguous(p.q.data(), crisp::DType::f32, Hq, p.q_tokens, d),
                         crisp::TensorView::contiguous(p.in.k.data(), crisp::DType::f32, c.num_kv_heads, T, d), cfg,
                         p.batch);
  } else {
    p.plan = crisp_gpu_test::random_plan(dense, c.random_density, c.seed * 7919 + 1);
  }
  return p;
}

// The float64 CPU attention of `plan` (contiguous K/V): O [Hq, query tokens, d], LSE [Hq, query tokens].
void reference_f64(Prepared& p, const crisp::Plan& plan, std::vector<double>& out, std::vector<double>& lse) {
  const int64_t Hq = p.in.num_q_heads, Hkv = p.in.num_kv_heads, T = p.in.tokens, d = p.in.head_dim;
  out.assign(static_cast<std::size_t>(Hq * p.q_tokens * d), 0.0);
  lse.assign(static_cast<std::size_t>(Hq * p.q_tokens), 0.0);
  crisp::Options f64;
  f64.precision = crisp::Precision::f64;
  crisp::attend(crisp::TensorView::contiguous(p.q.data(), crisp::DType::f32, Hq, p.q_tokens, d),
                crisp::TensorView::contiguous(p.in.k.data(), crisp::DType::f32, Hkv, T, d),
                crisp::TensorView::contiguous(p.in.v.data(), crisp::DType::f32, Hkv, T, d), plan,
                crisp::TensorView::contiguous(out.data(), crisp::DType::f64, Hq, p.q_tokens, d),
                crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f64, Hq, p.q_tokens), f64);
}

// K/V as the device reads them: contiguous, or a page pool whose pages hold the sequences' keys
// (in order or shuffled), every other pool row NaN (0xffff), and the block table (unused entries -1).
struct DeviceKv {
  std::vector<uint16_t> k_bits, v_bits;
  int64_t tokens = 0;
  std::vector<int32_t> table;
  int64_t max_pages = 0;
  bool nhd = false;  // element (h, row, x) at (row Hkv + h) d + x, else (h tokens + row) d + x
};

DeviceKv device_kv(const Prepared& p, int64_t page_size, bool shuffled, bool nhd, uint64_t seed) {
  DeviceKv kv;
  kv.nhd = nhd && page_size > 0;
  if (page_size == 0) {
    kv.k_bits = p.in.k_bits;
    kv.v_bits = p.in.v_bits;
    kv.tokens = p.in.tokens;
    return kv;
  }
  const crisp::SeqLens& cu_k = p.batch.cu_seqlens_k;
  const std::size_t S = cu_k.size() - 1;
  int64_t used = 0;
  for (std::size_t s = 0; s < S; ++s) {
    const int64_t pages = (cu_k[s + 1] - cu_k[s] + page_size - 1) / page_size;
    kv.max_pages = std::max(kv.max_pages, pages + 1);  // one spare column, left -1
    used += pages;
  }
  const int64_t num_pages = used + 3;  // spare pages, NaN, never read
  std::vector<int32_t> ids(static_cast<std::size_t>(num_pages));
  std::iota(ids.begin(), ids.end(), 0);
  if (shuffled) std::shuffle(ids.begin(), ids.end(), std::mt19937_64(seed));
  const int64_t Hkv = p.in.num_kv_heads, d = p.in.head_dim, T = p.in.tokens;
  kv.tokens = num_pages * page_size;
  kv.k_bits.assign(static_cast<std::size_t>(Hkv * kv.tokens * d), 0xffff);
  kv.v_bits = kv.k_bits;
  kv.table.assign(S * static_cast<std::size_t>(kv.max_pages), -1);
  std::size_t next = 0;
  for (std::size_t s = 0; s < S; ++s) {
    const int64_t n_k = cu_k[s + 1] - cu_k[s];
    for (int64_t page = 0; page * page_size < n_k; ++page) kv.table[s * kv.max_pages + page] = ids[next++];
    for (int64_t j = 0; j < n_k; ++j) {
      const int64_t row = crisp::kv_rows::key_row(0, kv.table.data() + s * kv.max_pages, page_size, j);
      for (int64_t h = 0; h < Hkv; ++h) {
        const int64_t to = (kv.nhd ? row * Hkv + h : h * kv.tokens + row) * d;
        std::copy_n(p.in.k_bits.begin() + (h * T + cu_k[s] + j) * d, d, kv.k_bits.begin() + to);
        std::copy_n(p.in.v_bits.begin() + (h * T + cu_k[s] + j) * d, d, kv.v_bits.begin() + to);
      }
    }
  }
  return kv;
}

// attend_async of `plan` with `options` on NaN-poisoned outputs; returns O bits and LSE.
void run_device(const Prepared& p, const DeviceKv& kv, int64_t page_size, const crisp::Plan& plan,
                const crisp::CudaOptions& options, std::vector<uint16_t>& out_bits, std::vector<float>& lse) {
  const int64_t Hq = p.in.num_q_heads, Hkv = p.in.num_kv_heads, d = p.in.head_dim, Tq = p.q_tokens;
  const std::size_t q_bytes = p.q_bits.size() * 2, kv_bytes = kv.k_bits.size() * 2;
  const std::size_t lse_bytes = static_cast<std::size_t>(Hq * Tq) * sizeof(float);
  const std::size_t table_bytes = std::max<std::size_t>(kv.table.size(), 1) * sizeof(int32_t);
  DeviceBuffer dq(q_bytes), dk(kv_bytes), dv(kv_bytes), dout(q_bytes), dlse(lse_bytes), dtable(table_bytes);
  ASSERT_TRUE(dq.ptr && dk.ptr && dv.ptr && dout.ptr && dlse.ptr && dtable.ptr);
  CUDA_OK(cudaMemcpy(dq.ptr, p.q_bits.data(), q_bytes, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dk.ptr, kv.k_bits.data(), kv_bytes, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dv.ptr, kv.v_bits.data(), kv_bytes, cudaMemcpyHostToDevice));
  if (!kv.table.empty())
    CUDA_OK(cudaMemcpy(dtable.ptr, kv.table.data(), kv.table.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dout.ptr, 0xff, q_bytes));
  CUDA_OK(cudaMemset(dlse.ptr, 0xff, lse_bytes));
  crisp::BlockTable table;
  if (page_size > 0) {
    table.data = static_cast<const int32_t*>(dtable.ptr);
    table.device = crisp::Device::cuda;
    table.max_pages_per_sequence = kv.max_pages;
    table.page_size = page_size;
  }
  const auto dev = crisp::Device::cuda;
  auto kv_view = [&](void* data) {
    crisp::TensorView view = crisp::TensorView::contiguous(data, p.in.dtype, Hkv, kv.tokens, d, dev);
    if (kv.nhd) {
      view.stride[0] = d;
      view.stride[1] = Hkv * d;
    }
    return view;
  };
  crisp_gpu_test::ScopedEnv no_override("CRISP_KERNEL", nullptr);
  crisp::cuda::DevicePlan dplan(plan);
  crisp::cuda::attend_async(crisp::TensorView::contiguous(dq.ptr, p.in.dtype, Hq, Tq, d, dev), kv_view(dk.ptr),
                            kv_view(dv.ptr), dplan,
                            crisp::TensorView::contiguous(dout.ptr, p.in.dtype, Hq, Tq, d, dev),
                            crisp::TensorView::contiguous2d(dlse.ptr, crisp::DType::f32, Hq, Tq, dev), nullptr, options,
                            table);
  CUDA_OK(cudaDeviceSynchronize());
  out_bits.resize(p.q_bits.size());
  lse.resize(static_cast<std::size_t>(Hq * Tq));
  CUDA_OK(cudaMemcpy(out_bits.data(), dout.ptr, q_bytes, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(lse.data(), dlse.ptr, lse_bytes, cudaMemcpyDeviceToHost));
}

class GpuChunkedAttention : public ::testing::TestWithParam<Case> {};

// The float64 reference of a plan.
struct Reference {
  std::vector<double> out, lse;
  double density = 0.0;
};
Reference reference_of(Prepared& p, const crisp::Plan& plan) {
  Reference ref;
  reference_f64(p, plan, ref.out, ref.lse);
  ref.density = plan.density();
  return ref;
}

// Runs the plan with one kernel setting and checks it against `ref` (of the plan itself, or of its
// GQA union when the Hopper kernel packs groups).
void check_kernel(const Case& c, const Prepared& p, const DeviceKv& kv, const Reference& ref, const char* what,
                  const crisp::CudaOptions& options) {
  std::vector<uint16_t> out_bits;
  std::vector<float> lse;
  run_device(p, kv, c.page_size, p.plan, options, out_bits, lse);
  if (::testing::Test::HasFatalFailure()) return;
  SCOPED_TRACE(what);
  const crisp_gpu_test::ReferenceErrors worst = crisp_gpu_test::expect_matches_reference(
      p.batch.cu_seqlens_q, p.in.num_q_heads, p.q_tokens, p.in.head_dim, c.dtype, out_bits, lse, ref.out, ref.lse);
  std::printf("[ %s / %s ] density %.3f, worst rel. error of O %.2e, worst |LSE - ref| %.2e\n", c.name.c_str(), what,
              ref.density, worst.worst_rel, worst.worst_lse);
}

TEST_P(GpuChunkedAttention, BothKernelsMatchFloat64ReferenceAndWriteEveryElement) {
  SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  Prepared p = prepare(c);
  const DeviceKv kv = device_kv(p, c.page_size, c.shuffled_pages, c.nhd_pool, c.seed * 31 + 7);

  const Reference ref = reference_of(p, p.plan);
  crisp::CudaOptions portable;
  portable.kernel = crisp::Kernel::portable;
  check_kernel(c, p, kv, ref, "portable", portable);
  if (!crisp::cuda::hopper_kernel_available()) return;  // no sm_90 device or no sm_90a code

  // Kernel::hopper, GQA packing off: the Hopper kernel runs chunks and paged K/V (with
  // Kernel::hopper it never falls back to the portable kernel; it would throw instead).
  crisp::CudaOptions hopper;
  hopper.kernel = crisp::Kernel::hopper;
  hopper.gqa_packing = crisp::GqaPacking::separate;
  check_kernel(c, p, kv, ref, "hopper", hopper);
  // GQA packing on, where it applies: the kernel then computes the group union.
  const int64_t group = c.num_q_heads / c.num_kv_heads;
  if (crisp::cuda::gqa_packing_applies(c.block_size, group)) {
    hopper.gqa_packing = crisp::GqaPacking::pack;
    check_kernel(c, p, kv, reference_of(p, crisp::gqa_union(p.plan)), "hopper packed", hopper);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuChunkedAttention,
    ::testing::Values(
        // name, dtype, d, B, Hq, Hkv, chunks {n_q, n_k}, layout, density, page size, shuffled, seed
        Case{"bf16_d128_B128_decode_gqa4", bf16, 128, 128, 8, 2, {{1, 1000}}, Layout::dense, 0, 0, false, 1},
        Case{"fp16_d64_B64_below_block_gqa2", f16, 64, 64, 4, 2, {{40, 777}}, Layout::crisp_plan, 0, 0, false, 2},
        Case{"bf16_d128_B64_one_block", bf16, 128, 64, 4, 4, {{64, 1000}}, Layout::random, 0.3, 0, false, 3},
        Case{"fp16_d128_B128_unaligned_gqa8", f16, 128, 128, 8, 1, {{300, 1500}}, Layout::crisp_plan, 0, 0, false, 4},
        Case{"bf16_d64_B128_whole_prompt_gqa4", bf16, 64, 128, 8, 2, {{900, 900}}, Layout::random, 0.2, 0, false, 5},
        Case{"bf16_d128_B128_varlen_mixed_gqa4", bf16, 128, 128, 8, 2, {{1, 700}, {129, 129}, {200, 1300}, {128, 1024}},
             Layout::random, 0.25, 0, false, 6},
        Case{"fp16_d64_B64_varlen_mixed_gqa2", f16, 64, 64, 4, 2, {{50, 50}, {1, 333}, {100, 1000}}, Layout::dense, 0, 0,
             false, 7},
        Case{"bf16_d128_B128_paged16_shuffled_vllm_layout", bf16, 128, 128, 8, 2, {{1, 700}, {300, 1100}, {57, 57}},
             Layout::random, 0.3, 16, true, 8, true},
        Case{"fp16_d64_B64_paged64_in_order", f16, 64, 64, 4, 2, {{200, 900}, {900, 900}}, Layout::crisp_plan, 0, 64,
             false, 9},
        Case{"bf16_d64_B128_paged128_shuffled", bf16, 64, 128, 4, 1, {{130, 1000}, {1, 257}}, Layout::random, 0.2, 128,
             true, 10},
        Case{"fp16_d128_B64_paged256_shuffled_vllm_layout", f16, 128, 64, 4, 2, {{77, 1500}, {1000, 1000}},
             Layout::random, 0.15, 256, true, 11, true},
        Case{"bf16_d128_B128_paged32_shuffled_gqa8", bf16, 128, 128, 8, 1, {{500, 2000}}, Layout::dense, 0, 32, true,
             12},
        // Every power-of-two page size at both block sizes (pages shorter than B: B / P TMA boxes
        // per key tile; longer: one), and page sizes that are no power of two (boxes of 16 rows).
        Case{"fp16_d128_B128_paged64_shuffled_gqa4", f16, 128, 128, 8, 2, {{300, 1000}, {1, 129}}, Layout::random,
             0.3, 64, true, 13},
        Case{"bf16_d64_B128_paged256_in_order_vllm_layout", bf16, 64, 128, 4, 2, {{128, 1300}}, Layout::crisp_plan, 0,
             256, false, 14, true},
        Case{"bf16_d128_B64_paged16_shuffled", bf16, 128, 64, 4, 2, {{100, 700}, {1, 65}}, Layout::random, 0.3, 16,
             true, 15},
        Case{"fp16_d64_B64_paged32_shuffled_vllm_layout", f16, 64, 64, 4, 1, {{64, 999}}, Layout::dense, 0, 32, true,
             16, true},
        Case{"bf16_d128_B64_paged128_shuffled_gqa4", bf16, 128, 64, 8, 2, {{500, 1234}}, Layout::crisp_plan, 0, 128,
             true, 17},
        Case{"fp16_d128_B128_paged48_shuffled", f16, 128, 128, 4, 2, {{200, 1000}, {33, 333}}, Layout::random, 0.3, 48,
             true, 18},
        Case{"bf16_d64_B64_paged80_vllm_layout", bf16, 64, 64, 4, 2, {{77, 800}}, Layout::dense, 0, 80, true, 19,
             true},
        // Rows of more than 32 and 64 key blocks: the Hopper producer reads a row's key blocks 32 at
        // a time (one per lane) and its page ids a tile ahead, across those boundaries too.
        Case{"bf16_d128_B64_paged16_shuffled_long_rows", bf16, 128, 64, 4, 2, {{130, 4500}}, Layout::dense, 0, 16,
             true, 20},
        Case{"fp16_d64_B128_paged48_shuffled_long_rows_gqa4", f16, 64, 128, 8, 2, {{128, 9000}, {1, 4200}},
             Layout::dense, 0, 48, true, 21, true},
        // Head dim 256 (Gemma 3): chunks, contiguous and paged (pages shorter and longer than B).
        Case{"bf16_d256_B128_varlen_mixed_gqa4", bf16, 256, 128, 8, 2, {{1, 700}, {129, 129}, {200, 1300}},
             Layout::random, 0.25, 0, false, 22},
        Case{"fp16_d256_B64_unaligned_gqa2", f16, 256, 64, 4, 2, {{300, 1500}, {64, 64}}, Layout::crisp_plan, 0, 0,
             false, 23},
        Case{"bf16_d256_B128_paged16_shuffled_vllm_layout", bf16, 256, 128, 4, 1, {{1, 700}, {300, 1100}},
             Layout::random, 0.3, 16, true, 24, true},
        Case{"fp16_d256_B64_paged128_shuffled_gqa4", f16, 256, 64, 8, 2, {{500, 1234}, {1, 65}}, Layout::crisp_plan, 0,
             128, true, 25},
        Case{"bf16_d256_B64_paged48_shuffled", bf16, 256, 64, 4, 2, {{77, 800}}, Layout::dense, 0, 48, true, 26},
        // Pages of whole key tiles (a multiple of B) at B = 128: the default kernel loads each tile as
        // one box, parts first, from its page (tile_shape.h, whole_tile_pages); unaligned chunks and
        // the last page partly past the sequence included.
        Case{"bf16_d128_B128_paged128_shuffled_vllm_layout", bf16, 128, 128, 8, 2, {{1, 700}, {300, 1100}, {129, 129}},
             Layout::random, 0.3, 128, true, 28, true},
        Case{"fp16_d256_B128_paged256_shuffled_gqa4", f16, 256, 128, 8, 2, {{500, 1234}, {1, 65}}, Layout::crisp_plan,
             0, 256, true, 29},
        // SmolLM2's shape (a group of 3) as llama.cpp holds it: a chunk over a prefix, K/V rows
        // token-major with the KV heads interleaved (one page covering the whole cache).
        Case{"fp16_d64_B128_chunk_gqa3_nhd_one_page", f16, 64, 128, 9, 3, {{1000, 1000}, {512, 1512}}, Layout::dense, 0,
             2048, false, 27, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// ------------------------------------------------------------------ the work order of chunks

// The work order of a chunk plan lists every row holding queries exactly once and no other row.
TEST(GpuChunkedWorkOrder, ListsEveryRowWithQueriesOnce) {
  SKIP_WITHOUT_GPU();
  const Case c{"order", bf16, 64, 64, 4, 2, {{1, 700}, {129, 129}, {200, 1300}, {64, 640}}, Layout::random, 0.3, 0,
               false, 13};
  const Prepared p = prepare(c);
  crisp::cuda::DevicePlan dplan(p.plan);
  const crisp::cuda_detail::DevicePlanView& view = crisp::cuda_detail::view_of(dplan);
  ASSERT_TRUE(view.work_order_ready);
  const int64_t H = c.num_q_heads, S = static_cast<int64_t>(p.plan.sequences.size());
  int64_t rows = 0;
  for (const auto& sp : p.plan.sequences) rows += H * (sp.num_blocks - sp.first_row);
  ASSERT_EQ(view.num_work_items, rows);
  std::vector<int32_t> order(static_cast<std::size_t>(rows));
  CUDA_OK(cudaMemcpy(order.data(), view.work_order, order.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  std::set<std::tuple<int64_t, int64_t, int64_t>> seen;
  for (const int32_t code : order) {
    const int64_t h = code % H, s = (code / H) % S;
    const int64_t r = p.plan.sequences[s].num_blocks - 1 - code / (H * S);
    EXPECT_GE(r, p.plan.sequences[s].first_row) << "code " << code;
    EXPECT_TRUE(seen.insert({s, h, r}).second) << "code " << code << " listed twice";
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), rows);
}

// A chunk plan travels to the device and back unchanged.
TEST(GpuChunkedWorkOrder, DevicePlanOfChunksRoundTrips) {
  SKIP_WITHOUT_GPU();
  const Case c{"round trip", f16, 64, 128, 4, 2, {{1, 700}, {300, 1300}}, Layout::crisp_plan, 0, 0, false, 14};
  const Prepared p = prepare(c);
  crisp::cuda::DevicePlan dplan(p.plan);
  const crisp::Plan back = dplan.to_host();
  ASSERT_EQ(back.sequences.size(), p.plan.sequences.size());
  for (std::size_t s = 0; s < back.sequences.size(); ++s) {
    const auto& a = p.plan.sequences[s];
    const auto& b = back.sequences[s];
    EXPECT_EQ(b.q_offset, a.q_offset);
    EXPECT_EQ(b.n_q, a.n_q);
    EXPECT_EQ(b.kv_offset, a.kv_offset);
    EXPECT_EQ(b.n_k, a.n_k);
    EXPECT_EQ(b.first_row, a.first_row);
    for (std::size_t h = 0; h < a.heads.size(); ++h) {
      EXPECT_EQ(b.heads[h].row_ptr, a.heads[h].row_ptr);
      EXPECT_EQ(b.heads[h].col, a.heads[h].col);
      EXPECT_DOUBLE_EQ(b.heads[h].density, a.heads[h].density);
    }
  }
}

// ------------------------------------------------------------------ argument checks

TEST(GpuChunkedArguments, BadBlockTablesAndKeyShapesAreNamed) {
  SKIP_WITHOUT_GPU();
  const Case c{"args", bf16, 64, 64, 4, 2, {{100, 300}}, Layout::dense, 0, 0, false, 15};
  const Prepared p = prepare(c);
  const int64_t Hq = 4, Hkv = 2, d = 64, Tq = p.q_tokens, Tk = p.in.tokens;
  DeviceBuffer dq(Hq * Tq * d * 2), dk(Hkv * 320 * d * 2), dv(Hkv * 320 * d * 2), dout(Hq * Tq * d * 2),
      dlse(Hq * Tq * 4), dtable(64);
  ASSERT_TRUE(dq.ptr && dk.ptr && dv.ptr && dout.ptr && dlse.ptr && dtable.ptr);
  const auto dev = crisp::Device::cuda;
  crisp::cuda::DevicePlan dplan(p.plan);
  const auto q = crisp::TensorView::contiguous(dq.ptr, bf16, Hq, Tq, d, dev);
  const auto out = crisp::TensorView::contiguous(dout.ptr, bf16, Hq, Tq, d, dev);
  const auto lse = crisp::TensorView::contiguous2d(dlse.ptr, crisp::DType::f32, Hq, Tq, dev);
  auto argument_of = [&](const crisp::TensorView& k, const crisp::TensorView& v, const crisp::BlockTable& table) {
    try {
      crisp::cuda::attend_async(q, k, v, dplan, out, lse, nullptr, {}, table);
    } catch (const crisp::Error& e) {
      return e.argument();
    }
    return std::string("(no error)");
  };
  // Contiguous K/V must hold the plan's keys exactly.
  const auto k_long = crisp::TensorView::contiguous(dk.ptr, bf16, Hkv, Tk + 16, d, dev);
  EXPECT_EQ(argument_of(k_long, k_long, {}), "k");
  // A pool of 320 rows: 20 pages of 16.
  const auto pool = crisp::TensorView::contiguous(dk.ptr, bf16, Hkv, 320, d, dev);
  const auto v_pool = crisp::TensorView::contiguous(dv.ptr, bf16, Hkv, 320, d, dev);
  crisp::BlockTable table;
  table.data = static_cast<const int32_t*>(dtable.ptr);
  table.device = crisp::Device::cuda;
  table.max_pages_per_sequence = 16;
  table.page_size = 8;
  EXPECT_EQ(argument_of(pool, v_pool, table), "batch.block_table.page_size");
  table.page_size = 16;
  table.max_pages_per_sequence = 18;  // 300 keys need 19 pages
  EXPECT_EQ(argument_of(pool, v_pool, table), "batch.block_table.max_pages_per_sequence");
  table.max_pages_per_sequence = 19;
  table.device = crisp::Device::cpu;
  EXPECT_EQ(argument_of(pool, v_pool, table), "batch.block_table.device");
  table.device = crisp::Device::cuda;
  const auto pool_ragged = crisp::TensorView::contiguous(dk.ptr, bf16, Hkv, 312, d, dev);
  EXPECT_EQ(argument_of(pool_ragged, pool_ragged, table), "k");
  const auto v_short = crisp::TensorView::contiguous(dv.ptr, bf16, Hkv, 304, d, dev);
  EXPECT_EQ(argument_of(pool, v_short, table), "v");
}

}  // namespace
