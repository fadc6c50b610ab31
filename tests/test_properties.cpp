// tests/test_properties.cpp — properties of plan/attend on random and structured inputs: the dense
// preset is dense attention (recall 1), sparse attention follows its layout exactly (against the
// oracle's naive float64 attention), every layout is well-formed CSR with its anchors, the float32
// path agrees with the float64 reference, every output element is written, f16/bf16 inputs work.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "crisp/crisp.h"
#include "crisp/workload.h"
#include "oracle.h"
#include "test_util.h"

namespace {

using crisp_test::seed_trace;
using crisp_test::Tensor3;
using crisp_test::test_seed;

struct Inputs {
  Tensor3 q, k, v;
  crisp::SeqLens cu;
};

Inputs random_inputs(uint64_t seed, int64_t hq, int64_t hkv, int64_t tokens, int64_t d, double sigma = 1.0) {
  Inputs in;
  in.q = crisp_test::random_tensor(seed, hq, tokens, d, sigma);
  in.k = crisp_test::random_tensor(seed + 1, hkv, tokens, d, sigma);
  in.v = crisp_test::random_tensor(seed + 2, hkv, tokens, d);
  return in;
}

Inputs workload_inputs(uint64_t seed, std::vector<int64_t> lens, int64_t hq = 4, int64_t hkv = 2, int64_t d = 32) {
  crisp::WorkloadSpec spec = crisp_test::workload_spec(hq, hkv, d, std::move(lens), seed);
  crisp::Workload w = crisp::make_workload(spec);
  Inputs in;
  in.q = Tensor3(hq, w.total_tokens, d);
  in.k = Tensor3(hkv, w.total_tokens, d);
  in.v = Tensor3(hkv, w.total_tokens, d);
  in.q.data = w.q;
  in.k.data = w.k;
  in.v.data = w.v;
  in.cu = w.cu_seqlens;
  return in;
}

crisp::Options options(crisp::Precision p, int threads = 0) {
  crisp::Options o;
  o.precision = p;
  o.num_threads = threads;
  return o;
}

// float64 outputs of crisp::attend.
struct Outputs {
  std::vector<double> out, lse;
};

Outputs attend_f64(Inputs& in, const crisp::Plan& plan, crisp::Precision precision) {
  Outputs o;
  o.out.assign(in.q.data.size(), std::numeric_limits<double>::quiet_NaN());
  o.lse.assign(static_cast<size_t>(in.q.heads * in.q.tokens), std::numeric_limits<double>::quiet_NaN());
  crisp::attend(in.q.view(), in.k.view(), in.v.view(), plan,
                crisp::TensorView::contiguous(o.out.data(), crisp::DType::f64, in.q.heads, in.q.tokens, in.q.dim),
                crisp::TensorView::contiguous2d(o.lse.data(), crisp::DType::f64, in.q.heads, in.q.tokens),
                options(precision));
  return o;
}

oracle::Attention oracle_attend(const Inputs& in, const crisp::Plan& plan) {
  std::vector<std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>>> layouts;
  crisp::SeqLens cu;
  for (const auto& sp : plan.sequences) {
    cu.push_back(sp.q_offset);
    std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> heads;
    for (const auto& hp : sp.heads) heads.push_back({hp.row_ptr, hp.col});
    layouts.push_back(heads);
  }
  cu.push_back(plan.sequences.back().q_offset + plan.sequences.back().n_q);
  return oracle::attend(oracle::Tensor::from_floats(in.q.data, in.q.heads, in.q.tokens, in.q.dim),
                        oracle::Tensor::from_floats(in.k.data, in.k.heads, in.k.tokens, in.k.dim),
                        oracle::Tensor::from_floats(in.v.data, in.v.heads, in.v.tokens, in.v.dim), cu, plan.block_size,
                        plan.softmax_scale, layouts);
}

// ||a - b||_F / ||b||_F over everything, and the largest |LSE difference|.
double rel_frobenius(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}
double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// ---------------------------------------------------------------- dense preset

TEST(Properties, DensePresetEqualsNaiveDenseAttention) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  Inputs in = random_inputs(seed, 4, 2, 333, 32, 1.5);  // n not a multiple of B
  crisp::Config cfg = crisp::Config::from_preset("dense");
  cfg.set("block_size=64");
  crisp::Plan plan = crisp::plan(in.q.view(), in.k.view(), cfg, {}, options(crisp::Precision::f64));
  for (const auto& hp : plan.sequences.at(0).heads) {
    EXPECT_EQ(hp.route, crisp::Route::dense);
    EXPECT_DOUBLE_EQ(hp.density, 1.0);
  }
  Outputs got = attend_f64(in, plan, crisp::Precision::f64);
  oracle::Attention ref = oracle_attend(in, crisp::dense_plan(4, 2, 32, {0, 333}, 64));
  EXPECT_LT(rel_frobenius(got.out, ref.out.data), 1e-13);
  EXPECT_LT(max_abs_diff(got.lse, ref.lse), 1e-12);

