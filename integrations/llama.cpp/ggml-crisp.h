// integrations/llama.cpp/ggml-crisp.h — crisp's hook inside ggml's CPU backend (see
// docs/llama_cpp.md). Compiled into ggml-cpu by integrations/llama.cpp/crisp.patch; the public
// setter (ggml_cpu_set_sparse_prefill) is declared in the patched ggml-cpu.h.
#pragma once

struct ggml_tensor;

// Called by every thread of ggml's CPU flash-attention op (GGML_OP_FLASH_ATTN_EXT) before its
// own kernel. Returns true when crisp computed this thread's share of `dst` (thread `ith` of
// `nth`); false when the op is not one crisp handles (sparse prefill off, a decode step, a mask
// that is not plain causal over a contiguous prefix, ALiBi, softcap, sinks, ...), and then
// llama.cpp's own kernel runs. That answer depends only on the op's tensors and the setting, so
// every thread of one op gives the same one (they share the setting the op's first thread read: a
// setting changed while the op runs applies from the next op on). Past it, crisp may
// still refuse the values themselves (a NaN or Inf in Q, K or V) on one thread's heads: the
// threads then meet at `barrier(barrier_arg)` (ggml's barrier of the op's threadpool, called by
// every thread of the op the same number of times) and all return false, so llama.cpp's kernel
// recomputes the whole op.
bool ggml_crisp_flash_attn_ext(struct ggml_tensor * dst, int ith, int nth, void (*barrier)(void *),
                               void * barrier_arg);
