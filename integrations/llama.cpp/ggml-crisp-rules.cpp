// integrations/llama.cpp/ggml-crisp-rules.cpp — the setting, statistics and op rules shared by
// crisp's CPU and CUDA hooks (ggml-crisp-rules.h). Compiled into each backend library.
#include "ggml-crisp-rules.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <set>

#include "ggml-impl.h"
#include "plan/rules.h"

namespace ggml_crisp {

namespace {
std::mutex g_mutex;                              // guards g_setting and g_reasons
std::shared_ptr<const SparsePrefill> g_setting;  // null: off
std::set<std::string> g_reasons;                 // messages already logged
std::atomic<int64_t> g_handled{0}, g_declined{0}, g_kept_blocks{0}, g_causal_blocks{0};
}  // namespace

const char * const kMaskDeclineReason =
    "a KQ mask that is neither plain causal over a contiguous prefix nor noted by llama.cpp (non-causal, several "
    "sequences, a sliding window without its note)";

bool set_sparse_prefill(const char * policy, const char * const * settings, int n_settings, char * error,
                        size_t error_size) {
  auto fail = [&](const std::string & message) {
    if (error && error_size > 0) std::snprintf(error, error_size, "%s", message.c_str());
    return false;
  };
  if (!policy) return fail("policy is null; expected crisp, flexprefill, minference, dense or off");
  if (n_settings < 0 || (n_settings > 0 && !settings)) return fail("settings: expected n_settings >= 0 key=value strings");
  const std::string name = policy;
  if (name != "crisp" && name != "flexprefill" && name != "minference" && name != "dense" && name != "off")
    return fail("unknown policy '" + name + "'; expected crisp, flexprefill, minference, dense or off");
  if (name == "off") {
    if (n_settings > 0) return fail("--sparse-prefill-set given with --sparse-prefill off");
    std::lock_guard<std::mutex> lock(g_mutex);
    g_setting.reset();
    return true;
  }
  auto setting = std::make_shared<SparsePrefill>();
  setting->policy = name;
  try {
    setting->config = crisp::Config::from_preset(name);
    for (int i = 0; i < n_settings; ++i) setting->config.set(std::string(settings[i]));
    setting->config.validate();
  } catch (const std::exception & e) {
    return fail(e.what());
  }
  // Each layer's scale is the model's (the op's scale parameter); a fixed one would be wrong.
  if (setting->config.softmax_scale != 0.0)
    return fail("softmax_scale: is set by the model in llama.cpp; expected it unset (0)");
  std::lock_guard<std::mutex> lock(g_mutex);
  g_setting = std::move(setting);
  return true;
}

std::shared_ptr<const SparsePrefill> current_setting() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_setting;
}

namespace {
struct OpSetting {
  std::shared_ptr<const SparsePrefill> setting;
  int readers = 0;
};
std::mutex g_op_settings_mutex;
std::map<const ggml_tensor *, OpSetting> g_op_settings;
}  // namespace

std::shared_ptr<const SparsePrefill> setting_of_op(const ggml_tensor * dst, int nth) {
  if (nth <= 1) return current_setting();
  std::lock_guard<std::mutex> lock(g_op_settings_mutex);
  const auto [it, first] = g_op_settings.try_emplace(dst);
  if (first) it->second.setting = current_setting();
  std::shared_ptr<const SparsePrefill> setting = it->second.setting;
  if (++it->second.readers == nth) g_op_settings.erase(it);
  return setting;
}

void log_once(const std::string & message) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_reasons.insert(message).second) GGML_LOG_INFO("crisp: %s\n", message.c_str());
}

void count_handled() { ++g_handled; }

void count_declined() { ++g_declined; }

void count_blocks(int64_t kept_blocks, int64_t causal_blocks) {
  g_kept_blocks += kept_blocks;
  g_causal_blocks += causal_blocks;
}

