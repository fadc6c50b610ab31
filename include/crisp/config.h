// crisp/config.h — every decision of the CRISP spec (docs/spec.md §2–§8) as a named,
// validated parameter, plus the four presets.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace crisp {

// §2: how a head chooses between the Vertical-Slash (VS) and the query-aware (PE) pattern.
enum class Routing {
  cstruct,      // CRISP: VS iff C_struct >= tau_proxy
  cstruct_rel,  // VS iff C_struct * n / (w_sink + w_local) >= rho
  jsd,          // FlexPrefill: PE iff JS distance < tau
  none,         // every head VS
};

// §3: which vertical and slash blocks a VS head keeps.
enum class VsRule {
  noise_floor,  // CRISP: keep blocks whose mass is above a floor (vs_floor below)
  cumulative,   // FlexPrefill: smallest token set reaching gamma, in blocks
  topk,         // MInference-style: fixed token budgets mapped to blocks (block-level approximation)
};

// §3 noise_floor: the floor a block's pooled mass must exceed (Config's default `mean` is the
// spec's v1 rule; the crisp preset uses `uniform`).
enum class VsFloor {
  mean,     // alpha * mean of the non-anchor masses 1 .. N-2
  uniform,  // uniform_alpha / N: the level of uniform attention
  max,      // the larger of the two
};

// §4: which entries of the block-causal estimate P a PE head keeps (Config's default `coverage`;
// the crisp preset uses `floor` with pe_alpha 0.5 since session 26, docs/algorithm.md).
enum class PeRule {
  coverage,  // global coverage: entries by P descending until the running sum reaches pe_gamma * N
  floor,     // every entry (r, c) with P[r, c] > pe_alpha / (r + 1), the row's uniform level
};

// §5: which key blocks a slash distance-block c reaches from query block r.
enum class SlashCover {
  exact,   // r-c and r-c-1 (a diagonal at distance [cB, cB+B) crosses both)
  single,  // r-c only (FlexPrefill parity)
};

// Per-head decision recorded in the plan.
enum class Route { vs, pe, dense };

const char* to_string(Routing r);
const char* to_string(VsRule r);
const char* to_string(VsFloor f);
const char* to_string(PeRule r);
const char* to_string(SlashCover c);
const char* to_string(Route r);

struct Config {
  std::string preset = "crisp";  // name of the preset this config started from
  bool dense = false;            // the dense preset: every causal block, no estimation

  // §2 routing. Config's default, calibrated on real captures (docs/evaluation.md): cstruct_rel
  // with rho = 2.2; the crisp preset uses rho = 0.5 (since session 9: heads without local structure
  // go VS, where the noise floor drops their tail; docs/algorithm.md). The spec's uncalibrated
  // defaults were cstruct with tau_proxy 0.25 (kept here for callers who switch back to cstruct)
  // and rho = 4.
  Routing routing = Routing::cstruct_rel;
  double tau_proxy = 0.25;  // cstruct threshold
  double rho = 2.2;         // cstruct_rel threshold (NOTE: calibrated, see above)
  double tau = 0.1;         // jsd threshold
  int64_t w_sink = 128;     // tokens counted as the architectural sink
  int64_t w_local = 128;    // tokens counted as the local window

  // §3 VS rule
  VsRule vs_budget = VsRule::noise_floor;
  double alpha = 1.0;              // noise_floor multiplier of the mean floor
  VsFloor vs_floor = VsFloor::mean;  // noise_floor: which floor
  double uniform_alpha = 1.0;      // noise_floor multiplier of the uniform level 1/N
  // noise_floor's uniform level is 1 / max(N, uniform_floor_blocks): below that many key blocks the
  // floor stops rising as N falls (a short prompt's floor 1/N would drop a needle that only the
  // last queries need; docs/algorithm.md, "Short prompts"). 0: the plain 1/N.
  int64_t uniform_floor_blocks = 0;
  // The slash side's own held floor: -1 follows uniform_floor_blocks; 0 leaves slashes at the
  // plain 1/N while verticals keep the held floor (a needle that only the last queries need is a
  // key block, so the vertical side alone can keep it; docs/algorithm.md, "Short prompts").
  int64_t uniform_floor_slash_blocks = -1;
  // The held floor for the last proxy rows' score only: a block is kept if all rows' pooled mass is
  // above the plain uniform_alpha / N, or the last rows' own above uniform_alpha / max(N, the
  // side's held floor blocks) (docs/algorithm.md, "Short prompts"). Needs vs_floor = uniform and
  // proxy_last_rows > 0 (validate() names them otherwise).
  bool uniform_floor_last_rows = false;
  // The last proxy_last_rows proxy rows are pooled on their own as well, and each block's pooled
  // vertical / slash mass is the larger of the two: a block that only the queries nearest the
  // answer need is not diluted by the other rows (docs/algorithm.md, "Short prompts"). 0 = off.
  // Both planners; the crisp preset sets 16 (and uniform_floor_blocks 32).
  int64_t proxy_last_rows = 0;
  double gamma = 0.95;             // cumulative mass target
  int64_t vertical_tokens = 1000;  // topk vertical budget (tokens)
  int64_t slash_tokens = 6096;     // topk slash budget (tokens)

