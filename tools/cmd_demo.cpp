// tools/cmd_demo.cpp — `crisp demo`: every preset on the structured workload, side by side.
//
// Runs the dense preset first (its O and LSE are the baseline of every comparison), then crisp,
// flexprefill and minference on the same inputs and the same backend, and prints one row per
// preset: density, needle blocks kept, recall, output error, VS share, plan and attention time,
// and the speedup over dense attention.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "validators.h"
#include "demo_backend.h"
#include "io_util.h"
#include "progress.h"
#include "workload_options.h"

namespace {

// NOTE: default --seq. Sized so the whole demo (workload, dense + three presets, comparisons)
// ends within a minute on a 2-core CPU: at 16384 tokens it took 15.8 s wall / 31 s CPU when
// pinned to 2 idle Xeon cores (`taskset -c 0,1 crisp demo --backend cpu`), and 39 s CPU on the
// shared 2-core development machine, so it fits the minute even on one free core; 32768 takes
// about four times as long.
constexpr int64_t kDefaultDemoSeq = 16384;

struct DemoArgs {
  crisp_cli::WorkloadOptions workload;
  std::string backend = "auto";
  int threads = 0;
  std::string json_path;
  bool quiet = false;
};

struct Row {
  std::string preset;
  double density = 0.0;
  double needles_kept = 0.0;  // share of (query block, needle block) pairs kept
  double recall_mean = 1.0;
  double recall_min = 1.0;
  double rel_error_mean = 0.0;
  double rel_error_max = 0.0;
  double vs_share = 0.0;
  bool any_routed = false;  // false when every head is dense (VS share is meaningless)
  double plan_ms = 0.0;
  double attention_ms = 0.0;
  double speedup = 1.0;
};

// Does layout row r of `head` contain key block `kb`?
bool row_has_block(const crisp::HeadPlan& head, int32_t r, int32_t kb) {
  const auto first = head.col.begin() + head.row_ptr[r];
  const auto last = head.col.begin() + head.row_ptr[r + 1];
  return std::binary_search(first, last, kb);
}

// Share of (query block r, needle block nb) pairs with r >= nb whose row r keeps nb, over every
// query head whose KV head owns the needle (one sequence).
double needle_blocks_kept(const crisp::Plan& plan, const crisp::Workload& workload) {
  const crisp::SequencePlan& seq = plan.sequences.front();
  const int64_t group = plan.num_q_heads / plan.num_kv_heads;
  int64_t pairs = 0, kept = 0;
  for (int64_t h = 0; h < plan.num_q_heads; ++h) {
    const crisp::HeadPlan& head = seq.heads[static_cast<std::size_t>(h)];
    for (int64_t position : workload.needle_positions[static_cast<std::size_t>(h / group)]) {
      const auto nb = static_cast<int32_t>(position / plan.block_size);
      for (int32_t r = nb; r < seq.num_blocks; ++r) {
        ++pairs;
        kept += row_has_block(head, r, nb) ? 1 : 0;
      }
    }
  }
  return pairs == 0 ? 1.0 : static_cast<double>(kept) / static_cast<double>(pairs);
}

// Any route other than dense?
bool has_routed_heads(const crisp::Plan& plan) {
  for (const auto& seq : plan.sequences)
    for (const auto& head : seq.heads)
      if (head.route != crisp::Route::dense) return true;
  return false;
}

void print_table(std::FILE* to, const std::vector<Row>& rows) {
  std::fprintf(to, "%-12s %8s %8s %8s %8s %9s %6s %9s %9s %8s\n", "preset", "density", "needles",
              "recall", "recall", "rel err", "VS", "plan", "attn", "speedup");
  std::fprintf(to, "%-12s %8s %8s %8s %8s %9s %6s %9s %9s %8s\n", "", "", "kept", "mean", "min", "mean",
              "heads", "ms", "ms", "vs dense");
  for (const Row& r : rows) {
    char vs[16];
    if (r.any_routed) std::snprintf(vs, sizeof vs, "%5.0f%%", 100.0 * r.vs_share);
    else std::snprintf(vs, sizeof vs, "%6s", "-");
    std::fprintf(to, "%-12s %7.1f%% %7.1f%% %8.4f %8.4f %9.2e %6s %9.1f %9.1f %7.2fx\n", r.preset.c_str(),
                100.0 * r.density, 100.0 * r.needles_kept, r.recall_mean, r.recall_min,
                r.rel_error_mean, vs, r.plan_ms, r.attention_ms, r.speedup);
  }
}

nlohmann::json rows_to_json(const std::vector<Row>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const Row& r : rows) {
    out.push_back({{"preset", r.preset},
                   {"density", r.density},
                   {"needle_blocks_kept", r.needles_kept},
                   {"recall_mean", r.recall_mean},
                   {"recall_min", r.recall_min},
                   {"rel_error_mean", r.rel_error_mean},
                   {"rel_error_max", r.rel_error_max},
                   {"vs_share", r.any_routed ? nlohmann::json(r.vs_share) : nlohmann::json(nullptr)},
                   {"plan_ms", r.plan_ms},
                   {"attention_ms", r.attention_ms},
                   {"speedup_vs_dense", r.speedup}});
  }
  return out;
}

