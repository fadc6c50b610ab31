// tests/test_structured_frontier.cpp — the structured-workload frontier (`crisp eval pareto
// --structured`): the workload's heads without local structure, the needle-block metric, the
// output error of the last queries against an independent float64 computation, the structured
// split, and a resumable run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <unistd.h>
#include <filesystem>
#include <string>
#include <vector>

#include "crisp/crisp.h"
#include "crisp/error.h"
#include "crisp/workload.h"
#include "eval/frontier.h"
#include "eval/splits.h"
#include "eval/structured_frontier.h"
#include "test_util.h"

namespace ce = crisp::eval;

namespace {

crisp::WorkloadSpec small_spec(uint64_t seed, int64_t n) {
  crisp::WorkloadSpec spec;
  spec.num_q_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 32;
  spec.seq_lens = {n};
  spec.seed = seed;
  return spec;
}

using crisp_test::error_of;

// Independent float64 output of query i of head h over the keys `keep(j)` says yes to.
template <typename Keep>
std::vector<double> reference_row(const crisp::Workload& w, int64_t h, int64_t i, Keep keep) {
  const int64_t n = w.total_tokens, d = w.spec.head_dim, kv = h / (w.spec.num_q_heads / w.spec.num_kv_heads);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> logits;
  std::vector<int64_t> keys;
  for (int64_t j = 0; j <= i; ++j) {
    if (!keep(j)) continue;
    double s = 0.0;
    for (int64_t x = 0; x < d; ++x) s += static_cast<double>(w.q[(h * n + i) * d + x]) * w.k[(kv * n + j) * d + x];
    logits.push_back(s * scale);
    keys.push_back(j);
  }
  double top = -1e300, z = 0.0;
  for (double l : logits) top = std::max(top, l);
  std::vector<double> out(static_cast<std::size_t>(d), 0.0);
  for (std::size_t e = 0; e < keys.size(); ++e) {
    const double p = std::exp(logits[e] - top);
    z += p;
    for (int64_t x = 0; x < d; ++x) out[static_cast<std::size_t>(x)] += p * w.v[(kv * n + keys[e]) * d + x];
  }
  for (double& o : out) o /= z;
  return out;
}

}  // namespace

TEST(Workload, HeadsWithoutLocalStructureCarryNoPositionalCode) {
  crisp::WorkloadSpec spec = small_spec(3, 512);
  spec.num_q_heads = 8;
  spec.diffuse_head_share = 0.25;
  spec.no_local_head_share = 0.5;
  const crisp::Workload w = crisp::make_workload(spec);
  int diffuse = 0, plain = 0;
  for (int64_t h = 0; h < 8; ++h) {
    EXPECT_FALSE(w.head_is_diffuse[h] && w.head_has_no_local[h]) << h;
    diffuse += w.head_is_diffuse[h];
    plain += w.head_has_no_local[h];
  }
  EXPECT_EQ(diffuse, 2);
  EXPECT_EQ(plain, 4);
  // The same seed without the knob: the diffuse heads are the same ones (one permutation).
  crisp::WorkloadSpec base = spec;
  base.no_local_head_share = 0.0;
  const crisp::Workload wb = crisp::make_workload(base);
  EXPECT_EQ(wb.head_is_diffuse, w.head_is_diffuse);
  // A head without local structure: its queries differ from the structured version of the head
  // (the positional code is gone), K and V are unchanged.
  EXPECT_EQ(w.k, wb.k);
  EXPECT_EQ(w.v, wb.v);
  const int64_t n = 512, d = 32;
  for (int64_t h = 0; h < 8; ++h) {
    const bool same = std::equal(w.q.begin() + h * n * d, w.q.begin() + (h + 1) * n * d, wb.q.begin() + h * n * d);
    EXPECT_EQ(same, !w.head_has_no_local[h]) << "head " << h;
  }
  spec.no_local_head_share = 0.8;  // 0.25 + 0.8 > 1
  EXPECT_NE(error_of([&] { crisp::make_workload(spec); }).find("no_local_head_share"), std::string::npos);
}

