// src/eval/splits.cpp — see splits.h.
#include "eval/splits.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "crisp/error.h"
#include "eval/json_file.h"
#include "eval/niah.h"

namespace crisp {
namespace eval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The split rules are chosen on; every other split is held out from it (see split_prose_paragraphs).
constexpr const char* kTuningSplit = "tuning";

const json& member(const json& object, const std::string& key, const std::string& where, const std::string& argument,
                   const std::string& expected) {
  if (!object.is_object() || !object.contains(key)) {
    throw Error(argument, where + " has no '" + key + "'", expected);
  }
  return object.at(key);
}

int64_t integer_at(const json& value, const std::string& where, const std::string& argument, int64_t minimum) {
  if (!value.is_number_integer() || value.get<int64_t>() < minimum) {
    throw Error(argument, where + " is " + value.dump(), "an integer >= " + std::to_string(minimum));
  }
  return value.get<int64_t>();
}

NiahSplit parse_niah_split(const json& entry, const std::string& where, const std::string& argument) {
  const std::string expected = "{seed, seeds, depths, prose_prompts}";
  NiahSplit split;
  split.seed = static_cast<uint64_t>(integer_at(member(entry, "seed", where, argument, expected), where + ".seed", argument, 0));
  split.seeds = integer_at(member(entry, "seeds", where, argument, expected), where + ".seeds", argument, 1);
  const json& depths = member(entry, "depths", where, argument, expected);
  if (!depths.is_array() || depths.empty()) throw Error(argument, where + ".depths is " + depths.dump(), "a non-empty list");
  for (const json& d : depths) {
    if (!d.is_number() || !(d.get<double>() >= 0.0 && d.get<double>() <= 1.0)) {
      throw Error(argument, where + ".depths holds " + d.dump(), "fractions in [0, 1]");
    }
    split.depths.push_back(d.get<double>());
  }
  const json& prompts = member(entry, "prose_prompts", where, argument, expected);
  if (!prompts.is_array() || prompts.empty()) {
    throw Error(argument, where + ".prose_prompts is " + prompts.dump(), "a non-empty list of QA prompt indices");
  }
  for (const json& p : prompts) split.prose_prompts.push_back(integer_at(p, where + ".prose_prompts[]", argument, 0));
  return split;
}

std::vector<CaptureItem> parse_capture_split(const json& entry, const std::string& where, const std::string& argument) {
  if (!entry.is_array()) throw Error(argument, where + " is " + entry.dump(), "a list of {qa_index, max_tokens}");
  std::vector<CaptureItem> items;
  for (const json& item : entry) {
    const std::string expected = "{qa_index, max_tokens}";
    CaptureItem c;
    c.qa_index = integer_at(member(item, "qa_index", where + "[]", argument, expected), where + "[].qa_index", argument, 0);
    c.max_tokens = integer_at(member(item, "max_tokens", where + "[]", argument, expected), where + "[].max_tokens", argument, 1);
    items.push_back(c);
  }
  return items;
}

std::vector<uint64_t> parse_structured_split(const json& entry, const std::string& where, const std::string& argument) {
  const json& seeds = member(entry, "seeds", where, argument, "{seeds: [workload seeds]}");
  if (!seeds.is_array() || seeds.empty()) throw Error(argument, where + ".seeds is " + seeds.dump(), "a non-empty list of seeds");
  std::vector<uint64_t> out;
  for (const json& s : seeds) out.push_back(static_cast<uint64_t>(integer_at(s, where + ".seeds[]", argument, 0)));
  return out;
}

template <typename Map>
const typename Map::mapped_type& named(const Map& map, const std::string& name, const std::string& what,
                                       const std::string& path, const std::string& argument) {
  const auto it = map.find(name);
  if (it != map.end()) return it->second;
  std::string names;
  for (const auto& [key, value] : map) names += (names.empty() ? "" : ", ") + key;
  throw Error(argument, "'" + path + "' has no " + what + " split '" + name + "'", "one of " + names);
}

}  // namespace

const NiahSplit& EvalSplits::niah_split(const std::string& name, const std::string& argument) const {
  return named(niah, name, "niah", path, argument);
}

const std::vector<CaptureItem>& EvalSplits::capture_split(const std::string& name, const std::string& argument) const {
  return named(captures, name, "captures", path, argument);
}

const std::vector<uint64_t>& EvalSplits::structured_split(const std::string& name, const std::string& argument) const {
  return named(structured, name, "structured", path, argument);
}

std::vector<std::string> EvalSplits::other_splits(const std::string& name) const {
  std::vector<std::string> others;
  for (const auto& [key, value] : niah) {
    if (key != name) others.push_back(key);
  }
  return others;
}

