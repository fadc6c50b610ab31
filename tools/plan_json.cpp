// tools/plan_json.cpp — see plan_json.h.
#include "plan_json.h"

#include <cmath>

#include "crisp/error.h"

namespace crisp_cli {
namespace {

// JSON has no NaN: a statistic that was not computed is null.
nlohmann::json number_or_null(double x) {
  return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr);
}

}  // namespace

nlohmann::json config_to_json(const crisp::Config& config) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, value] : config.to_key_values()) out[name] = value;
  return out;
}

nlohmann::json plan_to_json(const crisp::Plan& plan) {
  if (plan.sequences.size() != 1) {
    throw crisp::Error("plan", "holds " + std::to_string(plan.sequences.size()) + " sequences",
                       "exactly one sequence for JSON output");
  }
  const crisp::SequencePlan& seq = plan.sequences.front();

  nlohmann::json heads = nlohmann::json::array();
  for (std::size_t h = 0; h < seq.heads.size(); ++h) {
    const crisp::HeadPlan& head = seq.heads[h];
    heads.push_back({
        {"head", h},
        {"route", crisp::to_string(head.route)},
        {"c_struct", number_or_null(head.c_struct)},
        {"jsd", number_or_null(head.jsd)},
        {"vertical", head.vertical},
        {"slash", head.slash},
        {"row_ptr", head.row_ptr},
        {"col", head.col},
        {"density", head.density},
    });
  }

  return {
      {"config", config_to_json(plan.config)},
      {"n", seq.n_k},
      {"n_q", seq.n_q},
      {"n_k", seq.n_k},
      {"first_row", seq.first_row},
      {"block_size", plan.block_size},
      {"num_blocks", seq.num_blocks},
      {"num_q_heads", plan.num_q_heads},
      {"num_kv_heads", plan.num_kv_heads},
      {"head_dim", plan.head_dim},
      {"softmax_scale", plan.softmax_scale},
      {"density", plan.density()},
      {"vs_share", plan.vs_share()},
      {"heads", heads},
  };
}

}  // namespace crisp_cli
