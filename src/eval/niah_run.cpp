// src/eval/niah_run.cpp — see niah_run.h.
#include "eval/niah_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "model/llama.h"

namespace crisp {
namespace eval {

RopeChoice choose_rope(const std::string& option, int64_t length, int64_t trained_context) {
  RopeChoice choice;
  const bool too_long = length > trained_context;
  std::string method = option;
  if (method == "auto") method = too_long ? "yarn" : "none";
  choice.scaling.type = model::parse_rope_scaling(method, "--rope-scaling");
  if (choice.scaling.type != model::RopeScalingType::none) {
    // NOTE: the smallest integer factor that maps the length into the trained context.
    choice.scaling.factor =
        std::max(1.0, std::ceil(static_cast<double>(length) / static_cast<double>(trained_context)));
    char label[64];
    std::snprintf(label, sizeof label, "%s x%g", model::to_string(choice.scaling.type), choice.scaling.factor);
    choice.label = label;
  } else {
    choice.label = "none";
  }
  choice.beyond_training = too_long || choice.scaling.type != model::RopeScalingType::none;
  return choice;
}

std::string NiahPrompter::chat_prompt(const std::string& user_message, const std::string& answer_prefix) const {
  return tokenizer_.apply_chat_template({{"user", user_message}}, true) + answer_prefix;
}

PromptTokenCounter NiahPrompter::counter() const {
  return [this](const std::string& user, const std::string& prefix) {
    return static_cast<int64_t>(tokenizer_.encode(chat_prompt(user, prefix)).size());
  };
}

PreparedSample NiahPrompter::prepare(NiahSpec spec, const std::vector<std::string>& prose, bool answer_prefix,
                                     int64_t max_new_tokens) const {
  PreparedSample s;
  s.max_new_tokens = max_new_tokens > 0 ? max_new_tokens : default_max_new_tokens(spec.task);
  spec.reserved_tokens = s.max_new_tokens;
  const PromptTokenCounter count = counter();
  s.sample = make_niah_sample(spec, count, prose);
  if (!answer_prefix) {
    s.sample.answer_prefix.clear();
    s.sample.prompt_tokens = count(s.sample.user_message, "");
  }
  s.id = niah_sample_id(spec.task, spec.length, spec.depth, spec.seed);
  s.chat_prompt = chat_prompt(s.sample.user_message, s.sample.answer_prefix);
  s.prompt = tokenizer_.encode(s.chat_prompt);
  return s;
}

NiahOutcome answer_niah(const model::LlamaModel& model, const model::Tokenizer& tokenizer, const PreparedSample& sample,
                        const model::RunOptions& run) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t max_new = sample.max_new_tokens;
  model::LlamaContext context(model, static_cast<int64_t>(sample.prompt.size()) + max_new, run);
  const model::PrefillResult prefill = context.prefill(sample.prompt);
  const int64_t vocab = model.hparams().n_vocab;
  int32_t next = model::argmax(prefill.logits.data(), vocab);
  NiahOutcome o;
  o.ttft_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  o.density = prefill.density;
  o.prefill_attention_s = prefill.attention_seconds;
  std::vector<int32_t> generated;
  o.stop = "max_new_tokens";
  while (true) {
    if (tokenizer.is_end_of_generation(next)) {
      o.stop = "end";
      break;
    }
    generated.push_back(next);
    o.output = tokenizer.decode(generated);
    if (niah_score_decided(sample.sample, o.output)) {
      o.stop = "decided";
      break;
    }
    if (static_cast<int64_t>(generated.size()) >= max_new) break;
    const std::vector<float> logits = context.decode(next);
    next = model::argmax(logits.data(), vocab);
  }
  o.generated_tokens = static_cast<int64_t>(generated.size());
  o.correct = score_niah_output(sample.sample, o.output);
  return o;
}

}  // namespace eval
}  // namespace crisp
