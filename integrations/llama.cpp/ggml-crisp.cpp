// integrations/llama.cpp/ggml-crisp.cpp — routes llama.cpp's prompt-processing attention on the
// CPU backend through crisp (plan + attend). Compiled into ggml-cpu by crisp.patch; the layouts,
// the mask rule and the fallbacks are explained in docs/llama_cpp.md.
#include "ggml-crisp.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "crisp/crisp.h"
#include "ggml-cpu.h"
#include "ggml-crisp-rules.h"
#include "ggml-impl.h"
#include "ggml.h"

namespace {

using namespace ggml_crisp;

// The ggml types crisp reads directly; the others (quantised caches) fall back.
bool crisp_dtype(ggml_type type, crisp::DType * out) {
  switch (type) {
    case GGML_TYPE_F32:  *out = crisp::DType::f32;  return true;
    case GGML_TYPE_F16:  *out = crisp::DType::f16;  return true;
    case GGML_TYPE_BF16: *out = crisp::DType::bf16; return true;
    default: return false;
  }
}

// A rank-3 crisp view [heads, tokens, d] of a ggml tensor whose ne are [d, tokens, heads, 1],
// covering `heads` heads from `first_head` and the first `tokens` tokens (shape_decline_reason
// checked the type and that the strides are whole elements).
crisp::TensorView view_of(const ggml_tensor * t, int64_t first_head, int64_t heads, int64_t tokens) {
  crisp::TensorView view;
  crisp_dtype(t->type, &view.dtype);
  const size_t es = ggml_type_size(t->type);
  view.data = static_cast<char *>(t->data) + first_head * t->nb[2];
  view.device = crisp::Device::cpu;
  view.rank = 3;
  view.shape = {heads, tokens, t->ne[0]};
  view.stride = {static_cast<int64_t>(t->nb[2] / es), static_cast<int64_t>(t->nb[1] / es), 1};
  return view;
}

bool cpu_head_dim_supported(int64_t head_dim) { return head_dim >= 1 && head_dim <= crisp::kMaxHeadDim; }

// Whether every cell of the first n_q rows of the F16 mask agrees with the note (mask_cell_ok).
bool mask_matches_note(const ggml_tensor * mask, int64_t n_q, const ggml_kq_mask_note & note) {
  const int64_t n_kv = mask->ne[0];
  for (int64_t i = 0; i < n_q; ++i) {
    const uint16_t * row = reinterpret_cast<const uint16_t *>(static_cast<const char *>(mask->data) + i * mask->nb[1]);
    for (int64_t j = 0; j < n_kv; ++j)
      if (!mask_cell_ok(row[j], note, i, j)) return false;
  }
  return true;
}

// n_past when the first n_q rows of the F16 mask are bottom-right causal over a contiguous prefix
// (every cell read), -1 otherwise.
int64_t causal_prefix(const ggml_tensor * mask, int64_t n_q) {
  const int64_t n_kv = mask->ne[0];
  const uint16_t * row0 = static_cast<const uint16_t *>(mask->data);
  int64_t leading_zeros = 0;
  while (leading_zeros < n_kv && is_zero_f16(row0[leading_zeros])) ++leading_zeros;
  const int64_t n_past = n_past_of_row0(leading_zeros, n_q, n_kv);
  return n_past >= 0 && mask_matches_note(mask, n_q, plain_causal_note(n_past)) ? n_past : -1;
}

// Why crisp cannot compute this op, or "" when it can (and *layout where its keys are).
std::string decline_reason(const ggml_tensor * dst, KeyLayout * layout) {
  BackendLimits limits;
  limits.f32_kv = true;
  limits.head_dim_supported = cpu_head_dim_supported;
  const std::string reason = shape_decline_reason(dst, limits);
  if (!reason.empty()) return reason;
  const ggml_tensor * mask = dst->src[3];
  const int64_t n_q = dst->src[0]->ne[1];
  *layout = key_layout_of_op(
      dst, [&] { return causal_prefix(mask, n_q); },
      [&](const ggml_kq_mask_note & note) { return mask_matches_note(mask, n_q, note); });
  if (!layout->taken()) return kMaskDeclineReason;
  return "";
}

}  // namespace

extern "C" bool ggml_cpu_set_sparse_prefill(const char * policy, const char * const * settings, int n_settings,
                                            char * error, size_t error_size) {
  return set_sparse_prefill(policy, settings, n_settings, error, error_size);
}

extern "C" void ggml_cpu_get_sparse_prefill_stats(int64_t * handled, int64_t * declined, int64_t * kept_blocks,
                                                  int64_t * causal_blocks) {
  store_stats(stats(), handled, declined, kept_blocks, causal_blocks);
}

extern "C" void ggml_cpu_reset_sparse_prefill_stats(void) { reset_stats(); }

namespace {
// The ops (their dst) one of whose threads had its heads' values refused: inserted by that thread,
// read by every thread of the op after the first barrier, erased by its thread 0 after the second
// (before any of its threads can reach the next op). Keyed by op, so graphs that other threadpools
// compute at the same time do not see each other's; the count keeps the lock off the common path.
std::mutex g_refused_mutex;
std::set<const ggml_tensor *> g_refused_ops;
std::atomic<int> g_refused_count{0};

void mark_refused(const ggml_tensor * dst) {
  std::lock_guard<std::mutex> lock(g_refused_mutex);
  if (g_refused_ops.insert(dst).second) ++g_refused_count;
}
bool was_refused(const ggml_tensor * dst) {
  if (g_refused_count.load() == 0) return false;
  std::lock_guard<std::mutex> lock(g_refused_mutex);
  return g_refused_ops.count(dst) > 0;
}
void clear_refused(const ggml_tensor * dst) {
  std::lock_guard<std::mutex> lock(g_refused_mutex);
  if (g_refused_ops.erase(dst) > 0) --g_refused_count;
}

}  // namespace

