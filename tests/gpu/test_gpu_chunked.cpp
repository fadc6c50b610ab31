// tests/gpu/test_gpu_chunked.cpp — queries over a KV prefix and paged K/V (spec §11) on CUDA,
// through the public API (crisp::plan / crisp::attend on Device::cuda views, the block table on
// the device):
//  - attention: a varlen batch mixing a whole prompt, an unaligned chunk, a decode step, fewer
//    than a block and exactly a block of queries, with contiguous K/V or shuffled shared pages
//    (16 / 64 / 128 tokens), on the portable and the Hopper kernel (options.cuda.kernel), f16 and
//    bf16, d 64 and 128, against the CPU backend in float64 on the same (CPU-made) plan and the same
//    rounded inputs, with every output element written;
//  - planning: the CUDA plan of the same batch (contiguous or paged) equals the CPU plan;
//  - a sliding window (§12): the same, with windows narrower than the prompts (the dense preset's
//    band and a crisp plan clipped to the window; d 256 as Gemma 3's local layers), on both
//    kernels (the Hopper kernel's window launches: contiguous and paged, every head dim and block).
// Every test skips itself when no CUDA device is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "chunk_util.h"
#include "crisp/crisp.h"
#include "crisp/cuda.h"
#include "gpu/gpu_test_util.h"

namespace {

using crisp_gpu_test::DeviceBuffer;

#define SKIP_WITHOUT_GPU() \
  if (!crisp::cuda::available()) GTEST_SKIP() << "no CUDA device"

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

bool hopper_device() {
  cudaDeviceProp prop;
  return cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9;
}

// The mixed batch: prompt 0 whole and an unaligned chunk of it (sharing its pages), a decode step
// and 50 queries over prompt 1, one block of queries at the end of prompt 2.
std::vector<crisp_test::ChunkSeq> mixed_sequences(int block) {
  return {{0, 1300, 1300}, {0, 1000, 200}, {1, 1100, 1}, {1, 700, 50}, {2, 1280, block}};
}
const std::vector<int64_t> kPrompts = {1300, 1100, 1280};

// The inputs of one case rounded to the dtype: the bits for the device, the rounded floats for the
// CPU; the keys contiguous, and in a page pool when page_size > 0.
struct RoundedChunks {
  crisp_test::Chunks chunks;
  crisp::DType dtype;
  std::vector<uint16_t> q_bits, k_bits, v_bits;
  crisp_test::PagedPool pool;
  std::vector<uint16_t> pool_k_bits, pool_v_bits;

  RoundedChunks(uint64_t seed, int block, int64_t d, crisp::DType dt, int64_t page_size)
      : chunks(crisp_test::make_chunks(seed, kPrompts, mixed_sequences(block), 8, 2, d)), dtype(dt) {
    std::vector<float> rounded;
    crisp_gpu_test::round_to(chunks.q, dt, q_bits, rounded);
    chunks.q = rounded;
    crisp_gpu_test::round_to(chunks.k, dt, k_bits, rounded);
    chunks.k = rounded;
    crisp_gpu_test::round_to(chunks.v, dt, v_bits, rounded);
    chunks.v = rounded;
    if (page_size > 0) {
      pool = crisp_test::make_pool(chunks, page_size, seed + 1);
      crisp_gpu_test::round_to(pool.k, dt, pool_k_bits, rounded);
      crisp_gpu_test::round_to(pool.v, dt, pool_v_bits, rounded);
    }
  }
  bool paged() const { return pool.page_size > 0; }
};

// Device copies of one case's inputs and NaN-poisoned outputs.
struct DeviceChunks {
  const RoundedChunks& in;
  DeviceBuffer q, k, v, out, lse, table;

  static std::size_t bytes(const std::vector<uint16_t>& x) { return x.size() * sizeof(uint16_t); }
  explicit DeviceChunks(const RoundedChunks& r)
      : in(r),
        q(bytes(r.q_bits)),
        k(bytes(r.paged() ? r.pool_k_bits : r.k_bits)),
        v(bytes(r.paged() ? r.pool_v_bits : r.v_bits)),
        out(bytes(r.q_bits)),
        lse(static_cast<std::size_t>(r.chunks.hq * r.chunks.q_tokens()) * sizeof(float)),
        table(std::max<std::size_t>(r.pool.table.size(), 1) * sizeof(int32_t)) {}

