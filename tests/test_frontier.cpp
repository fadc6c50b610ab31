// tests/test_frontier.cpp — the frontier harness (`crisp eval pareto`): sweep specs, the splits
// file, the split prose haystacks, the top-mass recall, and a resumable run on captures.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "crisp/error.h"
#include "crisp/npy.h"
#include "crisp/workload.h"
#include "eval/frontier.h"
#include "eval/json_file.h"
#include "eval/splits.h"
#include "eval/sweep.h"
#include "test_util.h"

namespace ce = crisp::eval;

namespace {

// The source tree (eval/splits.json; data/ holds the QA prompts).
std::filesystem::path source_dir() { return CRISP_SOURCE_DIR; }

using crisp_test::error_of;

TEST(Sweep, CartesianProductLastKnobFastest) {
  const ce::Sweep sweep = ce::parse_sweep("crisp:alpha=0.5,1,2;rho=1.5,2.2");
  ASSERT_EQ(sweep.knobs.size(), 2u);
  const std::vector<ce::FrontierPoint> points = ce::expand_sweeps({sweep, ce::parse_sweep("dense")});
  ASSERT_EQ(points.size(), 7u);
  EXPECT_EQ(points[0].name, "crisp:alpha=0.5:rho=1.5");
  EXPECT_EQ(points[1].name, "crisp:alpha=0.5:rho=2.2");
  EXPECT_EQ(points[5].name, "crisp:alpha=2:rho=2.2");
  EXPECT_DOUBLE_EQ(points[5].config.alpha, 2.0);
  EXPECT_DOUBLE_EQ(points[5].config.rho, 2.2);
  EXPECT_EQ(points[6].name, "dense");
  EXPECT_TRUE(points[6].config.dense);
  // A repeated point is kept once.
  EXPECT_EQ(ce::expand_sweeps({ce::parse_sweep("flexprefill:gamma=0.9"), ce::parse_sweep("flexprefill:gamma=0.9")}).size(), 1u);
}

TEST(Sweep, ErrorsNameTheArgumentAndTheBadPart) {
  struct Case {
    std::string spec, part;
  };
  for (const Case& c : std::vector<Case>{{"nosuch:alpha=1", "nosuch"},
                                         {"crisp:alpha", "'alpha'"},
                                         {"crisp:alpha=", "alpha="},
                                         {"crisp:alpha=1,,2", "alpha=1,,2"},
                                         {"crisp:bogus_knob=1", "bogus_knob"},
                                         {"crisp:alpha=abc", "alpha=abc"},
                                         {"crisp:alpha=1;alpha=2", "given twice"},
                                         {"crisp:", "nothing after"},
                                         {":alpha=1", "no policy"}}) {
    const std::string message = error_of([&] { ce::parse_sweep(c.spec); });
    EXPECT_NE(message.find("--sweep"), std::string::npos) << c.spec << " -> " << message;
    EXPECT_NE(message.find(c.part), std::string::npos) << c.spec << " -> " << message;
  }
}

TEST(Sweep, FileOfStringsAndObjects) {
  const std::filesystem::path dir = crisp_test::temp_dir();
  crisp_test::write_bytes(dir / "sweep.json",
                          R"(["dense", {"policy": "flexprefill", "knobs": {"gamma": [0.9, 0.95], "tau": ["0.1"]}}])");
  const std::vector<ce::FrontierPoint> points = ce::expand_sweeps(ce::load_sweep_file((dir / "sweep.json").string()));
  ASSERT_EQ(points.size(), 3u);
  EXPECT_EQ(points[1].name, "flexprefill:gamma=0.9:tau=0.1");
  EXPECT_DOUBLE_EQ(points[2].config.gamma, 0.95);
  crisp_test::write_bytes(dir / "bad.json", R"([{"policy": "crisp", "knobs": {"alpha": ["x"]}}])");
  const std::string message = error_of([&] { ce::load_sweep_file((dir / "bad.json").string()); });
  EXPECT_NE(message.find("--sweep-file"), std::string::npos) << message;
  EXPECT_NE(message.find("alpha=x"), std::string::npos) << message;
}

TEST(Splits, TheFixedFileLoads) {
  const ce::EvalSplits splits = ce::load_splits((source_dir() / "eval" / "splits.json").string());
  const ce::NiahSplit& tuning = splits.niah_split("tuning", "--split");
  const ce::NiahSplit& test = splits.niah_split("test", "--split");
  EXPECT_NE(tuning.seed, test.seed);
  for (double d : tuning.depths) EXPECT_EQ(std::count(test.depths.begin(), test.depths.end(), d), 0) << d;
  for (int64_t p : tuning.prose_prompts) {
    EXPECT_EQ(std::count(test.prose_prompts.begin(), test.prose_prompts.end(), p), 0) << p;
  }
  EXPECT_FALSE(splits.capture_split("test", "--split").empty());
  EXPECT_NE(error_of([&] { splits.niah_split("validation", "--split"); }).find("--split"), std::string::npos);
}

TEST(Splits, LoadErrorsNameTheFileAndTheEntry) {
  const std::filesystem::path dir = crisp_test::temp_dir();
  struct Case {
    std::string text, part;
  };
  const std::string good_test = R"("test": {"seed": 2, "seeds": 1, "depths": [0.5], "prose_prompts": [1]})";
  for (const Case& c : std::vector<Case>{
           {"{", "is not JSON"},
           {"[]", "no 'niah'"},
           {R"({"niah": {"tuning": {"seeds": 1, "depths": [0.5], "prose_prompts": [0]}, )" + good_test + "}}", "niah.tuning has no 'seed'"},
           {R"({"niah": {"tuning": {"seed": 1, "seeds": 0, "depths": [0.5], "prose_prompts": [0]}, )" + good_test + "}}", "niah.tuning.seeds"},
           {R"({"niah": {"tuning": {"seed": 1, "seeds": 1, "depths": [1.5], "prose_prompts": [0]}, )" + good_test + "}}", "1.5"},
           {R"({"niah": {"tuning": {"seed": 1, "seeds": 1, "depths": [0.5], "prose_prompts": []}, )" + good_test + "}}", "prose_prompts"},
           {R"({"niah": {)" + good_test + R"(}, "captures": {"test": [{"qa_index": 1}]}})", "max_tokens"}}) {
    crisp_test::write_bytes(dir / "splits.json", c.text);
    const std::string message = error_of([&] { ce::load_splits((dir / "splits.json").string(), "--splits"); });
    EXPECT_EQ(message.rfind("--splits", 0), 0u) << c.text << " -> " << message;
    EXPECT_NE(message.find(c.part), std::string::npos) << c.text << " -> " << message;
  }
  EXPECT_NE(error_of([&] { ce::load_splits((dir / "absent.json").string(), "--splits"); }).find("cannot open"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ce::load_splits("", "--splits"); }).find("--splits"), std::string::npos);
}

