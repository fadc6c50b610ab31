// tests/gpu/test_gpu_work_order.cpp — the attention work order a DevicePlan builds on the device
// with every fill (src/cuda/work_order.h): the real rows' item codes, each once, heaviest CSR row
// first, ties in item order; rebuilt when the plan changes. Checked after plan_async and after upload,
// against the costs recomputed here from the host copy of the same plan. Every test skips itself
// when no CUDA device is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "crisp/crisp.h"
#include "crisp/cuda.h"
#include "crisp/workload.h"
#include "common/half.h"
#include "cuda/device_plan.h"
#include "cuda/device_plan_internal.h"
#include "gpu/gpu_test_util.h"

namespace {

using crisp_gpu_test::DeviceBuffer;

#define SKIP_WITHOUT_GPU() \
  if (!crisp::cuda::available()) GTEST_SKIP() << "no CUDA device"

// Cost of item i as the kernels decode it: h = i % H, s = (i / H) % S, r = N_s - 1 - i / (H S);
// the row's key-block count, 0 past the sequence's first block.
int64_t item_cost(const crisp::Plan& plan, int64_t item, int64_t max_blocks) {
  const int64_t H = plan.num_q_heads, S = static_cast<int64_t>(plan.sequences.size());
  const int64_t h = item % H, s = (item / H) % S, from_end = item / (H * S);
  EXPECT_LT(from_end, max_blocks);
  const crisp::SequencePlan& sp = plan.sequences[s];
  const int64_t r = sp.num_blocks - 1 - from_end;
  if (r < 0) return 0;
  const auto& row_ptr = sp.heads[h].row_ptr;
  return row_ptr[r + 1] - row_ptr[r];
}

// Reads the device work order and checks it against the host copy of the plan: every real row
// (one per query block, head and sequence) exactly once, no empty code, heaviest first, equal
// costs in ascending code.
void expect_longest_first(const crisp::cuda::DevicePlan& dplan) {
  const crisp::cuda_detail::DevicePlanView& view = crisp::cuda_detail::view_of(dplan);
  ASSERT_TRUE(view.work_order_ready);
  const crisp::Plan plan = dplan.to_host(nullptr);
  int64_t max_blocks = 0, rows = 0;
  for (const auto& sp : plan.sequences) {
    max_blocks = std::max<int64_t>(max_blocks, sp.num_blocks);
    rows += sp.num_blocks * plan.num_q_heads;
  }
  const int64_t num_codes = plan.num_q_heads * static_cast<int64_t>(plan.sequences.size()) * max_blocks;
  ASSERT_EQ(view.num_work_items, rows);
  std::vector<int32_t> order(static_cast<std::size_t>(rows));
  ASSERT_EQ(cudaMemcpy(order.data(), view.work_order, order.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
            cudaSuccess);

  std::vector<char> seen(static_cast<std::size_t>(num_codes), 0);
  for (std::size_t j = 0; j < order.size(); ++j) {
    ASSERT_GE(order[j], 0) << "position " << j;
    ASSERT_LT(order[j], num_codes) << "position " << j;
    ASSERT_FALSE(seen[order[j]]) << "item " << order[j] << " listed twice";
    seen[order[j]] = 1;
    // A real row lists at least its diagonal block; an empty code (past a shorter sequence's
    // first block) costs 0.
    ASSERT_GE(item_cost(plan, order[j], max_blocks), 1) << "position " << j << ": item " << order[j] << " is empty";
    if (j == 0) continue;
    const int64_t before = item_cost(plan, order[j - 1], max_blocks), here = item_cost(plan, order[j], max_blocks);
    ASSERT_GE(before, here) << "position " << j << ": a lighter row before a heavier one";
    if (before == here) ASSERT_LT(order[j - 1], order[j]) << "position " << j << ": equal costs out of item order";
  }
}

TEST(GpuWorkOrder, PlanAsyncBuildsLongestRowsFirst) {
  SKIP_WITHOUT_GPU();
  crisp::WorkloadSpec spec = crisp_test::workload_spec(8, 2, 128, {3000, 700, 1500}, 41);
  const crisp::Workload w = crisp::make_workload(spec);
  std::vector<uint16_t> q_bits(w.q.size()), k_bits(w.k.size());
  for (std::size_t i = 0; i < w.q.size(); ++i) q_bits[i] = crisp::half::float_to_bf16(w.q[i]);
  for (std::size_t i = 0; i < w.k.size(); ++i) k_bits[i] = crisp::half::float_to_bf16(w.k[i]);
  DeviceBuffer q(q_bits.size() * 2), k(k_bits.size() * 2);
  ASSERT_TRUE(q.ptr && k.ptr);
  ASSERT_EQ(cudaMemcpy(q.ptr, q_bits.data(), q_bits.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(k.ptr, k_bits.data(), k_bits.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  const auto dev = crisp::Device::cuda;
  const auto qv = crisp::TensorView::contiguous(q.ptr, crisp::DType::bf16, 8, w.total_tokens, 128, dev);
  const auto kv = crisp::TensorView::contiguous(k.ptr, crisp::DType::bf16, 2, w.total_tokens, 128, dev);

  crisp::Config cfg = crisp::Config::from_preset("crisp");
  crisp::cuda::DevicePlan dplan(8, 2, 128, w.cu_seqlens, cfg);
  EXPECT_FALSE(crisp::cuda_detail::view_of(dplan).work_order_ready);  // not filled yet
  crisp::cuda::plan_async(qv, kv, cfg, dplan, nullptr);
  expect_longest_first(dplan);
  // A refill with another policy changes the rows: the order follows.
  const crisp::Config flex = crisp::Config::from_preset("flexprefill");
  crisp::cuda::plan_async(qv, kv, flex, dplan, nullptr);
  expect_longest_first(dplan);
}

TEST(GpuWorkOrder, UploadBuildsLongestRowsFirst) {
  SKIP_WITHOUT_GPU();
  const crisp::Plan dense = crisp::dense_plan(4, 2, 64, {0, 1000, 1129, 3000}, 128);
  crisp::cuda::DevicePlan dplan(dense);
  expect_longest_first(dplan);
  dplan.upload(crisp_gpu_test::random_plan(dense, 0.3, 7), nullptr);
  expect_longest_first(dplan);
}

// One sequence sorts by the row cost alone (its rows are enumerated in item-code order, which the
// stable sort keeps among equal costs): the same order as the batch key gives.
TEST(GpuWorkOrder, OneSequenceSortsByCostInItemOrder) {
  SKIP_WITHOUT_GPU();
  const crisp::Plan dense = crisp::dense_plan(4, 2, 64, {0, 5000}, 128);
  crisp::cuda::DevicePlan dplan(dense);
  expect_longest_first(dplan);
  for (uint64_t seed : {3, 11}) {
    dplan.upload(crisp_gpu_test::random_plan(dense, 0.2, seed), nullptr);
    expect_longest_first(dplan);
  }
}

// A varlen batch of very uneven lengths (one 8192-token sequence among twenty 1-token ones) has 21
// item codes per query block of the long sequence, 20 of them empty: the work order lists the 84
// real rows per head only, and attention still writes every row.
TEST(GpuWorkOrder, VeryUnevenVarlenBatchListsOnlyRealRows) {
  SKIP_WITHOUT_GPU();
  crisp::SeqLens cu{0, 8192};
  for (int i = 0; i < 20; ++i) cu.push_back(cu.back() + 1);
  const int64_t H = 2, d = 64, T = cu.back();
  crisp::cuda::DevicePlan dplan(crisp::dense_plan(H, H, d, cu, 128));
  expect_longest_first(dplan);
  EXPECT_EQ(crisp::cuda_detail::view_of(dplan).num_work_items, H * (64 + 20));
  DeviceBuffer q(H * T * d * 2), out(H * T * d * 2), lse(H * T * 4);
  ASSERT_TRUE(q.ptr && out.ptr && lse.ptr);
  ASSERT_EQ(cudaMemset(q.ptr, 0, H * T * d * 2), cudaSuccess);  // zeros: every output row is 0
  ASSERT_EQ(cudaMemset(out.ptr, 0xff, H * T * d * 2), cudaSuccess);  // NaN
  ASSERT_EQ(cudaMemset(lse.ptr, 0xff, H * T * 4), cudaSuccess);
  const auto dev = crisp::Device::cuda;
  const auto view = [&](void* p) { return crisp::TensorView::contiguous(p, crisp::DType::bf16, H, T, d, dev); };
  crisp::cuda::attend_async(view(q.ptr), view(q.ptr), view(q.ptr), dplan, view(out.ptr),
                            crisp::TensorView::contiguous2d(lse.ptr, crisp::DType::f32, H, T, dev));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> o(static_cast<std::size_t>(H * T * d));
  std::vector<float> l(static_cast<std::size_t>(H * T));
  ASSERT_EQ(cudaMemcpy(o.data(), out.ptr, o.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(l.data(), lse.ptr, l.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (std::size_t i = 0; i < o.size(); ++i) ASSERT_EQ(o[i], 0) << "output element " << i;
  // Uniform attention over the t + 1 keys of a sequence (all logits 0): LSE = ln(t + 1).
  for (int64_t h = 0; h < H; ++h)
    for (std::size_t s = 0; s + 1 < cu.size(); ++s)
      for (int64_t t = cu[s]; t < cu[s + 1]; ++t)
        ASSERT_NEAR(l[h * T + t], std::log(static_cast<double>(t - cu[s] + 1)), 1e-4) << "head " << h << ", token " << t;
}

}  // namespace
