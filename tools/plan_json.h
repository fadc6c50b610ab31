// tools/plan_json.h — a crisp::Plan as JSON (the output of `crisp plan`).
#pragma once
#include <nlohmann/json.hpp>

#include "crisp/plan.h"

namespace crisp_cli {

// {"config": {name: value, ...}, "n", "block_size", "num_q_heads", "num_kv_heads", "head_dim",
//  "softmax_scale", "num_blocks", "density", "vs_share",
//  "heads": [{"head", "route", "c_struct", "jsd", "vertical", "slash", "row_ptr", "col",
//             "density"}, ...]}
// Single-sequence plans only (the .npy inputs of the CLI hold one sequence); NaN statistics
// (dense or short-sequence heads, JSD under other routings) are written as null.
nlohmann::json plan_to_json(const crisp::Plan& plan);

// A configuration as every JSON output of the command writes it: {"preset": ..., name: value, ...},
// the pairs of Config::to_key_values with their string values.
nlohmann::json config_to_json(const crisp::Config& config);

}  // namespace crisp_cli
