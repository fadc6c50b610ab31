// tests/test_readme_example.cpp — the C++ example of README.md, compiled and run.
//
// The code between the readme-example markers is the README's example verbatim; the second test
// checks that README.md still contains exactly this text, so the two cannot drift apart.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

// readme-example-begin
#include <cstdio>
#include <vector>

#include "crisp/crisp.h"
#include "crisp/workload.h"

// Plans and runs CRISP sparse attention on one sequence; returns the plan.
crisp::Plan run_example(std::vector<float>& out, std::vector<float>& lse) {
  // Input: the structured synthetic workload (your own buffers work the same way).
  crisp::WorkloadSpec spec;  // 8 query heads, 2 KV heads, d = 128
  spec.seq_lens = {2048};
  crisp::Workload workload = crisp::make_workload(spec);
  crisp::TensorView q = workload.q_view();  // [Hq, n, d] float32
  crisp::TensorView k = workload.k_view();  // [Hkv, n, d]
  crisp::TensorView v = workload.v_view();  // [Hkv, n, d]

  const int64_t heads = q.heads(), n = q.tokens(), d = q.dim();
  out.resize(heads * n * d);
  lse.resize(heads * n);
  auto out_view = crisp::TensorView::contiguous(out.data(), crisp::DType::f32, heads, n, d);
  auto lse_view = crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, heads, n);

  crisp::Config config = crisp::Config::from_preset("crisp");
  config.set("alpha", "1.5");  // any parameter of the spec, by name

  crisp::Plan plan = crisp::plan(q, k, config);  // per head: route, blocks, density
  for (const crisp::HeadPlan& head : plan.sequences[0].heads) {
    std::printf("%-5s C_struct %.3f  density %.3f\n", crisp::to_string(head.route),
                head.c_struct, head.density);
  }
  crisp::attend(q, k, v, plan, out_view, lse_view);  // O [Hq, n, d], LSE [Hq, n]
  return plan;
}
// readme-example-end

namespace {

std::string read_text(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// README.md and this file in the source tree (CRISP_SOURCE_DIR: tests/CMakeLists.txt), not through
// __FILE__, which is relative to the build directory under Ninja or ccache's base_dir.
std::string readme_path() { return std::string(CRISP_SOURCE_DIR) + "/README.md"; }
std::string this_file_path() { return std::string(CRISP_SOURCE_DIR) + "/tests/test_readme_example.cpp"; }

}  // namespace

TEST(ReadmeExample, RunsAndProducesAWellFormedPlanAndFiniteOutputs) {
  std::vector<float> out, lse;
  const crisp::Plan plan = run_example(out, lse);
  ASSERT_EQ(plan.sequences.size(), 1u);
  EXPECT_EQ(plan.sequences[0].heads.size(), 8u);
  EXPECT_NO_THROW(plan.check_well_formed());
  EXPECT_GT(plan.density(), 0.0);
  EXPECT_LE(plan.density(), 1.0);
  EXPECT_EQ(plan.config.alpha, 1.5);
  for (float x : out) ASSERT_TRUE(std::isfinite(x));
  for (float x : lse) ASSERT_TRUE(std::isfinite(x));
}

TEST(ReadmeExample, ReadmeShowsThisExactCode) {
  const std::string source = read_text(this_file_path());
  const std::string begin_marker = "// readme-example-begin\n", end_marker = "// readme-example-end";
  const std::size_t begin = source.find(begin_marker);
  const std::size_t end = source.find(end_marker);
  ASSERT_NE(begin, std::string::npos);
  ASSERT_NE(end, std::string::npos);
  const std::string example = source.substr(begin + begin_marker.size(), end - begin - begin_marker.size());
  const std::string readme = read_text(readme_path());
  ASSERT_FALSE(readme.empty()) << "cannot read " << readme_path();
  EXPECT_NE(readme.find(example), std::string::npos)
      << "README.md's C++ example differs from tests/test_readme_example.cpp";
}