  // compare() of the dense preset against dense_plan: recall exactly 1, error 0.
  crisp::Plan dense = crisp::dense_plan(4, 2, 32, {0, 333}, 64);
  Outputs d = attend_f64(in, dense, crisp::Precision::f64);
  auto view_out = [&](std::vector<double>& x) { return crisp::TensorView::contiguous(x.data(), crisp::DType::f64, 4, 333, 32); };
  auto view_lse = [&](std::vector<double>& x) { return crisp::TensorView::contiguous2d(x.data(), crisp::DType::f64, 4, 333); };
  auto metrics = crisp::compare(view_out(got.out), view_lse(got.lse), view_out(d.out), view_lse(d.lse));
  ASSERT_EQ(metrics.size(), 4u);
  for (const auto& m : metrics) {
    EXPECT_NEAR(m.recall_mean, 1.0, 1e-12);
    EXPECT_NEAR(m.recall_min, 1.0, 1e-12);
    EXPECT_NEAR(m.rel_error, 0.0, 1e-12);
  }
}

TEST(Properties, DensePlanShape) {
  crisp::Plan p = crisp::dense_plan(4, 2, 64, {0, 100, 1000}, 128);
  ASSERT_EQ(p.sequences.size(), 2u);
  EXPECT_EQ(p.sequences[1].q_offset, 100);
  EXPECT_EQ(p.sequences[1].n_k, 900);
  EXPECT_EQ(p.sequences[1].num_blocks, 8);
  EXPECT_DOUBLE_EQ(p.softmax_scale, 1.0 / 8.0);
  for (const auto& sp : p.sequences)
    for (const auto& hp : sp.heads) {
      EXPECT_EQ(crisp_test::csr_problem(hp, sp.num_blocks), "");
      EXPECT_EQ(hp.col.size(), static_cast<size_t>(sp.num_blocks) * (sp.num_blocks + 1) / 2);
    }
  EXPECT_DOUBLE_EQ(p.density(), 1.0);
}

// ---------------------------------------------------------------- sparse attention follows the layout

