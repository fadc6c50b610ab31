// tests/gpu/test_gpu_context_parallel.cpp — context-parallel prefill over NCCL
// (crisp/context_parallel.h) against the single-GPU run of the same inputs: the same plan on
// every rank, and O / LSE bit for bit (the same kernel computes every row from the same data).
// Skips itself without two CUDA devices or without NCCL in the build.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#if defined(CRISP_WITH_NCCL)
#include <nccl.h>
#endif

#include "common/half.h"
#include "crisp/context_parallel.h"
#include "crisp/cuda.h"
#include "gpu/gpu_test_util.h"
#include "crisp/workload.h"
#include "plan/shard_copy.h"
#include "cuda/attention_rows.h"

using crisp::partition::copy_shard_tokens;

namespace {

using crisp_gpu_test::DeviceBuffer;

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

#define SKIP_WITHOUT_TWO_GPUS_AND_NCCL()                                          \
  do {                                                                            \
    if (!crisp::cuda::available()) GTEST_SKIP() << "no CUDA device";              \
    if (!crisp::cuda::nccl_built()) GTEST_SKIP() << "built without NCCL";          \
    if (device_count() < 2) GTEST_SKIP() << "fewer than 2 CUDA devices";           \
  } while (0)

TEST(GpuContextParallel, WithoutNcclOrCommunicatorGivesAClearError) {
  if (!crisp::cuda::available()) GTEST_SKIP() << "no CUDA device";
  crisp::Config cfg = crisp::Config::from_preset("crisp");
  try {
    crisp::cuda::ContextParallelPrefill cp(8, 2, 128, 4096, crisp::DType::bf16, cfg, crisp::CpPartition::zigzag, 0, 2,
                                           nullptr);
    FAIL() << "no error for a null communicator";
  } catch (const crisp::Error& e) {
    if (crisp::cuda::nccl_built())
      EXPECT_EQ(e.argument(), "nccl_comm") << e.what();
    else
      EXPECT_NE(std::string(e.what()).find("without NCCL"), std::string::npos) << e.what();
  }
}

// The row-subset launch on one GPU (no NCCL): listed rows, written at chosen tokens of a smaller
// output, equal the same rows of the full launch bit for bit; rows not listed stay untouched.
// Lists rows {N-1, 9, 5, 0} (every_row false: 32 work items, fewer than an H200's SMs) or those
// followed by every other row in descending order (every_row true: 192 items, so the Hopper
// kernel's persistent CTAs take row-subset items from their counter).
void expect_listed_rows_equal_the_full_launch(bool every_row) {
  const int64_t Hq = 8, Hkv = 2, d = 128, n = 128 * 23 + 77;
  const int block = 128;
  crisp::WorkloadSpec spec = crisp_test::workload_spec(Hq, Hkv, d, {n}, 3);
  crisp::Workload w = crisp::make_workload(spec);
  std::vector<uint16_t> qb(w.q.size()), kb(w.k.size()), vb(w.v.size());
  for (std::size_t i = 0; i < qb.size(); ++i) qb[i] = crisp::half::float_to_bf16(w.q[i]);
  for (std::size_t i = 0; i < kb.size(); ++i) kb[i] = crisp::half::float_to_bf16(w.k[i]);
  for (std::size_t i = 0; i < vb.size(); ++i) vb[i] = crisp::half::float_to_bf16(w.v[i]);
  crisp::Config cfg = crisp::Config::from_preset("crisp");
  cfg.block_size = block;
  const int32_t N = static_cast<int32_t>((n + block - 1) / block);
  // Blocks 0, 5, the partial last one and 9, written back to back from token 0 of the output.
  std::vector<int32_t> listed = {N - 1, 9, 5, 0};
  if (every_row)
    for (int32_t r = N - 2; r >= 0; --r)
      if (r != 9 && r != 5 && r != 0) listed.push_back(r);
  std::vector<crisp::cuda_detail::attention::RowItem> items;
  int64_t out_tokens = 0;
  for (const int32_t r : listed) {
    items.push_back({0, r, out_tokens});
    out_tokens += std::min<int64_t>(n, int64_t{r + 1} * block) - int64_t{r} * block;
  }
  DeviceBuffer q(qb.size() * 2), k(kb.size() * 2), v(vb.size() * 2), o(qb.size() * 2), l(Hq * n * 4),
      os(Hq * out_tokens * d * 2), ls(Hq * out_tokens * 4), it(items.size() * sizeof(items[0]));
  ASSERT_TRUE(q.ptr && k.ptr && v.ptr && o.ptr && l.ptr && os.ptr && ls.ptr && it.ptr);
  ASSERT_EQ(cudaMemcpy(q.ptr, qb.data(), qb.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(k.ptr, kb.data(), kb.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(v.ptr, vb.data(), vb.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(it.ptr, items.data(), items.size() * sizeof(items[0]), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(os.ptr, 0xff, Hq * out_tokens * d * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(ls.ptr, 0xff, Hq * out_tokens * 4), cudaSuccess);
  const auto dev = crisp::Device::cuda;
  const auto qv = crisp::TensorView::contiguous(q.ptr, crisp::DType::bf16, Hq, n, d, dev);
  const auto kv = crisp::TensorView::contiguous(k.ptr, crisp::DType::bf16, Hkv, n, d, dev);
  const auto vv = crisp::TensorView::contiguous(v.ptr, crisp::DType::bf16, Hkv, n, d, dev);
  crisp::cuda::DevicePlan plan(Hq, Hkv, d, {0, n}, cfg);
  crisp::cuda::plan_async(qv, kv, cfg, plan);
  crisp::cuda::attend_async(qv, kv, vv, plan, crisp::TensorView::contiguous(o.ptr, crisp::DType::bf16, Hq, n, d, dev),
                            crisp::TensorView::contiguous2d(l.ptr, crisp::DType::f32, Hq, n, dev));
  crisp::cuda_detail::attend_rows_async(
      qv, kv, vv, plan, crisp::TensorView::contiguous(os.ptr, crisp::DType::bf16, Hq, out_tokens, d, dev),
      crisp::TensorView::contiguous2d(ls.ptr, crisp::DType::f32, Hq, out_tokens, dev),
      static_cast<const crisp::cuda_detail::attention::RowItem*>(it.ptr), static_cast<int64_t>(items.size()), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> full(qb.size()), sub(static_cast<std::size_t>(Hq * out_tokens * d));
  std::vector<float> full_lse(static_cast<std::size_t>(Hq * n)), sub_lse(static_cast<std::size_t>(Hq * out_tokens));
  ASSERT_EQ(cudaMemcpy(full.data(), o.ptr, full.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(sub.data(), os.ptr, sub.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(full_lse.data(), l.ptr, full_lse.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(sub_lse.data(), ls.ptr, sub_lse.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  int64_t differing = 0;
  for (int64_t h = 0; h < Hq; ++h)
    for (const auto& item : items) {
      const int64_t rows = std::min<int64_t>(n, int64_t{item.query_block + 1} * block) - int64_t{item.query_block} * block;
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t t = int64_t{item.query_block} * block + i, u = item.out_token + i;
        differing += std::memcmp(&full[static_cast<std::size_t>((h * n + t) * d)],
                                 &sub[static_cast<std::size_t>((h * out_tokens + u) * d)], d * 2) != 0;
        differing += std::memcmp(&full_lse[static_cast<std::size_t>(h * n + t)],
                                 &sub_lse[static_cast<std::size_t>(h * out_tokens + u)], 4) != 0;
      }
    }
  EXPECT_EQ(differing, 0) << "rows (of O or LSE) differ from the full launch";
}

TEST(GpuRowSubset, ListedRowsEqualTheFullLaunchBitForBit) {
  if (!crisp::cuda::available()) GTEST_SKIP() << "no CUDA device";
  expect_listed_rows_equal_the_full_launch(false);
}

TEST(GpuRowSubset, EveryRowListedInAnotherOrderEqualsTheFullLaunch) {
  if (!crisp::cuda::available()) GTEST_SKIP() << "no CUDA device";
  expect_listed_rows_equal_the_full_launch(true);
}

// The same on the portable kernel at B = 128 (on sm_90 `auto` runs the Hopper kernel there): the
// portable kernel's row-subset epilogue writes each listed row at its out_token.
TEST(GpuRowSubset, PortableKernelListedRowsEqualTheFullLaunch) {
  if (!crisp::cuda::available()) GTEST_SKIP() << "no CUDA device";
  crisp_gpu_test::ScopedEnv kernel("CRISP_KERNEL", "portable");
  expect_listed_rows_equal_the_full_launch(false);
  expect_listed_rows_equal_the_full_launch(true);
}

#if defined(CRISP_WITH_NCCL)

std::vector<uint16_t> to_half_bits(const std::vector<float>& x, crisp::DType dt) {
  std::vector<uint16_t> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    out[i] = crisp_gpu_test::to_bits(x[i], dt);
  return out;
}

struct Case {
  const char* preset;
  crisp::DType dtype;
  int64_t head_dim;
  int block;
  int64_t n;
};

struct RankOutput {
  std::vector<uint16_t> out;
  std::vector<float> lse;
  crisp::Plan plan;
  std::string error;
};

TEST(GpuContextParallel, ShardedOutputEqualsSingleGpuOutputBitForBit) {
  SKIP_WITHOUT_TWO_GPUS_AND_NCCL();
  const int world = 2;
  const int64_t Hq = 8, Hkv = 2;
  const Case cases[] = {
      {"crisp", crisp::DType::bf16, 128, 128, 128 * 41 + 45},
      {"flexprefill", crisp::DType::bf16, 128, 128, 128 * 40},
      {"dense", crisp::DType::f16, 64, 64, 64 * 37 + 9},
      {"minference", crisp::DType::f16, 128, 64, 64 * 52 + 63},
  };
  ncclComm_t comms[2];
  const int devices[2] = {0, 1};
  ASSERT_EQ(ncclCommInitAll(comms, world, devices), ncclSuccess);

  for (const Case& c : cases)
    for (const crisp::CpPartition partition : {crisp::CpPartition::contiguous, crisp::CpPartition::zigzag}) {
      SCOPED_TRACE(std::string(c.preset) + " " + crisp::to_string(partition) + " n=" + std::to_string(c.n) +
                   " d=" + std::to_string(c.head_dim) + " B=" + std::to_string(c.block));
      crisp::WorkloadSpec spec = crisp_test::workload_spec(Hq, Hkv, c.head_dim, {c.n}, 7);
      crisp::Workload w = crisp::make_workload(spec);
      const auto qb = to_half_bits(w.q, c.dtype), kb = to_half_bits(w.k, c.dtype), vb = to_half_bits(w.v, c.dtype);
      crisp::Config cfg = crisp::Config::from_preset(c.preset);
      cfg.block_size = c.block;
      const int64_t n = c.n, d = c.head_dim;

      // The single-GPU run on device 0.
      std::vector<uint16_t> out_ref(qb.size());
      std::vector<float> lse_ref(static_cast<std::size_t>(Hq * n));
      crisp::Plan plan_ref;
      {
        ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
        DeviceBuffer q(qb.size() * 2), k(kb.size() * 2), v(vb.size() * 2), o(qb.size() * 2), l(lse_ref.size() * 4);
        ASSERT_TRUE(q.ptr && k.ptr && v.ptr && o.ptr && l.ptr);
        ASSERT_EQ(cudaMemcpy(q.ptr, qb.data(), qb.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(k.ptr, kb.data(), kb.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(v.ptr, vb.data(), vb.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
        const auto dev = crisp::Device::cuda;
        const auto qv = crisp::TensorView::contiguous(q.ptr, c.dtype, Hq, n, d, dev);
        const auto kv = crisp::TensorView::contiguous(k.ptr, c.dtype, Hkv, n, d, dev);
        const auto vv = crisp::TensorView::contiguous(v.ptr, c.dtype, Hkv, n, d, dev);
        crisp::cuda::DevicePlan dplan(Hq, Hkv, d, {0, n}, cfg);
        crisp::cuda::plan_async(qv, kv, cfg, dplan);
        crisp::cuda::attend_async(qv, kv, vv, dplan, crisp::TensorView::contiguous(o.ptr, c.dtype, Hq, n, d, dev),
                                  crisp::TensorView::contiguous2d(l.ptr, crisp::DType::f32, Hq, n, dev));
        plan_ref = dplan.to_host();
        ASSERT_EQ(cudaMemcpy(out_ref.data(), o.ptr, out_ref.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(lse_ref.data(), l.ptr, lse_ref.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      }

      // The sharded run: one thread per GPU, each holding only its slices.
      std::vector<RankOutput> results(world);
      std::vector<std::thread> threads;
      for (int rank = 0; rank < world; ++rank)
        threads.emplace_back([&, rank] {
          RankOutput& res = results[rank];
          try {
            if (cudaSetDevice(devices[rank]) != cudaSuccess) throw std::runtime_error("cudaSetDevice");
            const crisp::CpShard shard = crisp::cp_shard(n, c.block, partition, rank, world);
            const auto ql = copy_shard_tokens(qb, Hq, n, d, shard), kl = copy_shard_tokens(kb, Hkv, n, d, shard),
                       vl = copy_shard_tokens(vb, Hkv, n, d, shard);
            const int64_t lt = shard.local_tokens;
            DeviceBuffer q(ql.size() * 2), k(kl.size() * 2), v(vl.size() * 2), o(ql.size() * 2),
                l(static_cast<std::size_t>(Hq * lt) * 4);
            if (!(q.ptr && k.ptr && v.ptr && o.ptr && l.ptr)) throw std::runtime_error("cudaMalloc");
            cudaMemcpy(q.ptr, ql.data(), ql.size() * 2, cudaMemcpyHostToDevice);
            cudaMemcpy(k.ptr, kl.data(), kl.size() * 2, cudaMemcpyHostToDevice);
            cudaMemcpy(v.ptr, vl.data(), vl.size() * 2, cudaMemcpyHostToDevice);
            // Poison the outputs so an unwritten element cannot pass.
            cudaMemset(o.ptr, 0xff, ql.size() * 2);
            cudaMemset(l.ptr, 0xff, static_cast<std::size_t>(Hq * lt) * 4);
            cudaStream_t stream;
            cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
            const auto dev = crisp::Device::cuda;
            crisp::cuda::ContextParallelPrefill cp(Hq, Hkv, d, n, c.dtype, cfg, partition, rank, world, comms[rank]);
            // Twice: the second run reuses every buffer and must give the same result.
            for (int rep = 0; rep < 2; ++rep)
              cp.run(crisp::TensorView::contiguous(q.ptr, c.dtype, Hq, lt, d, dev),
                     crisp::TensorView::contiguous(k.ptr, c.dtype, Hkv, lt, d, dev),
                     crisp::TensorView::contiguous(v.ptr, c.dtype, Hkv, lt, d, dev),
                     crisp::TensorView::contiguous(o.ptr, c.dtype, Hq, lt, d, dev),
                     crisp::TensorView::contiguous2d(l.ptr, crisp::DType::f32, Hq, lt, dev), stream);
            if (cudaStreamSynchronize(stream) != cudaSuccess) throw std::runtime_error("stream");
            res.plan = cp.plan().to_host(stream);
            res.out.resize(ql.size());
            res.lse.resize(static_cast<std::size_t>(Hq * lt));
            cudaMemcpy(res.out.data(), o.ptr, res.out.size() * 2, cudaMemcpyDeviceToHost);
            cudaMemcpy(res.lse.data(), l.ptr, res.lse.size() * 4, cudaMemcpyDeviceToHost);
            cudaStreamDestroy(stream);
          } catch (const std::exception& e) {
            res.error = e.what();
          }
        });
      for (auto& t : threads) t.join();

      for (int rank = 0; rank < world; ++rank) {
        SCOPED_TRACE("rank " + std::to_string(rank));
        const RankOutput& res = results[rank];
        ASSERT_TRUE(res.error.empty()) << res.error;
        // The same plan as the single GPU (hence on every rank).
        ASSERT_EQ(res.plan.sequences.size(), 1u);
        for (std::size_t h = 0; h < plan_ref.sequences[0].heads.size(); ++h) {
          EXPECT_EQ(res.plan.sequences[0].heads[h].route, plan_ref.sequences[0].heads[h].route) << "head " << h;
          EXPECT_EQ(res.plan.sequences[0].heads[h].row_ptr, plan_ref.sequences[0].heads[h].row_ptr) << "head " << h;
          EXPECT_EQ(res.plan.sequences[0].heads[h].col, plan_ref.sequences[0].heads[h].col) << "head " << h;
        }
        const crisp::CpShard shard = crisp::cp_shard(n, c.block, partition, rank, world);
        const auto want_out = copy_shard_tokens(out_ref, Hq, n, d, shard);
        const auto want_lse = copy_shard_tokens(lse_ref, Hq, n, 1, shard);
        int64_t out_mismatch = 0, lse_mismatch = 0;
        for (std::size_t i = 0; i < want_out.size(); ++i) out_mismatch += want_out[i] != res.out[i];
        for (std::size_t i = 0; i < want_lse.size(); ++i)
          lse_mismatch += std::memcmp(&want_lse[i], &res.lse[i], sizeof(float)) != 0;
        EXPECT_EQ(out_mismatch, 0) << "of " << want_out.size() << " O elements differ from the single-GPU run";
        EXPECT_EQ(lse_mismatch, 0) << "of " << want_lse.size() << " LSE elements differ from the single-GPU run";
      }
    }
  for (ncclComm_t comm : comms) ncclCommDestroy(comm);
}

#endif  // CRISP_WITH_NCCL

}  // namespace
