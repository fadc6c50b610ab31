// src/cuda/cuda_check.h — turns CUDA runtime errors into crisp::Error, so a failing allocation,
// copy or launch reaches the caller as the library's one error type with the failing call named.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "crisp/error.h"

namespace crisp {
namespace cuda_detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* what, const char* file,
                                          int line) {
  throw Error(std::string("CUDA ") + what,
              std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ") at " +
                  file + ":" + std::to_string(line),
              "cudaSuccess");
}

}  // namespace cuda_detail
}  // namespace crisp

// Evaluates a cudaError_t expression and throws crisp::Error naming it on failure.
#define CRISP_CUDA_CHECK(expr)                                                              \
  do {                                                                                      \
    const cudaError_t crisp_cuda_status_ = (expr);                                          \
    if (crisp_cuda_status_ != cudaSuccess)                                                  \
      ::crisp::cuda_detail::throw_cuda_error(crisp_cuda_status_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: reports launch-configuration errors (without synchronising).
#define CRISP_CUDA_CHECK_LAUNCH(kernel_name)                                                 \
  do {                                                                                      \
    const cudaError_t crisp_cuda_status_ = cudaGetLastError();                              \
    if (crisp_cuda_status_ != cudaSuccess)                                                  \
      ::crisp::cuda_detail::throw_cuda_error(crisp_cuda_status_, "launch of " kernel_name,   \
                                             __FILE__, __LINE__);                           \
  } while (0)