// Six prompts whose documents overlap across the splits (as RULER's qa prompts do): the test
// haystack keeps no paragraph of a tuning prompt, and each haystack only its own prompts' paragraphs.
TEST(Splits, ProseHaystacksShareNoParagraph) {
  const ce::EvalSplits splits = ce::load_splits((source_dir() / "eval" / "splits.json").string());
  std::vector<std::vector<std::string>> documents;
  for (int prompt = 0; prompt < 6; ++prompt) {
    std::vector<std::string> docs;
    for (int d = 0; d < 4; ++d) docs.push_back("Title " + std::to_string(prompt * 3 + d) + "\nText.");  // overlaps the next prompt
    docs.push_back("Common title\nIn every prompt.");
    documents.push_back(docs);
  }
  auto check = [&](const std::vector<std::vector<std::string>>& docs) {
    const std::vector<std::string> tuning = ce::split_prose_paragraphs(docs, splits, "tuning", "--split");
    const std::vector<std::string> test = ce::split_prose_paragraphs(docs, splits, "test", "--split");
    ASSERT_FALSE(test.empty());
    std::set<std::string> of_tuning_prompts, of_test_prompts;
    for (int64_t i : splits.niah_split("tuning", "--split").prose_prompts) of_tuning_prompts.insert(docs[i].begin(), docs[i].end());
    for (int64_t i : splits.niah_split("test", "--split").prose_prompts) of_test_prompts.insert(docs[i].begin(), docs[i].end());
    for (const std::string& p : test) {
      EXPECT_EQ(of_tuning_prompts.count(p), 0u) << p;
      EXPECT_EQ(of_test_prompts.count(p), 1u) << p;
      EXPECT_EQ(std::count(tuning.begin(), tuning.end(), p), 0) << p;
    }
    for (const std::string& p : tuning) EXPECT_EQ(of_tuning_prompts.count(p), 1u) << p;
    EXPECT_EQ(std::set<std::string>(tuning.begin(), tuning.end()).size(), tuning.size());
  };
  check(documents);
  // The real QA prompts (committed in data/).
  check(ce::load_qa_documents((source_dir() / "data" / "long_qa_prompts.json").string()));
  // An index past the file is an error naming the argument.
  EXPECT_NE(error_of([&] { ce::prose_paragraphs(documents, {9}, {}, "--split"); }).find("--split"), std::string::npos);
}

