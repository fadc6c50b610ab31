// src/model/cuda/llama_cuda.h — the CUDA backend of the Llama runner (src/model/llama.h): the
// same computation as the CPU LlamaContext, on one GPU.
//
// Plain C++ header (no CUDA types), included by src/model/llama.cpp in CUDA builds only
// (CRISP_WITH_CUDA). Reached through RunOptions::backend = ModelBackend::cuda; nothing else
// should call it directly.
//
// Choices (see llama_cuda.cu for the why):
//  - weights: LlamaModel's float32 dequantised copies, uploaded once per model (kept in
//    LlamaModel::backend_cache()) and shared by every context of that model;
//  - matmuls: cublasSgemm, CUBLAS_DEFAULT_MATH (float32 compute, no TF32), so the products are
//    float32 like the CPU's and differ from them only in summation order;
//  - RoPE: the CPU Rope's own cos/sin tables, uploaded;
//  - prefill attention: crisp::cuda::plan_async on the float32 post-RoPE Q/K (the CPU planner's
//    input precision), then attend_async on float16 copies of Q/K/V (the kernel takes f16/bf16;
//    f16 keeps 3 more mantissa bits than bf16 and the post-RoPE values of these models are far
//    inside its range), or a float32 reference kernel following the same plan
//    (CudaPrefillAttention::reference_f32);
//  - decode: dense float32 attention over a float32 KV cache (split over key chunks, merged).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "model/llama.h"

namespace crisp {
namespace model {
namespace cuda_runner {

// True when a CUDA device is visible. Never throws.
bool cuda_device_visible();
// The current device's name ("" when none). Never throws.
std::string device_name();

// The CUDA implementation of one LlamaContext of `capacity` positions. `rope` must have reserved
// at least `capacity` positions. Uploads the model's weights on first use.
std::unique_ptr<detail::ContextBackend> make_cuda_context(const LlamaModel& model, int64_t capacity,
                                                          const RunOptions& options, const Rope& rope);

}  // namespace cuda_runner
}  // namespace model
}  // namespace crisp
