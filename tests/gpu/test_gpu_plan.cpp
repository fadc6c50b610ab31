// tests/gpu/test_gpu_plan.cpp — the device planner (crisp::cuda::plan_async) against the CPU
// reference (crisp::plan on the CPU, Precision::f32 and Precision::f64) on the structured
// workload: routes, verticals, slashes and the CSR layout must be identical; C_struct and the JS
// distance within 1e-4. Also: the API path (crisp::plan on device views), CUDA-graph capture of
// plan_async, and argument errors. Every test skips itself when no CUDA device is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/half.h"
#include "crisp/crisp.h"
#include "crisp/cuda.h"
#include "crisp/workload.h"
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

class GpuPlanMatchesCpu : public testing::TestWithParam<PlanCase> {};

TEST_P(GpuPlanMatchesCpu, RoutesLayoutsAndStatistics) {
  SKIP_WITHOUT_GPU();
  const PlanCase& pc = GetParam();
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
  cases.push_back({"pe_gamma_08", "crisp", {"pe_gamma=0.8", "tau_proxy=0.6"}, {4096}, 8, 2, 128, 128, 13});
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
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Presets, GpuPlanMatchesCpu, testing::ValuesIn(plan_cases()), case_name);

// The API dispatch (crisp::plan on Device::cuda views) is the same planner.
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

}  // namespace
