// src/plan/plan_params.h — the planner's view of a Config: a trivially copyable struct that the
// CPU planner reads and the CUDA planner passes by value to its kernels. Config's own enums are
// kept (they are plain enum classes, usable on the device), so there is no second encoding of
// them; the int32 codes of src/plan/rules.h are derived from them.
#pragma once
#include <cstdint>
#include <type_traits>

#include "crisp/config.h"

namespace crisp {

struct PlanParams {
  int32_t block_size;
  bool dense;
  // §2 routing
  Routing routing;
  double tau_proxy, rho, tau;
  int64_t w_sink, w_local;
  // §3 VS rules
  VsRule vs_rule;
  double alpha, gamma;
  VsFloor vs_floor;
  double uniform_alpha;
  int64_t uniform_floor_blocks, uniform_floor_slash_blocks;
  bool uniform_floor_last_rows;
  int64_t proxy_last_rows;
  int64_t vertical_tokens, slash_tokens;
  // §4 PE rule
  PeRule pe_rule;
  double pe_gamma, pe_alpha;
  // §5 layout
  SlashCover cover;
  // Budget clamps and §7
  int64_t min_budget, max_budget, dense_below;
  // §12 sliding window (0 = none)
  int64_t window;
};
static_assert(std::is_trivially_copyable<PlanParams>::value, "PlanParams is passed to kernels by value");

inline PlanParams plan_params(const Config& c) {
  PlanParams p{};
  p.block_size = c.block_size;
  p.dense = c.dense;
  p.routing = c.routing;
  p.tau_proxy = c.tau_proxy;
  p.rho = c.rho;
  p.tau = c.tau;
  p.w_sink = c.w_sink;
  p.w_local = c.w_local;
  p.vs_rule = c.vs_budget;
  p.alpha = c.alpha;
  p.gamma = c.gamma;
  p.vs_floor = c.vs_floor;
  p.uniform_alpha = c.uniform_alpha;
  p.uniform_floor_blocks = c.uniform_floor_blocks;
  p.uniform_floor_slash_blocks = c.uniform_floor_slash_blocks;
  p.uniform_floor_last_rows = c.uniform_floor_last_rows;
  p.proxy_last_rows = c.proxy_last_rows;
  p.vertical_tokens = c.vertical_tokens;
  p.slash_tokens = c.slash_tokens;
  p.pe_rule = c.pe_rule;
  p.pe_gamma = c.pe_gamma;
  p.pe_alpha = c.pe_alpha;
  p.cover = c.slash_cover;
  p.min_budget = c.min_budget;
  p.max_budget = c.max_budget;
  p.dense_below = c.dense_below;
  p.window = c.window;
  return p;
}

}  // namespace crisp
