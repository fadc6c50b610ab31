// src/eval/niah_grid.cpp — see niah_grid.h.
#include "eval/niah_grid.h"

#include <algorithm>
#include <utility>

namespace crisp {
namespace eval {

NiahGrid::NiahGrid(NiahGridSettings settings, std::vector<NiahPolicy> policies) : settings_(std::move(settings)) {
  for (NiahPolicy& p : policies) {
    const bool seen = std::any_of(policies_.begin(), policies_.end(), [&](const NiahPolicy& q) { return q.name == p.name; });
    if (!seen) policies_.push_back(std::move(p));
  }
  const auto dense = std::find_if(policies_.begin(), policies_.end(), [](const NiahPolicy& p) { return p.name == "dense"; });
  if (dense != policies_.end()) std::rotate(policies_.begin(), dense, dense + 1);
}

int64_t NiahGrid::total_samples() const {
  return static_cast<int64_t>(settings_.tasks.size() * settings_.lengths.size() * settings_.depths.size()) *
         settings_.seeds;
}

void NiahGrid::run(const model::LlamaModel& model, const model::Tokenizer& tokenizer,
                   const std::vector<std::string>& prose, const NiahGridHooks& hooks) {
  const NiahPrompter prompter(tokenizer);
  int64_t index = 0;
  for (NiahTask task : settings_.tasks) {
    for (int64_t length : settings_.lengths) {
      const RopeChoice rope = choose_rope(settings_.rope_scaling, length, model.hparams().n_ctx_train);
      ropes_[length] = rope;
      if (hooks.on_length) hooks.on_length(task, length, rope);
      for (double depth : settings_.depths) {
        for (int64_t replicate = 0; replicate < settings_.seeds; ++replicate) {
          NiahSpec spec;
          spec.task = task;
          spec.length = length;
          spec.depth = depth;
          spec.seed = settings_.seed + static_cast<uint64_t>(replicate);
          const PreparedSample sample =
              prompter.prepare(spec, prose, settings_.answer_prefix, settings_.max_new_tokens);
          ++index;
          if (hooks.on_sample) hooks.on_sample(index, sample, rope);
          bool dense_correct = false;
          for (std::size_t p = 0; p < policies_.size() && !settings_.dry_run; ++p) {
            model::RunOptions run = settings_.run;
            run.attention = policies_[p].config;
            run.rope = rope.scaling;
            const NiahOutcome o = answer_niah(model, tokenizer, sample, run);
            if (p == 0 && have_dense()) dense_correct = o.correct;
            NiahCell& cell = cells_[{static_cast<int>(task), length, p}];
            ++cell.samples;
            cell.correct += o.correct;
            cell.dense_correct += dense_correct;
            cell.both_correct += dense_correct && o.correct;
            cell.density_sum += o.density;
            cell.ttft_sum += o.ttft_s;
            cell.prompt_tokens_sum += static_cast<double>(sample.prompt.size());
            if (hooks.on_outcome) hooks.on_outcome(index, sample, policies_[p], o);
          }
          if (hooks.on_sample_done) hooks.on_sample_done(index, sample);
        }
      }
    }
  }
}

}  // namespace eval
}  // namespace crisp