  // Copies the inputs up and poisons the outputs (0xffff is NaN in f16 and bf16, 0xffffffff in f32).
  ::testing::AssertionResult upload() {
    if (!(q.ptr && k.ptr && v.ptr && out.ptr && lse.ptr && table.ptr)) return ::testing::AssertionFailure() << "cudaMalloc";
    const auto& kb = in.paged() ? in.pool_k_bits : in.k_bits;
    const auto& vb = in.paged() ? in.pool_v_bits : in.v_bits;
    bool ok = cudaMemcpy(q.ptr, in.q_bits.data(), bytes(in.q_bits), cudaMemcpyHostToDevice) == cudaSuccess &&
              cudaMemcpy(k.ptr, kb.data(), bytes(kb), cudaMemcpyHostToDevice) == cudaSuccess &&
              cudaMemcpy(v.ptr, vb.data(), bytes(vb), cudaMemcpyHostToDevice) == cudaSuccess &&
              cudaMemset(out.ptr, 0xff, bytes(in.q_bits)) == cudaSuccess &&
              cudaMemset(lse.ptr, 0xff, static_cast<std::size_t>(in.chunks.hq * in.chunks.q_tokens()) * sizeof(float)) ==
                  cudaSuccess;
    if (in.paged())
      ok = ok && cudaMemcpy(table.ptr, in.pool.table.data(), in.pool.table.size() * sizeof(int32_t),
                            cudaMemcpyHostToDevice) == cudaSuccess;
    return ok ? ::testing::AssertionSuccess() : ::testing::AssertionFailure() << "cudaMemcpy";
  }