bool ggml_crisp_flash_attn_ext(ggml_tensor * dst, int ith, int nth, void (*barrier)(void *), void * barrier_arg) {
  const ggml_tensor * q = dst->src[0];
  if (!is_prompt_op(dst)) return false;  // decode steps stay llama.cpp's
  const std::shared_ptr<const SparsePrefill> setting = setting_of_op(dst, nth);
  if (!setting) return false;

  KeyLayout layout;
  const std::string reason = decline_reason(dst, &layout);
  if (!reason.empty()) {
    if (ith == 0) {
      count_declined();
      log_once("sparse prefill falls back to llama.cpp's attention: " + reason);
    }
    return false;
  }

  const ggml_tensor * k = dst->src[1];
  const ggml_tensor * v = dst->src[2];
  const int64_t n_past = layout.note.n_past, n_q = q->ne[1], n_k = n_past + n_q;
  const int64_t heads = q->ne[2], group = q->ne[2] / k->ne[2], dim = q->ne[0];
  const bool windowed = layout.windowed();
  const crisp::Config config = config_of_op(dst, *setting, layout);

  // ggml's threads split the query heads: each runs crisp on its heads, one head per call, with
  // one crisp thread (nested OpenMP would oversubscribe the cores ggml's threads already hold).
  // Plans are per (sequence, query head), so the split changes nothing in what is computed.
  crisp::Options options;
  options.num_threads = 1;
  // The ubatch's queries are the last n_q of the n_k = n_past + n_q positions (bottom-right
  // causal): a chunk of a chunked prefill, or the whole prompt when n_past == 0. A ring's keys are
  // the op's n_kv cells read as pages.
  const int64_t n_kv = dst->src[3]->ne[0];
  std::vector<int32_t> table;
  crisp::BlockTable block_table;
  if (windowed) {
    table.resize(static_cast<size_t>(ring_table_pages(n_k, layout.ring_page)));
    for (size_t i = 0; i < table.size(); ++i)
      table[i] = ring_block_table_entry(static_cast<int64_t>(i), layout.ring_page, layout.note, n_kv);
    block_table.data = table.data();
    block_table.max_pages_per_sequence = static_cast<int64_t>(table.size());
    block_table.page_size = layout.ring_page;
  }
  const crisp::Batch batch({0, n_q}, {0, n_k}, block_table);
  const int64_t key_rows = windowed ? n_kv : n_k;
  std::vector<float> lse(n_q);
  int64_t kept_blocks = 0, heads_computed = 0;
  std::string refusal;
  for (int64_t h = heads * ith / nth; h < heads * (ith + 1) / nth && refusal.empty(); ++h) {
    const crisp::TensorView qv = view_of(q, h, 1, n_q);
    const crisp::TensorView kv = view_of(k, h / group, 1, key_rows);
    const crisp::TensorView vv = view_of(v, h / group, 1, key_rows);
    // dst is [DV, heads, n_q] (ggml's permuted result): head h of token t at (t * heads + h) rows.
    crisp::TensorView out;
    out.data = static_cast<char *>(dst->data) + h * dst->nb[1];
    out.dtype = crisp::DType::f32;
    out.shape = {1, n_q, dim};
    out.stride = {static_cast<int64_t>(dst->nb[1] / sizeof(float)), static_cast<int64_t>(dst->nb[2] / sizeof(float)), 1};
    const crisp::TensorView lse_view = crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, 1, n_q);
    try {
      const crisp::Plan plan = crisp::prefill(qv, kv, vv, config, out, lse_view, batch, options);
      kept_blocks += static_cast<int64_t>(plan.sequences.at(0).heads.at(0).col.size());
      ++heads_computed;
    } catch (const std::exception & e) {
      // Past the checks above only non-finite Q/K/V values get here (crisp refuses them, where
      // llama.cpp's kernel carries the NaN on): this op falls back, on every thread (below).
      refusal = "head " + std::to_string(h) + ": " + e.what();
      mark_refused(dst);
    }
  }
  // Every thread meets here, so all fall back together when one refused: llama.cpp's kernel then
  // rewrites every element of dst, the heads crisp wrote included.
  barrier(barrier_arg);
  const bool fall_back = was_refused(dst);
  barrier(barrier_arg);
  if (fall_back) {
    if (ith == 0) clear_refused(dst);
    // The first refusal's message only (each names its head and value; log_once keeps every distinct one).
    static std::atomic<bool> logged{false};
    if (!refusal.empty() && !logged.exchange(true))
      log_once("sparse prefill falls back to llama.cpp's attention on ops whose values crisp refuses; the first, " +
               refusal);
    if (ith == 0) count_declined();
    return false;
  }
  // The statistics' density is that of the sparse plans: a window's band is left out of it.
  if (!windowed) count_blocks(kept_blocks, heads_computed * causal_blocks_of_op(n_past, n_q, config.for_keys(n_k).block_size));
  if (ith == 0) {
    count_handled();
    log_once("sparse prefill '" + setting->policy + "' computes the attention of prompt ubatches");
  }
  return true;
}
