// src/eval/frontier_file.cpp — see frontier_file.h.
#include "eval/frontier_file.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "crisp/error.h"
#include "eval/json_file.h"

namespace crisp {
namespace eval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

}  // namespace

FrontierFile FrontierFile::open(const std::string& path, const json& settings, const std::string& argument) {
  FrontierFile file;
  file.path_ = path;
  file.argument_ = argument;
  std::error_code ec;
  if (!path.empty() && fs::exists(path, ec)) {
    const std::string expected = "a frontier JSON of 'crisp eval pareto' made with the same settings, or a new path";
    file.doc_ = read_json_file(path, argument, expected);
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
  const json* dense = find_point(kDensePoint);
  json rows = json::array();
  for (const json& point : doc_["points"]) {
    struct Row {
      int64_t units = 0, correct = 0, dense_correct = 0, both_correct = 0, heads = 0;
      int64_t density_unknown = 0;  // NIAH units recorded with a null density (not measured)
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
        if (r.at("density").is_null()) {
          ++row.density_unknown;
        } else {
          row.density += r.at("density").get<double>();
        }
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
                    {"mean_density", row.density_unknown ? json(nullptr) : json(row.density / row.units)}});
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

}  // namespace eval
}  // namespace crisp
