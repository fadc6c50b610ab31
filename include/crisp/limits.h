// crisp/limits.h — the bounds of one call, for callers that check (or route) before they allocate:
// an engine choosing between crisp and its own kernel, the Python package, the llama.cpp hooks.
// The library checks the same bounds and names the argument when one fails (crisp::Error); the
// CUDA kernels' head dims are crisp::cuda::head_dim_supported (crisp/cuda.h).
#pragma once
#include <cstdint>

namespace crisp {

// The most tokens of q, and of k, in one call (or one context-parallel sequence): plans store
// token and block indices as int32.
constexpr int64_t kMaxTokens = 2147483647;

// The largest head dim of any backend: the CPU backend takes 1 <= d <= kMaxHeadDim.
// NOTE: set by the CUDA kernels' register budget (their largest instantiation); the CPU backend
// keeps the same bound so that every shape one backend takes, the other takes too.
constexpr int64_t kMaxHeadDim = 256;

}  // namespace crisp
