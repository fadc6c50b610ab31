// src/model/matmul.h — the dense float32 products of the model runner.
//
// Every linear layer of the model is y = x · Wᵀ with W stored as GGUF stores it: one contiguous
// row per output feature ("transpose-free": the weights are used in their file layout, no packed
// copy). Both operands are then read along their contiguous dimension, so the product is a grid
// of dot products, register-blocked over several tokens × several weight rows.
#pragma once
#include <cstdint>

namespace crisp {
namespace model {

// y[i, j] = Σ_p x[i, p] · w[j, p] for i < tokens, j < rows.
//   x: [tokens, depth] with row stride ldx; w: [rows, depth] with row stride ldw;
//   y: [tokens, rows] with row stride ldy. threads: OpenMP threads (0 = all).
// Dispatches once to an AVX-512, AVX2+FMA or portable kernel by what the CPU supports.
void matmul_xwt(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy,
                int64_t tokens, int64_t rows, int64_t depth, int threads);

// Name of the kernel the dispatcher picked ("avx512", "avx2", "portable").
const char* matmul_kernel_name();

}  // namespace model
}  // namespace crisp
