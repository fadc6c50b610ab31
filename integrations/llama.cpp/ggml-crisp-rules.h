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

// ---------------------------------------------------------------- the mask rule
// llama.cpp's KQ mask (F16 [n_kv, >= n_q]) for one sequence after n_past cached tokens in an
// unfragmented cache is bottom-right causal over a contiguous prefix: row i is 0 on cells
// [0, n_past + i] and -inf on the rest. n_past is read off row 0 (its leading zero cells, minus
// one); then every cell of the first n_q rows must obey mask_cell_ok. Anything else (non-causal,
// a sliding window beyond its reach, several sequences, holes in the cache, ALiBi biases) falls
// back. Detect, don't guess: every cell is read (on the host by the CPU hook, by a kernel on the
// device by the CUDA hook).
GGML_CRISP_HD bool is_zero_f16(uint16_t bits) { return (bits & 0x7fff) == 0; }
GGML_CRISP_HD bool is_minus_inf_f16(uint16_t bits) { return bits == 0xfc00; }
// n_past from row 0's count of leading zero cells; -1 when that cannot be a causal mask of n_q
// queries over n_kv cells.
GGML_CRISP_HD int64_t n_past_of_row0(int64_t leading_zero_cells, int64_t n_q, int64_t n_kv) {
  const int64_t n_past = leading_zero_cells - 1;
  return n_past < 0 || n_past + n_q > n_kv ? -1 : n_past;
}
GGML_CRISP_HD bool mask_cell_ok(uint16_t bits, int64_t i, int64_t j, int64_t n_past) {
  return j <= n_past + i ? is_zero_f16(bits) : is_minus_inf_f16(bits);
}

// ---------------------------------------------------------------- the mask's causal note
// The patched llama.cpp knows, when it fills a KQ mask, whether the mask is plain causal over a
// contiguous prefix and after how many cells (llama_kv_cache_unified::causal_note_of_mask), and
// leaves that note on the node the op reads the mask from (ggml_kq_mask_set_causal_note). A noted
// op needs no reading of the mask: on CUDA no kernels and no synchronisation, which used to stall
// the host in the middle of each ubatch's launches (docs/llama_cpp.md). An op without a note (a
// llama.cpp path that leaves none, another program's graph) is checked cell by cell as before.
// noted_n_past: the note's n_past, or -1 when there is none, it does not fit the op (n_past + n_q
// cells within the mask's), or CRISP_HOOK_MASK_NOTE=0 turns notes off (the A/B of the check).
int64_t noted_n_past(const ggml_tensor * dst);
// CRISP_HOOK_MASK_NOTE=check: a noted op's mask is read as well, and a note that disagrees with the
// cells aborts (tests/llama_cpp runs it).
bool mask_note_check_requested();
[[noreturn]] void abort_on_wrong_note(const ggml_tensor * dst, int64_t noted, int64_t checked);

// The op's n_past (-1: the mask rules the op out), from its note, or from check_mask() (the
// backend's reading of every cell) when there is no note or the check is requested.
template <typename CheckMask>
int64_t causal_prefix_of_op(const ggml_tensor * dst, CheckMask && check_mask) {
  const int64_t noted = noted_n_past(dst);
  if (noted >= 0 && !mask_note_check_requested()) return noted;
  const int64_t checked = check_mask();
  if (noted >= 0 && checked != noted) abort_on_wrong_note(dst, noted, checked);
  return checked;
}

}  // namespace ggml_crisp
