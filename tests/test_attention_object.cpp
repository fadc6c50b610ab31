// tests/test_attention_object.cpp — crisp::Attention (plan once, run many times) on the CPU: runs
// repeat bit for bit, agree with the free functions, and every bad option is an error naming it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend.h"
#include "crisp/crisp.h"
#include "test_util.h"

namespace {

using crisp_test::test_seed;
using crisp_test::seed_trace;

// Runs f; it must throw crisp::Error whose argument() is `argument`.
void expect_error_naming(const std::function<void()>& f, const std::string& argument) {
  try {
    f();
    ADD_FAILURE() << "no crisp::Error; expected one naming " << argument;
  } catch (const crisp::Error& e) {
    EXPECT_EQ(e.argument(), argument) << "what() = " << e.what();
    EXPECT_NE(std::string(e.what()).find(argument), std::string::npos) << e.what();
  }
}

// out and lse of one run, f32.
struct Outputs {
  std::vector<float> out, lse;
  crisp::TensorView out_view, lse_view;
  Outputs(int64_t heads, int64_t tokens, int64_t dim)
      : out(static_cast<std::size_t>(heads * tokens * dim)), lse(static_cast<std::size_t>(heads * tokens)) {
    out_view = crisp::TensorView::contiguous(out.data(), crisp::DType::f32, heads, tokens, dim);
    lse_view = crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, heads, tokens);
  }
  bool bitwise_equal(const Outputs& other) const {
    return out.size() == other.out.size() && lse.size() == other.lse.size() &&
           std::memcmp(out.data(), other.out.data(), out.size() * sizeof(float)) == 0 &&
           std::memcmp(lse.data(), other.lse.data(), lse.size() * sizeof(float)) == 0;
  }
};

void expect_same_layout(const crisp::Plan& a, const crisp::Plan& b) {
  ASSERT_EQ(a.sequences.size(), b.sequences.size());
  EXPECT_EQ(a.softmax_scale, b.softmax_scale);
  for (std::size_t s = 0; s < a.sequences.size(); ++s) {
    ASSERT_EQ(a.sequences[s].heads.size(), b.sequences[s].heads.size());
    for (std::size_t h = 0; h < a.sequences[s].heads.size(); ++h) {
      EXPECT_EQ(a.sequences[s].heads[h].route, b.sequences[s].heads[h].route) << "s=" << s << " h=" << h;
      EXPECT_EQ(a.sequences[s].heads[h].row_ptr, b.sequences[s].heads[h].row_ptr) << "s=" << s << " h=" << h;
      EXPECT_EQ(a.sequences[s].heads[h].col, b.sequences[s].heads[h].col) << "s=" << s << " h=" << h;
    }
  }
}

crisp::Options two_threads() {
  crisp::Options options;
  options.num_threads = 2;
  return options;
}

TEST(AttentionObject, PlanOnceRunTwiceGivesIdenticalOutputs) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  crisp::Workload w = crisp::make_workload(crisp_test::workload_spec(4, 2, 32, {700, 1500}, seed));
  const crisp::Config config = crisp::Config::from_preset("crisp");
  crisp::Attention attention(config, two_threads());
  EXPECT_FALSE(attention.planned());
  attention.plan(w.q_view(), w.k_view(), w.cu_seqlens);
  ASSERT_TRUE(attention.planned());
  EXPECT_EQ(attention.backend(), crisp::Backend::cpu);

  Outputs first(4, w.total_tokens, 32), second(4, w.total_tokens, 32);
  attention.run(w.q_view(), w.k_view(), w.v_view(), first.out_view, first.lse_view);
  attention.run(w.q_view(), w.k_view(), w.v_view(), second.out_view, second.lse_view);
  EXPECT_TRUE(first.bitwise_equal(second));

  // The same plan and outputs as the free functions.
  Outputs reference(4, w.total_tokens, 32);
  const crisp::Plan planned =
      crisp::prefill(w.q_view(), w.k_view(), w.v_view(), config, reference.out_view, reference.lse_view,
                     w.cu_seqlens, two_threads());
  expect_same_layout(attention.host_plan(), planned);
  EXPECT_TRUE(first.bitwise_equal(reference));
}

TEST(AttentionObject, OnePlanServesNewValues) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  crisp::Workload w = crisp::make_workload(crisp_test::workload_spec(2, 1, 16, {900}, seed));
  crisp_test::Tensor3 v2 = crisp_test::random_tensor(seed + 1, 1, w.total_tokens, 16);
  crisp::Attention attention(crisp::Config::from_preset("flexprefill"), two_threads());
  attention.plan(w.q_view(), w.k_view());
  Outputs ours(2, w.total_tokens, 16), theirs(2, w.total_tokens, 16);
  attention.run(w.q_view(), w.k_view(), v2.view(), ours.out_view, ours.lse_view);
  crisp::attend(w.q_view(), w.k_view(), v2.view(), attention.host_plan(), theirs.out_view, theirs.lse_view,
                two_threads());
  EXPECT_TRUE(ours.bitwise_equal(theirs));
}

