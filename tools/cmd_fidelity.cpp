// tools/cmd_fidelity.cpp — `crisp eval fidelity`: what each policy keeps of real attention maps.
//
// For every captured layer (see `crisp-llama-eval capture`) and query head: per policy the density, recall
// mean and minimum and relative output error against the dense run (spec §9) and the route; the
// C_struct and JSD statistics with the decisions of routing=cstruct and routing=jsd; then the
// calibration of tau_proxy (cstruct) and rho (cstruct_rel) against the JSD decisions, per
// sequence length and pooled over all lengths (src/eval/fidelity.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "crisp/npy.h"
#include "eval/fidelity.h"
#include "eval/json_file.h"
#include "io_util.h"
#include "progress.h"
#include "validators.h"

namespace {

namespace fs = std::filesystem;
namespace ev = crisp::eval;
using nlohmann::json;

struct FidelityArgs {
  std::vector<std::string> captures;
  std::string policies = "dense,crisp,flexprefill,minference";
  std::vector<std::string> routing_sets;  // key=value on the routing config (the crisp preset)
  std::string block_size;
  std::string layers = "all";
  std::vector<std::string> layouts;  // "L:H": layouts of these heads go into the JSON
  std::string json_path;
  int threads = 0;
  bool routing_only = false;
  bool quiet = false;
};

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> items;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, sep)) items.push_back(item);
  return items;
}

// NOTE: the grids of the agreement curves in the JSON (figures and tables). The best threshold
// itself comes from the exact sweep, not from these grids.
std::vector<double> tau_proxy_grid() {
  std::vector<double> g;
  for (int i = 0; i <= 100; ++i) g.push_back(i / 100.0);
  return g;
}
std::vector<double> rho_grid() {
  std::vector<double> g;  // 2^-2 .. 2^8 in steps of 2^(1/8)
  for (int i = -16; i <= 64; ++i) g.push_back(std::pow(2.0, i / 8.0));
  return g;
}

json sweep_to_json(const ev::ThresholdSweep& s) {
  json grid = json::array();
  for (const ev::SweepPoint& p : s.grid) grid.push_back({p.threshold, p.agreement});
  auto finite_or_null = [](double x) { return std::isfinite(x) ? json(x) : json(nullptr); };
  return {{"form", ev::to_string(s.form)},
          {"heads", s.samples},
          {"best_range", {finite_or_null(s.best_lo), finite_or_null(s.best_hi)}},
          {"best_threshold", s.best_threshold},
          {"best_agreement", s.best_agreement},
          {"grid", grid}};
}

double nan_to(double x, double fallback) { return std::isfinite(x) ? x : fallback; }
json number_or_null(double x) { return std::isfinite(x) ? json(x) : json(nullptr); }

struct PolicySummary {
  double density_sum = 0, recall_mean_sum = 0, recall_min = 1.0, rel_error_sum = 0, rel_error_max = 0;
  int64_t heads = 0, vs = 0, routed = 0;
  json to_json() const {
    const double k = heads ? static_cast<double>(heads) : 1.0;
    return {{"heads", heads},
            {"density_mean", density_sum / k},
            {"recall_mean", recall_mean_sum / k},
            {"recall_min", recall_min},
            {"rel_error_mean", rel_error_sum / k},
            {"rel_error_max", rel_error_max},
            {"vs_share", routed ? json(static_cast<double>(vs) / routed) : json(nullptr)}};
  }
  void add(const ev::PolicyHeadMetrics& m) {
    ++heads;
    density_sum += m.density;
    recall_mean_sum += m.recall_mean;
    recall_min = std::min(recall_min, m.recall_min);
    rel_error_sum += m.rel_error;
    rel_error_max = std::max(rel_error_max, m.rel_error);
    if (m.route != crisp::Route::dense) {
      ++routed;
      vs += m.route == crisp::Route::vs;
    }
  }
};

json layout_to_json(const crisp::HeadPlan& head, int32_t num_blocks) {
  json rows = json::array();
  for (int32_t r = 0; r < num_blocks; ++r)
    rows.push_back(std::vector<int32_t>(head.col.begin() + head.row_ptr[r], head.col.begin() + head.row_ptr[r + 1]));
  return {{"route", crisp::to_string(head.route)},
          {"density", head.density},
          {"vertical", head.vertical},
          {"slash", head.slash},
          {"rows", rows}};
}

void run_fidelity(const FidelityArgs& args) {
  // The output before the (long) evaluation: an unwritable path fails now, not after it.
  crisp_cli::require_writable("--json", args.json_path);
  crisp_cli::require_not_capture_file("--json", args.json_path, args.captures);
  // Policies.
  std::vector<ev::PolicySpec> policies;
  for (const std::string& name : args.routing_only ? std::vector<std::string>{} : split(args.policies, ',')) {
    // A preset, or a preset with overrides (PRESET:key=value[:key=value...]), as in `crisp eval niah`.
    crisp::Config c = crisp_cli::config_of_policy_spec(name, "--policies");
    if (!args.block_size.empty()) {
      // --block is every policy's block size: a policy that sets its own would run at --block's
      // under its own name.
      if (name.find(":block_size=") != std::string::npos)
        throw crisp::Error("--block", "is given with the policy '" + name + "', which sets its own block size",
                           "one of them (--block for every policy, or block_size in each policy)");
      c.set("block_size", args.block_size);
    }
    c.validate();
    policies.push_back({name, c});
  }
  if (policies.empty() && !args.routing_only)
    throw crisp::Error("--policies", "is empty", "a list such as dense,crisp (or --routing-only)");

  // The routing comparison: the crisp preset's statistics windows and thresholds (tau for jsd).
  crisp::Config routing = crisp::Config::from_preset("crisp");
  for (const std::string& kv : args.routing_sets) routing.set(kv);
  if (!args.block_size.empty()) routing.set("block_size", args.block_size);
  routing.validate();

  std::vector<std::pair<int64_t, int64_t>> layout_heads;
  for (const std::string& item : args.layouts) {
    for (const std::string& lh : split(item, ',')) {
      const auto parts = split(lh, ':');
      std::size_t u0 = 0, u1 = 0;
      long long l = -1, h = -1;
      try {
        if (parts.size() == 2) {
          l = std::stoll(parts[0], &u0);
          h = std::stoll(parts[1], &u1);
        }
      } catch (const std::exception&) {
        l = -1;
      }
      if (parts.size() != 2 || u0 != parts[0].size() || u1 != parts[1].size() || l < 0 || h < 0)
        throw crisp::Error("--layouts", "'" + lh + "' is not LAYER:HEAD", "e.g. 3:0,15:4");
      layout_heads.emplace_back(l, h);
    }
  }

  crisp::Options options;
  options.num_threads = args.threads;
  crisp_cli::Progress progress(!args.quiet);

  json captures_json = json::array();
  json layouts_json = json::array();
  std::vector<ev::RoutingSample> all_samples;
  std::map<int64_t, std::vector<ev::RoutingSample>> samples_by_length;
  std::map<int64_t, std::vector<std::string>> sources_by_length;

  for (size_t ci = 0; ci < args.captures.size(); ++ci) {
    const std::string& dir = args.captures[ci];
    const ev::Capture capture = ev::read_capture(dir, "--captures");
    const json& meta = capture.meta;
    if (!meta.contains("tokens") || capture.layers.empty())
      throw crisp::Error("--captures", "'" + dir + "/meta.json' lacks tokens or layers", "meta.json of 'crisp-llama-eval capture'");
    std::vector<int64_t> only;
    if (args.layers != "all") {
      for (const std::string& s : split(args.layers, ',')) {
        std::size_t used = 0;
        long long l = -1;
        try {
          l = std::stoll(s, &used);
        } catch (const std::exception&) {
        }
        if (used != s.size() || l < 0) throw crisp::Error("--layers", "'" + s + "' is not a layer index", "all or 0,5,29");
        only.push_back(l);
      }
    }
    std::vector<PolicySummary> summaries(policies.size());
    std::vector<crisp::Route> decisions_c, decisions_j;
    json layers_json = json::array();
    int64_t n = 0;
    for (const ev::CaptureLayer& f : capture.layers) {
      const int64_t layer = f.layer;
      if (!only.empty() && std::find(only.begin(), only.end(), layer) == only.end()) continue;
      crisp::NpyArray q = crisp::read_npy(f.q), k = crisp::read_npy(f.k), v = crisp::read_npy(f.v);
      const std::string where = "--captures " + dir + " layer " + std::to_string(layer);
      const crisp::TensorView qv = q.view(where + " q", 3), kv = k.view(where + " k", 3), vv = v.view(where + " v", 3);
      n = qv.tokens();
      progress.begin("fidelity " + dir + " layer " + std::to_string(layer) + " (n = " + std::to_string(n) + ")");
      const ev::LayerFidelity lf = ev::evaluate_layer(qv, kv, vv, policies, routing, options);
      progress.done();

      json heads_json = json::array();
      for (int64_t h = 0; h < lf.num_q_heads; ++h) {
        json head = {{"head", h}};
        if (!lf.routing.empty()) {
          const ev::RoutingSample& s = lf.routing[h];
          head["c_struct"] = number_or_null(s.c_struct);
          head["c_rel"] = number_or_null(ev::routing_statistic(s, ev::RoutingForm::relative, routing.w_sink, routing.w_local));
          head["jsd"] = number_or_null(s.jsd);
          head["route_cstruct"] = crisp::to_string(s.route_cstruct);
          head["route_jsd"] = crisp::to_string(s.route_jsd);
          decisions_c.push_back(s.route_cstruct);
          decisions_j.push_back(s.route_jsd);
        }
        json per_policy = json::object();
        for (size_t p = 0; p < policies.size(); ++p) {
          const ev::PolicyHeadMetrics& m = lf.metrics[p][h];
          summaries[p].add(m);
          per_policy[policies[p].name] = {{"route", crisp::to_string(m.route)},
                                          {"density", m.density},
                                          {"recall_mean", m.recall_mean},
                                          {"recall_min", m.recall_min},
                                          {"rel_error", m.rel_error}};
        }
        head["policies"] = per_policy;
        heads_json.push_back(head);
      }
      layers_json.push_back({{"layer", layer}, {"heads", heads_json}});
      for (const ev::RoutingSample& s : lf.routing) {
        all_samples.push_back(s);
        samples_by_length[n].push_back(s);
      }
      for (const auto& [l, h] : layout_heads) {
        if (l != layer || h >= lf.num_q_heads) continue;
        json entry = {{"capture", dir}, {"layer", l}, {"head", h}, {"tokens", n},
                      {"block_size", lf.plans.empty() ? routing.block_size : lf.plans.front().block_size}};
        if (!lf.routing.empty()) {
          entry["c_struct"] = number_or_null(lf.routing[h].c_struct);
          entry["jsd"] = number_or_null(lf.routing[h].jsd);
        }
        json per_policy = json::object();
        for (size_t p = 0; p < policies.size(); ++p) {
          const crisp::SequencePlan& seq = lf.plans[p].sequences.front();
          per_policy[policies[p].name] = layout_to_json(seq.heads[h], seq.num_blocks);
        }
        entry["policies"] = per_policy;
        layouts_json.push_back(entry);
      }
    }
    if (layers_json.empty()) throw crisp::Error("--layers", "selects no layer of " + dir, "layers present in the capture");
    sources_by_length[n].push_back(dir);
    json summary = json::object();
    for (size_t p = 0; p < policies.size(); ++p) summary[policies[p].name] = summaries[p].to_json();
    const double agree = decisions_c.empty() ? std::nan("") : ev::agreement(decisions_c, decisions_j);
    captures_json.push_back({{"dir", dir},
                             {"source", meta.value("source", json(nullptr))},
                             {"tokens", n},
                             {"summary", summary},
                             {"routing_agreement", number_or_null(agree)},
                             {"layers", layers_json}});

    std::printf("\n%s: %lld tokens, %zu layers\n", dir.c_str(), static_cast<long long>(n), layers_json.size());
    std::printf("  %-12s %8s %12s %11s %10s %9s\n", "policy", "density", "recall mean", "recall min", "rel error",
                "VS share");
    for (size_t p = 0; p < policies.size(); ++p) {
      const json s = summaries[p].to_json();
      std::printf("  %-12s %8.4f %12.5f %11.5f %10.5f %9s\n", policies[p].name.c_str(), s["density_mean"].get<double>(),
                  s["recall_mean"].get<double>(), s["recall_min"].get<double>(), s["rel_error_mean"].get<double>(),
                  s["vs_share"].is_null() ? "-" : std::to_string(s["vs_share"].get<double>()).substr(0, 5).c_str());
    }
    std::printf("  routing: cstruct (tau_proxy %.3g) agrees with jsd (tau %.3g) on %.1f%% of %zu heads\n",
                routing.tau_proxy, routing.tau, 100.0 * nan_to(agree, 0.0), decisions_c.size());
  }

  // Calibration: per length, and pooled over every length.
  json calibration = {{"w_sink", routing.w_sink}, {"w_local", routing.w_local}, {"jsd_tau", routing.tau},
                      {"block_size", routing.block_size}, {"config_tau_proxy", routing.tau_proxy},
                      {"config_rho", routing.rho}};
  if (all_samples.empty()) {
    calibration["note"] = "no routed heads (every capture is a short sequence): nothing to calibrate";
  } else {
    const auto tau_grid = tau_proxy_grid();
    const auto r_grid = rho_grid();
    const ev::ThresholdSweep pooled_abs =
        ev::sweep_threshold(all_samples, ev::RoutingForm::absolute, routing.w_sink, routing.w_local, tau_grid);
    const ev::ThresholdSweep pooled_rel =
        ev::sweep_threshold(all_samples, ev::RoutingForm::relative, routing.w_sink, routing.w_local, r_grid);
    json by_length = json::array();
    std::printf("\ncalibration against jsd routing (tau %.3g), w_sink %lld, w_local %lld:\n", routing.tau,
                static_cast<long long>(routing.w_sink), static_cast<long long>(routing.w_local));
    std::printf("  %7s %6s %8s | %-22s %6s | %-22s %6s | %11s %11s | %8s\n", "tokens", "heads", "jsd VS", "best tau_proxy",
                "agree", "best rho", "agree", "pooled tau", "pooled rho", "config");
    for (const auto& [len, samples] : samples_by_length) {
      const ev::ThresholdSweep a =
          ev::sweep_threshold(samples, ev::RoutingForm::absolute, routing.w_sink, routing.w_local, tau_grid);
      const ev::ThresholdSweep r =
          ev::sweep_threshold(samples, ev::RoutingForm::relative, routing.w_sink, routing.w_local, r_grid);
      int64_t jsd_vs = 0;
      std::vector<crisp::Route> dc, dj;
      for (const ev::RoutingSample& s : samples) {
        jsd_vs += s.route_jsd == crisp::Route::vs;
        dc.push_back(s.route_cstruct);
        dj.push_back(s.route_jsd);
      }
      const double at_pooled_abs = ev::agreement_at(samples, ev::RoutingForm::absolute, pooled_abs.best_threshold,
                                                    routing.w_sink, routing.w_local);
      const double at_pooled_rel = ev::agreement_at(samples, ev::RoutingForm::relative, pooled_rel.best_threshold,
                                                    routing.w_sink, routing.w_local);
      const double at_config = ev::agreement(dc, dj);
      by_length.push_back({{"tokens", len},
                           {"captures", sources_by_length[len]},
                           {"heads", samples.size()},
                           {"jsd_vs_share", static_cast<double>(jsd_vs) / samples.size()},
                           // What a constant decision (all VS or all PE) already agrees on.
                           {"majority_baseline", std::max(jsd_vs, static_cast<int64_t>(samples.size()) - jsd_vs) /
                                                     static_cast<double>(samples.size())},
                           {"absolute", sweep_to_json(a)},
                           {"relative", sweep_to_json(r)},
                           {"agreement_at_pooled_tau_proxy", at_pooled_abs},
                           {"agreement_at_pooled_rho", at_pooled_rel},
                           {"agreement_at_config_tau_proxy", number_or_null(at_config)}});
      char ra[64], rr[64];
      std::snprintf(ra, sizeof(ra), "%.4g (%.4g..%.4g]", a.best_threshold, a.best_lo, a.best_hi);
      std::snprintf(rr, sizeof(rr), "%.4g (%.4g..%.4g]", r.best_threshold, r.best_lo, r.best_hi);
      std::printf("  %7lld %6zu %7.1f%% | %-22s %5.1f%% | %-22s %5.1f%% | %10.1f%% %10.1f%% | %7.1f%%\n",
                  static_cast<long long>(len), samples.size(), 100.0 * jsd_vs / samples.size(), ra,
                  100.0 * a.best_agreement, rr, 100.0 * r.best_agreement, 100.0 * at_pooled_abs, 100.0 * at_pooled_rel,
                  100.0 * nan_to(at_config, 0.0));
    }
    const bool relative_better = pooled_rel.best_agreement > pooled_abs.best_agreement;
    calibration["by_length"] = by_length;
    calibration["pooled"] = {{"absolute", sweep_to_json(pooled_abs)}, {"relative", sweep_to_json(pooled_rel)}};
    calibration["better_form"] =
        pooled_rel.best_agreement == pooled_abs.best_agreement ? "tie" : (relative_better ? "cstruct_rel" : "cstruct");
    std::printf("  pooled over %lld heads: tau_proxy %.4g -> %.1f%%, rho %.4g -> %.1f%%; better form: %s\n",
                static_cast<long long>(pooled_abs.samples), pooled_abs.best_threshold, 100.0 * pooled_abs.best_agreement,
                pooled_rel.best_threshold, 100.0 * pooled_rel.best_agreement,
                calibration["better_form"].get<std::string>().c_str());
  }

  json policies_json = json::array();
  for (const ev::PolicySpec& p : policies) policies_json.push_back({{"name", p.name}, {"config", p.config.to_key_values()}});
  const json out = {{"policies", policies_json},
                    {"routing_config", routing.to_key_values()},
                    {"captures", captures_json},
                    {"calibration", calibration},
                    {"layouts", layouts_json}};
  crisp_cli::write_text_file("--json", args.json_path, out.dump(1) + "\n");
  std::printf("-> %s\n", args.json_path.c_str());
}

}  // namespace

