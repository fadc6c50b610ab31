// integrations/llama.cpp/ggml-crisp-cuda-check.h — the CUDA hook's debug check of its outputs
// (CRISP_HOOK_CHECK_OUTPUT, docs/llama_cpp.md "Debugging on CUDA"): each op crisp computed is
// computed again by llama.cpp's own kernel (and, on request, by an exact attention in double), the
// differences are logged, and either result may be kept in dst. Compiled into ggml-cuda by
// crisp.patch beside ggml-crisp-cuda.cu.
#pragma once

#include <cstdint>

#include "ggml-sparse-prefill.h"  // ggml_kq_mask_note

struct ggml_tensor;
struct ggml_backend_cuda_context;

// CRISP_HOOK_CHECK_OUTPUT is 1 or exact (read once).
bool ggml_crisp_cuda_output_check_requested();

// True on this thread while the check runs llama.cpp's kernel: the hook declines then.
bool ggml_crisp_cuda_computing_reference();

// After crisp wrote dst (on ctx's stream): llama.cpp's kernel computes the op into the pool, the
// largest difference is measured and logged when it exceeds the tolerance (the op, its note and
// the ring's page size), the worst op of each kind (windowed or not) is printed at exit; with
// CRISP_HOOK_CHECK_OUTPUT=exact the exact attention too. CRISP_HOOK_CHECK_KEEP chooses what stays in
// dst. Synchronises the stream.
void ggml_crisp_cuda_check_output(ggml_backend_cuda_context & ctx, ggml_tensor * dst, const ggml_kq_mask_note & note,
                                  int64_t ring_page);
