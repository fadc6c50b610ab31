// src/eval/niah_run.h — running NIAH samples on a real model (`crisp eval niah`, `crisp eval pareto`):
// the prompt of a sample in the model's chat template, the RoPE choice per length, and one greedy
// answer under one attention policy, stopped as soon as its score is decided.
//
//   NiahPrompter prompter(tokenizer);
//   PreparedSample s = prompter.prepare(spec, prose, /*answer_prefix=*/true);
//   NiahOutcome o = answer_niah(model, tokenizer, s, run_options);
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "eval/niah.h"
#include "model/llama.h"
#include "model/tokenizer.h"

namespace crisp {
namespace eval {

// RoPE scaling for a length: `option` is auto (YaRN with the smallest integer factor for lengths
// past the trained context, none below), none, linear, ntk or yarn.
struct RopeChoice {
  model::RopeScaling scaling;
  bool beyond_training = false;  // longer than trained, or any scaling: flagged in every report
  std::string label;             // "none", "yarn x4", ...
};
RopeChoice choose_rope(const std::string& option, int64_t length, int64_t trained_context);

// A generated sample with its prompt as the model reads it.
struct PreparedSample {
  NiahSample sample;
  std::string id;                 // niah_sample_id
  std::string chat_prompt;        // chat template + user message + answer prefix
  std::vector<int32_t> prompt;    // its token ids
  int64_t max_new_tokens = 0;
};

// Builds samples whose length budget counts the chat template and the answer prefix.
class NiahPrompter {
 public:
  explicit NiahPrompter(const model::Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  std::string chat_prompt(const std::string& user_message, const std::string& answer_prefix) const;
  PromptTokenCounter counter() const;
  // max_new_tokens 0: the task's default (default_max_new_tokens); reserved in spec.length.
  PreparedSample prepare(NiahSpec spec, const std::vector<std::string>& prose, bool answer_prefix,
                         int64_t max_new_tokens) const;

 private:
  const model::Tokenizer& tokenizer_;
};

// One model answer to one sample under one policy.
struct NiahOutcome {
  std::string output;
  bool correct = false;
  std::string stop;  // "end" (end-of-generation token), "decided" (score fixed), "max_new_tokens"
  int64_t generated_tokens = 0;
  double density = 1.0;  // mean prefill density over layers
  double ttft_s = 0.0;   // prefill + choosing the first token
  double prefill_attention_s = 0.0;
};

// Greedy generation (as model::generate) that stops as soon as the score is decided: the score is
// that of the full output (see niah_score_decided), and wrong answers run to max_new_tokens.
NiahOutcome answer_niah(const model::LlamaModel& model, const model::Tokenizer& tokenizer, const PreparedSample& sample,
                        const model::RunOptions& run);

}  // namespace eval
}  // namespace crisp