TEST(Properties, SparseAttentionMatchesOracleF64AndF32) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  Inputs in = workload_inputs(seed, {700, 450});
  crisp::Plan dense = crisp::dense_plan(in.q.heads, in.k.heads, in.q.dim, in.cu, 64);
  oracle::Attention ref_dense = oracle_attend(in, dense);
  Outputs d64 = attend_f64(in, dense, crisp::Precision::f64);
  for (const char* preset : {"crisp", "minference", "flexprefill"}) {
    crisp::Config cfg = crisp::Config::from_preset(preset);
    cfg.set("block_size=64");
    if (std::string(preset) == "flexprefill") cfg.set("min_budget=128");  // so the sequences are planned
    if (std::string(preset) == "minference") {  // token budgets below n, so something is sparse
      cfg.set("vertical_tokens=100");
      cfg.set("slash_tokens=200");
    }
    crisp::Plan plan = crisp::plan(in.q.view(), in.k.view(), cfg, in.cu, options(crisp::Precision::f64));
    EXPECT_LT(plan.density(), 1.0) << preset << ": nothing sparse to test";
    oracle::Attention ref = oracle_attend(in, plan);
    Outputs f64 = attend_f64(in, plan, crisp::Precision::f64);
    EXPECT_LT(rel_frobenius(f64.out, ref.out.data), 1e-13) << preset;
    EXPECT_LT(max_abs_diff(f64.lse, ref.lse), 1e-12) << preset;
    // NOTE: float32 tolerance. Logits and the weighted sum of V are float32 (rel. eps 6e-8); over
    // up to ~700 keys per row with values of order 1 the rounding random-walks to ~sqrt(700)*6e-8
    // ~ 2e-6 relative. 1e-5 leaves 5x headroom while still catching any wrong block or mask
    // (those give errors of order 1e-2 and above). LSE: |LSE| <= ~30 here, float32 -> 1e-5 abs.
    Outputs f32 = attend_f64(in, plan, crisp::Precision::f32);
    EXPECT_LT(rel_frobenius(f32.out, ref.out.data), 1e-5) << preset;
    EXPECT_LT(max_abs_diff(f32.lse, ref.lse), 1e-5) << preset;

    // compare() against the dense run: recall = exp(LSE_sparse - LSE_dense) per query.
    const int64_t H = in.q.heads, T = in.q.tokens, D = in.q.dim;
    auto vo = [&](std::vector<double>& x) { return crisp::TensorView::contiguous(x.data(), crisp::DType::f64, H, T, D); };
    auto vl = [&](std::vector<double>& x) { return crisp::TensorView::contiguous2d(x.data(), crisp::DType::f64, H, T); };
    auto metrics = crisp::compare(vo(f64.out), vl(f64.lse), vo(d64.out), vl(d64.lse), in.cu);
    ASSERT_EQ(metrics.size(), static_cast<size_t>(2 * H));
    for (size_t s = 0; s < 2; ++s)
      for (int64_t h = 0; h < H; ++h) {
        double rmean = 0, rmin = 1e300, num = 0, den = 0;
        for (int64_t t = in.cu[s]; t < in.cu[s + 1]; ++t) {
          const double r = std::exp(ref.lse[h * T + t] - ref_dense.lse[h * T + t]);
          rmean += r / static_cast<double>(in.cu[s + 1] - in.cu[s]);
          rmin = std::min(rmin, r);
          for (int64_t x = 0; x < D; ++x) {
            const double a = ref.out.row(h, t)[x], b = ref_dense.out.row(h, t)[x];
            num += (a - b) * (a - b);
            den += b * b;
          }
        }
        const auto& m = metrics[s * H + h];
        EXPECT_NEAR(m.recall_mean, rmean, 1e-10) << preset << " s=" << s << " h=" << h;
        EXPECT_NEAR(m.recall_min, rmin, 1e-10) << preset << " s=" << s << " h=" << h;
        EXPECT_LE(m.recall_min, 1.0 + 1e-12);
        EXPECT_NEAR(m.rel_error, std::sqrt(num / den), 1e-10) << preset << " s=" << s << " h=" << h;
      }
  }
}

// ---------------------------------------------------------------- layouts are well formed

