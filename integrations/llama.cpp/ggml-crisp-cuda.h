// integrations/llama.cpp/ggml-crisp-cuda.h — crisp's hook inside ggml's CUDA backend (see
// docs/llama_cpp.md). Compiled into ggml-cuda by crisp.patch, whose fattn.cu and ggml-cuda.cu
// repeat these declarations (their include paths do not reach this directory).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

struct ggml_tensor;
struct ggml_backend_cuda_context;

// Called by ggml_cuda_flash_attn_ext before its own kernels. Returns true when crisp computed
// `dst` (enqueued on ctx's stream); false when the op is not one crisp handles (sparse prefill off,
// a decode step, a mask that is not plain causal over a contiguous prefix, ALiBi, softcap, sinks,
// a quantised cache, a head dim crisp's CUDA kernels lack, ...), and then llama.cpp's kernel runs.
bool ggml_crisp_cuda_flash_attn_ext(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// Whether ggml_crisp_cuda_flash_attn_ext takes `dst` unless its mask's values rule it out (the
// verdict it waits for on the host). ggml-cuda captures no CUDA graph holding such an op.
bool ggml_crisp_cuda_would_take(const ggml_tensor * dst);

// Called by ggml-cuda at the start of every graph compute: a new generation of its inputs. The KQ
// mask of a compute is set before it and read by every layer's op in it, so the hook checks it once
// per (compute, mask) and reuses the verdict for the other layers (no kernel, no synchronisation).
void ggml_crisp_cuda_graph_compute_begin(void);

// The registry's "ggml_backend_set_sparse_prefill", "ggml_backend_get_sparse_prefill_stats" and
// "ggml_backend_reset_sparse_prefill_stats" of the CUDA backend.
extern "C" bool ggml_cuda_set_sparse_prefill(const char * policy, const char * const * settings, int n_settings,
                                             char * error, size_t error_size);
extern "C" void ggml_cuda_get_sparse_prefill_stats(int64_t * handled, int64_t * declined, int64_t * kept_blocks,
                                                   int64_t * causal_blocks);
extern "C" void ggml_cuda_reset_sparse_prefill_stats(void);

// The grid of the hook's element-wise kernels (conversions, tables, its output check's
// comparisons), which stride over what the grid does not cover.
// NOTE: 256 threads a block, at most 4096 blocks: enough to fill an H200 at any size.
constexpr int kGgmlCrispElementThreads = 256;
inline unsigned ggml_crisp_element_blocks(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kGgmlCrispElementThreads - 1) / kGgmlCrispElementThreads, 4096));
}