// Hand-made block masses: row 1 holds 0.7 in block 0 and 0.3 in block 1, so its top 90% are both
// blocks; row 2 holds 0.95 in block 2, so its top 90% is block 2 alone.
TEST(Frontier, TopMassRecallCountsTheHeaviestBlocksReachingTheShare) {
  const std::vector<double> masses = {1.0, 0, 0, 0.7, 0.3, 0, 0.03, 0.02, 0.95};
  crisp::HeadPlan all;
  all.row_ptr = {0, 1, 3, 6};
  all.col = {0, 0, 1, 0, 1, 2};
  EXPECT_DOUBLE_EQ(ce::top_mass_recall(masses, 3, all, 0.9), 1.0);
  crisp::HeadPlan some = all;  // row 1 drops block 1; row 2 drops block 1
  some.row_ptr = {0, 1, 2, 4};
  some.col = {0, 0, 0, 2};
  // top sets: {0}, {0, 1}, {2}: 4 blocks, of which 3 kept.
  EXPECT_DOUBLE_EQ(ce::top_mass_recall(masses, 3, some, 0.9), 0.75);
  EXPECT_NE(error_of([&] { ce::top_mass_recall(masses, 3, all, 1.5); }).find("top_mass_share"), std::string::npos);
}

// Block masses against a direct softmax: each query row's masses sum to its query count.
TEST(Frontier, BlockMassesSumToTheQueriesOfEachRow) {
  const int64_t n = 150, d = 8;
  std::vector<float> q = crisp_test::gaussian(crisp_test::test_seed(1), n * d * 2);
  std::vector<float> k = crisp_test::gaussian(crisp_test::test_seed(2), n * d);
  const crisp::TensorView qv = crisp::TensorView::contiguous(q.data(), crisp::DType::f32, 2, n, d);
  const crisp::TensorView kv = crisp::TensorView::contiguous(k.data(), crisp::DType::f32, 1, n, d);
  const std::vector<double> m = ce::block_masses(qv, kv, 1, 64, 0.0);
  ASSERT_EQ(m.size(), 9u);
  const double rows[3] = {64, 64, 22};
  for (int r = 0; r < 3; ++r) {
    EXPECT_NEAR(m[r * 3] + m[r * 3 + 1] + m[r * 3 + 2], rows[r], 1e-9) << r;
    for (int c = r + 1; c < 3; ++c) EXPECT_EQ(m[r * 3 + c], 0.0);  // causal
  }
}

