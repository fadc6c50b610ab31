// tests/gpu/test_gpu_hopper.cpp — the Hopper (sm_90a, TMA + wgmma) attention kernel (head dim 64,
// 128 and 256, block size 128 and 64), forced with Kernel::hopper, against the CPU float64 reference on
// the same plan and the same rounded inputs (the tolerances of test_gpu_attention.cpp: relative
// Frobenius error of O <= 1e-2 per (sequence, head), |LSE - ref| <= 1e-3), with NaN-poisoned
// outputs; the Hopper kernel against the portable kernel on the same inputs; and the kernel
// options' dispatch. Every test skips itself without an sm_90 device whose binary carries the sm_90a code.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/half.h"
#include "crisp/crisp.h"
#include "crisp/cuda.h"
#include "gpu/gpu_test_util.h"
#include "crisp/workload.h"
#include "cuda/attention_params.h"
#include "cuda/device_plan_internal.h"
#include "cuda/hopper/gqa_pack.h"
#include "cuda/hopper/hopper_attention.h"

namespace {

using crisp_gpu_test::DeviceBuffer;
using crisp_gpu_test::from_bits;
using crisp_gpu_test::random_plan;

#define SKIP_WITHOUT_HOPPER()                                                              \
  if (!crisp::cuda::available()) GTEST_SKIP() << "no CUDA device";                         \
  if (!crisp::cuda_detail::hopper::kernel_available())                                     \
  GTEST_SKIP() << "the device is not sm_90 or the build has no sm_90a code"

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

using crisp_gpu_test::ScopedEnv;

// The Hopper kernel's schedule and ping-pong settings (automatic = the library default).
struct Variant {
  crisp::Schedule schedule;
  crisp::PingPong ping_pong;
};
constexpr Variant kDefaultVariant{crisp::Schedule::automatic, crisp::PingPong::automatic};
constexpr Variant kAllVariants[] = {{crisp::Schedule::persistent, crisp::PingPong::on},
                                    {crisp::Schedule::persistent, crisp::PingPong::off},
                                    {crisp::Schedule::grid, crisp::PingPong::on},
                                    {crisp::Schedule::grid, crisp::PingPong::off}};

enum class Layout { dense, crisp_plan, random };

struct Case {
  std::string name;
  crisp::DType dtype;
  int64_t head_dim;
  int64_t num_q_heads, num_kv_heads;
  std::vector<int64_t> seq_lens;
  Layout layout;
  double random_density;
  uint64_t seed;
  int block_size = 128;
};
std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

// Inputs of one case: the workload rounded to the dtype (bits for the device, floats for the
// reference) and the plan.
struct Prepared {
  crisp::SeqLens cu_seqlens;
  crisp_gpu_test::RoundedInputs in;
  crisp::Plan plan;
};

Prepared prepare(const Case& c) {
  const int64_t d = c.head_dim;
  crisp::WorkloadSpec spec = crisp_test::workload_spec(c.num_q_heads, c.num_kv_heads, d, c.seq_lens, c.seed);
  const int64_t shortest = *std::min_element(c.seq_lens.begin(), c.seq_lens.end());
  spec.needles = std::min<int64_t>(spec.needles, shortest - 1);
  const crisp::Workload w = crisp::make_workload(spec);
  Prepared p;
  p.cu_seqlens = w.cu_seqlens;
  p.in = crisp_gpu_test::round_inputs(w, c.dtype);
  const crisp::Plan dense = crisp::dense_plan(c.num_q_heads, c.num_kv_heads, d, w.cu_seqlens, c.block_size);
  if (c.layout == Layout::dense) {
    p.plan = dense;
  } else if (c.layout == Layout::crisp_plan) {
    crisp::Config cfg = crisp::Config::from_preset("crisp");
    cfg.block_size = c.block_size;
    const int64_t T = p.in.tokens;
    p.plan = crisp::plan(crisp::TensorView::contiguous(p.in.q.data(), crisp::DType::f32, c.num_q_heads, T, d),
                         crisp::TensorView::contiguous(p.in.k.data(), crisp::DType::f32, c.num_kv_heads, T, d), cfg,
                         w.cu_seqlens);
  } else {
    p.plan = random_plan(dense, c.random_density, c.seed * 7919 + 1);
  }
  return p;
}

// Runs attend_async with `kernel` (and the Hopper variant) on NaN-poisoned outputs; returns O bits
// and LSE. CRISP_KERNEL is unset so that Kernel::automatic means the library's own choice.
void run_device(const Prepared& p, crisp::Kernel kernel, std::vector<uint16_t>& out_bits, std::vector<float>& lse,
                Variant variant = kDefaultVariant, crisp::GqaPacking gqa = crisp::GqaPacking::automatic) {
  ScopedEnv no_override("CRISP_KERNEL", nullptr);
  crisp::CudaOptions options;
  options.kernel = kernel;
  options.schedule = variant.schedule;
  options.ping_pong = variant.ping_pong;
  options.gqa_packing = gqa;
  crisp_gpu_test::attend_poisoned(p.in, p.plan, out_bits, lse, options);
}

class GpuHopper : public ::testing::TestWithParam<Case> {};

TEST_P(GpuHopper, MatchesFloat64ReferenceAndWritesEveryElement) {
  SKIP_WITHOUT_HOPPER();
  const Case& c = GetParam();
  const int64_t d = c.head_dim;
  Prepared p = prepare(c);  // not const: the CPU views take mutable pointers
  const int64_t Hq = c.num_q_heads, T = p.in.tokens;
  std::vector<double> ref_out, ref_lse;
  crisp_gpu_test::reference_f64(p.in, p.plan, ref_out, ref_lse);

  std::vector<uint16_t> out_bits;
  std::vector<float> lse;
  run_device(p, crisp::Kernel::hopper, out_bits, lse);
  if (HasFatalFailure()) return;

  const crisp_gpu_test::ReferenceErrors worst = crisp_gpu_test::expect_matches_reference(
      p.cu_seqlens, Hq, T, d, c.dtype, out_bits, lse, ref_out, ref_lse);
  std::printf("[ %s ] density %.3f, worst rel. error of O %.2e, worst |LSE - ref| %.2e\n", c.name.c_str(),
              p.plan.density(), worst.worst_rel, worst.worst_lse);
}

// The Hopper and the portable kernel on the same inputs: both accumulate in fp32 and round O once
// to the dtype, so they differ by about one rounding of the output (relative Frobenius difference
// per (sequence, head) <= 5e-3, half the reference tolerance) and LSE by fp32 summation order
// (<= 1e-4). Auto dispatch on sm_90 runs the Hopper kernel on calls of at least 2^35 of causal work
// (crisp::cuda::automatic_prefers_hopper), the portable one below: bit-identical to that kernel.
TEST_P(GpuHopper, AgreesWithPortableKernelAndAutoDispatchPicksIt) {
  SKIP_WITHOUT_HOPPER();
  const Case& c = GetParam();
  const int64_t d = c.head_dim;
  const Prepared p = prepare(c);
  const int64_t Hq = c.num_q_heads, T = p.in.tokens;
  std::vector<uint16_t> hopper_out, portable_out, auto_out;
  std::vector<float> hopper_lse, portable_lse, auto_lse;
  run_device(p, crisp::Kernel::hopper, hopper_out, hopper_lse);
  if (HasFatalFailure()) return;
  run_device(p, crisp::Kernel::portable, portable_out, portable_lse);
  if (HasFatalFailure()) return;
  run_device(p, crisp::Kernel::automatic, auto_out, auto_lse);
  if (HasFatalFailure()) return;
  const bool auto_hopper = crisp::cuda::automatic_prefers_hopper(Hq, p.cu_seqlens, d);
  EXPECT_EQ(auto_out, auto_hopper ? hopper_out : portable_out) << (auto_hopper ? "hopper" : "portable");
  EXPECT_EQ(auto_lse, auto_hopper ? hopper_lse : portable_lse);

  double worst_rel = 0.0, worst_lse = 0.0;
  for (std::size_t s = 0; s + 1 < p.cu_seqlens.size(); ++s) {
    for (int64_t h = 0; h < Hq; ++h) {
      double diff2 = 0.0, ref2 = 0.0;
      for (int64_t t = p.cu_seqlens[s]; t < p.cu_seqlens[s + 1]; ++t) {
        worst_lse = std::max(worst_lse, static_cast<double>(std::fabs(hopper_lse[h * T + t] - portable_lse[h * T + t])));
        for (int64_t x = 0; x < d; ++x) {
          const std::size_t i = static_cast<std::size_t>((h * T + t) * d + x);
          const double a = from_bits(hopper_out[i], c.dtype), b = from_bits(portable_out[i], c.dtype);
          diff2 += (a - b) * (a - b);
          ref2 += b * b;
        }
      }
      const double rel = std::sqrt(diff2 / ref2);
      worst_rel = std::max(worst_rel, rel);
      EXPECT_LE(rel, 5e-3) << "sequence " << s << ", head " << h;
    }
  }
  EXPECT_LE(worst_lse, 1e-4);
  std::printf("[ %s ] hopper vs portable: worst rel. difference of O %.2e, worst |dLSE| %.2e\n", c.name.c_str(),
              worst_rel, worst_lse);
}

// Scheduling (persistent CTAs with a work counter, or one CTA per item) and ping-pong change only
// which SM computes a row and when: every variant must write bit-identical outputs, all of them.
TEST_P(GpuHopper, EverySchedulingVariantWritesIdenticalOutputs) {
  SKIP_WITHOUT_HOPPER();
  const Case& c = GetParam();
  const Prepared p = prepare(c);
  std::vector<uint16_t> first_out;
  std::vector<float> first_lse;
  for (const Variant& variant : kAllVariants) {
    std::vector<uint16_t> out;
    std::vector<float> lse;
    run_device(p, crisp::Kernel::hopper, out, lse, variant);
    if (HasFatalFailure()) return;
    const std::string label =
        std::string("schedule ") + crisp::to_string(variant.schedule) + ", ping-pong " + crisp::to_string(variant.ping_pong);
    for (std::size_t i = 0; i < lse.size(); ++i)
      ASSERT_FALSE(std::isnan(lse[i])) << label << ": LSE element " << i << " not written";
    if (first_out.empty()) {
      first_out = out;
      first_lse = lse;
      continue;
    }
    EXPECT_EQ(out, first_out) << label;
    EXPECT_EQ(lse, first_lse) << label;
  }
}

// GQA packing (GqaPacking::pack): where it applies (block size 128, group size 2/4/8/16) the
// kernel runs the union of each group's layouts, so it must match the float64 reference of
// crisp::gqa_union(plan) with the same tolerances, every element written; where it does not
// (group size 1, block size 64) the launch runs unpacked: bit-identical to GqaPacking::separate.
TEST_P(GpuHopper, GqaPackingRunsTheUnionOfEachGroupsLayouts) {
  SKIP_WITHOUT_HOPPER();
  const Case& c = GetParam();
  const int64_t d = c.head_dim, Hq = c.num_q_heads, group = c.num_q_heads / c.num_kv_heads;
  Prepared p = prepare(c);
  std::vector<uint16_t> packed_out, separate_out;
  std::vector<float> packed_lse, separate_lse;
  run_device(p, crisp::Kernel::hopper, packed_out, packed_lse, kDefaultVariant, crisp::GqaPacking::pack);
  if (HasFatalFailure()) return;
  run_device(p, crisp::Kernel::hopper, separate_out, separate_lse, kDefaultVariant, crisp::GqaPacking::separate);
  if (HasFatalFailure()) return;
  if (!crisp::cuda_detail::hopper::gqa_pack_applies(c.block_size, group, false, 1)) {
    EXPECT_EQ(packed_out, separate_out);
    EXPECT_EQ(packed_lse, separate_lse);
    return;
  }
  const crisp::Plan union_plan = crisp::gqa_union(p.plan);
  // Where the union adds blocks, a launch that silently ran unpacked would give other outputs.
  if (union_plan.density() > p.plan.density()) EXPECT_NE(packed_lse, separate_lse) << "packing did not run";
  std::vector<double> ref_out, ref_lse;
  crisp_gpu_test::reference_f64(p.in, union_plan, ref_out, ref_lse);
  const crisp_gpu_test::ReferenceErrors worst = crisp_gpu_test::expect_matches_reference(
      p.cu_seqlens, Hq, p.in.tokens, d, c.dtype, packed_out, packed_lse, ref_out, ref_lse);
  // One CTA per item gives the same bits as the persistent CTAs.
  std::vector<uint16_t> grid_out;
  std::vector<float> grid_lse;
  run_device(p, crisp::Kernel::hopper, grid_out, grid_lse, Variant{crisp::Schedule::grid, crisp::PingPong::off},
             crisp::GqaPacking::pack);
  if (HasFatalFailure()) return;
  EXPECT_EQ(grid_out, packed_out);
  EXPECT_EQ(grid_lse, packed_lse);
  std::printf("[ %s ] packed %lld heads per tile: density %.3f -> union %.3f, worst rel. error of O %.2e, worst "
              "|LSE - ref| %.2e\n",
              c.name.c_str(), static_cast<long long>(group), p.plan.density(), union_plan.density(), worst.worst_rel,
              worst.worst_lse);
}

// The device-built union rows of `plan` (one warp per row, a bitmap in shared memory) against
// crisp::gqa_union on the host, for every (sequence, kv head, query block).
void expect_device_union_equals_host(const crisp::Plan& plan) {
  const int64_t Hkv = plan.num_kv_heads, group = plan.num_q_heads / plan.num_kv_heads;
  crisp::cuda::DevicePlan dplan(plan);
  crisp::cuda_detail::hopper::PackedGqaLayout packed(crisp::cuda_detail::view_of(dplan), static_cast<int>(group),
                                                     nullptr);
  std::vector<int32_t> col(packed.col_entries()), len(packed.len_entries());
  CUDA_OK(cudaMemcpy(col.data(), packed.col(), col.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(len.data(), packed.len(), len.size() * 4, cudaMemcpyDeviceToHost));
  const crisp::Plan union_plan = crisp::gqa_union(plan);
  int64_t block_base = 0, col_base = 0;
  for (std::size_t s = 0; s < union_plan.sequences.size(); ++s) {
    const auto& seq = union_plan.sequences[s];
    const int64_t N = seq.num_blocks;
    for (int64_t kv = 0; kv < Hkv; ++kv) {
      const crisp::HeadPlan& head = seq.heads[static_cast<std::size_t>(kv * group)];
      for (int64_t r = 0; r < N; ++r) {
        const int32_t n_host = head.row_ptr[r + 1] - head.row_ptr[r];
        const int32_t n_dev = len[static_cast<std::size_t>(block_base * Hkv + kv * N + r)];
        ASSERT_EQ(n_dev, n_host) << "sequence " << s << ", kv head " << kv << ", row " << r;
        const int32_t* dev_row = col.data() + col_base * Hkv + kv * N * (N + 1) / 2 + r * (r + 1) / 2;
        const std::vector<int32_t> host_row(head.col.begin() + head.row_ptr[r], head.col.begin() + head.row_ptr[r + 1]);
        ASSERT_EQ(std::vector<int32_t>(dev_row, dev_row + n_dev), host_row)
            << "sequence " << s << ", kv head " << kv << ", row " << r;
      }
    }
    block_base += N;
    col_base += N * (N + 1) / 2;
  }
}

TEST_P(GpuHopper, DeviceUnionRowsEqualTheHostUnion) {
  SKIP_WITHOUT_HOPPER();
  const Case& c = GetParam();
  if (!crisp::cuda_detail::hopper::gqa_pack_applies(c.block_size, c.num_q_heads / c.num_kv_heads, false, 1))
    GTEST_SKIP() << "packing does not apply to this shape";
  expect_device_union_equals_host(prepare(c).plan);
}

// A long random plan: 1250 query blocks (160k tokens; a row's bitmap spans more than 32 words, so
// the write-out takes several prefix-sum rounds) and 8 x 1250 = 10000 union rows (more than the
// union kernel's 2048 CTAs x 4 warps, so warps reuse their bitmap for a second row). Plan only, no
// attention.
TEST(GpuHopperGqaPack, DeviceUnionRowsOfALongPlan) {
  SKIP_WITHOUT_HOPPER();
  const crisp::Plan dense = crisp::dense_plan(16, 8, 128, {0, 160000}, 128);
  expect_device_union_equals_host(random_plan(dense, 0.02, 4242));
}

// A batch of chunks (spec §11): the union rows before each sequence's first_row are empty, the
// others the host union's.
TEST(GpuHopperGqaPack, DeviceUnionRowsOfChunks) {
  SKIP_WITHOUT_HOPPER();
  crisp::Batch chunks;
  chunks.cu_seqlens_q = {0, 1, 301, 1001, 1129};
  chunks.cu_seqlens_k = {0, 1000, 2300, 3000, 4024};
  const crisp::Plan dense = crisp::dense_plan(16, 4, 128, chunks, 128);
  expect_device_union_equals_host(random_plan(dense, 0.2, 4343));
}

constexpr auto bf16 = crisp::DType::bf16;
constexpr auto f16 = crisp::DType::f16;

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuHopper,
    ::testing::Values(
        // name, dtype, d, Hq, Hkv, seq_lens, layout, random density, seed[, block size: 128]
        Case{"bf16_d128_dense_gqa4_unaligned", bf16, 128, 8, 2, {1000}, Layout::dense, 0, 101},
        Case{"bf16_d128_dense_gqa1_aligned", bf16, 128, 4, 4, {2048}, Layout::dense, 0, 102},
        Case{"bf16_d128_crisp_gqa4", bf16, 128, 8, 2, {3000}, Layout::crisp_plan, 0, 103},
        Case{"fp16_d128_crisp_gqa8", f16, 128, 8, 1, {2600}, Layout::crisp_plan, 0, 104},
        Case{"bf16_d128_random30_gqa2", bf16, 128, 4, 2, {2100}, Layout::random, 0.3, 105},
        Case{"fp16_d128_random10_gqa4", f16, 128, 8, 2, {3300}, Layout::random, 0.1, 106},
        Case{"bf16_d128_n_below_block", bf16, 128, 4, 1, {37}, Layout::dense, 0, 107},
        Case{"bf16_d128_varlen_dense", bf16, 128, 8, 2, {50, 700, 129, 1024}, Layout::dense, 0, 108},
        Case{"bf16_d128_varlen_random10_gqa8", bf16, 128, 8, 1, {300, 1200, 65, 901}, Layout::random, 0.1, 109},
        Case{"fp16_d128_varlen_crisp", f16, 128, 4, 2, {1500, 77, 2200}, Layout::crisp_plan, 0, 110},
        Case{"bf16_d64_dense_gqa4_unaligned", bf16, 64, 8, 2, {1000}, Layout::dense, 0, 111},
        Case{"fp16_d64_crisp_gqa4", f16, 64, 8, 2, {2600}, Layout::crisp_plan, 0, 112},
        Case{"bf16_d64_random20_gqa8", bf16, 64, 8, 1, {2100}, Layout::random, 0.2, 113},
        Case{"bf16_d64_varlen_crisp", bf16, 64, 4, 2, {1500, 77, 2200}, Layout::crisp_plan, 0, 114},
        Case{"fp16_d64_varlen_random10", f16, 64, 4, 1, {300, 1200, 65, 901}, Layout::random, 0.1, 115},
        // More work items (16 heads x 47 blocks) than the H200 has SMs: the persistent CTAs take
        // most rows from the work counter. 2^35.1 of causal work: automatic runs it on Hopper.
        Case{"bf16_d128_crisp_many_items", bf16, 128, 16, 4, {6000}, Layout::crisp_plan, 0, 116},
        // 16 heads x 8192 tokens at d 128: 2^36 of causal work, automatic runs it on Hopper.
        Case{"bf16_d128_random10_auto_hopper", bf16, 128, 16, 4, {8192}, Layout::random, 0.1, 133},
        Case{"fp16_d128_varlen_random20_many_items", f16, 128, 16, 2, {2500, 130, 3900}, Layout::random, 0.2, 117},
        // 16 query heads on one kv head: packed, 8 queries of each head per tile.
        Case{"bf16_d128_crisp_gqa16", bf16, 128, 16, 1, {2000}, Layout::crisp_plan, 0, 126},
        // Block size 64: one consumer warpgroup per CTA, two CTAs per SM.
        Case{"bf16_d128_b64_dense_gqa4_unaligned", bf16, 128, 8, 2, {1000}, Layout::dense, 0, 118, 64},
        Case{"fp16_d128_b64_crisp_gqa4", f16, 128, 8, 2, {3000}, Layout::crisp_plan, 0, 119, 64},
        Case{"bf16_d128_b64_random10_gqa8", bf16, 128, 8, 1, {2100}, Layout::random, 0.1, 120, 64},
        Case{"bf16_d128_b64_n_below_block", bf16, 128, 4, 1, {37}, Layout::dense, 0, 121, 64},
        Case{"bf16_d128_b64_varlen_crisp", bf16, 128, 4, 2, {1500, 77, 2200}, Layout::crisp_plan, 0, 122, 64},
        Case{"bf16_d64_b64_crisp_gqa4", bf16, 64, 8, 2, {2600}, Layout::crisp_plan, 0, 123, 64},
        Case{"fp16_d64_b64_varlen_random20", f16, 64, 4, 1, {300, 1200, 65, 901}, Layout::random, 0.2, 124, 64},
        // 16 heads x 94 blocks: more items than the 2 x 132 resident CTAs.
        Case{"bf16_d128_b64_crisp_many_items", bf16, 128, 16, 4, {6000}, Layout::crisp_plan, 0, 125, 64},
        // Head dim 256 (Gemma 3): B = 128 (one stage, PV before the next S), B = 64 (three stages),
        // GQA 4:1 and 2:1 (B = 128 packs GQA groups), varlen, below a block, more items than SMs.
        Case{"bf16_d256_crisp_gqa4", bf16, 256, 8, 2, {3000}, Layout::crisp_plan, 0, 127},
        Case{"fp16_d256_random20_gqa4_1", f16, 256, 4, 1, {2100}, Layout::random, 0.2, 128},
        Case{"bf16_d256_dense_gqa2_unaligned", bf16, 256, 4, 2, {1000}, Layout::dense, 0, 129},
        Case{"bf16_d256_varlen_random10", bf16, 256, 4, 1, {300, 1200, 65, 901}, Layout::random, 0.1, 130},
        Case{"bf16_d256_crisp_many_items", bf16, 256, 16, 4, {5000}, Layout::crisp_plan, 0, 131},
        Case{"bf16_d256_b64_crisp_gqa4", bf16, 256, 8, 2, {3000}, Layout::crisp_plan, 0, 132, 64},
        Case{"fp16_d256_b64_dense_gqa4_1_unaligned", f16, 256, 4, 1, {1000}, Layout::dense, 0, 133, 64},
        Case{"bf16_d256_b64_n_below_block", bf16, 256, 4, 1, {37}, Layout::dense, 0, 134, 64},
        Case{"fp16_d256_b64_varlen_random20", f16, 256, 4, 2, {300, 1200, 65, 901}, Layout::random, 0.2, 135, 64}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// The launch rules are host code and need no device, so this test runs everywhere the CUDA
// backend is built (CI included).
TEST(GpuHopperDispatch, LaunchRulesNeedNoDevice) {
  namespace hop = crisp::cuda_detail::hopper;
  // Packing applies at block size 128 to groups of 2, 4, 8 or 16 heads, on whole-plan launches.
  EXPECT_TRUE(hop::gqa_pack_applies(128, 4, false, 100));
  EXPECT_FALSE(hop::gqa_pack_applies(64, 4, false, 100));
  EXPECT_FALSE(hop::gqa_pack_applies(128, 1, false, 100));
  EXPECT_FALSE(hop::gqa_pack_applies(128, 3, false, 100));
  EXPECT_FALSE(hop::gqa_pack_applies(128, 4, true, 100));
  // The shapes the kernel is compiled for: the CUDA backend's (bf16/f16, d 64/128/256, B 64/128).
  for (const auto dtype : {bf16, f16})
    for (const int64_t d : {64, 128, 256})
      for (const int block : {64, 128}) EXPECT_TRUE(hop::shape_supported(dtype, d, block));
  EXPECT_FALSE(hop::shape_supported(crisp::DType::f32, 128, 128));
  EXPECT_FALSE(hop::shape_supported(bf16, 96, 128));
  EXPECT_FALSE(hop::shape_supported(bf16, 512, 64));
  EXPECT_FALSE(hop::shape_supported(bf16, 128, 32));
}

// Paged K/V take the Hopper kernel below 2^31 pool rows (int32 TMA coordinates) and 2^31 block
// table entries (int32 table indices in the producer); host code, no device needed.
TEST(GpuHopperDispatch, PagedPoolAndTableLimitsNeedNoDevice) {
  namespace hop = crisp::cuda_detail::hopper;
  crisp::cuda_detail::attention::Params params{};
  EXPECT_TRUE(hop::paged_pool_supported(params));  // contiguous K/V
  const int32_t table_entry = 0;
  params.block_table = &table_entry;
  params.page_size = 16;
  params.plan.num_sequences = 4;
  params.table_stride = 1000;
  params.pool_rows = INT32_MAX;
  EXPECT_TRUE(hop::paged_pool_supported(params));
  params.pool_rows = int64_t{INT32_MAX} + 1;
  EXPECT_FALSE(hop::paged_pool_supported(params));
  params.pool_rows = 4096;
  params.table_stride = INT32_MAX / 4;  // 4 x (2^31 - 1) / 4 entries: below 2^31
  EXPECT_TRUE(hop::paged_pool_supported(params));
  params.table_stride = int64_t{1} << 29;  // 4 x 2^29 = 2^31 entries
  EXPECT_FALSE(hop::paged_pool_supported(params));
}

// The kernel options at a launch: "hopper", "portable" and "auto" all run block size 64 (the
// Hopper kernel covers every shape the CUDA backend takes); a Hopper setting with the portable
// kernel, an invalid enumerator or an unknown CRISP_KERNEL is an error naming it.
TEST(GpuHopperDispatch, KernelChoiceErrorsNameTheOption) {
  SKIP_WITHOUT_HOPPER();
  const int64_t H = 2, T = 256, d = 128;
  const crisp::Plan plan = crisp::dense_plan(H, H, d, {0, T}, 64);
  crisp::cuda::DevicePlan dplan(plan);
  DeviceBuffer q(H * T * d * 2), k(H * T * d * 2), v(H * T * d * 2), o(H * T * d * 2), l(H * T * 4);
  ASSERT_TRUE(q.ptr && k.ptr && v.ptr && o.ptr && l.ptr);
  CUDA_OK(cudaMemset(q.ptr, 0, H * T * d * 2));
  CUDA_OK(cudaMemset(k.ptr, 0, H * T * d * 2));
  CUDA_OK(cudaMemset(v.ptr, 0, H * T * d * 2));
  const auto dev = crisp::Device::cuda;
  auto view = [&](void* ptr) { return crisp::TensorView::contiguous(ptr, bf16, H, T, d, dev); };
  const auto lse = crisp::TensorView::contiguous2d(l.ptr, crisp::DType::f32, H, T, dev);
  ScopedEnv no_override("CRISP_KERNEL", nullptr);
  const auto call_with = [&](const crisp::CudaOptions& options) {
    crisp::cuda::attend_async(view(q.ptr), view(k.ptr), view(v.ptr), dplan, view(o.ptr), lse, nullptr, options);
  };
  const auto expect_error = [&](const crisp::CudaOptions& options, const char* argument) {
    try {
      call_with(options);
      ADD_FAILURE() << "no error naming " << argument;
    } catch (const crisp::Error& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
  };
  for (const crisp::Kernel kernel : {crisp::Kernel::hopper, crisp::Kernel::portable, crisp::Kernel::automatic}) {
    crisp::CudaOptions options;
    options.kernel = kernel;
    EXPECT_NO_THROW(call_with(options)) << crisp::to_string(kernel);
  }
  crisp::CudaOptions portable_grid;
  portable_grid.kernel = crisp::Kernel::portable;
  portable_grid.schedule = crisp::Schedule::grid;
  expect_error(portable_grid, "options.cuda.schedule");
  crisp::CudaOptions bad_ping_pong;
  bad_ping_pong.ping_pong = static_cast<crisp::PingPong>(7);
  expect_error(bad_ping_pong, "options.cuda.ping_pong");
  {
    ScopedEnv bad("CRISP_KERNEL", "fastest");
    expect_error(crisp::CudaOptions{}, "CRISP_KERNEL");
  }
  CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace
