// src/eval/frontier.cpp — see frontier.h.
#include "eval/frontier.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <utility>

#include "crisp/npy.h"
#include "eval/fidelity.h"
#include "eval/niah_run.h"

namespace crisp {
namespace eval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kDense = "dense";

}  // namespace

void put_dense_first(std::vector<FrontierPoint>& points) {
  const auto it = std::find_if(points.begin(), points.end(), [](const FrontierPoint& p) { return p.name == kDense; });
  if (it == points.end()) {
    FrontierPoint dense;
    dense.name = dense.policy = kDense;
    dense.config = Config::from_preset(kDense);
    points.insert(points.begin(), dense);
  } else {
    std::rotate(points.begin(), it, it + 1);
  }
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

FrontierFile FrontierFile::open(const std::string& path, const json& settings, const std::string& argument) {
  FrontierFile file;
  file.path_ = path;
  file.argument_ = argument;
  std::error_code ec;
  if (!path.empty() && fs::exists(path, ec)) {
    const std::string expected = "a frontier JSON of 'crisp eval pareto' made with the same settings, or a new path";
    std::ifstream in(path, std::ios::binary);
    try {
      file.doc_ = json::parse(in);
    } catch (const json::exception& e) {
      throw Error(argument, "'" + path + "' exists and is not JSON (" + e.what() + ")", expected);
    }
    if (!file.doc_.is_object() || file.doc_.value("suite", "") != "frontier" || !file.doc_.contains("points") ||
        !file.doc_.contains("settings")) {
      throw Error(argument, "'" + path + "' exists and is not a frontier file", expected);
    }
    const json& old = file.doc_["settings"];
    for (const auto& [key, value] : settings.items()) {
      if (!old.contains(key) || old[key] != value) {
        throw Error(argument, "'" + path + "' was made with other settings (" + key + ": " +
                                  (old.contains(key) ? old[key].dump() : "absent") + ", now " + value.dump() + ")",
                    expected);
      }
    }
  } else {
    file.doc_ = {{"suite", "frontier"}, {"settings", settings}, {"points", json::array()}, {"runs", json::array()},
                 {"rows", json::array()}, {"complete", false}};
  }
  return file;
}

json* FrontierFile::find_point(const std::string& name) {
  for (json& p : doc_["points"]) {
    if (p.at("name") == name) return &p;
  }
  return nullptr;
}

const json* FrontierFile::find_point(const std::string& name) const {
  for (const json& p : doc_.at("points")) {
    if (p.at("name") == name) return &p;
  }
  return nullptr;
}

void FrontierFile::add_point(const FrontierPoint& point) {
  json knobs = json::object();
  for (const auto& [key, value] : point.knobs) knobs[key] = value;
  json config = json::object();
  for (const auto& [key, value] : point.config.to_key_values()) config[key] = value;
  json* existing = find_point(point.name);
  if (existing == nullptr) {
    doc_["points"].push_back({{"name", point.name}, {"policy", point.policy}, {"units", json::object()}});
    existing = &doc_["points"].back();
  }
  (*existing)["knobs"] = knobs;
  (*existing)["config"] = config;
}

bool FrontierFile::has(const std::string& point, const std::string& unit) const {
  const json* p = find_point(point);
  return p != nullptr && p->at("units").contains(unit);
}

void FrontierFile::record(const std::string& point, const std::string& unit, const json& result) {
  json* p = find_point(point);
  if (p == nullptr) throw Error("frontier", "point '" + point + "' was not added", "add_point first");
  (*p)["units"][unit] = result;
  ++computed_;
  if (!doc_["runs"].empty()) doc_["runs"].back()["computed"] = computed_;
}

void FrontierFile::begin_run() {
  computed_ = 0;
  int64_t already = 0;
  for (const json& p : doc_["points"]) already += static_cast<int64_t>(p.at("units").size());
  doc_["runs"].push_back({{"found", already}, {"computed", 0}});
}

void FrontierFile::save() {
  if (path_.empty()) return;
  const std::string temporary = path_ + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(argument_, "cannot write '" + temporary + "'", "a writable path");
    // Generated text may hold invalid UTF-8 (a token that ends inside a character): U+FFFD.
    out << doc_.dump(1, ' ', false, json::error_handler_t::replace) << '\n';
    out.close();
    if (!out) throw Error(argument_, "failed writing '" + temporary + "'", "a writable path with free space");
  }
  std::error_code ec;
  fs::rename(temporary, path_, ec);
  if (ec) throw Error(argument_, "cannot replace '" + path_ + "' (" + ec.message() + ")", "a writable path");
}

void FrontierFile::summarize() {
  const bool captures = doc_["settings"].value("mode", "") == "captures";
  if (doc_["settings"].value("mode", "") == "structured") return summarize_structured();
  const json* dense = find_point(kDense);
  json rows = json::array();
  for (const json& point : doc_["points"]) {
    struct Row {
      int64_t units = 0, correct = 0, dense_correct = 0, both_correct = 0, heads = 0;
      double density = 0, recall_mean = 0, recall_min = 1, top = 0, top_min = 1, error = 0, error_max = 0;
    };
    std::map<int64_t, Row> by_length;
    for (const auto& [unit, r] : point.at("units").items()) {
      Row& row = by_length[r.at("length").get<int64_t>()];
      ++row.units;
      if (captures) {
        const int64_t heads = r.at("heads").get<int64_t>();
        row.heads += heads;
        row.density += heads * r.at("density_mean").get<double>();
        row.recall_mean += heads * r.at("recall_mean").get<double>();
        row.recall_min = std::min(row.recall_min, r.at("recall_min").get<double>());
        row.top += heads * r.at("top_mass_recall_mean").get<double>();
        row.top_min = std::min(row.top_min, r.at("top_mass_recall_min").get<double>());
        row.error += heads * r.at("rel_error_mean").get<double>();
        row.error_max = std::max(row.error_max, r.at("rel_error_max").get<double>());
      } else {
        const bool correct = r.at("correct").get<bool>();
        row.correct += correct;
        row.density += r.at("density").get<double>();
        const bool dense_known = dense != nullptr && dense->at("units").contains(unit);
        if (dense_known && dense->at("units").at(unit).at("correct").get<bool>()) {
          ++row.dense_correct;
          row.both_correct += correct;
        }
      }
    }
    for (const auto& [length, row] : by_length) {
      json out = {{"point", point.at("name")}, {"policy", point.at("policy")}, {"knobs", point.at("knobs")},
                  {"length", length}};
      if (captures) {
        const double h = static_cast<double>(std::max<int64_t>(1, row.heads));
        out.update({{"layers", row.units},
                    {"heads", row.heads},
                    {"density_mean", row.density / h},
                    {"recall_mean", row.recall_mean / h},
                    {"recall_min", row.recall_min},
                    {"top_mass_recall_mean", row.top / h},
                    {"top_mass_recall_min", row.top_min},
                    {"rel_error_mean", row.error / h},
                    {"rel_error_max", row.error_max}});
      } else {
        out.update({{"samples", row.units},
                    {"correct", row.correct},
                    {"accuracy", static_cast<double>(row.correct) / row.units},
                    {"dense_correct", row.dense_correct},
                    {"kept_of_dense", row.dense_correct ? json(static_cast<double>(row.both_correct) / row.dense_correct)
                                                        : json(nullptr)},
                    {"mean_density", row.density / row.units}});
      }
      rows.push_back(out);
    }
  }
  doc_["rows"] = rows;
}

void FrontierFile::summarize_structured() {
  // Per point and length: means over the workloads (seeds); null-valued kinds (no such heads) skipped.
  json rows = json::array();
  const char* const mean_fields[] = {"density", "vs_share", "needles_kept_mean", "rel_error_mean",
                                     "density_structured", "density_no_local", "density_diffuse"};
  for (const json& point : doc_["points"]) {
    std::map<int64_t, std::vector<const json*>> by_length;
    for (const auto& [unit, r] : point.at("units").items()) by_length[r.at("length").get<int64_t>()].push_back(&r);
    for (const auto& [length, units] : by_length) {
      json out = {{"point", point.at("name")}, {"policy", point.at("policy")}, {"knobs", point.at("knobs")},
                  {"length", length}, {"workloads", units.size()}};
      for (const char* field : mean_fields) {
        double sum = 0.0;
        int64_t count = 0;
        for (const json* r : units) {
          if (r->at(field).is_null()) continue;
          sum += r->at(field).get<double>();
          ++count;
        }
        out[std::string(field) == "density" ? "density_mean" : field] = count ? json(sum / count) : json(nullptr);
      }
      double kept_min = 1.0, error_max = 0.0;
      bool any_kept = false;
      for (const json* r : units) {
        if (!r->at("needles_kept_min").is_null()) {
          kept_min = std::min(kept_min, r->at("needles_kept_min").get<double>());
          any_kept = true;
        }
        error_max = std::max(error_max, r->at("rel_error_max").get<double>());
      }
      out["needles_kept_min"] = any_kept ? json(kept_min) : json(nullptr);
      out["rel_error_max"] = error_max;
      rows.push_back(out);
    }
  }
  doc_["rows"] = rows;
}

int64_t run_niah_frontier(const model::LlamaModel& model, const model::Tokenizer& tokenizer,
                          const NiahFrontierSettings& settings, std::vector<FrontierPoint> points,
                          const std::vector<std::string>& prose, FrontierFile& file, const FrontierHooks& hooks) {
  put_dense_first(points);
  for (const FrontierPoint& p : points) file.add_point(p);
  file.begin_run();
  const NiahPrompter prompter(tokenizer);
  const NiahGridSettings& grid = settings.samples;
  const int64_t total = static_cast<int64_t>(grid.lengths.size() * grid.tasks.size() * grid.depths.size()) * grid.seeds;
  int64_t index = 0, computed_samples = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t length : grid.lengths) {
    const RopeChoice rope = choose_rope(grid.rope_scaling, length, model.hparams().n_ctx_train);
    for (NiahTask task : grid.tasks) {
      for (double depth : grid.depths) {
        for (int64_t replicate = 0; replicate < grid.seeds; ++replicate) {
          ++index;
          const uint64_t seed = grid.seed + static_cast<uint64_t>(replicate);
          const std::string id = niah_sample_id(task, length, depth, seed);
          std::vector<const FrontierPoint*> pending;
          for (const FrontierPoint& p : points) {
            if (!file.has(p.name, id)) pending.push_back(&p);
          }
          if (pending.empty()) continue;
          if (settings.stop_after > 0 && computed_samples >= settings.stop_after) {
            file.mark_complete(false);
            file.summarize();
            file.save();
            return computed_samples;
          }
          NiahSpec spec;
          spec.task = task;
          spec.length = length;
          spec.depth = depth;
          spec.seed = seed;
          const PreparedSample sample = prompter.prepare(spec, prose, grid.answer_prefix, grid.max_new_tokens);
          for (const FrontierPoint* p : pending) {
            model::RunOptions run = grid.run;
            run.attention = p->config;
            run.rope = rope.scaling;
            const NiahOutcome o = answer_niah(model, tokenizer, sample, run);
            file.record(p->name, id,
                        {{"task", to_string(task)}, {"length", length}, {"depth", depth}, {"seed", seed},
                         {"prompt_tokens", sample.prompt.size()}, {"correct", o.correct}, {"density", o.density},
                         {"ttft_s", o.ttft_s}, {"output", o.output}, {"stop", o.stop},
                         {"beyond_training", rope.beyond_training}});
            if (hooks.progress) {
              char line[512];
              std::snprintf(line, sizeof line, "[%lld/%lld] %s %-40s %s density %.3f (%.0f s)",
                            static_cast<long long>(index), static_cast<long long>(total), id.c_str(), p->name.c_str(),
                            o.correct ? "ok  " : "MISS", o.density, seconds_since(start));
              hooks.progress(line);
            }
          }
          ++computed_samples;
          file.summarize();
          file.save();
        }
      }
    }
  }
  file.mark_complete(true);
  file.summarize();
  file.save();
  return computed_samples;
}

std::vector<double> block_masses(const TensorView& q, const TensorView& k, int64_t head, int block_size, double scale) {
  if (q.dtype != DType::f32 || k.dtype != DType::f32 || q.device != Device::cpu || k.device != Device::cpu) {
    throw Error("q/k", "are not float32 CPU tensors", "float32 captures");
  }
  const int64_t n = q.tokens(), d = q.dim();
  const int64_t group = q.heads() / std::max<int64_t>(1, k.heads());
  const int64_t kv_head = head / std::max<int64_t>(1, group);
  const int64_t blocks = (n + block_size - 1) / block_size;
  const double s = scale > 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(d));
  const float* qd = static_cast<const float*>(q.data);
  const float* kd = static_cast<const float*>(k.data);
  std::vector<double> masses(static_cast<std::size_t>(blocks * blocks), 0.0);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t r = 0; r < blocks; ++r) {
    std::vector<double> scores(static_cast<std::size_t>(n));
    for (int64_t i = r * block_size; i < std::min(n, (r + 1) * block_size); ++i) {
      double top = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0.0;
        for (int64_t x = 0; x < d; ++x) dot += static_cast<double>(qd[q.offset(head, i, x)]) * kd[k.offset(kv_head, j, x)];
        scores[j] = dot * s;
        top = std::max(top, scores[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j <= i; ++j) sum += (scores[j] = std::exp(scores[j] - top));
      for (int64_t j = 0; j <= i; ++j) masses[static_cast<std::size_t>(r * blocks + j / block_size)] += scores[j] / sum;
    }
  }
  return masses;
}

double top_mass_recall(const std::vector<double>& masses, int32_t num_blocks, const HeadPlan& head, double share) {
  if (!(share > 0.0 && share <= 1.0)) throw Error("top_mass_share", "is " + std::to_string(share), "a share in (0, 1]");
  int64_t top_total = 0, top_kept = 0;
  std::vector<int32_t> order;
  for (int32_t r = 0; r < num_blocks; ++r) {
    const double* row = masses.data() + static_cast<std::size_t>(r) * num_blocks;
    order.resize(static_cast<std::size_t>(r) + 1);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    const double row_mass = std::accumulate(row, row + r + 1, 0.0);
    const auto kept_begin = head.col.begin() + head.row_ptr[r];
    const auto kept_end = head.col.begin() + head.row_ptr[r + 1];
    double covered = 0.0;
    for (int32_t c : order) {
      if (covered >= share * row_mass) break;
      covered += row[c];
      ++top_total;
      top_kept += std::binary_search(kept_begin, kept_end, c);
    }
  }
  return top_total ? static_cast<double>(top_kept) / static_cast<double>(top_total) : 1.0;
}

int64_t run_capture_frontier(const CaptureFrontierSettings& settings, std::vector<FrontierPoint> points,
                             FrontierFile& file, const FrontierHooks& hooks) {
  put_dense_first(points);
  for (const FrontierPoint& p : points) file.add_point(p);
  file.begin_run();
  const Config routing = Config::from_preset("crisp");
  int64_t computed_layers = 0;
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& dir : settings.captures) {
    const std::string meta_path = (fs::path(dir) / "meta.json").string();
    std::ifstream meta_in(meta_path);
    json meta;
    try {
      meta = json::parse(meta_in);
    } catch (const json::exception& e) {
      throw Error("--captures", "cannot read '" + meta_path + "' (" + e.what() + ")", "a directory of 'crisp capture'");
    }
    if (!meta.contains("files") || !meta["files"].is_array()) {
      throw Error("--captures", "'" + meta_path + "' lacks files", "meta.json of 'crisp capture'");
    }
    for (const json& f : meta["files"]) {
      const int64_t layer = f.at("layer").get<int64_t>();
      const std::string unit = dir + "#" + std::to_string(layer);
      std::vector<PolicySpec> pending;
      for (const FrontierPoint& p : points) {
        if (!file.has(p.name, unit)) pending.push_back({p.name, p.config});
      }
      if (pending.empty()) continue;
      if (settings.stop_after > 0 && computed_layers >= settings.stop_after) {
        file.mark_complete(false);
        file.summarize();
        file.save();
        return computed_layers;
      }
      const std::string where = "--captures " + dir + " layer " + std::to_string(layer);
      NpyArray q = read_npy((fs::path(dir) / f.at("q").get<std::string>()).string());
      NpyArray k = read_npy((fs::path(dir) / f.at("k").get<std::string>()).string());
      NpyArray v = read_npy((fs::path(dir) / f.at("v").get<std::string>()).string());
      const TensorView qv = q.view(where + " q"), kv = k.view(where + " k"), vv = v.view(where + " v");
      const LayerFidelity lf = evaluate_layer(qv, kv, vv, pending, routing, settings.options);
      // The true block masses, once per (head, block size) for every pending point.
      std::map<std::pair<int64_t, int>, std::vector<double>> masses;
      for (std::size_t p = 0; p < pending.size(); ++p) {
        const Plan& plan = lf.plans[p];
        const SequencePlan& seq = plan.sequences.front();
        double density = 0, recall = 0, recall_min = 1, top = 0, top_min = 1, error = 0, error_max = 0;
        for (int64_t h = 0; h < lf.num_q_heads; ++h) {
          const PolicyHeadMetrics& m = lf.metrics[p][static_cast<std::size_t>(h)];
          auto& mass = masses[{h, plan.block_size}];
          if (mass.empty()) mass = block_masses(qv, kv, h, plan.block_size, pending[p].config.softmax_scale);
          const double t = top_mass_recall(mass, seq.num_blocks, seq.heads[static_cast<std::size_t>(h)],
                                           settings.top_mass_share);
          density += m.density;
          recall += m.recall_mean;
          recall_min = std::min(recall_min, m.recall_min);
          top += t;
          top_min = std::min(top_min, t);
          error += m.rel_error;
          error_max = std::max(error_max, m.rel_error);
        }
        const double heads = static_cast<double>(lf.num_q_heads);
        file.record(pending[p].name, unit,
                    {{"capture", dir}, {"layer", layer}, {"length", lf.n}, {"heads", lf.num_q_heads},
                     {"density_mean", density / heads}, {"recall_mean", recall / heads}, {"recall_min", recall_min},
                     {"top_mass_recall_mean", top / heads}, {"top_mass_recall_min", top_min},
                     {"rel_error_mean", error / heads}, {"rel_error_max", error_max}});
      }
      ++computed_layers;
      if (hooks.progress) {
        char line[512];
        std::snprintf(line, sizeof line, "%s layer %lld (n = %lld): %zu points (%.0f s)", dir.c_str(),
                      static_cast<long long>(layer), static_cast<long long>(lf.n), pending.size(), seconds_since(start));
        hooks.progress(line);
      }
      file.summarize();
      file.save();
    }
  }
  file.mark_complete(true);
  file.summarize();
  file.save();
  return computed_layers;
}

}  // namespace eval
}  // namespace crisp
