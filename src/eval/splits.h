// src/eval/splits.h — the tuning and test splits of the evaluation (eval/splits.json), and the
// real-prose haystack built from a split's QA prompts only.
//
// Rules and knobs are chosen on the tuning split; the verdict is read on the test split. The file
// fixes per split the NIAH seeds and depths, the QA prompts whose documents make the niah_prose
// haystack, and the prompts captured for `crisp eval fidelity` / `crisp eval pareto --captures`.
//
//   EvalSplits s = load_splits(path, "--splits");
//   const NiahSplit& test = s.niah_split("test", "--split");
//   auto prose = split_prose_paragraphs(qa_prompts, s, "test");   // shares no paragraph with tuning
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace crisp {
namespace eval {

struct NiahSplit {
  uint64_t seed = 0;                   // first seed; samples use seed, seed + 1, ...
  int64_t seeds = 1;                   // samples per (task, length, depth)
  std::vector<double> depths;          // depths of the asked needle, in [0, 1]
  std::vector<int64_t> prose_prompts;  // indices into the QA prompts: the niah_prose documents
};

struct CaptureItem {
  int64_t qa_index = 0;    // the QA prompt captured (`crisp-llama-eval capture --qa-index`)
  int64_t max_tokens = 0;  // its length cap (`crisp-llama-eval capture --max-tokens`)
};

struct EvalSplits {
  std::string path;  // where it was read from (for messages)
  std::map<std::string, NiahSplit> niah;                   // "tuning", "test"
  std::map<std::string, std::vector<CaptureItem>> captures;  // "tuning", "test"
  std::map<std::string, std::vector<uint64_t>> structured;   // "tuning", "test": workload seeds

  // The split named `name`; throws crisp::Error naming `argument` for an unknown name.
  const NiahSplit& niah_split(const std::string& name, const std::string& argument) const;
  const std::vector<CaptureItem>& capture_split(const std::string& name, const std::string& argument) const;
  const std::vector<uint64_t>& structured_split(const std::string& name, const std::string& argument) const;
  // The names of the splits other than `name` (their prompts are kept out of `name`'s haystack).
  std::vector<std::string> other_splits(const std::string& name) const;
};

// Reads and checks a splits file. Every problem (missing file, not JSON, a split without seed /
// seeds / depths / prose_prompts, a value of the wrong type or range) throws crisp::Error naming
// `argument` and the offending entry.
EvalSplits load_splits(const std::string& path, const std::string& argument = "--splits");

// The default splits file: eval/splits.json of the source tree the binary was built from
// (`source_dir`), else next to the executable (<exe dir>/eval/splits.json or <exe dir>/../eval/...);
// "" when none exists. Never relative to the current directory.
std::string default_splits_path(const std::string& source_dir);

// The documents of every QA prompt, as paragraphs (qa_prompt_paragraphs of each prompt), from a
// long_qa_prompts.json file (a JSON list of {prompt, answer}). Errors name `argument`.
std::vector<std::vector<std::string>> load_qa_documents(const std::string& path, const std::string& argument = "--prose");

// The prose haystack of the prompts `include`: their paragraphs, each once, in order of first
// appearance, without any paragraph that also occurs in a prompt of `exclude`. An index outside
// `documents` throws crisp::Error naming `argument`; so does a result with no paragraph left.
std::vector<std::string> prose_paragraphs(const std::vector<std::vector<std::string>>& documents,
                                          const std::vector<int64_t>& include, const std::vector<int64_t>& exclude,
                                          const std::string& argument);

// Every paragraph of every prompt, each once (the haystack without a split).
std::vector<std::string> all_prose_paragraphs(const std::vector<std::vector<std::string>>& documents);

// The haystack of split `name`: its prose_prompts' paragraphs. The test split's haystack drops every
// paragraph that also occurs in another split's prompts, so that no paragraph read while tuning is
// in the verdict; the tuning split keeps all of its own.
std::vector<std::string> split_prose_paragraphs(const std::vector<std::vector<std::string>>& documents,
                                                const EvalSplits& splits, const std::string& name,
                                                const std::string& argument);

}  // namespace eval
}  // namespace crisp