Stats stats() {
  Stats s;
  s.handled = g_handled.load();
  s.declined = g_declined.load();
  s.kept_blocks = g_kept_blocks.load();
  s.causal_blocks = g_causal_blocks.load();
  return s;
}

void store_stats(const Stats & s, int64_t * handled, int64_t * declined, int64_t * kept_blocks, int64_t * causal_blocks) {
  if (handled) *handled = s.handled;
  if (declined) *declined = s.declined;
  if (kept_blocks) *kept_blocks = s.kept_blocks;
  if (causal_blocks) *causal_blocks = s.causal_blocks;
}

void reset_stats() {
  g_handled = 0;
  g_declined = 0;
  g_kept_blocks = 0;
  g_causal_blocks = 0;
}

int64_t causal_blocks_of_op(int64_t n_past, int64_t n_q, int block_size) {
  const int64_t n_k = n_past + n_q;
  const int32_t num_blocks = static_cast<int32_t>((n_k + block_size - 1) / block_size);
  return crisp::rules::causal_blocks_of_rows(crisp::rules::first_query_block(n_k, n_q, block_size), num_blocks);
}

namespace {
// A ggml tensor whose ne are [d, tokens, heads, 1] read as crisp's [heads, tokens, d] with element
// strides: the innermost dimension dense, the others whole elements, and row starts aligned.
bool whole_element_rows(const ggml_tensor * t, size_t row_alignment) {
  const size_t es = ggml_type_size(t->type);
  return t->nb[0] == es && t->nb[1] % es == 0 && t->nb[2] % es == 0 &&
         reinterpret_cast<uintptr_t>(t->data) % row_alignment == 0 && t->nb[1] % row_alignment == 0 &&
         t->nb[2] % row_alignment == 0;
}
}  // namespace

std::string shape_decline_reason(const ggml_tensor * dst, const BackendLimits & limits) {
  const ggml_tensor * q = dst->src[0];
  const ggml_tensor * k = dst->src[1];
  const ggml_tensor * v = dst->src[2];
  const ggml_tensor * mask = dst->src[3];
  const ggml_tensor * sinks = dst->src[4];
  float max_bias = 0.0f, softcap = 0.0f;
  std::memcpy(&max_bias, reinterpret_cast<const float *>(dst->op_params) + 1, sizeof(float));
  std::memcpy(&softcap, reinterpret_cast<const float *>(dst->op_params) + 2, sizeof(float));
  auto kv_type_ok = [&](ggml_type type) {
    return type == GGML_TYPE_F16 || type == GGML_TYPE_BF16 || (limits.f32_kv && type == GGML_TYPE_F32);
  };
  if (max_bias != 0.0f) return "ALiBi (max_bias != 0)";
  if (softcap != 0.0f) return "logit softcap";
  if (sinks) return "attention sinks";
  if (!mask) return "no KQ mask (non-causal attention)";
  if (mask->type != GGML_TYPE_F16) return "a KQ mask that is not F16";
  if (mask->ne[2] != 1 || mask->ne[3] != 1) return "a KQ mask per head or per stream";
  if (mask->nb[0] != sizeof(uint16_t) || mask->nb[1] % sizeof(uint16_t) != 0) return "a KQ mask with non-contiguous rows";
  // crisp reads up to as many K/V rows as the mask has cells (ggml_flash_attn_ext does not check).
  if (k->ne[1] < mask->ne[0] || v->ne[1] < mask->ne[0]) return "K/V views with fewer cells than the KQ mask";
  if (q->ne[3] != 1 || k->ne[3] != 1 || v->ne[3] != 1) return "several KV streams in one ubatch";
  if (q->type != GGML_TYPE_F32) return "Q that is not F32";
  if (!kv_type_ok(k->type) || !kv_type_ok(v->type))
    return limits.f32_kv ? "a quantised KV cache (F16, BF16 or F32 only)" : "a KV cache that is not F16 or BF16";
  if (k->type != v->type) return "K and V of different types";
  if (k->ne[0] != v->ne[0] || q->ne[0] != k->ne[0]) return "K and V head dims differ";
  if (!limits.head_dim_supported(q->ne[0])) return "head dim " + std::to_string(q->ne[0]) + " (not supported by crisp here)";
  if (q->ne[2] % k->ne[2] != 0 || v->ne[2] != k->ne[2]) return "head counts that are not GQA";
  if (!ggml_is_contiguous(dst)) return "a non-contiguous output";
  if (!whole_element_rows(q, 1) || !whole_element_rows(k, limits.row_alignment) ||
      !whole_element_rows(v, limits.row_alignment))
    return "Q/K/V strides that are not whole (aligned) elements";
  return "";
}