void register_eval_fidelity(CLI::App& eval) {
  auto args = std::make_shared<FidelityArgs>();
  CLI::App* sub = eval.add_subcommand(
      "fidelity", "Per layer and head of captured real attention (crisp-llama-eval capture): density, recall, output "
                  "error and route of each policy against dense; C_struct vs JSD routing; calibration of "
                  "tau_proxy and rho against the JSD decisions");
  sub->add_option("--captures", args->captures, "Capture directories written by 'crisp-llama-eval capture'")
      ->required()
      ->expected(1, -1);
  sub->add_option("--policies", args->policies,
                  "Policies to evaluate, comma-separated: presets, or a preset with overrides as "
                  "PRESET:key=value[:key=value...] (e.g. crisp:routing=cstruct_rel:rho=2.2)")
      ->capture_default_str();
  sub->add_option("--set", args->routing_sets,
                  "Override a parameter of the routing comparison (the crisp preset), e.g. tau=0.1 or "
                  "w_local=256 (repeatable)")
      ->type_name("KEY=VALUE");
  sub->add_option("--block", args->block_size, "Block size B of every policy: 64 or 128 (default 128)");
  sub->add_option("--layers", args->layers, "Layers to evaluate: all or a list such as 0,5,29")->capture_default_str();
  sub->add_option("--layouts", args->layouts, "Also write the block layouts of these heads (LAYER:HEAD, ...)");
  sub->add_option("--json", args->json_path, "Output JSON file")->required();
  crisp_cli::add_threads_option(*sub, args->threads);
  sub->add_flag("--routing-only", args->routing_only,
                "Only the routing comparison and the calibration (no policy runs, no attention)");
  sub->add_flag("--quiet", args->quiet, "No progress lines on stderr");
  sub->callback([args] { run_fidelity(*args); });
}