#ifdef CRISP_CLI_PATH
std::string read_all(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// NOTE: 2048 tokens: at 512 (8 blocks of 64) crisp keeps every block at either alpha, so the
// frontier's density would not move.
constexpr int64_t kCaptureTokens = 2048;

// A capture directory in the format of `crisp-llama-eval capture` (meta.json, layer_LL_{q,k,v}.npy
// [heads, n, d]): two "layers", each the structured synthetic workload of its own seed.
std::filesystem::path write_capture(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  nlohmann::json files = nlohmann::json::array();
  for (int layer = 0; layer < 2; ++layer) {
    crisp::WorkloadSpec spec;
    spec.num_q_heads = 4;
    spec.num_kv_heads = 2;
    spec.head_dim = 64;
    spec.seq_lens = {kCaptureTokens};
    spec.seed = 40 + static_cast<uint64_t>(layer);
    const crisp::Workload w = crisp::make_workload(spec);
    const std::string prefix = "layer_0" + std::to_string(layer) + "_";
    crisp::write_npy((dir / (prefix + "q.npy")).string(), w.q.data(), {4, kCaptureTokens, 64});
    crisp::write_npy((dir / (prefix + "k.npy")).string(), w.k.data(), {2, kCaptureTokens, 64});
    crisp::write_npy((dir / (prefix + "v.npy")).string(), w.v.data(), {2, kCaptureTokens, 64});
    files.push_back({{"layer", layer}, {"q", prefix + "q.npy"}, {"k", prefix + "k.npy"}, {"v", prefix + "v.npy"}});
  }
  std::ofstream(dir / "meta.json") << nlohmann::json{{"tokens", kCaptureTokens}, {"files", files}}.dump();
  return dir;
}

// The captures frontier: a run stopped after one layer and re-run computes only the other and ends
// with the results of an uninterrupted run; a third run computes nothing; other settings on the
// same file are refused. Dense keeps everything, a larger alpha keeps fewer blocks, every measure
// is a share.
TEST(Frontier, CapturesModeResumesAndMeasures) {
  if (!std::filesystem::exists(CRISP_CLI_PATH)) GTEST_SKIP() << "crisp CLI not built";
  const std::filesystem::path dir = crisp_test::temp_dir();
  const std::string capture = write_capture(dir / "capture").string();
  auto pareto = [&](const std::string& json, const std::string& extra, const std::string& log) {
    const std::string cmd = std::string(CRISP_CLI_PATH) + " eval pareto --captures " + capture +
                            " --sweep 'crisp:uniform_alpha=0.5,4;block_size=64' --threads 2 --quiet --json " +
                            (dir / json).string() + " " + extra + " > " + (dir / log).string() + " 2>&1";
    return WEXITSTATUS(std::system(cmd.c_str()));
  };
  std::filesystem::remove(dir / "resumed.json");
  std::filesystem::remove(dir / "fresh.json");
  ASSERT_EQ(pareto("resumed.json", "--stop-after 1", "r1.log"), 0) << read_all(dir / "r1.log");
  nlohmann::json doc = read_json(dir / "resumed.json");
  EXPECT_FALSE(doc.at("complete").get<bool>());
  ASSERT_EQ(doc.at("runs").back().at("computed"), 1 * 3);  // 1 layer x (dense + 2 points)
  ASSERT_EQ(pareto("resumed.json", "", "r2.log"), 0) << read_all(dir / "r2.log");
  doc = read_json(dir / "resumed.json");
  EXPECT_TRUE(doc.at("complete").get<bool>());
  EXPECT_EQ(doc.at("runs").back().at("found"), 1 * 3);
  EXPECT_EQ(doc.at("runs").back().at("computed"), 1 * 3);
  ASSERT_EQ(pareto("resumed.json", "", "r3.log"), 0) << read_all(dir / "r3.log");
  EXPECT_EQ(read_json(dir / "resumed.json").at("runs").back().at("computed"), 0);

  ASSERT_EQ(pareto("fresh.json", "", "fresh.log"), 0) << read_all(dir / "fresh.log");
  const nlohmann::json fresh = read_json(dir / "fresh.json");
  EXPECT_EQ(fresh.at("rows"), doc.at("rows"));
  std::map<std::string, nlohmann::json> rows;
  for (const nlohmann::json& r : fresh.at("rows")) rows[r.at("point").get<std::string>()] = r;
  ASSERT_EQ(rows.size(), 3u) << fresh.at("rows").dump();
  EXPECT_DOUBLE_EQ(rows["dense"].at("density_mean").get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(rows["dense"].at("top_mass_recall_mean").get<double>(), 1.0);
  const nlohmann::json& a1 = rows["crisp:uniform_alpha=0.5:block_size=64"];
  const nlohmann::json& a4 = rows["crisp:uniform_alpha=4:block_size=64"];
  EXPECT_LT(a4.at("density_mean").get<double>(), a1.at("density_mean").get<double>());
  for (const nlohmann::json* r : {&a1, &a4}) {
    for (const char* key : {"recall_mean", "recall_min", "top_mass_recall_mean", "top_mass_recall_min"}) {
      EXPECT_GE(r->at(key).get<double>(), 0.0) << key;
      EXPECT_LE(r->at(key).get<double>(), 1.0) << key;
    }
  }

  // Other settings on the same file: refused, naming --json and the setting.
  EXPECT_EQ(pareto("resumed.json", "--top-mass-share 0.8", "other.log"), 2);
  const std::string log = read_all(dir / "other.log");
  EXPECT_NE(log.find("--json"), std::string::npos) << log;
  EXPECT_NE(log.find("top_mass_share"), std::string::npos) << log;
  // A bad sweep names --sweep and the part.
  const std::string bad = std::string(CRISP_CLI_PATH) + " eval pareto --captures " + capture + " --sweep 'crisp:alpah=1' --json " +
                          (dir / "bad.json").string() + " > " + (dir / "bad.log").string() + " 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(bad.c_str())), 2);
  EXPECT_NE(read_all(dir / "bad.log").find("--sweep"), std::string::npos) << read_all(dir / "bad.log");
  EXPECT_NE(read_all(dir / "bad.log").find("alpah"), std::string::npos) << read_all(dir / "bad.log");
}

// A capture's meta.json is checked entry by entry (a float layer ran as its integer part, a layer
// beyond int64 was recorded as -2^63, a repeated layer ran twice), and a --json naming one of a
// capture's files is refused (eval fidelity overwrote meta.json and the .npy files with its JSON);
// another file in the capture directory is fine.
TEST(Frontier, CaptureEntriesAndOutputsOutsideTheCapture) {
  if (!std::filesystem::exists(CRISP_CLI_PATH)) GTEST_SKIP() << "crisp CLI not built";
  const std::filesystem::path dir = crisp_test::temp_dir();
  const std::filesystem::path capture = write_capture(dir / "capture_checks");
  const nlohmann::json good = read_json(capture / "meta.json");
  for (const auto& [layer, part] : std::vector<std::pair<nlohmann::json, std::string>>{
           {1.5, "has layer 1.5"}, {-1, "has layer -1"}, {nlohmann::json::parse("1180591620717411303424"), "has layer"},
           {0, "lists layer 0 again"}}) {
    nlohmann::json meta = good;
    meta["files"][1]["layer"] = layer;
    std::ofstream(capture / "meta.json") << meta.dump();
    const std::string message = error_of([&] { ce::read_capture(capture.string(), "--captures"); });
    EXPECT_EQ(message.rfind("--captures: ", 0), 0u) << message;
    EXPECT_NE(message.find(part), std::string::npos) << layer.dump() << " -> " << message;
  }
  std::ofstream(capture / "meta.json") << good.dump();
  EXPECT_EQ(ce::read_capture(capture.string(), "--captures").layers.size(), 2u);
  for (const std::string command : {"eval fidelity --threads 1 --quiet", "eval pareto --threads 1 --quiet --sweep crisp"}) {
    for (const char* file : {"meta.json", "layer_01_k.npy"}) {
      const std::string inside = (capture / file).string();
      const std::string cmd = std::string(CRISP_CLI_PATH) + " " + command + " --captures " + capture.string() +
                              " --json " + inside + " > " + (dir / "inside.log").string() + " 2>&1";
      EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 2) << cmd;
      const std::string log = read_all(dir / "inside.log");
      EXPECT_NE(log.find("--json: '" + inside + "' is the --captures input file"), std::string::npos) << log;
    }
    EXPECT_EQ(read_json(capture / "meta.json"), good) << "the capture's meta.json was overwritten";
  }
  // A frontier beside its capture: accepted (one layer of dense, --stop-after 1).
  const std::string beside = (capture / "frontier.json").string();
  std::filesystem::remove(beside);
  const std::string cmd = std::string(CRISP_CLI_PATH) + " eval pareto --threads 2 --quiet --sweep crisp --stop-after 1 --captures " +
                          capture.string() + " --json " + beside + " > " + (dir / "beside.log").string() + " 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 0) << read_all(dir / "beside.log");
}
#endif

}  // namespace
