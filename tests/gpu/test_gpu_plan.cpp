// tests/gpu/test_gpu_plan.cpp — the device planner (crisp::cuda::plan_async) against the CPU
// reference (crisp::plan on the CPU, Precision::f32 and Precision::f64) on the structured
// workload: routes, verticals, slashes and the CSR layout must be identical; C_struct and the JS
// distance within 1e-4. Also: the API path (crisp::plan on device views), CUDA-graph capture of
// plan_async, and argument errors. Every test skips itself when no CUDA device is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/half.h"
#include "crisp/crisp.h"
#include "crisp/cuda.h"
#include "crisp/workload.h"
#include "cuda/device_plan_internal.h"
#include "cuda/setup_copies.h"
#include "gpu/gpu_test_util.h"

namespace {

#define SKIP_WITHOUT_GPU() \
  if (!crisp::cuda::available()) GTEST_SKIP() << "no CUDA device"

// Device copy of a host array, freed on scope exit.
struct DeviceArray {
  void* ptr = nullptr;
  DeviceArray(const void* host, std::size_t bytes) {
    if (cudaMalloc(&ptr, bytes) != cudaSuccess) {
      ptr = nullptr;
      return;
    }
    if (cudaMemcpy(ptr, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
      cudaFree(ptr);
      ptr = nullptr;
    }
  }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

struct PlanCase {
  std::string name;
  std::string preset;
  std::vector<std::string> sets;  // --set key=value
  std::vector<int64_t> seq_lens;
  int64_t hq, hkv, d;
  int block;
  uint64_t seed;
  bool bf16 = false;
};

std::string case_name(const testing::TestParamInfo<PlanCase>& info) { return info.param.name; }

void expect_close_stat(double gpu, double cpu, const char* what) {
  if (std::isnan(cpu)) {
    EXPECT_TRUE(std::isnan(gpu)) << what << ": GPU " << gpu << ", CPU NaN";
  } else {
    EXPECT_NEAR(gpu, cpu, 1e-4) << what;
  }
}

// Same decisions head by head; returns the number of heads compared.
void expect_same_plan(const crisp::Plan& gpu, const crisp::Plan& cpu, const char* reference) {
  ASSERT_EQ(gpu.sequences.size(), cpu.sequences.size());
  int vs_heads = 0, pe_heads = 0;
  for (std::size_t s = 0; s < cpu.sequences.size(); ++s) {
    const auto& gs = gpu.sequences[s];
    const auto& cs = cpu.sequences[s];
    ASSERT_EQ(gs.n_k, cs.n_k);
    ASSERT_EQ(gs.n_q, cs.n_q);
    ASSERT_EQ(gs.first_row, cs.first_row);
    ASSERT_EQ(gs.num_blocks, cs.num_blocks);
    ASSERT_EQ(gs.heads.size(), cs.heads.size());
    for (std::size_t h = 0; h < cs.heads.size(); ++h) {
      SCOPED_TRACE(std::string(reference) + ": sequence " + std::to_string(s) + " (n_q " + std::to_string(cs.n_q) + " of n_k " + std::to_string(cs.n_k) +
                   "), head " + std::to_string(h));
      const auto& g = gs.heads[h];
      const auto& c = cs.heads[h];
      EXPECT_EQ(crisp::to_string(g.route), std::string(crisp::to_string(c.route)));
      expect_close_stat(g.c_struct, c.c_struct, "c_struct");
      expect_close_stat(g.jsd, c.jsd, "jsd");
      EXPECT_EQ(g.vertical, c.vertical);
      EXPECT_EQ(g.slash, c.slash);
      EXPECT_EQ(g.row_ptr, c.row_ptr);
      EXPECT_EQ(g.col, c.col);
      EXPECT_DOUBLE_EQ(g.density, c.density);
      vs_heads += c.route == crisp::Route::vs;
      pe_heads += c.route == crisp::Route::pe;
    }
  }
  testing::Test::RecordProperty(std::string(reference) + "_vs_heads", vs_heads);
  testing::Test::RecordProperty(std::string(reference) + "_pe_heads", pe_heads);
}

// One case: the device plan against the CPU's (float32 and float64), and a refill of it.
void expect_gpu_plan_matches_cpu(const PlanCase& pc) {
  crisp::WorkloadSpec spec = crisp_test::workload_spec(pc.hq, pc.hkv, pc.d, pc.seq_lens, pc.seed);
  crisp::Workload w = crisp::make_workload(spec);
  crisp::Config cfg = crisp::Config::from_preset(pc.preset);
  cfg.block_size = pc.block;
  for (const auto& kv : pc.sets) cfg.set(kv);

  // Host inputs: float32, or bf16 bits (the CPU reads the same rounded values).
  crisp::TensorView q_host = w.q_view(), k_host = w.k_view();
  std::vector<uint16_t> q_bits, k_bits;
  if (pc.bf16) {
    q_bits.resize(w.q.size());
    k_bits.resize(w.k.size());
    for (std::size_t i = 0; i < w.q.size(); ++i) q_bits[i] = crisp::half::float_to_bf16(w.q[i]);
    for (std::size_t i = 0; i < w.k.size(); ++i) k_bits[i] = crisp::half::float_to_bf16(w.k[i]);
    q_host = crisp::TensorView::contiguous(q_bits.data(), crisp::DType::bf16, pc.hq, w.total_tokens, pc.d);
    k_host = crisp::TensorView::contiguous(k_bits.data(), crisp::DType::bf16, pc.hkv, w.total_tokens, pc.d);
  }
  const std::size_t esize = crisp::dtype_size(q_host.dtype);
  DeviceArray q_dev(q_host.data, static_cast<std::size_t>(q_host.numel()) * esize);
  DeviceArray k_dev(k_host.data, static_cast<std::size_t>(k_host.numel()) * esize);
  ASSERT_NE(q_dev.ptr, nullptr);
  ASSERT_NE(k_dev.ptr, nullptr);
  const auto q_gpu = crisp::TensorView::contiguous(q_dev.ptr, q_host.dtype, pc.hq, w.total_tokens, pc.d,
                                                   crisp::Device::cuda);
  const auto k_gpu = crisp::TensorView::contiguous(k_dev.ptr, k_host.dtype, pc.hkv, w.total_tokens, pc.d,
                                                   crisp::Device::cuda);

  crisp::cuda::DevicePlan dplan(pc.hq, pc.hkv, pc.d, w.cu_seqlens, cfg);
  crisp::cuda::plan_async(q_gpu, k_gpu, cfg, dplan, nullptr);
  const crisp::Plan gpu = dplan.to_host(nullptr);
  ASSERT_NO_THROW(gpu.check_well_formed());

  crisp::Options f32;
  f32.precision = crisp::Precision::f32;
  crisp::Options f64;
  f64.precision = crisp::Precision::f64;
  const crisp::Plan cpu32 = crisp::plan(q_host, k_host, cfg, w.cu_seqlens, f32);
  const crisp::Plan cpu64 = crisp::plan(q_host, k_host, cfg, w.cu_seqlens, f64);
  expect_same_plan(gpu, cpu32, "cpu_f32");
  expect_same_plan(gpu, cpu64, "cpu_f64");

  // A second fill of the same DevicePlan (reused workspace) gives the same plan.
  crisp::cuda::plan_async(q_gpu, k_gpu, cfg, dplan, nullptr);
  expect_same_plan(dplan.to_host(nullptr), cpu32, "cpu_f32_refill");
}

class GpuPlanMatchesCpu : public testing::TestWithParam<PlanCase> {};

TEST_P(GpuPlanMatchesCpu, RoutesLayoutsAndStatistics) {
  SKIP_WITHOUT_GPU();
  expect_gpu_plan_matches_cpu(GetParam());
}

// The bf16 cases again with the fused proxy pass on the mma.sync kernel (the sm_80 one): on a
// Hopper device the suite above runs the wgmma kernel (hopper/plan_proxy_wgmma.cuh), so without
// this the sm_80 kernel would go untested on the H200.
class GpuPlanMmaSyncProxyMatchesCpu : public testing::TestWithParam<PlanCase> {
 protected:
  void SetUp() override { crisp::cuda_detail::set_proxy_mma_kernel(crisp::cuda_detail::ProxyMmaKernel::mma_sync); }
  void TearDown() override { crisp::cuda_detail::set_proxy_mma_kernel(crisp::cuda_detail::ProxyMmaKernel::automatic); }
};

TEST_P(GpuPlanMmaSyncProxyMatchesCpu, RoutesLayoutsAndStatistics) {
  SKIP_WITHOUT_GPU();
  expect_gpu_plan_matches_cpu(GetParam());
}

std::vector<PlanCase> plan_cases() {
  std::vector<PlanCase> cases;
  const std::vector<std::string> presets = {"crisp", "flexprefill", "minference", "dense"};
  for (const auto& preset : presets) {
    // Shapes: aligned and unaligned n, n < B, both block sizes, GQA 1/4/8, a varlen batch.
    cases.push_back({preset + "_n4096_b128_gqa4_s0", preset, {}, {4096}, 8, 2, 128, 128, 0});
    cases.push_back({preset + "_n3001_b128_gqa4_s1", preset, {}, {3001}, 8, 2, 128, 128, 1});
    cases.push_back({preset + "_n2500_b64_gqa1_s2", preset, {}, {2500}, 4, 4, 64, 64, 2});
    cases.push_back({preset + "_n3333_b64_gqa8_s3", preset, {}, {3333}, 8, 1, 128, 64, 3});
    cases.push_back({preset + "_n100_b128_short_s4", preset, {}, {100}, 4, 1, 64, 128, 4});
    cases.push_back({preset + "_varlen_b128_gqa4_s5", preset, {}, {1500, 4096, 77, 2900}, 8, 2, 128, 128, 5});
    cases.push_back({preset + "_n6000_b128_bf16_s6", preset, {}, {6000}, 8, 2, 128, 128, 6, true});
    // bf16 runs the tensor-core proxy (crisp: one fused pass; flexprefill and minference: two, for
    // their token-level rules; dense plans nothing, a check of the short path): its row tiles hold
    // the GQA group's rows (64 / 128 / 512 / 2 x 512 here), both block sizes and head dims, and a
    // varlen batch.
    cases.push_back({preset + "_n2500_b64_gqa1_d64_bf16_s15", preset, {}, {2500}, 4, 4, 64, 64, 15, true});
    cases.push_back({preset + "_n3333_b64_gqa8_bf16_s16", preset, {}, {3333}, 8, 1, 128, 64, 16, true});
    cases.push_back({preset + "_n3000_b128_gqa8_bf16_s17", preset, {}, {3000}, 8, 1, 128, 128, 17, true});
    cases.push_back({preset + "_n2100_b128_gqa1_d64_bf16_s18", preset, {}, {2100}, 4, 4, 64, 128, 18, true});
    cases.push_back({preset + "_varlen_b128_gqa4_bf16_s19", preset, {}, {1500, 4096, 77, 2900}, 8, 2, 128, 128, 19,
                     true});
    // Head dim 256 (Gemma 3), both block sizes, GQA 4 and 2: bf16 on the tensor-core proxy (256
    // rows per work item, so GQA 4 at B 128 takes two row tiles), f32 on the FFMA one
    // (plan_device.cu, tensor_core_proxy).
    cases.push_back({preset + "_n3001_b128_gqa4_d256_bf16_s31", preset, {}, {3001}, 8, 2, 256, 128, 31, true});
    cases.push_back({preset + "_n2500_b64_gqa2_d256_s32", preset, {}, {2500}, 4, 2, 256, 64, 32});
    cases.push_back({preset + "_varlen_b64_gqa4_d256_bf16_s33", preset, {}, {1500, 77, 2100}, 4, 1, 256, 64, 33,
                     true});
  }
  // Ablations through --set.
  cases.push_back({"jsd_noise_floor", "crisp", {"routing=jsd"}, {4096, 2222}, 8, 2, 128, 128, 7});
  cases.push_back({"cstruct_rel", "crisp", {"routing=cstruct_rel"}, {5000}, 8, 2, 128, 128, 8});
  cases.push_back({"budgets", "crisp", {"min_budget=512", "max_budget=768"}, {4096}, 8, 2, 128, 128, 9});
  cases.push_back({"single_cover_alpha2", "crisp", {"slash_cover=single", "alpha=2"}, {3500}, 8, 2, 128, 64, 10});
  cases.push_back({"cstruct_topk", "crisp", {"vs_budget=topk", "vertical_tokens=300", "slash_tokens=700"}, {4096},
                   8, 2, 128, 128, 11});
  cases.push_back({"cstruct_cumulative_g09", "crisp", {"vs_budget=cumulative", "gamma=0.9"}, {3000}, 8, 2, 128,
                   128, 12});
  cases.push_back({"pe_gamma_08", "crisp", {"pe_rule=coverage", "pe_gamma=0.8", "tau_proxy=0.6"}, {4096}, 8, 2, 128, 128, 13});
  cases.push_back({"dense_below", "crisp", {"dense_below=2000"}, {1800, 4096}, 8, 2, 128, 128, 14});
  // Options under evaluation: the noise floor at the uniform level (or the larger of it and the
  // mean floor), and the PE row floor (PE forced by tau_proxy, beside VS heads), on the scalar and
  // the tensor-core proxy, both block sizes, a varlen batch.
  cases.push_back({"vs_floor_uniform_all_vs", "crisp", {"routing=none", "vs_floor=uniform"}, {4096}, 8, 2, 128, 128, 23});
  cases.push_back({"vs_floor_uniform_ua2_b64", "crisp", {"vs_floor=uniform", "uniform_alpha=2"}, {3500}, 8, 2, 128, 64,
                   24});
  cases.push_back({"vs_floor_max_bf16", "crisp", {"vs_floor=max", "alpha=1.5"}, {6000}, 8, 2, 128, 128, 25, true});
  cases.push_back({"vs_floor_uniform_budgets_varlen", "crisp",
                   {"routing=none", "vs_floor=uniform", "min_budget=512", "max_budget=1024"},
                   {1500, 4096, 77, 2900}, 8, 2, 128, 128, 26});
  cases.push_back({"pe_floor", "crisp", {"routing=cstruct", "tau_proxy=0.6", "pe_rule=floor"}, {4096}, 8, 2, 128, 128,
                   27});
  cases.push_back({"pe_floor_alpha2_varlen", "crisp", {"routing=cstruct", "tau_proxy=0.6", "pe_rule=floor", "pe_alpha=2"},
                   {1500, 4096, 77, 2900}, 8, 2, 128, 128, 28});
  cases.push_back({"pe_floor_min_budget_b64_bf16", "crisp",
                   {"routing=cstruct", "tau_proxy=0.6", "pe_rule=floor", "pe_alpha=0.5", "min_budget=512"}, {3333}, 8,
                   1, 128, 64, 29, true});
  cases.push_back({"floors_flexprefill_jsd", "flexprefill", {"vs_budget=noise_floor", "vs_floor=uniform", "pe_rule=floor"},
                   {4096, 2222}, 8, 2, 128, 128, 30});
  cases.push_back({"uniform_floor_blocks_varlen", "crisp", {"uniform_floor_blocks=32"}, {1500, 4096, 77, 2900, 5000}, 8,
                   2, 128, 128, 31});
  cases.push_back({"uniform_floor_blocks_b64_bf16", "crisp", {"routing=none", "uniform_floor_blocks=64"}, {3333}, 8, 2,
                   128, 64, 32, true});
  // Short prompts at finer blocks: the longest sequence below fine_blocks_below plans the batch
  // at B = 64 with the holds doubled (the DevicePlan is sized for it), at or above it at 128.
  cases.push_back({"fine_blocks_below_varlen_bf16", "crisp", {"fine_blocks_below=4096"}, {1500, 2900, 77, 4000}, 8, 2,
                   128, 128, 46, true});
  cases.push_back({"fine_blocks_below_not_below_varlen", "crisp", {"fine_blocks_below=4096"}, {1500, 4096, 77}, 8, 2,
                   128, 128, 47});
  cases.push_back({"uniform_floor_slash_blocks_varlen", "crisp",
                   {"routing=none", "uniform_floor_blocks=32", "uniform_floor_slash_blocks=0", "proxy_last_rows=16"},
                   {1500, 2900, 77, 4096}, 8, 2, 128, 128, 41});
  cases.push_back({"uniform_floor_last_rows_bf16", "crisp", {"uniform_floor_last_rows=true", "uniform_floor_slash_blocks=20"},
                   {1500, 3001, 2048}, 8, 2, 128, 128, 42, true});
  cases.push_back({"uniform_floor_last_rows_jsd_d256", "flexprefill",
                   {"vs_budget=noise_floor", "vs_floor=uniform", "proxy_last_rows=16", "uniform_floor_blocks=32",
                    "uniform_floor_last_rows=true"},
                   {2500}, 8, 2, 256, 128, 43});
  // proxy_last_rows on every proxy path: the FFMA one (f32, d 256, and token-level rules, which
  // leave the tensor cores for it), the fused tensor-core one (bf16, d 64 / 128, L = 64 / 128),
  // R < L, R > L (every row), a varlen batch, FlexPrefill's JSD reading the combined pv.
  cases.push_back({"proxy_last_rows_varlen", "crisp", {"proxy_last_rows=16"}, {1500, 4096, 77, 2900}, 8, 2, 128, 128,
                   34});
  cases.push_back({"proxy_last_rows_bf16", "crisp", {"proxy_last_rows=16"}, {6000}, 8, 2, 128, 128, 35, true});
  cases.push_back({"proxy_last_rows_b64_d64_ufb_bf16", "crisp", {"routing=none", "proxy_last_rows=8", "uniform_floor_blocks=32"},
                   {2500}, 4, 4, 64, 64, 36, true});
  cases.push_back({"proxy_last_rows_over_l_b64_bf16", "crisp", {"proxy_last_rows=100"}, {3333}, 8, 1, 128, 64, 37, true});
  cases.push_back({"proxy_last_rows_d256_bf16", "crisp", {"proxy_last_rows=16"}, {3001}, 8, 2, 256, 128, 38, true});
  cases.push_back({"proxy_last_rows_flexprefill_bf16", "flexprefill", {"proxy_last_rows=16"}, {4096, 2222}, 8, 2, 128,
                   128, 39, true});
  cases.push_back({"proxy_last_rows_minference", "minference", {"proxy_last_rows=8"}, {3000}, 8, 2, 128, 128, 40});
  // The radix select runs in one launch per slot up to kSelectChunk = 8192 entries and as a grid of
  // chunks above: PE maps of N(N+1)/2 > 8192 entries (N = 141 blocks of 64) and token walks of
  // more than 8192 keys, beside a sequence below the limit in the same batch.
  cases.push_back({"select_chunks_pe_b64", "crisp", {"routing=cstruct", "tau_proxy=0.6", "pe_rule=coverage"}, {9000, 2000}, 4, 1, 64, 64,
                   41});
  cases.push_back({"select_chunks_flexprefill", "flexprefill", {}, {10000, 3000}, 4, 2, 64, 128, 42});
  cases.push_back({"select_chunks_topk", "minference", {}, {9500}, 4, 2, 64, 128, 43, true});
  // N = 512 blocks of 64: 131k PE entries per head, 16 chunks; compaction lists the stop bucket's
  // entries after a grid pass and the one-block passes read only those.
  cases.push_back({"select_chunks_pe_n32k_b64", "crisp", {"routing=cstruct", "tau_proxy=0.6", "pe_rule=coverage"}, {32768}, 4, 1, 64, 64,
                   44});
  // N = 180 blocks of 128: 16290 PE entries, 4072 candidates at most, whose staging (32 KB) with the
  // rest kernel's static shared memory (27 KB) is above the 48 KB a launch gets without opting in.
  cases.push_back({"select_chunks_pe_n23k_b128", "crisp", {"routing=cstruct", "tau_proxy=0.6", "pe_rule=coverage"}, {23000}, 4, 1, 64,
                   128, 45});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Presets, GpuPlanMatchesCpu, testing::ValuesIn(plan_cases()), case_name);

std::vector<PlanCase> bf16_plan_cases() {
  std::vector<PlanCase> cases;
  for (const PlanCase& pc : plan_cases())
    if (pc.bf16) cases.push_back(pc);
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Bf16, GpuPlanMmaSyncProxyMatchesCpu, testing::ValuesIn(bf16_plan_cases()), case_name);

// The selections above kSelectChunk entries again with compaction off (plan_select.cuh): the
// passes after the grid passes then read every entry in one block per slot, the path of a slot
// whose stop bucket stays crowded, which the inputs above rarely reach.
class GpuPlanSelectWithoutCompactionMatchesCpu : public testing::TestWithParam<PlanCase> {
 protected:
  void SetUp() override { crisp::cuda_detail::set_select_compaction(false); }
  void TearDown() override { crisp::cuda_detail::set_select_compaction(true); }
};

TEST_P(GpuPlanSelectWithoutCompactionMatchesCpu, RoutesLayoutsAndStatistics) {
  SKIP_WITHOUT_GPU();
  expect_gpu_plan_matches_cpu(GetParam());
}

std::vector<PlanCase> select_chunk_cases() {
  std::vector<PlanCase> cases;
  for (const PlanCase& pc : plan_cases())
    if (pc.name.rfind("select_chunks", 0) == 0) cases.push_back(pc);
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Chunks, GpuPlanSelectWithoutCompactionMatchesCpu, testing::ValuesIn(select_chunk_cases()),
                         case_name);

// The API dispatch (crisp::plan on Device::cuda views) is the same planner, and refuses what it lacks.
TEST(GpuPlan, ApiPathMatchesCpu) {
  SKIP_WITHOUT_GPU();
  crisp::WorkloadSpec spec = crisp_test::workload_spec(8, 2, 128, {3000, 1000}, 21);
  crisp::Workload w = crisp::make_workload(spec);
  const crisp::Config cfg = crisp::Config::from_preset("crisp");
  DeviceArray q_dev(w.q.data(), w.q.size() * sizeof(float));
  DeviceArray k_dev(w.k.data(), w.k.size() * sizeof(float));
  ASSERT_NE(q_dev.ptr, nullptr);
  ASSERT_NE(k_dev.ptr, nullptr);
  const auto q_gpu = crisp::TensorView::contiguous(q_dev.ptr, crisp::DType::f32, 8, w.total_tokens, 128, crisp::Device::cuda);
  const auto k_gpu = crisp::TensorView::contiguous(k_dev.ptr, crisp::DType::f32, 2, w.total_tokens, 128, crisp::Device::cuda);
  const crisp::Plan gpu = crisp::plan(q_gpu, k_gpu, cfg, w.cu_seqlens);
  const crisp::Plan cpu = crisp::plan(w.q_view(), w.k_view(), cfg, w.cu_seqlens);
  expect_same_plan(gpu, cpu, "api");
  // An option that needs more workspace than the call before (proxy_last_rows) on the same path.
  crisp::Config last_rows = cfg;
  last_rows.set("proxy_last_rows", "16");
  expect_same_plan(crisp::plan(q_gpu, k_gpu, last_rows, w.cu_seqlens),
                   crisp::plan(w.q_view(), w.k_view(), last_rows, w.cu_seqlens), "api_last_rows");
}

// plan_async makes no host synchronisation and fixed-size launches: it can be captured in a CUDA
// graph (after one warm-up call that sizes the workspace) and replayed.
TEST(GpuPlan, CapturesInCudaGraph) {
  SKIP_WITHOUT_GPU();
  crisp::WorkloadSpec spec = crisp_test::workload_spec(8, 2, 128, {4096}, 22);
  crisp::Workload w = crisp::make_workload(spec);
  for (const char* preset : {"crisp", "flexprefill", "minference"}) {
    SCOPED_TRACE(preset);
    const crisp::Config cfg = crisp::Config::from_preset(preset);
    DeviceArray q_dev(w.q.data(), w.q.size() * sizeof(float));
    DeviceArray k_dev(w.k.data(), w.k.size() * sizeof(float));
    ASSERT_NE(q_dev.ptr, nullptr);
    const auto q_gpu = crisp::TensorView::contiguous(q_dev.ptr, crisp::DType::f32, 8, w.total_tokens, 128, crisp::Device::cuda);
    const auto k_gpu = crisp::TensorView::contiguous(k_dev.ptr, crisp::DType::f32, 2, w.total_tokens, 128, crisp::Device::cuda);
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    crisp::cuda::DevicePlan dplan(8, 2, 128, w.cu_seqlens, cfg);
    crisp::cuda::plan_async(q_gpu, k_gpu, cfg, dplan, stream);  // warm-up: allocates the workspace
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    crisp::cuda::plan_async(q_gpu, k_gpu, cfg, dplan, stream);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    // Overwrite the device plan with a different (dense) plan, then replay: the graph must
    // restore the planned layout.
    dplan.upload(crisp::dense_plan(8, 2, 128, w.cu_seqlens, cfg.block_size), stream);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const crisp::Plan cpu = crisp::plan(w.q_view(), w.k_view(), cfg, w.cu_seqlens);
    expect_same_plan(dplan.to_host(stream), cpu, "graph");
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// A new DevicePlan and its planner workspace copy their shape tables with cudaMemcpy and
// cudaMemset, on the legacy default stream; plan_async on a non-blocking stream (ggml's, in
// llama.cpp's CUDA hook) right after must read those tables, not the ones of an earlier, larger
// plan that held the same memory (a race, behind the hook's intermittent illegal memory accesses
// with Gemma 3). The hook's pattern, many times over: a long prompt's plan, then a short one, each
// made and planned at once and freed after.
TEST(GpuPlan, NewPlansOnANonBlockingStreamReadTheirOwnTables) {
  SKIP_WITHOUT_GPU();
  const crisp::Config cfg = crisp::Config::from_preset("flexprefill");
  struct Prompt {
    crisp::Workload w;
    crisp::Plan cpu;
  };
  std::vector<Prompt> prompts;
  for (const int64_t n : {4096, 512}) {
    crisp::Workload w = crisp::make_workload(crisp_test::workload_spec(4, 1, 64, {n}, 31));
    crisp::Plan cpu = crisp::plan(w.q_view(), w.k_view(), cfg, w.cu_seqlens);
    prompts.push_back({std::move(w), std::move(cpu)});
  }
  std::vector<std::unique_ptr<DeviceArray>> arrays;
  for (const Prompt& p : prompts) {
    arrays.push_back(std::make_unique<DeviceArray>(p.w.q.data(), p.w.q.size() * sizeof(float)));
    arrays.push_back(std::make_unique<DeviceArray>(p.w.k.data(), p.w.k.size() * sizeof(float)));
    ASSERT_NE(arrays[arrays.size() - 2]->ptr, nullptr);
    ASSERT_NE(arrays.back()->ptr, nullptr);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the inputs' own copies rode the legacy stream
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  // NOTE: 16 rounds: the race needs the copy to land late; more rounds, more chances.
  for (int round = 0; round < 16; ++round) {
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      SCOPED_TRACE("round " + std::to_string(round) + ", prompt " + std::to_string(prompts[i].w.total_tokens));
      const crisp::Workload& w = prompts[i].w;
      const auto q_gpu = crisp::TensorView::contiguous(arrays[2 * i]->ptr, crisp::DType::f32, 4, w.total_tokens, 64,
                                                       crisp::Device::cuda);
      const auto k_gpu = crisp::TensorView::contiguous(arrays[2 * i + 1]->ptr, crisp::DType::f32, 1, w.total_tokens,
                                                       64, crisp::Device::cuda);
      crisp::cuda::DevicePlan dplan(4, 1, 64, w.cu_seqlens, cfg);
      crisp::cuda::plan_async(q_gpu, k_gpu, cfg, dplan, stream);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      expect_same_plan(dplan.to_host(stream), prompts[i].cpu, "fresh plan on a non-blocking stream");
    }
  }
  cudaStreamDestroy(stream);
}

// llama.cpp's hook since session 15: one device buffer reused for a DevicePlan per shape, each made
// on the op's stream (its bases uploaded in that stream's order, no synchronisation), planned right
// away, then destroyed, its planner workspace kept as a spare for the next DevicePlan, which lays
// it out again for a smaller or larger shape (growing it when too small). Shapes alternate
// between two non-blocking streams, so the workspace's wait for its last use on the other stream
// is exercised too. Every plan must equal the CPU reference.
TEST(GpuPlan, PlansMadeOnAStreamInReusedMemoryMatchCpu) {
  SKIP_WITHOUT_GPU();
  crisp::cuda::release_cached_workspaces();  // the spares start empty: the first plan allocates
  const crisp::Config cfg = crisp::Config::from_preset("crisp");
  struct Prompt {
    crisp::Workload w;
    crisp::Plan cpu;
    std::unique_ptr<DeviceArray> q, k;
  };
  std::vector<Prompt> prompts;
  // Smaller, then larger than the first: the spare is re-laid out in place, then grown.
  for (const int64_t n : {2048, 512, 6144, 1024}) {
    Prompt p{crisp::make_workload(crisp_test::workload_spec(4, 2, 64, {n}, 41 + n)), {}, nullptr, nullptr};
    p.cpu = crisp::plan(p.w.q_view(), p.w.k_view(), cfg, p.w.cu_seqlens);
    p.q = std::make_unique<DeviceArray>(p.w.q.data(), p.w.q.size() * sizeof(float));
    p.k = std::make_unique<DeviceArray>(p.w.k.data(), p.w.k.size() * sizeof(float));
    ASSERT_NE(p.q->ptr, nullptr);
    ASSERT_NE(p.k->ptr, nullptr);
    prompts.push_back(std::move(p));
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the inputs' copies rode the legacy stream
  std::size_t capacity = 0;
  for (const Prompt& p : prompts)
    capacity = std::max(capacity, crisp::cuda::DevicePlan::bytes_required(4, p.w.cu_seqlens, cfg.block_size));
  void* memory = nullptr;
  ASSERT_EQ(cudaMalloc(&memory, capacity), cudaSuccess);
  // Poison: a plan that read stale bases would index from these.
  ASSERT_EQ(cudaMemset(memory, 0x7f, capacity), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaStream_t streams[2] = {nullptr, nullptr};
  for (cudaStream_t& s : streams) ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  // NOTE: 4 rounds of 4 shapes: every shape follows a larger and a smaller one, on either stream.
  for (int round = 0; round < 4; ++round) {
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      const Prompt& p = prompts[i];
      cudaStream_t stream = streams[(round + i) % 2];
      SCOPED_TRACE("round " + std::to_string(round) + ", prompt " + std::to_string(p.w.total_tokens));
      const auto q_gpu = crisp::TensorView::contiguous(p.q->ptr, crisp::DType::f32, 4, p.w.total_tokens, 64,
                                                       crisp::Device::cuda);
      const auto k_gpu = crisp::TensorView::contiguous(p.k->ptr, crisp::DType::f32, 2, p.w.total_tokens, 64,
                                                       crisp::Device::cuda);
      crisp::cuda::DevicePlan dplan(4, 2, 64, p.w.cu_seqlens, cfg, memory, capacity, stream);
      crisp::cuda::plan_async(q_gpu, k_gpu, cfg, dplan, stream);
      expect_same_plan(dplan.to_host(stream), p.cpu, "plan made on a stream in reused memory");
    }
  }
  for (cudaStream_t s : streams) cudaStreamDestroy(s);
  cudaFree(memory);
  crisp::cuda::release_cached_workspaces();
}

// A shape's tables cannot be uploaded while the stream is being captured (a replay would read
// whatever the staging ring holds by then): a clear error naming the stream, and the capture
// can still be ended.
TEST(GpuPlan, StagedUploadRefusedDuringCapture) {
  SKIP_WITHOUT_GPU();
  void* target = nullptr;
  ASSERT_EQ(cudaMalloc(&target, 1024), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::vector<unsigned char> source(1024, 7);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  try {
    crisp::cuda_detail::upload_async(target, source.data(), source.size(), stream);
    ADD_FAILURE() << "upload_async during capture was not refused";
  } catch (const crisp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("stream"), std::string::npos) << e.what();
  }
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  cudaFree(target);
}

// cuda_detail::upload_async: many copies through the staging ring, more than a lap of it, onto
// two streams, each checked after all were enqueued (a copy whose staging was overwritten before
// its DMA ran would show the later copy's bytes).
TEST(GpuPlan, StagedUploadsLandInStreamOrder) {
  SKIP_WITHOUT_GPU();
  // NOTE: 48 copies of 256 KiB = 12 MiB, three laps of the 4 MiB ring, sizes not multiples of 256.
  constexpr int kCopies = 48;
  constexpr std::size_t kBytes = (std::size_t{256} << 10) - 40;
  std::vector<void*> targets(kCopies, nullptr);
  for (void*& t : targets) ASSERT_EQ(cudaMalloc(&t, kBytes), cudaSuccess);
  cudaStream_t streams[2] = {nullptr, nullptr};
  for (cudaStream_t& s : streams) ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  std::vector<unsigned char> source(kBytes);
  for (int c = 0; c < kCopies; ++c) {
    for (std::size_t b = 0; b < kBytes; ++b) source[b] = static_cast<unsigned char>((b * 7 + c * 13) & 0xff);
    crisp::cuda_detail::upload_async(targets[c], source.data(), kBytes, streams[c % 2]);
    std::fill(source.begin(), source.end(), 0xee);  // the source may be reused at once
  }
  for (cudaStream_t s : streams) ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  std::vector<unsigned char> back(kBytes);
  for (int c = 0; c < kCopies; ++c) {
    ASSERT_EQ(cudaMemcpy(back.data(), targets[c], kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    std::size_t wrong = 0;
    for (std::size_t b = 0; b < kBytes; ++b) wrong += back[b] != static_cast<unsigned char>((b * 7 + c * 13) & 0xff);
    EXPECT_EQ(wrong, 0u) << "copy " << c;
  }
  for (cudaStream_t s : streams) cudaStreamDestroy(s);
  for (void* t : targets) cudaFree(t);
}

// A DevicePlan held by a static object (as llama.cpp's CUDA hook caches its plans) is destroyed at
// exit after every function-local static constructed later, crisp's registry of planner
// workspaces among them: destroying it then must not touch that registry's freed memory (it freed
// the workspace a second time: "free(): double free detected", exit status 134).
TEST(GpuPlanDeathTest, DevicePlanInAStaticIsDestroyedCleanlyAtExit) {
  SKIP_WITHOUT_GPU();
  // A fresh process runs the statement, so the static below is made before crisp's own.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        static std::unique_ptr<crisp::cuda::DevicePlan> held;  // destroyed after crisp's statics
        crisp::Workload w = crisp::make_workload(crisp_test::workload_spec(4, 2, 64, {512}, 23));
        const crisp::Config cfg = crisp::Config::from_preset("crisp");
        DeviceArray q_dev(w.q.data(), w.q.size() * sizeof(float));
        DeviceArray k_dev(w.k.data(), w.k.size() * sizeof(float));
        const auto q_gpu =
            crisp::TensorView::contiguous(q_dev.ptr, crisp::DType::f32, 4, w.total_tokens, 64, crisp::Device::cuda);
        const auto k_gpu =
            crisp::TensorView::contiguous(k_dev.ptr, crisp::DType::f32, 2, w.total_tokens, 64, crisp::Device::cuda);
        held = std::make_unique<crisp::cuda::DevicePlan>(4, 2, 64, w.cu_seqlens, cfg);
        crisp::cuda::plan_async(q_gpu, k_gpu, cfg, *held, nullptr);  // makes crisp's workspace registry
        std::exit(cudaDeviceSynchronize() == cudaSuccess ? 0 : 3);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(GpuPlan, RejectsBadArguments) {
  SKIP_WITHOUT_GPU();
  crisp::WorkloadSpec spec;
  spec.num_q_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.seq_lens = {1000};
  crisp::Workload w = crisp::make_workload(spec);
  const crisp::Config cfg = crisp::Config::from_preset("crisp");
  DeviceArray q_dev(w.q.data(), w.q.size() * sizeof(float));
  DeviceArray k_dev(w.k.data(), w.k.size() * sizeof(float));
  ASSERT_NE(q_dev.ptr, nullptr);
  const auto q_gpu = crisp::TensorView::contiguous(q_dev.ptr, crisp::DType::f32, 4, w.total_tokens, 64, crisp::Device::cuda);
  const auto k_gpu = crisp::TensorView::contiguous(k_dev.ptr, crisp::DType::f32, 2, w.total_tokens, 64, crisp::Device::cuda);
  crisp::cuda::DevicePlan dplan(4, 2, 64, w.cu_seqlens, cfg);
  // Host views.
  try {
    crisp::cuda::plan_async(w.q_view(), k_gpu, cfg, dplan);
    FAIL() << "host q accepted";
  } catch (const crisp::Error& e) {
    EXPECT_EQ(e.argument(), "q");
  }
  // Shape that is not the DevicePlan's.
  const auto k_wrong = crisp::TensorView::contiguous(k_dev.ptr, crisp::DType::f32, 1, w.total_tokens, 64, crisp::Device::cuda);
  try {
    crisp::cuda::plan_async(q_gpu, k_wrong, cfg, dplan);
    FAIL() << "k of the wrong head count accepted";
  } catch (const crisp::Error& e) {
    EXPECT_EQ(e.argument(), "k");
  }
  // Block size that is not the DevicePlan's.
  crisp::Config other = cfg;
  other.block_size = 64;
  try {
    crisp::cuda::plan_async(q_gpu, k_gpu, other, dplan);
    FAIL() << "block size mismatch accepted";
  } catch (const crisp::Error& e) {
    EXPECT_EQ(e.argument(), "config.block_size");
  }
}

// ---------------------------------------------------------------- chunks and paged K/V (spec §11)
// Queries over a KV prefix: sequence s keeps its n_k keys (a structured workload's whole prompt)
// and only its last n_q queries. K is contiguous, or a page pool whose pages are shuffled (pages
// the table does not use hold other values, so a wrong row changes the plan). The CUDA plan must
// match the CPU plan of the same batch over contiguous K (f32 and f64) block for block.
enum class Elem { f32, f16, bf16 };

struct ChunkCase {
  std::string name;
  std::string preset;
  std::vector<std::string> sets;
  std::vector<int64_t> n_k, n_q;  // per sequence, n_q <= n_k
  int64_t hq, hkv, d;
  int block;
  uint64_t seed;
  Elem elem = Elem::f32;
  int64_t page_size = 0;  // 0: contiguous K
};

std::string chunk_case_name(const testing::TestParamInfo<ChunkCase>& info) { return info.param.name; }

// Host storage of one [H, T, d] input in the case's element type.
struct HostInput {
  std::vector<float> f32;
  std::vector<uint16_t> bits;
  crisp::DType dtype = crisp::DType::f32;

  HostInput(const std::vector<float>& values, Elem elem) {
    if (elem == Elem::f32) {
      f32 = values;
      return;
    }
    dtype = elem == Elem::f16 ? crisp::DType::f16 : crisp::DType::bf16;
    bits.resize(values.size());
    for (std::size_t i = 0; i < values.size(); ++i)
      bits[i] = elem == Elem::f16 ? crisp::half::float_to_f16(values[i]) : crisp::half::float_to_bf16(values[i]);
  }
  void* data() { return f32.empty() ? static_cast<void*>(bits.data()) : static_cast<void*>(f32.data()); }
  std::size_t bytes() const { return f32.empty() ? bits.size() * sizeof(uint16_t) : f32.size() * sizeof(float); }
};

// Rows [first, first + count) of every head of a row-major [heads, tokens, d] array, appended to out.
void append_rows(const std::vector<float>& src, int64_t heads, int64_t tokens, int64_t d, int64_t first, int64_t count,
                 std::vector<std::vector<float>>& out) {
  for (int64_t h = 0; h < heads; ++h)
    out[h].insert(out[h].end(), src.begin() + (h * tokens + first) * d, src.begin() + (h * tokens + first + count) * d);
}

std::vector<float> concat_heads(const std::vector<std::vector<float>>& per_head) {
  std::vector<float> out;
  for (const auto& h : per_head) out.insert(out.end(), h.begin(), h.end());
  return out;
}

class GpuChunkPlanMatchesCpu : public testing::TestWithParam<ChunkCase> {};

TEST_P(GpuChunkPlanMatchesCpu, RoutesLayoutsAndStatistics) {
  SKIP_WITHOUT_GPU();
  const ChunkCase& cc = GetParam();
  ASSERT_EQ(cc.n_k.size(), cc.n_q.size());
  const int64_t S = static_cast<int64_t>(cc.n_k.size()), d = cc.d;
  crisp::Workload w = crisp::make_workload(crisp_test::workload_spec(cc.hq, cc.hkv, d, cc.n_k, cc.seed));
  crisp::Config cfg = crisp::Config::from_preset(cc.preset);
  cfg.block_size = cc.block;
  for (const auto& kv : cc.sets) cfg.set(kv);

  // The chunk's queries: the last n_q rows of each sequence.
  crisp::SeqLens cu_q{0};
  std::vector<std::vector<float>> q_heads(static_cast<std::size_t>(cc.hq));
  for (int64_t s = 0; s < S; ++s) {
    ASSERT_LE(cc.n_q[s], cc.n_k[s]);
    append_rows(w.q, cc.hq, w.total_tokens, d, w.cu_seqlens[s + 1] - cc.n_q[s], cc.n_q[s], q_heads);
    cu_q.push_back(cu_q.back() + cc.n_q[s]);
  }
  const int64_t q_tokens = cu_q.back();
  HostInput q_host(concat_heads(q_heads), cc.elem);
  HostInput k_host(w.k, cc.elem);
  const auto q_view = crisp::TensorView::contiguous(q_host.data(), q_host.dtype, cc.hq, q_tokens, d);
  const auto k_view = crisp::TensorView::contiguous(k_host.data(), k_host.dtype, cc.hkv, w.total_tokens, d);
  const crisp::Batch batch(cu_q, w.cu_seqlens);

  crisp::Options f32;
  f32.precision = crisp::Precision::f32;
  crisp::Options f64;
  f64.precision = crisp::Precision::f64;
  const crisp::Plan cpu32 = crisp::plan(q_view, k_view, cfg, batch, f32);
  const crisp::Plan cpu64 = crisp::plan(q_view, k_view, cfg, batch, f64);

  // Device K: the keys themselves, or a pool of shuffled pages (two spare pages the table never
  // names, filled with other keys).
  std::vector<float> k_device_values = w.k;
  int64_t k_tokens = w.total_tokens;
  std::vector<int32_t> table;
  int64_t max_pages = 0;
  if (cc.page_size > 0) {
    const int64_t P = cc.page_size;
    for (int64_t s = 0; s < S; ++s) max_pages = std::max(max_pages, (cc.n_k[s] + P - 1) / P);
    int64_t used = 0;
    for (int64_t s = 0; s < S; ++s) used += (cc.n_k[s] + P - 1) / P;
    const int64_t num_pages = used + 2;
    std::vector<int32_t> order(static_cast<std::size_t>(num_pages));
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 rng(static_cast<uint32_t>(cc.seed) + 1u);
    std::shuffle(order.begin(), order.end(), rng);
    k_tokens = num_pages * P;
    std::vector<float> pool(static_cast<std::size_t>(cc.hkv * k_tokens * d));
    // Spare pages (and the tails of last pages) hold keys of the workload too, in reverse order.
    for (std::size_t i = 0; i < pool.size(); ++i) pool[i] = w.k[(w.k.size() - 1 - i % w.k.size())];
    table.assign(static_cast<std::size_t>(S * max_pages), 0);
    int64_t next = 0;
    for (int64_t s = 0; s < S; ++s)
      for (int64_t p = 0; p * P < cc.n_k[s]; ++p) {
        const int32_t page = order[next++];
        table[s * max_pages + p] = page;
        for (int64_t j = p * P; j < std::min((p + 1) * P, cc.n_k[s]); ++j)
          for (int64_t kv = 0; kv < cc.hkv; ++kv)
            std::copy_n(w.k.begin() + (kv * w.total_tokens + w.cu_seqlens[s] + j) * d, d,
                        pool.begin() + (kv * k_tokens + page * P + j % P) * d);
      }
    k_device_values = std::move(pool);
  }
  HostInput k_device_host(k_device_values, cc.elem);
  if (cc.page_size > 0) {  // the pool and table hold the same keys: the CPU plans them alike
    crisp::BlockTable host_table;
    host_table.data = table.data();
    host_table.max_pages_per_sequence = max_pages;
    host_table.page_size = cc.page_size;
    const auto pool_view = crisp::TensorView::contiguous(k_device_host.data(), k_device_host.dtype, cc.hkv, k_tokens, d);
    expect_same_plan(crisp::plan(q_view, pool_view, cfg, crisp::Batch(cu_q, w.cu_seqlens, host_table), f32), cpu32,
                     "cpu_f32_paged");
  }
  const std::size_t esize = crisp::dtype_size(q_host.dtype);
  DeviceArray q_dev(q_host.data(), q_host.bytes());
  DeviceArray k_dev(k_device_host.data(), k_device_host.bytes());
  ASSERT_NE(q_dev.ptr, nullptr);
  ASSERT_NE(k_dev.ptr, nullptr);
  ASSERT_EQ(k_device_host.bytes(), static_cast<std::size_t>(cc.hkv * k_tokens * d) * esize);
  crisp::BlockTable device_table;
  std::unique_ptr<DeviceArray> table_dev;
  if (cc.page_size > 0) {
    table_dev = std::make_unique<DeviceArray>(table.data(), table.size() * sizeof(int32_t));
    ASSERT_NE(table_dev->ptr, nullptr);
    device_table.data = static_cast<const int32_t*>(table_dev->ptr);
    device_table.device = crisp::Device::cuda;
    device_table.max_pages_per_sequence = max_pages;
    device_table.page_size = cc.page_size;
  }
  const auto q_gpu = crisp::TensorView::contiguous(q_dev.ptr, q_host.dtype, cc.hq, q_tokens, d, crisp::Device::cuda);
  const auto k_gpu = crisp::TensorView::contiguous(k_dev.ptr, q_host.dtype, cc.hkv, k_tokens, d, crisp::Device::cuda);

  crisp::cuda::DevicePlan dplan(cc.hq, cc.hkv, d, batch, cfg);
  EXPECT_EQ(dplan.total_tokens(), q_tokens);
  EXPECT_EQ(dplan.total_keys(), w.total_tokens);
  crisp::cuda::plan_async(q_gpu, k_gpu, cfg, dplan, nullptr, device_table);
  const crisp::Plan gpu = dplan.to_host(nullptr);
  ASSERT_NO_THROW(gpu.check_well_formed());
  expect_same_plan(gpu, cpu32, "cpu_f32");
  expect_same_plan(gpu, cpu64, "cpu_f64");

  // The API path (crisp::plan on device views: cuda_plan) with the same batch and table.
  const crisp::Plan api = crisp::plan(q_gpu, k_gpu, cfg, crisp::Batch(cu_q, w.cu_seqlens, device_table));
  expect_same_plan(api, cpu32, "api_cpu_f32");

  // The host plan round-trips through a DevicePlan made from it (upload / to_host of a chunk plan).
  crisp::cuda::DevicePlan uploaded(cpu32);
  expect_same_plan(uploaded.to_host(nullptr), cpu32, "uploaded_cpu_f32");
}

std::vector<ChunkCase> chunk_cases() {
  std::vector<ChunkCase> cases;
  // n_q of 1, < B, = B, unaligned (the first row starts mid-block) and = n_k (a whole prompt) in
  // one batch; both block sizes, GQA 1 / 4 / 8.
  const std::vector<int64_t> nk128 = {3000, 2500, 4096, 4096, 2200};
  const std::vector<int64_t> nq128 = {1, 77, 128, 1000, 2200};
  const std::vector<int64_t> nk64 = {2500, 3333, 2100};
  const std::vector<int64_t> nq64 = {64, 1, 2100};
  // Every estimated sequence with n_q >= B: the tensor-core proxy takes bf16 / f16 chunks.
  const std::vector<int64_t> nk_tc = {3000, 4096, 2900};
  const std::vector<int64_t> nq_tc = {128, 1001, 2900};
  for (const std::string preset : {"crisp", "flexprefill", "minference", "dense"}) {
    cases.push_back({preset + "_mix_b128_gqa4", preset, {}, nk128, nq128, 8, 2, 128, 128, 40});
    cases.push_back({preset + "_mix_b128_gqa4_bf16_pages16", preset, {}, nk128, nq128, 8, 2, 128, 128, 41, Elem::bf16,
                     16});
    cases.push_back({preset + "_mix_b64_gqa8_f16_pages128", preset, {}, nk64, nq64, 8, 1, 128, 64, 42, Elem::f16, 128});
    cases.push_back({preset + "_mix_b64_gqa1_d64_pages16", preset, {}, nk64, nq64, 4, 4, 64, 64, 43, Elem::f32, 16});
    cases.push_back({preset + "_tc_b128_gqa4_bf16", preset, {}, nk_tc, nq_tc, 8, 2, 128, 128, 44, Elem::bf16});
    cases.push_back({preset + "_tc_b128_gqa8_f16_pages128", preset, {}, nk_tc, nq_tc, 8, 1, 128, 128, 45, Elem::f16,
                     128});
    cases.push_back({preset + "_tc_b64_gqa1_d64_bf16_pages16", preset, {}, nk64, {64, 500, 2100}, 4, 4, 64, 64, 46,
                     Elem::bf16, 16});
    // Head dim 256, paged and contiguous, both block sizes: bf16 chunks of n_q >= B on the
    // tensor-core proxy (256 rows per work item: the GQA group's 512 rows over two), the f16 batch
    // with a 1-query chunk on the FFMA proxy.
    cases.push_back({preset + "_mix_b128_gqa4_d256_bf16_pages16", preset, {}, nk_tc, nq_tc, 8, 2, 256, 128, 53,
                     Elem::bf16, 16});
    cases.push_back({preset + "_mix_b64_gqa2_d256_f16", preset, {}, nk64, nq64, 4, 2, 256, 64, 54, Elem::f16});
    // The shape llama.cpp's CUDA hook plans for SmolLM2-135M (9 query heads on 3 KV heads, head dim
    // 64, an F16 cache): 512-token ubatches over the cache, the first, a middle one and an unaligned
    // last one, one per sequence.
    cases.push_back({preset + "_llama_ubatches_b128_gqa3_d64_f16", preset, {}, {512, 2048, 4061}, {512, 512, 477}, 9, 3,
                     64, 128, 55, Elem::f16});
    // And for Gemma 3's global layers (4 query heads on 1 KV head, head dim 256): the tensor-core
    // proxy at d = 256 over the same ubatches.
    cases.push_back({preset + "_llama_ubatches_b128_gqa4_d256_f16", preset, {}, {512, 2048, 4061}, {512, 512, 477}, 4,
                     1, 256, 128, 57, Elem::f16});
  }
  // PE heads (forced by tau_proxy) over a chunk's rows: global coverage and the row floor.
  cases.push_back({"pe_coverage_mix", "crisp", {"routing=cstruct", "tau_proxy=0.6", "pe_rule=coverage"}, nk128, nq128, 8, 2, 128, 128, 47});
  cases.push_back({"pe_coverage_mix_bf16_pages16", "crisp", {"routing=cstruct", "tau_proxy=0.6", "pe_rule=coverage"}, nk_tc, nq_tc, 8, 2,
                   128, 128, 48, Elem::bf16, 16});
  cases.push_back({"pe_floor_mix_pages128", "crisp", {"routing=cstruct", "tau_proxy=0.6", "pe_rule=floor"}, nk128,
                   nq128, 8, 2, 128, 128, 49, Elem::f32, 128});
  cases.push_back({"jsd_mix_b64", "crisp", {"routing=jsd"}, nk64, nq64, 8, 2, 128, 64, 50});
  // The crisp preset with rho 2.2 (the knobs of the H200's SmolLM2 NIAH runs) on that shape.
  cases.push_back({"crisp_rho22_llama_ubatches_b128_gqa3_d64_f16", "crisp", {"rho=2.2"}, {512, 2048, 4061},
                   {512, 512, 477}, 9, 3, 64, 128, 56, Elem::f16});
  cases.push_back({"topk_mix_bf16", "crisp", {"vs_budget=topk", "vertical_tokens=300", "slash_tokens=700"}, nk128,
                   nq128, 8, 2, 128, 128, 51, Elem::bf16});
  // proxy_last_rows over chunks (L = min(B, n_q): chunks shorter than a block have fewer proxy rows
  // than R), on llama.cpp's SmolLM2 shape and on paged bf16 chunks.
  cases.push_back({"last_rows_llama_ubatches_b128_gqa3_d64_f16", "crisp", {"proxy_last_rows=16"}, {512, 2048, 4061},
                   {512, 512, 477}, 9, 3, 64, 128, 57, Elem::f16});
  cases.push_back({"last_rows_mix_bf16_pages16", "crisp", {"proxy_last_rows=16", "uniform_floor_blocks=64"}, nk_tc, nq_tc,
                   8, 2, 128, 128, 58, Elem::bf16, 16});
  cases.push_back({"last_rows_mix_b64", "crisp", {"proxy_last_rows=48"}, nk64, nq64, 8, 2, 128, 64, 59});
  // Pages of 48 on the tensor-core proxy: boxes of 16 keys whose pages start mid-tile.
  cases.push_back({"tc_b128_gqa4_bf16_pages48", "crisp", {}, nk_tc, nq_tc, 8, 2, 128, 128, 60, Elem::bf16, 48});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Chunks, GpuChunkPlanMatchesCpu, testing::ValuesIn(chunk_cases()), chunk_case_name);

// Paged K with a table the planner cannot use is refused naming the field (the API's names).
TEST(GpuPlan, RejectsBadBlockTable) {
  SKIP_WITHOUT_GPU();
  crisp::Workload w = crisp::make_workload(crisp_test::workload_spec(4, 2, 64, {1000}, 52));
  const crisp::Config cfg = crisp::Config::from_preset("crisp");
  DeviceArray q_dev(w.q.data(), w.q.size() * sizeof(float));
  DeviceArray k_dev(w.k.data(), w.k.size() * sizeof(float));
  ASSERT_NE(q_dev.ptr, nullptr);
  ASSERT_NE(k_dev.ptr, nullptr);
  const std::vector<int32_t> table(64, 0);
  DeviceArray table_dev(table.data(), table.size() * sizeof(int32_t));
  ASSERT_NE(table_dev.ptr, nullptr);
  const auto q_gpu = crisp::TensorView::contiguous(q_dev.ptr, crisp::DType::f32, 4, w.total_tokens, 64, crisp::Device::cuda);
  // A pool of 1000 / 16 = 62 whole pages of 16 (the last 8 keys dropped).
  const auto k_pool = crisp::TensorView::contiguous(k_dev.ptr, crisp::DType::f32, 2, 992, 64, crisp::Device::cuda);
  crisp::cuda::DevicePlan dplan(4, 2, 64, w.cu_seqlens, cfg);
  const auto expect_refused = [&](crisp::BlockTable bt, const crisp::TensorView& k, const char* argument) {
    try {
      crisp::cuda::plan_async(q_gpu, k, cfg, dplan, nullptr, bt);
      ADD_FAILURE() << argument << " accepted";
    } catch (const crisp::Error& e) {
      EXPECT_EQ(e.argument(), argument);
    }
  };
  crisp::BlockTable good;
  good.data = static_cast<const int32_t*>(table_dev.ptr);
  good.device = crisp::Device::cuda;
  good.max_pages_per_sequence = 63;  // ceil(1000 / 16)
  good.page_size = 16;
  crisp::BlockTable bt = good;
  bt.page_size = 24;
  expect_refused(bt, k_pool, "batch.block_table.page_size");
  bt = good;
  bt.data = nullptr;
  expect_refused(bt, k_pool, "batch.block_table.data");
  bt = good;
  bt.device = crisp::Device::cpu;
  expect_refused(bt, k_pool, "batch.block_table.device");
  bt = good;
  bt.max_pages_per_sequence = 62;
  expect_refused(bt, k_pool, "batch.block_table.max_pages_per_sequence");
  const auto k_partial = crisp::TensorView::contiguous(k_dev.ptr, crisp::DType::f32, 2, 1000, 64, crisp::Device::cuda);
  expect_refused(good, k_partial, "k");
}

// A DevicePlan for a batch whose chunk has more queries than keys is refused naming the list.
TEST(GpuPlan, RejectsMoreQueriesThanKeys) {
  SKIP_WITHOUT_GPU();
  const crisp::Config cfg = crisp::Config::from_preset("crisp");
  try {
    crisp::cuda::DevicePlan dplan(4, 2, 64, crisp::Batch({0, 300, 400}, {0, 200, 600}), cfg);
    FAIL() << "n_q > n_k accepted";
  } catch (const crisp::Error& e) {
    EXPECT_EQ(e.argument(), "batch.cu_seqlens_q");
  }
}

}  // namespace