TEST(Workload, SetFieldParsesAndNamesTheArgument) {
  crisp::WorkloadSpec spec;
  crisp::set_workload_field(spec, "background_scale=2.5", "--workload-set");
  crisp::set_workload_field(spec, "num_q_heads=16", "--workload-set");
  EXPECT_EQ(spec.background_scale, 2.5);
  EXPECT_EQ(spec.num_q_heads, 16);
  EXPECT_NE(error_of([&] { crisp::set_workload_field(spec, "noise=1", "--workload-set"); }).find("--workload-set"),
            std::string::npos);
  EXPECT_NE(error_of([&] { crisp::set_workload_field(spec, "num_q_heads=1.5", "--workload-set"); }).find("an integer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { crisp::set_workload_field(spec, "background_scale", "--workload-set"); }).find("'='"),
            std::string::npos);
  EXPECT_NE(error_of([&] { crisp::set_workload_field(spec, "sink_strength=x", "--workload-set"); }).find("a number"),
            std::string::npos);
}

TEST(StructuredFrontier, NeedleBlocksKeptCountsEveryRowFromTheNeedleOn) {
  crisp::Workload w = crisp::make_workload(small_spec(5, 1024));
  const crisp::Plan dense = crisp::plan(w.q_view(), w.k_view(), crisp::Config::from_preset("dense"));
  for (std::size_t h = 0; h < 4; ++h) {
    const double kept = ce::needle_blocks_kept(dense, w)[h];
    if (w.head_is_diffuse[h]) EXPECT_TRUE(std::isnan(kept)) << h;
    else EXPECT_EQ(kept, 1.0) << h;
  }
  // Drop the first needle block of KV head 0 from the last row of every head: exactly one pair of
  // each structured head of that KV head is lost.
  crisp::Plan cut = dense;
  const int64_t nb = w.needle_positions[0].front() / cut.block_size;
  crisp::SequencePlan& seq = cut.sequences.front();
  int64_t pairs = 0;
  for (int64_t p : w.needle_positions[0]) pairs += seq.num_blocks - p / cut.block_size;
  ASSERT_GT(seq.num_blocks - 1, nb);  // the last row is not the needle's own (diagonal) block
  for (std::size_t h = 0; h < 2; ++h) {
    crisp::HeadPlan& head = seq.heads[h];
    const int32_t last = seq.num_blocks - 1;
    const auto begin = head.col.begin() + head.row_ptr[last];
    head.col.erase(std::find(begin, head.col.end(), static_cast<int32_t>(nb)));
    head.row_ptr[last + 1] -= 1;
    const double kept = ce::needle_blocks_kept(cut, w)[h];
    if (!w.head_is_diffuse[h]) EXPECT_DOUBLE_EQ(kept, 1.0 - 1.0 / static_cast<double>(pairs)) << h;
  }
}

TEST(StructuredFrontier, TailErrorMatchesAFloat64Reference) {
  crisp::Workload w = crisp::make_workload(small_spec(7, 640));
  crisp::Config dense_cfg = crisp::Config::from_preset("dense");
  dense_cfg.block_size = 64;
  const crisp::Plan dense = crisp::plan(w.q_view(), w.k_view(), dense_cfg);
  crisp::Config cfg = crisp::Config::from_preset("crisp");
  cfg.block_size = 64;
  cfg.min_budget = 0;  // a budget of 512 keys would keep every block of this short sequence
  const crisp::Plan sparse = crisp::plan(w.q_view(), w.k_view(), cfg);
  ASSERT_LT(sparse.density(), 1.0);
  const int64_t queries = 100;
  const auto errors = ce::tail_output_errors(w, {dense, sparse}, queries);
  for (int64_t h = 0; h < 4; ++h) {
    EXPECT_LT(errors[0][h], 1e-12) << "dense plan, head " << h;
    // The sparse plan's error from an independent computation over its kept keys.
    const crisp::HeadPlan& head = sparse.sequences.front().heads[h];
    double diff2 = 0.0, ref2 = 0.0;
    for (int64_t i = 640 - queries; i < 640; ++i) {
      const int32_t r = static_cast<int32_t>(i / 64);
      const auto full = reference_row(w, h, i, [](int64_t) { return true; });
      const auto kept = reference_row(w, h, i, [&](int64_t j) {
        return std::binary_search(head.col.begin() + head.row_ptr[r], head.col.begin() + head.row_ptr[r + 1],
                                  static_cast<int32_t>(j / 64));
      });
      for (std::size_t x = 0; x < full.size(); ++x) {
        diff2 += (kept[x] - full[x]) * (kept[x] - full[x]);
        ref2 += full[x] * full[x];
      }
    }
    EXPECT_NEAR(errors[1][h], std::sqrt(diff2 / ref2), 1e-9) << "head " << h;
  }
  EXPECT_NE(error_of([&] { ce::tail_output_errors(w, {dense}, 0); }).find("error_queries"), std::string::npos);
  EXPECT_NE(error_of([&] { ce::tail_output_errors(w, {dense}, 641); }).find("error_queries"), std::string::npos);
}

TEST(StructuredFrontier, TheSplitsFileHasDisjointStructuredSeeds) {
  const ce::EvalSplits splits = ce::load_splits((std::filesystem::path(CRISP_SOURCE_DIR) / "eval" / "splits.json").string());
  const auto& tuning = splits.structured_split("tuning", "--split");
  const auto& test = splits.structured_split("test", "--split");
  ASSERT_FALSE(tuning.empty());
  ASSERT_FALSE(test.empty());
  for (uint64_t s : tuning) EXPECT_EQ(std::count(test.begin(), test.end(), s), 0) << s;
  EXPECT_NE(error_of([&] { splits.structured_split("validation", "--split"); }).find("--split"), std::string::npos);
}

TEST(StructuredFrontier, ResumedRunRecordsEveryPointOnce) {
  const auto path = std::filesystem::temp_directory_path() / ("crisp_structured_" + std::to_string(::getpid()) + ".json");
  std::filesystem::remove(path);
  ce::StructuredFrontierSettings s;
  s.workload = small_spec(0, 512);
  s.workload.no_local_head_share = 0.25;
  s.lengths = {384, 512};
  s.seeds = {11};
  s.error_queries = 32;
  std::vector<ce::FrontierPoint> points = ce::expand_sweeps({ce::parse_sweep("crisp:uniform_alpha=0.5,1", "--sweep")}, "--sweep");
  const nlohmann::json settings = {{"mode", "structured"}};
  {
    ce::FrontierFile file = ce::FrontierFile::open(path.string(), settings, "--json");
    s.stop_after = 1;
    EXPECT_EQ(ce::run_structured_frontier(s, points, file, {}), 1);
    EXPECT_FALSE(file.document().at("complete").get<bool>());
  }
  ce::FrontierFile file = ce::FrontierFile::open(path.string(), settings, "--json");
  s.stop_after = 0;
  EXPECT_EQ(ce::run_structured_frontier(s, points, file, {}), 1);  // only the second length is left
  EXPECT_TRUE(file.document().at("complete").get<bool>());
  const auto& rows = file.document().at("rows");
  ASSERT_EQ(rows.size(), 6u);  // dense + 2 points, 2 lengths
  for (const auto& r : rows) {
    EXPECT_EQ(r.at("workloads").get<int64_t>(), 1);
    const double density = r.at("density_mean").get<double>();
    EXPECT_GT(density, 0.0);
    EXPECT_LE(density, 1.0);
    if (r.at("point") == "dense") {
      EXPECT_EQ(density, 1.0);
      EXPECT_EQ(r.at("needles_kept_mean").get<double>(), 1.0);
      EXPECT_LT(r.at("rel_error_max").get<double>(), 1e-12);
    }
    EXPECT_FALSE(r.at("density_no_local").is_null());
  }
  std::filesystem::remove(path);
}