TEST(Properties, EveryLayoutIsWellFormedWithAnchors) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  int checked = 0;
  for (int block : {64, 128}) {
    for (int trial = 0; trial < 3; ++trial) {
      Inputs in = trial == 0 ? workload_inputs(seed + trial, {1000, 129, 640})
                             : random_inputs(seed + trial, 2, 1, 400 + 311 * trial, 16, 1.0 + trial);
      for (const char* preset : {"crisp", "flexprefill", "minference", "dense"}) {
        for (const char* extra : {"", "rho=50", "slash_cover=single", "routing=jsd"}) {
          crisp::Config cfg = crisp::Config::from_preset(preset);
          cfg.set("block_size=" + std::to_string(block));
          if (*extra) cfg.set(extra);
          if (std::string(preset) == "flexprefill") cfg.set("min_budget=64");
          // f32 here; the float64 planner's layouts are checked in every PlanOracle grid.
          for (auto precision : {crisp::Precision::f32}) {
            crisp::Plan plan = crisp::plan(in.q.view(), in.k.view(), cfg, in.cu, options(precision, 1));
            EXPECT_NO_THROW(plan.check_well_formed());
            for (const auto& sp : plan.sequences)
              for (const auto& hp : sp.heads) {
                EXPECT_EQ(crisp_test::csr_problem(hp, sp.num_blocks), "") << preset << " " << extra;
                ++checked;
              }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 50);
}

TEST(Properties, CheckWellFormedRejectsBrokenLayouts) {
  // The library's own checker must catch what csr_problem catches (a checker that passes
  // everything would make the property above vacuous).
  crisp::Plan good = crisp::dense_plan(1, 1, 16, {0, 300}, 64);
  EXPECT_NO_THROW(good.check_well_formed());
  auto broken = [&](auto mutate) {
    crisp::Plan p = good;
    mutate(p.sequences[0].heads[0]);
    return p;
  };
  // drop the diagonal of row 4 (the last row): {0..4} -> {0..3}
  EXPECT_THROW(broken([](crisp::HeadPlan& h) { h.col.pop_back(); h.row_ptr.back()--; }).check_well_formed(), crisp::Error);
  // unsorted row 2
  EXPECT_THROW(broken([](crisp::HeadPlan& h) { std::swap(h.col[3], h.col[4]); }).check_well_formed(), crisp::Error);
  // a column beyond the diagonal in row 1 ({0, 1} -> {0, 2})
  EXPECT_THROW(broken([](crisp::HeadPlan& h) { h.col[2] = 2; }).check_well_formed(), crisp::Error);
  // missing sink in row 3 ({0,1,2,3} -> {1,1,2,3} -> duplicate and no 0)
  EXPECT_THROW(broken([](crisp::HeadPlan& h) { h.col[6] = 1; }).check_well_formed(), crisp::Error);
  // row_ptr of the wrong length
  EXPECT_THROW(broken([](crisp::HeadPlan& h) { h.row_ptr.pop_back(); }).check_well_formed(), crisp::Error);
}

// ---------------------------------------------------------------- float32 vs float64 plans

TEST(Properties, F32PlanEqualsF64PlanOnStructuredWorkload) {
  // The structured workload has large margins; where the oracle marks a decision fragile at 1e-5
  // (a legitimate float32 knife edge, see run_grid in test_plan_oracle.cpp) the head is counted,
  // not compared, and the count is bounded.
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  Inputs in = workload_inputs(seed, {1500, 800}, 8, 2, 64);
  oracle::Planner op(in.q.data, in.k.data, 8, 2, in.q.tokens, 64, in.cu);
  int compared = 0, skipped = 0;
  for (const char* preset : {"crisp", "flexprefill", "minference"}) {
    crisp::Config cfg = crisp::Config::from_preset(preset);
    if (std::string(preset) == "flexprefill") cfg.set("min_budget=256");
    crisp::Plan p32 = crisp::plan(in.q.view(), in.k.view(), cfg, in.cu, options(crisp::Precision::f32));
    crisp::Plan p64 = crisp::plan(in.q.view(), in.k.view(), cfg, in.cu, options(crisp::Precision::f64));
    auto ref = op.plan(cfg, 1e-5);
    for (size_t s = 0; s < p64.sequences.size(); ++s)
      for (size_t h = 0; h < p64.sequences[s].heads.size(); ++h) {
        if (!ref[s][h].fragile.empty()) {
          ++skipped;
          continue;
        }
        ++compared;
        const auto& a = p32.sequences[s].heads[h];
        const auto& b = p64.sequences[s].heads[h];
        EXPECT_EQ(a.route, b.route) << preset << " s=" << s << " h=" << h;
        EXPECT_EQ(a.vertical, b.vertical) << preset << " s=" << s << " h=" << h;
        EXPECT_EQ(a.slash, b.slash) << preset << " s=" << s << " h=" << h;
        EXPECT_EQ(a.col, b.col) << preset << " s=" << s << " h=" << h;
        if (b.route != crisp::Route::dense) {
          EXPECT_NEAR(a.c_struct, b.c_struct, 1e-5);
          if (cfg.routing == crisp::Routing::jsd) EXPECT_NEAR(a.jsd, b.jsd, 1e-4);
        }
      }
  }
  std::cout << "[ compared ] heads=" << compared << " fragile_skipped=" << skipped << "\n";
  EXPECT_LE(skipped * 20, compared + skipped);
}

TEST(Properties, PlanIsIndependentOfThreadCount) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  Inputs in = workload_inputs(seed, {900, 300});
  crisp::Config cfg = crisp::Config::from_preset("crisp");
  for (auto precision : {crisp::Precision::f32, crisp::Precision::f64}) {
    crisp::Plan a = crisp::plan(in.q.view(), in.k.view(), cfg, in.cu, options(precision, 1));
    crisp::Plan b = crisp::plan(in.q.view(), in.k.view(), cfg, in.cu, options(precision, 2));
    for (size_t s = 0; s < a.sequences.size(); ++s)
      for (size_t h = 0; h < a.sequences[s].heads.size(); ++h) {
        EXPECT_EQ(a.sequences[s].heads[h].col, b.sequences[s].heads[h].col);
        EXPECT_EQ(a.sequences[s].heads[h].vertical, b.sequences[s].heads[h].vertical);
      }
  }
}

// ---------------------------------------------------------------- every output element written

TEST(Properties, EveryOutputElementIsWritten) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  Inputs in = workload_inputs(seed, {333, 700, 64});
  crisp::Plan plan = crisp::plan(in.q.view(), in.k.view(), crisp::Config::from_preset("crisp"), in.cu);
  const int64_t H = in.q.heads, T = in.q.tokens, D = in.q.dim;
  oracle::Attention ref = oracle_attend(in, plan);
  // f32 out / f32 lse
  {
    std::vector<float> out(static_cast<size_t>(H * T * D), std::numeric_limits<float>::quiet_NaN());
    std::vector<float> lse(static_cast<size_t>(H * T), std::numeric_limits<float>::quiet_NaN());
    crisp::attend(in.q.view(), in.k.view(), in.v.view(), plan,
                  crisp::TensorView::contiguous(out.data(), crisp::DType::f32, H, T, D),
                  crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, H, T));
    size_t nan_out = 0, nan_lse = 0;
    for (float x : out) nan_out += std::isnan(x);
    for (float x : lse) nan_lse += std::isnan(x);
    EXPECT_EQ(nan_out, 0u);
    EXPECT_EQ(nan_lse, 0u);
  }
  // f16 and bf16 out (poisoned with their NaN patterns), f32 lse; compared with the oracle at the
  // output type's precision. NOTE: f16 has 11 significant bits (rel. 4.9e-4 per element), bf16 8
  // (3.9e-3): the Frobenius error of a correctly rounded output is below half that.
  for (auto dt : {crisp::DType::f16, crisp::DType::bf16}) {
    const uint16_t nan_bits = dt == crisp::DType::f16 ? 0x7E00 : 0x7FC0;
    std::vector<uint16_t> out(static_cast<size_t>(H * T * D), nan_bits);
    std::vector<float> lse(static_cast<size_t>(H * T), std::numeric_limits<float>::quiet_NaN());
    crisp::attend(in.q.view(), in.k.view(), in.v.view(), plan, crisp::TensorView::contiguous(out.data(), dt, H, T, D),
                  crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, H, T));
    std::vector<double> got(out.size());
    size_t nan_out = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      got[i] = dt == crisp::DType::f16 ? crisp_test::half_to_float(out[i]) : crisp_test::bf16_to_float(out[i]);
      nan_out += std::isnan(got[i]);
    }
    EXPECT_EQ(nan_out, 0u) << crisp::to_string(dt);
    if (nan_out == 0) EXPECT_LT(rel_frobenius(got, ref.out.data), dt == crisp::DType::f16 ? 5e-4 : 4e-3) << crisp::to_string(dt);
  }
}

