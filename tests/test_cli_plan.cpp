// tests/test_cli_plan.cpp — `crisp plan --q Q.npy --k K.npy --policy P --set ... --json OUT`
// follows the spec: the JSON's selected block sets equal the independent oracle's, for every
// preset and a set of --set combinations, on the structured workload and on random inputs
// (float32 and float16 .npy). The library-level grid (test_plan_oracle.cpp) covers many more
// combinations; this checks the command-line path end to end (parsing, --block, JSON writing).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "crisp/crisp.h"
#include "crisp/npy.h"
#include "crisp/workload.h"
#include "oracle.h"
#include "test_util.h"

namespace {

using crisp_test::seed_trace;
using crisp_test::test_seed;

bool cli_available() {
#ifdef CRISP_CLI_PATH
  return std::filesystem::exists(CRISP_CLI_PATH);
#else
  return false;
#endif
}

// Runs `crisp plan` and returns the parsed JSON (fails the test on a non-zero exit).
nlohmann::json run_plan(const std::string& q, const std::string& k, const std::string& args, const std::string& json_path) {
  const std::string cmd = std::string(CRISP_CLI_PATH) + " plan --q " + q + " --k " + k + " --json " + json_path + " " + args +
                          " > " + json_path + ".log 2>&1";
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd;
  std::ifstream in(json_path);
  if (rc != 0 || !in) return nlohmann::json();
  return nlohmann::json::parse(in);
}

std::vector<int32_t> ints(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

void expect_json_matches(const nlohmann::json& plan, const std::vector<oracle::HeadResult>& ref, const std::string& context) {
  ASSERT_TRUE(plan.contains("heads")) << context;
  ASSERT_EQ(plan["heads"].size(), ref.size()) << context;
  for (size_t h = 0; h < ref.size(); ++h) {
    const auto& got = plan["heads"][h];
    const auto& want = ref[h];
    const std::string where = context + " head " + std::to_string(h);
    EXPECT_EQ(got["route"].get<std::string>(), crisp::to_string(want.route)) << where;
    EXPECT_EQ(ints(got["vertical"]), want.vertical) << where;
    EXPECT_EQ(ints(got["slash"]), want.slash) << where;
    EXPECT_EQ(ints(got["row_ptr"]), want.row_ptr) << where;
    EXPECT_EQ(ints(got["col"]), want.col) << where;
    EXPECT_NEAR(got["density"].get<double>(), want.density, 1e-12) << where;
    if (want.route == crisp::Route::dense) {
      EXPECT_TRUE(got["c_struct"].is_null()) << where;
    } else {
      ASSERT_TRUE(got["c_struct"].is_number()) << where;
      EXPECT_NEAR(got["c_struct"].get<double>(), want.c_struct, 1e-9) << where;
    }
  }
}

// (preset, extra CLI arguments, the same settings for the oracle's config)
struct CliCase {
  const char* policy;
  std::vector<std::string> sets;
  int block;  // 0: the preset's
};

std::vector<CliCase> cli_cases() {
  return {
      {"crisp", {}, 0},
      {"crisp", {}, 64},
      {"flexprefill", {"min_budget=256"}, 0},
      {"flexprefill", {}, 64},
      {"minference", {"vertical_tokens=100", "slash_tokens=300"}, 64},
      {"minference", {}, 0},
      {"dense", {}, 0},
      {"crisp", {"routing=jsd", "vs_budget=cumulative", "slash_cover=single"}, 64},
      {"crisp", {"routing=cstruct_rel", "rho=2", "alpha=2"}, 0},
      {"crisp", {"routing=cstruct", "tau_proxy=0.9", "pe_gamma=0.7", "min_budget=200"}, 64},
      {"crisp", {"routing=none", "alpha=0.5", "max_budget=300"}, 128},
      {"crisp", {"routing=cstruct", "w_sink=64", "w_local=32", "tau_proxy=0.1", "softmax_scale=0.15"}, 64},
      {"flexprefill", {"tau=0.3", "gamma=0.8", "min_budget=0", "slash_cover=exact"}, 128},
      {"crisp", {"routing=none", "vs_floor=uniform", "uniform_alpha=2"}, 0},
      {"crisp", {"vs_floor=max", "uniform_alpha=0.5", "alpha=1.5"}, 64},
      {"crisp", {"routing=cstruct", "tau_proxy=0.9", "pe_rule=floor", "pe_alpha=2"}, 64},
  };
}

void run_cases(const std::string& q_path, const std::string& k_path, oracle::Planner& op, const std::string& dir) {
  int index = 0;
  for (const CliCase& c : cli_cases()) {
    std::string args = std::string("--policy ") + c.policy + " --precision f64";
    crisp::Config cfg = crisp::Config::from_preset(c.policy);
    for (const auto& s : c.sets) {
      args += " --set " + s;
      cfg.set(s);
    }
    if (c.block) {
      args += " --block " + std::to_string(c.block);
      cfg.block_size = c.block;
    }
    const std::string json_path = dir + "/plan" + std::to_string(index++) + ".json";
    nlohmann::json plan = run_plan(q_path, k_path, args, json_path);
    if (plan.is_null()) continue;
    EXPECT_EQ(plan["block_size"].get<int>(), cfg.block_size) << args;
    // The JSON's config lists every setting as given.
    for (const auto& set : c.sets) {
      const std::string key = set.substr(0, set.find('=')), value = set.substr(set.find('=') + 1);
      ASSERT_TRUE(plan["config"].contains(key)) << args << ": no config." << key;
      EXPECT_EQ(plan["config"][key].get<std::string>(), value) << args;
    }
    expect_json_matches(plan, op.plan(cfg, 1e-12)[0], args);
  }
}

TEST(CliPlan, StructuredWorkloadMatchesOracle) {
  if (!cli_available()) GTEST_SKIP() << "the crisp command is not built (build target crisp_cli)";
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  crisp::WorkloadSpec spec = crisp_test::workload_spec(4, 2, 32, {1100}, seed);
  crisp::Workload w = crisp::make_workload(spec);
  const std::string dir = crisp_test::temp_dir().string();
  crisp::write_npy(dir + "/Q.npy", w.q.data(), {4, w.total_tokens, 32});
  crisp::write_npy(dir + "/K.npy", w.k.data(), {2, w.total_tokens, 32});
  oracle::Planner op(w.q, w.k, 4, 2, w.total_tokens, 32);
  run_cases(dir + "/Q.npy", dir + "/K.npy", op, dir);
}

TEST(CliPlan, RandomFloat16NpyMatchesOracleOnConvertedValues) {
  if (!cli_available()) GTEST_SKIP() << "the crisp command is not built (build target crisp_cli)";
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  const int64_t hq = 2, hkv = 1, n = 900, d = 16;
  std::vector<float> q = crisp_test::gaussian(seed, static_cast<size_t>(hq * n * d), 1.5);
  std::vector<float> k = crisp_test::gaussian(seed + 1, static_cast<size_t>(hkv * n * d), 1.5);
  // float16 files written by hand (the library writes float32 only); the oracle sees the
  // converted values.
  auto write_f16 = [](const std::string& path, std::vector<float>& x, int64_t h, int64_t t, int64_t dd) {
    std::vector<uint16_t> bits(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      bits[i] = crisp_test::float_to_half(x[i]);
      x[i] = crisp_test::half_to_float(bits[i]);
    }
    const std::string dict = "{'descr': '<f2', 'fortran_order': False, 'shape': (" + std::to_string(h) + ", " +
                             std::to_string(t) + ", " + std::to_string(dd) + "), }";
    crisp_test::write_bytes(path, crisp_test::npy_bytes(dict, std::string(reinterpret_cast<const char*>(bits.data()), bits.size() * 2)));
  };
  const std::string dir = crisp_test::temp_dir().string();
  write_f16(dir + "/Q.npy", q, hq, n, d);
  write_f16(dir + "/K.npy", k, hkv, n, d);
  oracle::Planner op(q, k, hq, hkv, n, d);
  run_cases(dir + "/Q.npy", dir + "/K.npy", op, dir);
}


// `crisp attend` end to end on a chunk (n_q < n_k, unaligned, GQA): O and LSE against the float64
// oracle, float32 files by default and float64 files with --precision f64 (the reference the
// command can now hand out unrounded).
TEST(CliAttend, ChunkMatchesOracleInBothPrecisions) {
  if (!cli_available()) GTEST_SKIP() << "the crisp command is not built (build target crisp_cli)";
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  const int64_t hq = 4, hkv = 2, n_q = 77, n_k = 300, d = 32;
  const std::vector<float> q = crisp_test::gaussian(seed, static_cast<size_t>(hq * n_q * d), 1.0);
  const std::vector<float> k = crisp_test::gaussian(seed + 1, static_cast<size_t>(hkv * n_k * d), 1.0);
  const std::vector<float> v = crisp_test::gaussian(seed + 2, static_cast<size_t>(hkv * n_k * d), 1.0);
  const std::string dir = crisp_test::temp_dir().string();
  crisp::write_npy(dir + "/Q.npy", q.data(), {hq, n_q, d});
  crisp::write_npy(dir + "/K.npy", k.data(), {hkv, n_k, d});
  crisp::write_npy(dir + "/V.npy", v.data(), {hkv, n_k, d});
  const oracle::Attention want =
      oracle::attend_chunks(oracle::Tensor::from_floats(q, hq, n_q, d), oracle::Tensor::from_floats(k, hkv, n_k, d),
                            oracle::Tensor::from_floats(v, hkv, n_k, d), {0, n_q}, {0, n_k}, 64,
                            1.0 / std::sqrt(static_cast<double>(d)), nullptr);
  for (const char* precision : {"f32", "f64"}) {
    const bool f64 = std::string(precision) == "f64";
    const std::string out = dir + "/O_" + precision + ".npy", lse = dir + "/L_" + precision + ".npy";
    const std::string cmd = std::string(CRISP_CLI_PATH) + " attend --q " + dir + "/Q.npy --k " + dir + "/K.npy --v " +
                            dir + "/V.npy --out " + out + " --lse " + lse + " --policy dense --threads 1 --precision " +
                            precision + " > " + out + ".log 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    crisp::NpyArray o = crisp::read_npy(out), l = crisp::read_npy(lse);
    EXPECT_EQ(o.dtype, f64 ? crisp::DType::f64 : crisp::DType::f32) << precision;
    EXPECT_EQ(l.dtype, o.dtype) << precision;
    ASSERT_EQ(o.shape, (std::vector<int64_t>{hq, n_q, d})) << precision;
    ASSERT_EQ(l.shape, (std::vector<int64_t>{hq, n_q})) << precision;
    const auto at = [](const crisp::NpyArray& a, size_t i) {
      double x;
      if (a.dtype == crisp::DType::f64) {
        std::memcpy(&x, a.bytes.data() + i * 8, 8);
      } else {
        float f;
        std::memcpy(&f, a.bytes.data() + i * 4, 4);
        x = f;
      }
      return x;
    };
    // NOTE: the tolerances of tests/chunk_reference.h (output_tolerance): 1e-11 in float64 (the
    // same sums in another order), 1e-5 in float32 (rounded logits and partial sums).
    const double tol = f64 ? 1e-11 : 1e-5;
    double worst = 0.0;
    for (size_t i = 0; i < want.out.data.size(); ++i)
      worst = std::max(worst, std::fabs(at(o, i) - want.out.data[i]) / std::max(1.0, std::fabs(want.out.data[i])));
    for (size_t i = 0; i < want.lse.size(); ++i)
      worst = std::max(worst, std::fabs(at(l, i) - want.lse[i]) / std::max(1.0, std::fabs(want.lse[i])));
    EXPECT_LE(worst, tol) << precision;
  }
}

// A failed output leaves none behind: O was written before the LSE's write failed (/dev/full) and
// is removed; an output that existed before the run is left as it was when its own open fails.
TEST(CliAttend, FailedOutputLeavesNoPartialSet) {
  if (!cli_available()) GTEST_SKIP() << "the crisp command is not built (build target crisp_cli)";
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this system";
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  const std::vector<float> x = crisp_test::gaussian(seed, 2 * 40 * 16, 1.0);
  const std::string dir = crisp_test::temp_dir().string();
  crisp::write_npy(dir + "/X.npy", x.data(), {2, 40, 16});
  const std::string out = dir + "/O_full.npy";
  std::filesystem::remove(out);
  const std::string cmd = std::string(CRISP_CLI_PATH) + " attend --q " + dir + "/X.npy --k " + dir + "/X.npy --v " + dir +
                          "/X.npy --out " + out + " --lse /dev/full --threads 1 > " + out + ".log 2>&1";
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc)) << cmd;
  EXPECT_EQ(WEXITSTATUS(rc), 2) << cmd;
  EXPECT_FALSE(std::filesystem::exists(out)) << "O was left behind after the LSE failed";
  std::ifstream log(out + ".log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("--lse /dev/full: write failed"), std::string::npos) << text;
}

}  // namespace