  crisp::TensorView q_view() const {
    return crisp::TensorView::contiguous(q.ptr, in.dtype, in.chunks.hq, in.chunks.q_tokens(), in.chunks.d, crisp::Device::cuda);
  }
  crisp::TensorView kv_view(void* data) const {
    const crisp_test::Chunks& c = in.chunks;
    if (!in.paged()) return crisp::TensorView::contiguous(data, in.dtype, c.hkv, c.kv_tokens(), c.d, crisp::Device::cuda);
    return crisp::TensorView{data, in.dtype, crisp::Device::cuda, 3, {c.hkv, in.pool.num_pages * in.pool.page_size, c.d},
                             {c.d, c.hkv * c.d, 1}};
  }
  crisp::BlockTable block_table() const {
    if (!in.paged()) return {};
    crisp::BlockTable t = in.pool.block_table();
    t.data = static_cast<const int32_t*>(table.ptr);
    t.device = crisp::Device::cuda;
    return t;
  }
  crisp::TensorView out_view() const {
    return crisp::TensorView::contiguous(out.ptr, in.dtype, in.chunks.hq, in.chunks.q_tokens(), in.chunks.d, crisp::Device::cuda);
  }
  crisp::TensorView lse_view() const {
    return crisp::TensorView::contiguous2d(lse.ptr, crisp::DType::f32, in.chunks.hq, in.chunks.q_tokens(), crisp::Device::cuda);
  }
};

// ------------------------------------------------------------------ attention

struct AttendCase {
  std::string name;
  crisp::DType dtype;
  int64_t d;
  int block;
  int64_t page_size;  // 0: contiguous K/V
  crisp::Kernel kernel;
  uint64_t seed;
  int64_t window = 0;  // §12; 0 = none
};
std::ostream& operator<<(std::ostream& os, const AttendCase& c) { return os << c.name; }

class GpuApiChunkedAttention : public ::testing::TestWithParam<AttendCase> {};

TEST_P(GpuApiChunkedAttention, MatchesCpuFloat64OnTheSamePlan) {
  SKIP_WITHOUT_GPU();
  const AttendCase& c = GetParam();
  if (c.kernel == crisp::Kernel::hopper && !hopper_device()) GTEST_SKIP() << "the Hopper kernel needs an sm_90 device";
  RoundedChunks in(c.seed, c.block, c.d, c.dtype, c.page_size);
  crisp_test::Chunks& x = in.chunks;
  DeviceChunks dev(in);
  ASSERT_TRUE(dev.upload());

  crisp::Config cfg = crisp::Config::from_preset("crisp");
  cfg.block_size = c.block;
  cfg.window = c.window;
  const crisp::Plan sparse = crisp::plan(x.q_view(), x.k_view(), cfg, x.batch());
  crisp::Config dense_cfg = crisp::Config::from_preset("dense");
  dense_cfg.block_size = c.block;
  dense_cfg.window = c.window;
  const crisp::Plan dense = c.window > 0 ? crisp::plan(x.q_view(), x.k_view(), dense_cfg, x.batch())
                                         : crisp::dense_plan(x.hq, x.hkv, x.d, x.batch(), c.block);
  for (const crisp::Plan* plan : {&sparse, &dense}) {
    SCOPED_TRACE(plan == &sparse ? "crisp plan" : "dense plan");
    // Reference: the CPU backend in float64 on the rounded inputs (contiguous K/V), same plan.
    crisp_test::Outputs ref(crisp::DType::f64, x.hq, x.q_tokens(), x.d);
    crisp::Options f64;
    f64.precision = crisp::Precision::f64;
    crisp::attend(x.q_view(), x.k_view(), x.v_view(), *plan, ref.out(), ref.lse(), f64);

    ASSERT_TRUE(dev.upload());  // re-poisons the outputs
    crisp::Options options;
    options.cuda.kernel = c.kernel;
    crisp::attend(dev.q_view(), dev.kv_view(dev.k.ptr), dev.kv_view(dev.v.ptr), *plan, dev.out_view(), dev.lse_view(),
                  options, dev.block_table());
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> out_bits(in.q_bits.size());
    std::vector<float> lse(static_cast<std::size_t>(x.hq * x.q_tokens()));
    CUDA_OK(cudaMemcpy(out_bits.data(), dev.out.ptr, out_bits.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(lse.data(), dev.lse.ptr, lse.size() * sizeof(float), cudaMemcpyDeviceToHost));
    const crisp_gpu_test::ReferenceErrors worst = crisp_gpu_test::expect_matches_reference(
        x.cu_q, x.hq, x.q_tokens(), x.d, c.dtype, out_bits, lse, ref.out64, ref.lse64);
    std::printf("[ %s ] density %.3f, worst rel. error of O %.2e, worst |LSE - ref| %.2e\n", c.name.c_str(),
                plan->density(), worst.worst_rel, worst.worst_lse);
  }
}

constexpr auto bf16 = crisp::DType::bf16;
constexpr auto f16 = crisp::DType::f16;
constexpr auto portable = crisp::Kernel::portable;
constexpr auto hopper = crisp::Kernel::hopper;

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuApiChunkedAttention,
    ::testing::Values(
        // name, dtype, d, B, page size, kernel, seed
        AttendCase{"portable_bf16_d128_B128_contiguous", bf16, 128, 128, 0, portable, 1},
        AttendCase{"portable_bf16_d128_B64_page16", bf16, 128, 64, 16, portable, 2},
        AttendCase{"portable_f16_d64_B128_page64", f16, 64, 128, 64, portable, 3},
        AttendCase{"portable_f16_d128_B64_page128", f16, 128, 64, 128, portable, 4},
        AttendCase{"portable_bf16_d64_B64_contiguous", bf16, 64, 64, 0, portable, 5},
        AttendCase{"portable_f16_d64_B128_page16", f16, 64, 128, 16, portable, 6},
        AttendCase{"hopper_bf16_d128_B128_contiguous", bf16, 128, 128, 0, hopper, 7},
        AttendCase{"hopper_bf16_d128_B64_page16", bf16, 128, 64, 16, hopper, 8},
        AttendCase{"hopper_f16_d64_B128_page64", f16, 64, 128, 64, hopper, 9},
        AttendCase{"hopper_f16_d128_B64_page128", f16, 128, 64, 128, hopper, 10},
        AttendCase{"hopper_bf16_d64_B64_contiguous", bf16, 64, 64, 0, hopper, 11},
        AttendCase{"hopper_bf16_d128_B128_page128", bf16, 128, 128, 128, hopper, 12},
        // §12 sliding windows: narrower than a block, unaligned, a block and a half, wider than
        // some prompts; d 256 (Gemma 3's local layers: window 512, B 64).
        AttendCase{"portable_bf16_d128_B128_window100", bf16, 128, 128, 0, portable, 13, 100},
        AttendCase{"portable_f16_d256_B64_page16_window512", f16, 256, 64, 16, portable, 14, 512},
        AttendCase{"portable_bf16_d64_B64_window1", bf16, 64, 64, 0, portable, 15, 1},
        AttendCase{"portable_f16_d256_B128_page256_window512", f16, 256, 128, 256, portable, 17, 512},
        AttendCase{"portable_bf16_d256_B128_window512", bf16, 256, 128, 0, portable, 18, 512},
        AttendCase{"portable_f16_d128_B64_page64_window1200", f16, 128, 64, 64, portable, 20, 1200},
        AttendCase{"hopper_bf16_d128_B128_window100", bf16, 128, 128, 0, hopper, 21, 100},
        AttendCase{"hopper_f16_d256_B64_page16_window512", f16, 256, 64, 16, hopper, 22, 512},
        AttendCase{"hopper_bf16_d64_B64_window1", bf16, 64, 64, 0, hopper, 23, 1},
        AttendCase{"hopper_f16_d256_B128_page256_window512", f16, 256, 128, 256, hopper, 24, 512},
        AttendCase{"hopper_bf16_d256_B128_window512", bf16, 256, 128, 0, hopper, 25, 512},
        AttendCase{"hopper_f16_d128_B64_page64_window1200", f16, 128, 64, 64, hopper, 26, 1200},
        AttendCase{"hopper_bf16_d128_B128_page16_window300", bf16, 128, 128, 16, hopper, 27, 300},
        AttendCase{"hopper_f16_d64_B128_window130", f16, 64, 128, 0, hopper, 28, 130},
        // Kernel::automatic with a window: the Hopper kernel on an sm_90 device, else the portable one.
        AttendCase{"automatic_bf16_d128_B128_window100", bf16, 128, 128, 0, crisp::Kernel::automatic, 16, 100},
        AttendCase{"automatic_bf16_d64_B64_window1", bf16, 64, 64, 0, crisp::Kernel::automatic, 19, 1}),
    [](const ::testing::TestParamInfo<AttendCase>& info) { return info.param.name; });

// ------------------------------------------------------------------ planning

struct PlanCase {
  std::string name;
  std::string preset;
  crisp::DType dtype;
  int64_t d;
  int block;
  int64_t page_size;
  uint64_t seed;
  int64_t window = 0;  // §12; 0 = none
};
std::ostream& operator<<(std::ostream& os, const PlanCase& c) { return os << c.name; }

class GpuApiChunkedPlan : public ::testing::TestWithParam<PlanCase> {};

// The CUDA plan of the batch (its K/V contiguous or paged) has the CPU plan's shapes, routes,
// verticals, slashes and CSR, on the same rounded inputs.
TEST_P(GpuApiChunkedPlan, MatchesCpuPlan) {
  SKIP_WITHOUT_GPU();
  const PlanCase& c = GetParam();
  RoundedChunks in(c.seed, c.block, c.d, c.dtype, c.page_size);
  crisp_test::Chunks& x = in.chunks;
  DeviceChunks dev(in);
  ASSERT_TRUE(dev.upload());
  crisp::Config cfg = crisp::Config::from_preset(c.preset);
  cfg.block_size = c.block;
  cfg.window = c.window;
  const crisp::Plan gpu = crisp::plan(dev.q_view(), dev.kv_view(dev.k.ptr), cfg, x.batch(dev.block_table()));
  ASSERT_NO_THROW(gpu.check_well_formed());
  for (crisp::Precision precision : {crisp::Precision::f32, crisp::Precision::f64}) {
    crisp::Options options;
    options.precision = precision;
    const crisp::Plan cpu = crisp::plan(x.q_view(), x.k_view(), cfg, x.batch(), options);
    ASSERT_EQ(gpu.sequences.size(), cpu.sequences.size());
    for (std::size_t s = 0; s < cpu.sequences.size(); ++s) {
      const crisp::SequencePlan &g = gpu.sequences[s], &p = cpu.sequences[s];
      EXPECT_EQ(crisp_test::shape_of(g), crisp_test::shape_of(p)) << "sequence " << s;
      ASSERT_EQ(g.heads.size(), p.heads.size());
      for (std::size_t h = 0; h < p.heads.size(); ++h) {
        SCOPED_TRACE(std::string(precision == crisp::Precision::f64 ? "cpu f64" : "cpu f32") + ": sequence " +
                     std::to_string(s) + " (n_q " + std::to_string(p.n_q) + " of n_k " + std::to_string(p.n_k) +
                     "), head " + std::to_string(h));
        const crisp::HeadPlan &gh = g.heads[h], &ph = p.heads[h];
        EXPECT_EQ(crisp::to_string(gh.route), std::string(crisp::to_string(ph.route)));
        // NOTE: the statistics travel as float32 on the device (tests/gpu/test_gpu_plan.cpp: 1e-4).
        if (std::isnan(ph.c_struct)) EXPECT_TRUE(std::isnan(gh.c_struct));
        else EXPECT_NEAR(gh.c_struct, ph.c_struct, 1e-4);
        EXPECT_EQ(gh.vertical, ph.vertical);
        EXPECT_EQ(gh.slash, ph.slash);
        EXPECT_EQ(gh.row_ptr, ph.row_ptr);
        EXPECT_EQ(gh.col, ph.col);
        EXPECT_DOUBLE_EQ(gh.density, ph.density);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuApiChunkedPlan,
    ::testing::Values(
        // name, preset, dtype, d, B, page size, seed
        PlanCase{"crisp_bf16_d128_B128_contiguous", "crisp", bf16, 128, 128, 0, 21},
        PlanCase{"crisp_bf16_d128_B128_page16", "crisp", bf16, 128, 128, 16, 22},
        PlanCase{"crisp_f16_d64_B64_page64", "crisp", f16, 64, 64, 64, 23},
        PlanCase{"crisp_bf16_d64_B64_page128", "crisp", bf16, 64, 64, 128, 24},
        PlanCase{"flexprefill_bf16_d128_B128_page16", "flexprefill", bf16, 128, 128, 16, 25},
        PlanCase{"minference_f16_d128_B64_page64", "minference", f16, 128, 64, 64, 26},
        PlanCase{"crisp_bf16_d128_B128_window300", "crisp", bf16, 128, 128, 0, 27, 300},
        PlanCase{"dense_f16_d256_B64_page16_window512", "dense", f16, 256, 64, 16, 28, 512},
        PlanCase{"flexprefill_bf16_d64_B64_window1", "flexprefill", bf16, 64, 64, 0, 29, 1}),
    [](const ::testing::TestParamInfo<PlanCase>& info) { return info.param.name; });

// A DevicePlan records the page size of the K/V it was planned over (plan_async, upload, to_host),
// and attend_async refuses to run a plan made over pages without their table: the pool read as
// contiguous K/V would give other keys (crisp::attend refuses the same on the host Plan).
TEST(GpuApiChunkedDevicePlan, RecordsItsPagesAndRefusesToRunThemWithoutTheTable) {
  SKIP_WITHOUT_GPU();
  RoundedChunks in(31, 128, 64, bf16, 16);
  crisp_test::Chunks& x = in.chunks;
  DeviceChunks dev(in);
  ASSERT_TRUE(dev.upload());
  crisp::Config cfg = crisp::Config::from_preset("crisp");
  cfg.block_size = 128;
  crisp::cuda::DevicePlan dplan(x.hq, x.hkv, x.d, x.batch(), cfg);
  EXPECT_EQ(dplan.page_size(), 0);
  crisp::cuda::plan_async(dev.q_view(), dev.kv_view(dev.k.ptr), cfg, dplan, nullptr, dev.block_table());
  EXPECT_EQ(dplan.page_size(), 16);
  EXPECT_EQ(dplan.to_host().page_size, 16);
  std::string argument = "(no error)";
  try {
    crisp::cuda::attend_async(dev.q_view(), dev.kv_view(dev.k.ptr), dev.kv_view(dev.v.ptr), dplan, dev.out_view(),
                              dev.lse_view());
  } catch (const crisp::Error& e) {
    argument = e.argument();
  }
  EXPECT_EQ(argument, "block_table");
  EXPECT_NO_THROW(crisp::cuda::attend_async(dev.q_view(), dev.kv_view(dev.k.ptr), dev.kv_view(dev.v.ptr), dplan,
                                            dev.out_view(), dev.lse_view(), nullptr, {}, dev.block_table()));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // A plan of contiguous K/V, uploaded, clears it (and may then run over pages holding the same keys).
  dplan.upload(crisp::plan(x.q_view(), x.k_view(), cfg, x.batch()));
  EXPECT_EQ(dplan.page_size(), 0);
  EXPECT_THROW(dplan.set_page_size(-1), crisp::Error);
}

}  // namespace