EvalSplits load_splits(const std::string& path, const std::string& argument) {
  const std::string expected = "a splits file like eval/splits.json ({niah: {tuning, test}, captures: {...}})";
  if (path.empty()) throw Error(argument, "no splits file found", expected + "; give --splits FILE");
  const json data = read_json_file(path, argument, expected);
  EvalSplits splits;
  splits.path = path;
  const json& niah = member(data, "niah", "'" + path + "'", argument, expected);
  if (!niah.is_object() || niah.empty()) throw Error(argument, "'" + path + "': niah is " + niah.dump(), expected);
  for (const auto& [name, entry] : niah.items()) {
    splits.niah[name] = parse_niah_split(entry, "'" + path + "': niah." + name, argument);
  }
  if (data.contains("captures")) {
    const json& captures = data.at("captures");
    if (!captures.is_object()) throw Error(argument, "'" + path + "': captures is " + captures.dump(), expected);
    for (const auto& [name, entry] : captures.items()) {
      splits.captures[name] = parse_capture_split(entry, "'" + path + "': captures." + name, argument);
    }
  }
  if (data.contains("structured")) {
    const json& structured = data.at("structured");
    if (!structured.is_object()) throw Error(argument, "'" + path + "': structured is " + structured.dump(), expected);
    for (const auto& [name, entry] : structured.items()) {
      splits.structured[name] = parse_structured_split(entry, "'" + path + "': structured." + name, argument);
    }
  }
  return splits;
}

std::string default_splits_path(const std::string& source_dir) {
  std::error_code ec;
  std::vector<fs::path> candidates;
  if (!source_dir.empty()) candidates.push_back(fs::path(source_dir) / "eval" / "splits.json");
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    candidates.push_back(exe.parent_path() / "eval" / "splits.json");
    candidates.push_back(exe.parent_path().parent_path() / "eval" / "splits.json");
  }
  for (const fs::path& candidate : candidates) {
    if (fs::is_regular_file(candidate, ec)) return candidate.string();
  }
  return "";
}

std::vector<std::vector<std::string>> load_qa_documents(const std::string& path, const std::string& argument) {
  const std::string expected = "a long_qa_prompts.json file: a list of {prompt, answer}";
  const json data = read_json_file(path, argument, expected);
  if (!data.is_array()) throw Error(argument, "'" + path + "' is not a JSON list", expected);
  std::vector<std::vector<std::string>> documents;
  for (const json& item : data) {
    if (!item.is_object() || !item.contains("prompt") || !item["prompt"].is_string()) {
      throw Error(argument, "an entry of '" + path + "' has no string 'prompt'", expected);
    }
    documents.push_back(qa_prompt_paragraphs(item["prompt"].get<std::string>()));
  }
  return documents;
}

std::vector<std::string> prose_paragraphs(const std::vector<std::vector<std::string>>& documents,
                                          const std::vector<int64_t>& include, const std::vector<int64_t>& exclude,
                                          const std::string& argument) {
  auto check = [&](int64_t index) {
    if (index < 0 || index >= static_cast<int64_t>(documents.size())) {
      throw Error(argument, "QA prompt index " + std::to_string(index) + " is out of range",
                  "an index below " + std::to_string(documents.size()) + " (the prompts in the QA file)");
    }
    return static_cast<std::size_t>(index);
  };
  std::set<std::string> held_out;
  for (int64_t index : exclude) {
    for (const std::string& p : documents[check(index)]) held_out.insert(p);
  }
  std::vector<std::string> paragraphs;
  std::set<std::string> seen;
  for (int64_t index : include) {
    // The prompts share documents: keep each paragraph once, in order of first appearance.
    for (const std::string& p : documents[check(index)]) {
      if (!held_out.count(p) && seen.insert(p).second) paragraphs.push_back(p);
    }
  }
  if (paragraphs.empty()) throw Error(argument, "the chosen QA prompts leave no document", "prompts with documents of their own");
  return paragraphs;
}

std::vector<std::string> all_prose_paragraphs(const std::vector<std::vector<std::string>>& documents) {
  std::vector<int64_t> every(documents.size());
  for (std::size_t i = 0; i < every.size(); ++i) every[i] = static_cast<int64_t>(i);
  return prose_paragraphs(documents, every, {}, "--prose");
}

std::vector<std::string> split_prose_paragraphs(const std::vector<std::vector<std::string>>& documents,
                                                const EvalSplits& splits, const std::string& name,
                                                const std::string& argument) {
  const NiahSplit& split = splits.niah_split(name, argument);
  std::vector<int64_t> held_out;
  if (name != kTuningSplit) {
    for (const std::string& other : splits.other_splits(name)) {
      const NiahSplit& o = splits.niah.at(other);
      held_out.insert(held_out.end(), o.prose_prompts.begin(), o.prose_prompts.end());
    }
  }
  return prose_paragraphs(documents, split.prose_prompts, held_out, argument);
}

}  // namespace eval
}  // namespace crisp