// ---------------------------------------------------------------- f16 / bf16 inputs

TEST(Properties, HalfAndBfloat16InputsMatchReferenceOnConvertedValues) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  Inputs base = workload_inputs(seed, {600});
  const int64_t Hq = base.q.heads, Hkv = base.k.heads, T = base.q.tokens, D = base.q.dim;
  for (auto dt : {crisp::DType::f16, crisp::DType::bf16}) {
    auto to16 = [&](const std::vector<float>& x, std::vector<uint16_t>& bits, std::vector<float>& back) {
      bits.resize(x.size());
      back.resize(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        bits[i] = dt == crisp::DType::f16 ? crisp_test::float_to_half(x[i]) : crisp_test::float_to_bf16(x[i]);
        back[i] = dt == crisp::DType::f16 ? crisp_test::half_to_float(bits[i]) : crisp_test::bf16_to_float(bits[i]);
      }
    };
    std::vector<uint16_t> q16, k16, v16;
    Inputs conv = base;  // the converted values, exactly representable in float32
    to16(base.q.data, q16, conv.q.data);
    to16(base.k.data, k16, conv.k.data);
    to16(base.v.data, v16, conv.v.data);
    crisp::TensorView qv = crisp::TensorView::contiguous(q16.data(), dt, Hq, T, D);
    crisp::TensorView kv = crisp::TensorView::contiguous(k16.data(), dt, Hkv, T, D);
    crisp::TensorView vv = crisp::TensorView::contiguous(v16.data(), dt, Hkv, T, D);
    crisp::Config cfg = crisp::Config::from_preset("crisp");
    cfg.set("block_size=64");
    // The plan of 16-bit inputs equals the plan of their float32 conversion (the conversion is exact).
    for (auto precision : {crisp::Precision::f32, crisp::Precision::f64}) {
      crisp::Plan p16 = crisp::plan(qv, kv, cfg, {}, options(precision));
      crisp::Plan p32 = crisp::plan(conv.q.view(), conv.k.view(), cfg, {}, options(precision));
      for (size_t h = 0; h < p16.sequences[0].heads.size(); ++h) {
        EXPECT_EQ(p16.sequences[0].heads[h].col, p32.sequences[0].heads[h].col) << crisp::to_string(dt);
        EXPECT_EQ(p16.sequences[0].heads[h].route, p32.sequences[0].heads[h].route);
      }
    }
    // f64 attention of the 16-bit inputs equals the oracle on the converted values (1e-12); f32
    // within the float32 bound stated in SparseAttentionMatchesOracleF64AndF32.
    crisp::Plan plan = crisp::plan(qv, kv, cfg, {}, options(crisp::Precision::f64));
    oracle::Attention ref = oracle_attend(conv, plan);
    for (auto precision : {crisp::Precision::f64, crisp::Precision::f32}) {
      std::vector<double> out(static_cast<size_t>(Hq * T * D), std::numeric_limits<double>::quiet_NaN());
      std::vector<double> lse(static_cast<size_t>(Hq * T), std::numeric_limits<double>::quiet_NaN());
      crisp::attend(qv, kv, vv, plan, crisp::TensorView::contiguous(out.data(), crisp::DType::f64, Hq, T, D),
                    crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f64, Hq, T), options(precision));
      const bool f64 = precision == crisp::Precision::f64;
      EXPECT_LT(rel_frobenius(out, ref.out.data), f64 ? 1e-12 : 1e-5) << crisp::to_string(dt);
      EXPECT_LT(max_abs_diff(lse, ref.lse), f64 ? 1e-11 : 1e-5) << crisp::to_string(dt);
    }
  }
}

