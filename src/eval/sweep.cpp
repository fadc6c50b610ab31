// src/eval/sweep.cpp — see sweep.h.
#include "eval/sweep.h"

#include <cstdint>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "crisp/error.h"
#include "eval/json_file.h"

namespace crisp {
namespace eval {
namespace {

using nlohmann::json;

std::vector<std::string> split_on(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, separator)) parts.push_back(part);
  if (!text.empty() && text.back() == separator) parts.emplace_back();
  return parts;
}

std::string trimmed(const std::string& s) {
  const std::size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// The preset's Config, or an error naming `argument` and the sweep.
Config preset_config(const std::string& policy, const std::string& where, const std::string& argument) {
  try {
    return Config::from_preset(policy);
  } catch (const Error& e) {
    std::string names;
    for (const std::string& n : Config::preset_names()) names += (names.empty() ? "" : ", ") + n;
    throw Error(argument, where + ": unknown policy '" + policy + "'", "one of " + names);
  }
}

// Checks that each value of each knob is accepted by Config::set on the preset.
void check_values(const Sweep& sweep, const std::string& where, const std::string& argument) {
  const Config base = preset_config(sweep.policy, where, argument);
  std::set<std::string> seen;
  for (const auto& [key, values] : sweep.knobs) {
    if (key.empty()) throw Error(argument, where + ": a knob has no name", "KNOB=V1,V2,...");
    if (!seen.insert(key).second) throw Error(argument, where + ": knob '" + key + "' is given twice", "each knob once");
    if (values.empty()) throw Error(argument, where + ": knob '" + key + "' has no values", "KNOB=V1,V2,...");
    for (const std::string& value : values) {
      Config probe = base;
      try {
        probe.set(key, value);
      } catch (const Error& e) {
        throw Error(argument, where + ": '" + key + "=" + value + "' is rejected (" + e.what() + ")",
                    "a knob of Config::set (crisp plan --help) with a valid value");
      }
    }
  }
}

}  // namespace

Sweep parse_sweep(const std::string& text, const std::string& argument) {
  const std::string where = "'" + text + "'";
  const std::string expected = "POLICY or POLICY:KNOB=V1,V2[;KNOB=V1,...] (e.g. crisp:alpha=0.5,1;rho=2.2)";
  Sweep sweep;
  const std::size_t colon = text.find(':');
  sweep.policy = trimmed(text.substr(0, colon));
  if (sweep.policy.empty()) throw Error(argument, where + " names no policy", expected);
  if (colon != std::string::npos) {
    const std::string rest = text.substr(colon + 1);
    if (trimmed(rest).empty()) throw Error(argument, where + " has nothing after ':'", expected);
    for (const std::string& part : split_on(rest, ';')) {
      const std::size_t eq = part.find('=');
      if (eq == std::string::npos) throw Error(argument, where + ": '" + part + "' is not KNOB=V1,V2,...", expected);
      std::vector<std::string> values;
      for (const std::string& v : split_on(part.substr(eq + 1), ',')) {
        const std::string value = trimmed(v);
        if (value.empty()) throw Error(argument, where + ": '" + part + "' has an empty value", expected);
        values.push_back(value);
      }
      sweep.knobs.emplace_back(trimmed(part.substr(0, eq)), values);
    }
  }
  check_values(sweep, where, argument);
  return sweep;
}

std::vector<Sweep> load_sweep_file(const std::string& path, const std::string& argument) {
  const std::string expected =
      "a JSON list of sweep strings or {\"policy\": P, \"knobs\": {\"KNOB\": [values]}} objects";
  const json data = read_json_file(path, argument, expected);
  if (!data.is_array() || data.empty()) throw Error(argument, "'" + path + "' is not a non-empty list", expected);
  std::vector<Sweep> sweeps;
  for (std::size_t i = 0; i < data.size(); ++i) {
    const json& entry = data[i];
    const std::string where = "'" + path + "' entry " + std::to_string(i);
    if (entry.is_string()) {
      sweeps.push_back(parse_sweep(entry.get<std::string>(), argument + " (" + where + ")"));
      continue;
    }
    if (!entry.is_object() || !entry.contains("policy") || !entry["policy"].is_string()) {
      throw Error(argument, where + " is " + entry.dump(), expected);
    }
    Sweep sweep;
    sweep.policy = entry["policy"].get<std::string>();
    if (entry.contains("knobs")) {
      if (!entry["knobs"].is_object()) throw Error(argument, where + ": knobs is " + entry["knobs"].dump(), expected);
      for (const auto& [key, values] : entry["knobs"].items()) {
        std::vector<std::string> texts;
        for (const json& v : values.is_array() ? values : json::array({values})) {
          if (v.is_string()) texts.push_back(v.get<std::string>());
          else if (v.is_number() || v.is_boolean()) texts.push_back(v.dump());
          else throw Error(argument, where + ": knob '" + key + "' has value " + v.dump(), "numbers or strings");
        }
        sweep.knobs.emplace_back(key, texts);
      }
    }
    check_values(sweep, where, argument);
    sweeps.push_back(sweep);
  }
  return sweeps;
}

std::vector<FrontierPoint> expand_sweeps(const std::vector<Sweep>& sweeps, const std::string& argument) {
  // NOTE: far above any frontier measured (tens to a few hundred points), far below what fills
  // memory before the first point runs (10^8 points grew to 15 GB).
  constexpr uint64_t kMaxPoints = 100000;
  uint64_t total = 0;
  for (const Sweep& sweep : sweeps) {
    uint64_t product = 1;
    for (const auto& knob : sweep.knobs)
      if (__builtin_mul_overflow(product, static_cast<uint64_t>(knob.second.size()), &product)) product = UINT64_MAX;
    total = product > kMaxPoints ? product : total + product;
    if (total > kMaxPoints)
      throw Error(argument, "sweeps " + (product == UINT64_MAX ? std::string("more than 2^64") : std::to_string(total)) +
                                " points",
                  "at most " + std::to_string(kMaxPoints) + " points in all (fewer values per knob, or several runs)");
  }
  std::vector<FrontierPoint> points;
  std::set<std::string> names;
  for (const Sweep& sweep : sweeps) {
    // Odometer over the knobs' value lists, the last knob fastest.
    std::vector<std::size_t> at(sweep.knobs.size(), 0);
    while (true) {
      FrontierPoint point;
      point.policy = sweep.policy;
      point.name = sweep.policy;
      point.config = Config::from_preset(sweep.policy);
      for (std::size_t k = 0; k < sweep.knobs.size(); ++k) {
        const std::string& key = sweep.knobs[k].first;
        const std::string& value = sweep.knobs[k].second[at[k]];
        point.knobs.emplace_back(key, value);
        point.name += ":" + key + "=" + value;
        point.config.set(key, value);
      }
      try {
        point.config.validate();
      } catch (const Error& e) {
        throw Error(argument, "point '" + point.name + "' is not a valid configuration (" + e.what() + ")",
                    "knob values that fit together");
      }
      if (names.insert(point.name).second) points.push_back(std::move(point));
      std::size_t k = sweep.knobs.size();
      while (k > 0 && ++at[k - 1] == sweep.knobs[k - 1].second.size()) at[--k] = 0;
      if (k == 0) break;
    }
  }
  return points;
}

}  // namespace eval
}  // namespace crisp
