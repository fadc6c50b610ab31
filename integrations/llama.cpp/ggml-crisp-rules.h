// integrations/llama.cpp/ggml-crisp-rules.h — what crisp's hooks in ggml's CPU and CUDA backends
// share (docs/llama_cpp.md): the --sparse-prefill setting, the statistics, and the rules that say
// which flash-attention ops crisp takes. Each backend library compiles ggml-crisp-rules.cpp once,
// so each has its own setting and counters; the symbols are hidden, so the two copies never bind
// to each other across libggml-cpu.so and libggml-cuda.so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "crisp/config.h"
#include "ggml-sparse-prefill.h"  // the marks llama.cpp leaves: a layer's window, a mask's note
#include "ggml.h"

#if defined(__CUDACC__)
#define GGML_CRISP_HD __host__ __device__ inline
#else
#define GGML_CRISP_HD inline
#endif

namespace ggml_crisp __attribute__((visibility("hidden"))) {

// ---------------------------------------------------------------- the setting
// What --sparse-prefill chose: a crisp Config, or nothing (off).
struct SparsePrefill {
  std::string policy;
  crisp::Config config;
};

// The setter of "ggml_backend_set_sparse_prefill" (docs/llama_cpp.md): policy crisp, flexprefill,
// minference, dense or off; settings n_settings "key=value" crisp Config fields. On a bad policy
// or setting returns false, writes the reason to error (at most error_size bytes) and keeps the
// previous setting.
bool set_sparse_prefill(const char * policy, const char * const * settings, int n_settings, char * error,
                        size_t error_size);
// The current setting; null when off.
std::shared_ptr<const SparsePrefill> current_setting();
// The setting all `nth` threads of the op `dst` use: the first of them to ask reads the current
// one, the others get that one, and the last one's call forgets it. A setting changed while an op
// runs then applies from the next op on, and the threads of one op never see two (the CPU hook's
// threads meet at the op's barrier: docs/llama_cpp.md). nth == 1: the current setting.
std::shared_ptr<const SparsePrefill> setting_of_op(const ggml_tensor * dst, int nth);

// Logs each distinct message once per process (ggml's log, so llama.cpp's log settings apply): a
// model whose layers fall back says so once, not once per layer and ubatch.
void log_once(const std::string & message);

// ---------------------------------------------------------------- the statistics
// Prompt flash-attention ops crisp computed (handled) or left to llama.cpp (declined), and the
// blocks of the plans it ran: kept, and the causal blocks of the rows computed (so density =
// kept / causal), summed over (query head, op). A backend that counts kept blocks elsewhere (the
// CUDA hook, on the device) adds them when asked (get_sparse_prefill_stats's caller).
struct Stats {
  int64_t handled = 0, declined = 0, kept_blocks = 0, causal_blocks = 0;
};
void count_handled();  // once per op
void count_declined();
void count_blocks(int64_t kept_blocks, int64_t causal_blocks);  // any share of an op's heads
Stats stats();
void reset_stats();
// Writes s to the "ggml_backend_get_sparse_prefill_stats" out-parameters (any may be null).
void store_stats(const Stats & s, int64_t * handled, int64_t * declined, int64_t * kept_blocks, int64_t * causal_blocks);

// The causal blocks of the rows an op of n_q queries after n_past cached cells computes, per query
// head, with crisp's block size (the rows first_row .. N-1 of the whole prompt's grid).
int64_t causal_blocks_of_op(int64_t n_past, int64_t n_q, int block_size);

// ---------------------------------------------------------------- which ops crisp takes
// Decode steps (one query) stay llama.cpp's; they are not candidates and never counted.
inline bool is_prompt_op(const ggml_tensor * dst) { return dst->src[0]->ne[1] > 1; }

// What a backend's crisp can read.
struct BackendLimits {
  bool f32_kv = false;                        // K/V may be F32 (else F16 or BF16 only)
  bool (*head_dim_supported)(int64_t) = nullptr;
  size_t row_alignment = 1;                   // bytes every Q/K/V row start must be a multiple of
};

// Why crisp cannot compute this op on a backend with `limits`, or "" when it can, as far as the
// op's shapes, types, strides and parameters tell (everything but the mask's values, which
// mask_cell_ok below judges). Reads no tensor data, so it works on any backend's tensors.
std::string shape_decline_reason(const ggml_tensor * dst, const BackendLimits & limits);

// Whether a backend's hook takes this op unless the mask's values rule it out: a flash-attention op
// of a prompt ubatch, sparse prefill on, and no shape_decline_reason. The CUDA backend asks it of
// each graph's nodes before capturing the graph into a CUDA graph: the hook waits on the host for
// the device's mask verdict, which a stream being captured cannot, so such graphs run uncaptured.
bool takes_unless_mask_declines(const ggml_tensor * dst, const BackendLimits & limits);

// The message logged when the mask's values rule the op out (the same on both backends).
extern const char * const kMaskDeclineReason;

// ---------------------------------------------------------------- where the op's keys are
// What a hook knows of an op's keys and mask: the mask's note (ggml_kq_mask_note; the plain causal
// rule is plain_causal_note below) and, for a ring, the page crisp reads it in. note.n_past: the
// ubatch's queries are the positions n_past .. n_past + n_q - 1 (-1: crisp does not take the op).
// note.n_window 0: row i sees the cells [0, n_past + i], position p's K/V row is cell p (plain
// causal over a contiguous prefix). n_window > 0 (a sliding-window layer): row i sees positions
// [n_past + i - n_window + 1, n_past + i], in cell (p + ring_shift) % ring_cells — llama.cpp's
// sliding-window cache used as a ring — which crisp reads as pages of ring_page cells through a
// block table (ring_block_table_entry).
struct KeyLayout {
  ggml_kq_mask_note note{-1, 0, 0, 0};
  int64_t ring_page = 0;  // cells per page of the ring (a multiple of 16 dividing its size and shift)
  bool taken() const { return note.n_past >= 0; }
  bool windowed() const { return note.n_window > 0; }
};

// ---------------------------------------------------------------- the mask rule
// llama.cpp's KQ mask (F16 [n_kv, >= n_q]) for one sequence after n_past cached tokens in an
// unfragmented cache is bottom-right causal over a contiguous prefix: row i is 0 on cells
// [0, n_past + i] and -inf on the rest. n_past is read off row 0 (its leading zero cells, minus
// one); then every cell of the first n_q rows must obey mask_cell_ok. Anything else (non-causal,
// a sliding window beyond its reach, several sequences, holes in the cache, ALiBi biases) falls
// back unless llama.cpp noted it (below). Detect, don't guess: every cell is read (on the host by
// the CPU hook, by a kernel on the device by the CUDA hook).
GGML_CRISP_HD bool is_zero_f16(uint16_t bits) { return (bits & 0x7fff) == 0; }
GGML_CRISP_HD bool is_minus_inf_f16(uint16_t bits) { return bits == 0xfc00; }
// n_past from row 0's count of leading zero cells; -1 when that cannot be a causal mask of n_q
// queries over n_kv cells.
GGML_CRISP_HD int64_t n_past_of_row0(int64_t leading_zero_cells, int64_t n_q, int64_t n_kv) {
  const int64_t n_past = leading_zero_cells - 1;
  return n_past < 0 || n_past + n_q > n_kv ? -1 : n_past;
}
// Cell (i, j) against a note of the mask (ggml_kq_mask_note_sees: 0 where the row sees the cell,
// -inf elsewhere); the plain causal rule is the note {n_past, 0, 0, 0}.
GGML_CRISP_HD bool mask_cell_ok(uint16_t bits, const ggml_kq_mask_note & note, int64_t i, int64_t j) {
  return ggml_kq_mask_note_sees(&note, i, j) ? is_zero_f16(bits) : is_minus_inf_f16(bits);
}
GGML_CRISP_HD ggml_kq_mask_note plain_causal_note(int64_t n_past) { return ggml_kq_mask_note{n_past, 0, 0, 0}; }

// ---------------------------------------------------------------- the ring's pages
// NOTE: pages of at most 256 cells: llama.cpp pads its caches to 256 cells, so a ring's size is a
// multiple of it; crisp's paged K/V take any multiple of 16.
constexpr int64_t kMaxRingPage = 256;
// The largest page (a power of two from 256 down to 16) dividing the ring's size, its shift and the
// op's cells (the pool crisp reads is the op's K/V view), or 0 when there is none.
int64_t ring_page_size(int64_t ring_cells, int64_t ring_shift, int64_t n_kv);
// Entry i of the block table of a ring: the page of the cells of positions [i page, (i + 1) page),
// or page 0 where those cells lie past the op's n_kv (positions no query of the ubatch sees: crisp
// reads no key block wholly outside the window, and masks the edge).
GGML_CRISP_HD int32_t ring_block_table_entry(int64_t i, int64_t page, const ggml_kq_mask_note & ring, int64_t n_kv) {
  const int64_t cell = (i * page + ring.ring_shift) % ring.ring_cells;
  return cell + page <= n_kv ? static_cast<int32_t>(cell / page) : 0;
}
// Pages of the block table of an op with n_k keys.
inline int64_t ring_table_pages(int64_t n_k, int64_t page) { return (n_k + page - 1) / page; }

// ---------------------------------------------------------------- the mask's note
// The patched llama.cpp knows, when it fills a KQ mask, where the cells of the positions each row
// sees are (llama_kv_cache_unified::note_of_mask), and leaves that note on the node the op reads
// the mask from (ggml_kq_mask_set_note). A noted op needs no reading of the mask: on CUDA no kernels
// and no synchronisation, which used to stall the host in the middle of each ubatch's launches
// (docs/llama_cpp.md). An op without a note (a llama.cpp path that leaves none, another program's
// graph) is checked cell by cell as before, for the plain causal rule only.
// noted_layout: the note's KeyLayout (not taken when there is none, it does not fit the op — its
// rows past the mask's cells, a window other than the op's, a ring whose pages crisp cannot read —
// or CRISP_HOOK_MASK_NOTE=0 turns notes off, the A/B of the check).
KeyLayout noted_layout(const ggml_tensor * dst);
// CRISP_HOOK_MASK_NOTE=check: a noted op's mask is read as well, and a note that disagrees with the
// cells aborts (tests/llama_cpp runs it).
bool mask_note_check_requested();
[[noreturn]] void abort_on_wrong_note(const ggml_tensor * dst, const ggml_kq_mask_note & note);

// The op's KeyLayout (not taken: crisp does not take it): from its note, or, without one, from
// check_plain() (the backend's reading of every cell against the plain causal rule: n_past or -1).
// With the check requested, a noted op's cells are read too: check_note(note) is true when every
// cell agrees with the note (plain or ring alike). A sliding-window op without a note whose window
// is narrower than its cells is declined without reading the mask.
template <typename CheckPlain, typename CheckNote>
KeyLayout key_layout_of_op(const ggml_tensor * dst, CheckPlain && check_plain, CheckNote && check_note) {
  const KeyLayout noted = noted_layout(dst);
  if (noted.taken()) {
    if (mask_note_check_requested() && !check_note(noted.note)) abort_on_wrong_note(dst, noted.note);
    return noted;
  }
  KeyLayout plain;
  const int32_t window = ggml_flash_attn_ext_get_window(dst);
  if (window > 0 && dst->src[3]->ne[0] > window) return plain;  // a cut window, un-noted: not read
  plain.note = plain_causal_note(check_plain());
  return plain;
}

// ---------------------------------------------------------------- what crisp computes
// The Config an op runs with: a global layer's is the setting's; a sliding-window layer keeps its
// whole window (the dense preset with the layer's window: sparse selection applies to the global
// layers). Either way the setting's block size and the op's softmax scale.
crisp::Config config_of_op(const ggml_tensor * dst, const SparsePrefill & setting, const KeyLayout & layout);

}  // namespace ggml_crisp