// ---------------------------------------------------------------- prefill = plan + attend

TEST(Properties, PrefillEqualsPlanThenAttend) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  Inputs in = workload_inputs(seed, {500, 260});
  const int64_t H = in.q.heads, T = in.q.tokens, D = in.q.dim;
  crisp::Config cfg = crisp::Config::from_preset("crisp");
  std::vector<float> o1(static_cast<size_t>(H * T * D)), l1(static_cast<size_t>(H * T));
  crisp::Plan p = crisp::prefill(in.q.view(), in.k.view(), in.v.view(), cfg,
                                 crisp::TensorView::contiguous(o1.data(), crisp::DType::f32, H, T, D),
                                 crisp::TensorView::contiguous2d(l1.data(), crisp::DType::f32, H, T), in.cu);
  crisp::Plan q = crisp::plan(in.q.view(), in.k.view(), cfg, in.cu);
  std::vector<float> o2(o1.size()), l2(l1.size());
  crisp::attend(in.q.view(), in.k.view(), in.v.view(), q, crisp::TensorView::contiguous(o2.data(), crisp::DType::f32, H, T, D),
                crisp::TensorView::contiguous2d(l2.data(), crisp::DType::f32, H, T));
  for (size_t s = 0; s < p.sequences.size(); ++s)
    for (size_t h = 0; h < p.sequences[s].heads.size(); ++h) EXPECT_EQ(p.sequences[s].heads[h].col, q.sequences[s].heads[h].col);
  EXPECT_EQ(o1, o2);
  EXPECT_EQ(l1, l2);
}

}  // namespace