void run_demo(const DemoArgs& args) {
  crisp_cli::check_workload_options(args.workload);
  crisp_cli::require_writable("--json", args.json_path);
  // With the JSON on standard output the table goes to stderr, so stdout stays one JSON document.
  std::FILE* const summary = crisp_cli::is_stdout_path(args.json_path) ? stderr : stdout;
  crisp_cli::Progress progress(!args.quiet);
  const crisp::WorkloadSpec spec = crisp_cli::make_workload_spec(args.workload);
  std::unique_ptr<crisp_cli::DemoBackend> backend =
      crisp_cli::make_demo_backend(args.backend, args.threads);

  progress.begin("generating the structured workload (n = " + std::to_string(args.workload.seq) +
                 ", seed " + std::to_string(args.workload.seed) + ")");
  crisp::Workload workload = crisp::make_workload(spec);
  progress.done();
  backend->load(workload);
  progress.note("backend: " + backend->description());

  std::vector<float> dense_out, dense_lse, out, lse;
  std::vector<Row> rows;

  // The baseline: the dense preset through the same plan + attend path as the others.
  Row dense;
  dense.preset = "dense";
  progress.begin("dense: plan + attention (the baseline)");
  const crisp::Plan dense_plan = backend->plan(crisp::Config::from_preset("dense"), &dense.plan_ms);
  backend->attend(dense_plan, dense_out, dense_lse, &dense.attention_ms);
  progress.done();
  dense.density = dense_plan.density();
  dense.needles_kept = needle_blocks_kept(dense_plan, workload);
  dense.any_routed = has_routed_heads(dense_plan);
  dense.vs_share = dense_plan.vs_share();
  dense.speedup = dense.attention_ms / (dense.plan_ms + dense.attention_ms);
  rows.push_back(dense);

  const int64_t heads = workload.spec.num_q_heads, tokens = workload.total_tokens,
                dim = workload.spec.head_dim;
  const auto as_out = [&](std::vector<float>& o) {
    return crisp::TensorView::contiguous(o.data(), crisp::DType::f32, heads, tokens, dim);
  };
  const auto as_lse = [&](std::vector<float>& l) {
    return crisp::TensorView::contiguous2d(l.data(), crisp::DType::f32, heads, tokens);
  };

  for (const char* preset : {"crisp", "flexprefill", "minference"}) {
    Row row;
    row.preset = preset;
    progress.begin(std::string(preset) + ": plan + attention");
    const crisp::Plan plan = backend->plan(crisp::Config::from_preset(preset), &row.plan_ms);
    backend->attend(plan, out, lse, &row.attention_ms);
    progress.done();

    const std::vector<crisp::HeadMetrics> metrics =
        crisp::compare(as_out(out), as_lse(lse), as_out(dense_out), as_lse(dense_lse));
    row.recall_min = 1.0;
    double recall_sum = 0.0, error_sum = 0.0;
    for (const crisp::HeadMetrics& m : metrics) {
      recall_sum += m.recall_mean;
      row.recall_min = std::min(row.recall_min, m.recall_min);
      error_sum += m.rel_error;
      row.rel_error_max = std::max(row.rel_error_max, m.rel_error);
    }
    const double count = metrics.empty() ? 1.0 : static_cast<double>(metrics.size());
    row.recall_mean = recall_sum / count;
    row.rel_error_mean = error_sum / count;
    row.density = plan.density();
    row.needles_kept = needle_blocks_kept(plan, workload);
    row.any_routed = has_routed_heads(plan);
    row.vs_share = plan.vs_share();
    row.speedup = dense.attention_ms / (row.plan_ms + row.attention_ms);
    rows.push_back(row);
  }

  std::fprintf(summary, "crisp demo: structured workload n = %lld, Hq = %lld, Hkv = %lld, d = %lld, seed %llu; "
              "backend %s\n\n",
              static_cast<long long>(tokens), static_cast<long long>(heads),
              static_cast<long long>(workload.spec.num_kv_heads), static_cast<long long>(dim),
              static_cast<unsigned long long>(workload.spec.seed), backend->description().c_str());
  print_table(summary, rows);
  std::fprintf(summary,
      "\nneedles kept: share of (query block, needle block) pairs whose needle block is computed.\n"
      "recall: exp(LSE_sparse - LSE_dense) per query (mean over heads of the per-head mean; min over\n"
      "all queries). rel err: ||O - O_dense||_F / ||O_dense||_F, mean over heads. speedup: dense\n"
      "attention ms / (plan ms + attention ms). minference is a block-level approximation of\n"
      "MInference's token-level pattern.\n");

  if (!args.json_path.empty()) {
    nlohmann::json doc = {
        {"workload",
         {{"n", tokens}, {"num_q_heads", heads}, {"num_kv_heads", workload.spec.num_kv_heads},
          {"head_dim", dim}, {"seed", workload.spec.seed}}},
        {"backend", backend->description()},
        {"rows", rows_to_json(rows)},
    };
    crisp_cli::write_text_file("--json", args.json_path, doc.dump(1) + "\n");
    progress.note("wrote " + args.json_path);
  }
}

}  // namespace

void register_demo_command(CLI::App& app) {
  auto args = std::make_shared<DemoArgs>();
  args->workload.seq = kDefaultDemoSeq;
  CLI::App* sub = app.add_subcommand(
      "demo", "Run dense, crisp, flexprefill and minference on the structured workload and "
              "compare them (density, needles kept, recall, error, time)");
  crisp_cli::add_workload_options(*sub, args->workload);
  sub->add_option("--backend", args->backend,
                  "auto (CUDA when built and a GPU is present, else CPU), cpu or cuda")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  crisp_cli::add_threads_option(*sub, args->threads);
  sub->add_option("--json", args->json_path, "Also write the table as JSON to this file ('-': standard output, the table then on stderr)");
  sub->add_flag("--quiet", args->quiet, "No progress lines on stderr");
  sub->callback([args] { run_demo(*args); });
}