TEST(AttentionObject, ReplanningForAnotherShapeReplacesThePlan) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  crisp::Workload small = crisp::make_workload(crisp_test::workload_spec(2, 2, 16, {300}, seed));
  crisp::Workload large = crisp::make_workload(crisp_test::workload_spec(2, 2, 16, {1100}, seed + 1));
  crisp::Attention attention(crisp::Config::from_preset("crisp"), two_threads());
  attention.plan(small.q_view(), small.k_view());
  attention.plan(large.q_view(), large.k_view());
  Outputs ours(2, large.total_tokens, 16), theirs(2, large.total_tokens, 16);
  attention.run(large.q_view(), large.k_view(), large.v_view(), ours.out_view, ours.lse_view);
  crisp::prefill(large.q_view(), large.k_view(), large.v_view(), crisp::Config::from_preset("crisp"), theirs.out_view,
                 theirs.lse_view, {}, two_threads());
  EXPECT_TRUE(ours.bitwise_equal(theirs));
  // The old shape no longer matches the plan.
  Outputs old_shape(2, small.total_tokens, 16);
  expect_error_naming(
      [&] { attention.run(small.q_view(), small.k_view(), small.v_view(), old_shape.out_view, old_shape.lse_view); },
      "plan");
}

TEST(AttentionObject, RunBeforePlanIsAnError) {
  crisp::Workload w = crisp::make_workload(crisp_test::workload_spec(1, 1, 16, {200}, test_seed()));
  crisp::Attention attention(crisp::Config::from_preset("dense"));
  Outputs o(1, w.total_tokens, 16);
  expect_error_naming([&] { attention.run(w.q_view(), w.k_view(), w.v_view(), o.out_view, o.lse_view); }, "plan");
  expect_error_naming([&] { attention.host_plan(); }, "plan");
}

TEST(AttentionObject, BadOptionsNameTheField) {
  const crisp::Config config = crisp::Config::from_preset("crisp");
  const auto make = [&](const crisp::Options& options) { return [=] { crisp::Attention a(config, options); }; };
  crisp::Options o;
  o.num_threads = -1;
  expect_error_naming(make(o), "options.num_threads");
  o = {};
  o.backend = static_cast<crisp::Backend>(9);
  expect_error_naming(make(o), "options.backend");
  o = {};
  o.cuda.kernel = static_cast<crisp::Kernel>(9);
  expect_error_naming(make(o), "options.cuda.kernel");
  // Hopper settings with the portable kernel.
  o = {};
  o.cuda.kernel = crisp::Kernel::portable;
  o.cuda.schedule = crisp::Schedule::grid;
  expect_error_naming(make(o), "options.cuda.schedule");
  o.cuda.schedule = crisp::Schedule::automatic;
  o.cuda.ping_pong = crisp::PingPong::on;
  expect_error_naming(make(o), "options.cuda.ping_pong");
  o.cuda.ping_pong = crisp::PingPong::automatic;
  o.cuda.gqa_packing = crisp::GqaPacking::pack;
  expect_error_naming(make(o), "options.cuda.gqa_packing");
  // A CUDA kernel choice on the CPU backend.
  o = {};
  o.backend = crisp::Backend::cpu;
  o.cuda.kernel = crisp::Kernel::hopper;
  expect_error_naming(make(o), "options.cuda");
  // The config is validated too.
  crisp::Config bad = config;
  bad.alpha = -1.0;
  expect_error_naming([&] { crisp::Attention a(bad); }, "alpha");
}

TEST(AttentionObject, BackendMustMatchTheViews) {
  crisp::Workload w = crisp::make_workload(crisp_test::workload_spec(1, 1, 16, {200}, test_seed()));
  crisp::Options on_cuda;
  on_cuda.backend = crisp::Backend::cuda;
  crisp::Attention attention(crisp::Config::from_preset("crisp"), on_cuda);
  expect_error_naming([&] { attention.plan(w.q_view(), w.k_view()); }, "q");
  EXPECT_FALSE(attention.planned());
  // The free functions take the same option.
  expect_error_naming([&] { crisp::plan(w.q_view(), w.k_view(), crisp::Config::from_preset("crisp"), {}, on_cuda); },
                      "q");
}

using crisp_test::ScopedEnv;

TEST(AttentionObject, KernelOverrideStandsInForAutomaticOnly) {
  crisp::CudaOptions automatic;
  {
    ScopedEnv unset("CRISP_KERNEL", nullptr);
    EXPECT_EQ(crisp::detail::resolve_kernel_override(automatic).kernel, crisp::Kernel::automatic);
  }
  {
    ScopedEnv portable("CRISP_KERNEL", "portable");
    EXPECT_EQ(crisp::detail::resolve_kernel_override(automatic).kernel, crisp::Kernel::portable);
    // A Hopper setting is dropped with the portable kernel the override picks.
    crisp::CudaOptions grid;
    grid.schedule = crisp::Schedule::grid;
    EXPECT_EQ(crisp::detail::resolve_kernel_override(grid).schedule, crisp::Schedule::automatic);
    // An explicit choice wins over the variable.
    crisp::CudaOptions hopper;
    hopper.kernel = crisp::Kernel::hopper;
    hopper.schedule = crisp::Schedule::grid;
    const crisp::CudaOptions resolved = crisp::detail::resolve_kernel_override(hopper);
    EXPECT_EQ(resolved.kernel, crisp::Kernel::hopper);
    EXPECT_EQ(resolved.schedule, crisp::Schedule::grid);
  }
  {
    ScopedEnv hopper("CRISP_KERNEL", "hopper");
    EXPECT_EQ(crisp::detail::resolve_kernel_override(automatic).kernel, crisp::Kernel::hopper);
  }
  {
    ScopedEnv bad("CRISP_KERNEL", "fastest");
    expect_error_naming([&] { crisp::detail::resolve_kernel_override(automatic); }, "CRISP_KERNEL");
  }
}

}  // namespace