  // §4 PE rule
  PeRule pe_rule = PeRule::coverage;
  double pe_gamma = 0.95;  // coverage: keep entries until the running sum reaches pe_gamma*N
  double pe_alpha = 1.0;   // floor: keep P[r, c] > pe_alpha / (r + 1)

  // §5 layout
  SlashCover slash_cover = SlashCover::exact;

  // Budget clamps (tokens). min_budget: top blocks of pv/ps added until ceil(min_budget/B) blocks
  // of each kind are kept; also FlexPrefill's dense fallback for n <= min_budget.
  // max_budget: at most max(1, floor(max_budget/B)) blocks of each kind (anchors always kept);
  // 0 means no maximum.
  int64_t min_budget = 0;
  int64_t max_budget = 0;

  // §7: sequences with n <= dense_below tokens run dense. NOTE: tuning constant; 0 (off) until a
  // measured crossover says otherwise (bench/RESULTS.md).
  int64_t dense_below = 0;

  // §12 sliding window: query position p attends to the keys (p - window, p] only (its window most
  // recent positions, itself included; llama.cpp's n_swa, flash-attn's window_size = (window - 1, 0)).
  // 0 = no window. Every policy's plan drops the key blocks wholly outside the window and the kernels
  // mask the partly visible ones; selection is not window-aware, so a model's local layers use it
  // with the dense preset (what the llama.cpp integration does; docs/algorithm.md §12).
  int64_t window = 0;

  int block_size = 128;        // B: 64 or 128
  double softmax_scale = 0.0;  // s; 0 means 1/sqrt(d)

  // Short prompts at finer blocks (docs/algorithm.md, "Short prompts: finer blocks"): a call whose
  // longest sequence has fewer than fine_blocks_below keys is planned and computed with blocks of
  // 64 tokens when block_size is 128, its held floors (uniform_floor_blocks, and
  // uniform_floor_slash_blocks when > 0) doubled so that they hold the same tokens. At N = 16 blocks
  // every kept block is a sixteenth of a row; at 64 tokens the same rules choose at half that.
  // 0 = off (every preset: rejected on the tuning split, docs/evaluation.md). for_keys() applies it;
  // every planner and DevicePlan does so with the Config it is given.
  int64_t fine_blocks_below = 0;

  // The presets of §8: "crisp", "flexprefill", "minference", "dense". Throws crisp::Error
  // naming "preset" for any other name.
  static Config from_preset(const std::string& name);

  // Sets one parameter by its spec name (dense, tau_proxy, rho, alpha, vs_floor, uniform_alpha, uniform_floor_blocks,
  // uniform_floor_slash_blocks, uniform_floor_last_rows, proxy_last_rows, gamma,
  // pe_rule, pe_gamma, pe_alpha, tau, w_sink, w_local, min_budget, max_budget, routing, vs_budget,
  // slash_cover, vertical_tokens, slash_tokens, block_size, softmax_scale, dense_below,
  // fine_blocks_below, window). Throws crisp::Error naming the key for an unknown key or a value that does
  // not parse or is out of range.
  void set(const std::string& key, const std::string& value);

  // Parses "key=value" (the CLI's --set).
  void set(const std::string& key_equals_value);

  // Throws crisp::Error naming the first parameter out of its range.
  void validate() const;

  // The Config a call runs with when its longest sequence has `longest_keys` keys: this one, or,
  // below fine_blocks_below, the same with block_size 64 and the held floors doubled. The result
  // has fine_blocks_below 0, so it resolves to itself and a plan's recorded config is what ran.
  // Callers that size buffers themselves (DevicePlan::bytes_required) use its block_size.
  Config for_keys(int64_t longest_keys) const;

  // Every parameter as (name, value) strings, in a stable order (for JSON and printing).
  std::vector<std::pair<std::string, std::string>> to_key_values() const;

  // The list of names accepted by set().
  static std::vector<std::string> parameter_names();
  static std::vector<std::string> preset_names();
};

}  // namespace crisp