namespace {

TEST(Properties, Float64InputsAndPlanStatistics) {
  // DType::f64 views plan exactly like float32 views of the same values; Plan::density() is the
  // causal-block-weighted mean of head densities and vs_share() the VS share of non-dense heads.
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  Inputs in = workload_inputs(seed, {900, 500, 100});
  std::vector<double> q64(in.q.data.begin(), in.q.data.end()), k64(in.k.data.begin(), in.k.data.end());
  crisp::Config cfg = crisp::Config::from_preset("crisp");
  crisp::Plan a = crisp::plan(in.q.view(), in.k.view(), cfg, in.cu, options(crisp::Precision::f64));
  crisp::Plan b = crisp::plan(crisp::TensorView::contiguous(q64.data(), crisp::DType::f64, in.q.heads, in.q.tokens, in.q.dim),
                              crisp::TensorView::contiguous(k64.data(), crisp::DType::f64, in.k.heads, in.k.tokens, in.k.dim), cfg,
                              in.cu, options(crisp::Precision::f64));
  double nnz = 0, causal = 0;
  int vs = 0, routed = 0;
  for (size_t s = 0; s < a.sequences.size(); ++s)
    for (size_t h = 0; h < a.sequences[s].heads.size(); ++h) {
      const auto& x = a.sequences[s].heads[h];
      EXPECT_EQ(x.col, b.sequences[s].heads[h].col);
      EXPECT_EQ(x.route, b.sequences[s].heads[h].route);
      const double N = a.sequences[s].num_blocks;
      nnz += static_cast<double>(x.col.size());
      causal += N * (N + 1) / 2;
      if (x.route != crisp::Route::dense) ++routed;
      if (x.route == crisp::Route::vs) ++vs;
    }
  EXPECT_NEAR(a.density(), nnz / causal, 1e-12);
  ASSERT_GT(routed, 0);
  EXPECT_NEAR(a.vs_share(), static_cast<double>(vs) / routed, 1e-12);
}

}  // namespace