// CRISP_HOOK_MASK_NOTE, read once: "0" ignores notes, "check" reads noted masks too, else notes are used.
enum class MaskNoteMode { use, ignore, check };
static MaskNoteMode mask_note_mode() {
  static const MaskNoteMode mode = [] {
    const char * value = std::getenv("CRISP_HOOK_MASK_NOTE");
    if (value != nullptr && std::strcmp(value, "0") == 0) return MaskNoteMode::ignore;
    if (value != nullptr && std::strcmp(value, "check") == 0) return MaskNoteMode::check;
    return MaskNoteMode::use;
  }();
  return mode;
}

int64_t ring_page_size(int64_t ring_cells, int64_t ring_shift, int64_t n_kv) {
  for (int64_t page = kMaxRingPage; page >= 16; page /= 2)
    if (ring_cells % page == 0 && ring_shift % page == 0 && n_kv % page == 0) return page;
  return 0;
}

KeyLayout noted_layout(const ggml_tensor * dst) {
  const ggml_tensor * mask = dst->src[3];
  ggml_kq_mask_note note{};
  KeyLayout none;
  if (mask_note_mode() == MaskNoteMode::ignore || mask == nullptr || !ggml_kq_mask_get_note(mask, &note)) return none;
  const int64_t n_q = dst->src[0]->ne[1], n_kv = mask->ne[0];
  if (note.n_past < 0) return none;
  KeyLayout layout;
  layout.note = note;
  if (note.n_window == 0) {  // plain causal over a contiguous prefix: its rows within the mask's cells
    return note.ring_cells != 0 || note.n_past + n_q > n_kv ? none : layout;
  }
  // A window: the op's own (its mark), a ring of whole pages, the op's cells whole pages of it.
  if (note.n_window != ggml_flash_attn_ext_get_window(dst) || note.ring_cells <= 0 || n_kv > note.ring_cells)
    return none;
  layout.ring_page = ring_page_size(note.ring_cells, note.ring_shift, n_kv);
  return layout.ring_page > 0 ? layout : none;
}

bool mask_note_check_requested() { return mask_note_mode() == MaskNoteMode::check; }

void abort_on_wrong_note(const ggml_tensor * dst, const ggml_kq_mask_note & note) {
  GGML_ABORT("crisp: CRISP_HOOK_MASK_NOTE=check: op %s: the KQ mask's note (n_past %lld, window %d, ring of %d "
             "cells shifted %d) disagrees with its cells",
             dst->name, (long long) note.n_past, note.n_window, note.ring_cells, note.ring_shift);
}

crisp::Config config_of_op(const ggml_tensor * dst, const SparsePrefill & setting, const KeyLayout & layout) {
  crisp::Config config = layout.windowed() ? crisp::Config::from_preset("dense") : setting.config;
  config.block_size = setting.config.block_size;
  config.window = layout.note.n_window;
  float scale = 1.0f;
  std::memcpy(&scale, dst->op_params, sizeof(float));
  config.softmax_scale = scale;
  return config;
}

bool takes_unless_mask_declines(const ggml_tensor * dst, const BackendLimits & limits) {
  return dst->op == GGML_OP_FLASH_ATTN_EXT && is_prompt_op(dst) && current_setting() &&
         shape_decline_reason(dst, limits).empty();
}

}  // namespace ggml_crisp
