// Checks for CUDA code, the first error tier (a failure is a bug or a dead device: print
// file:line, the expression and the message, then abort). Runtime conditions (no device, out of
// memory at load) are the caller's to return as a Status. fmt stays out of .cu files (nvcc cannot
// evaluate its consteval format checks), hence these instead of TF_CHECK.
#pragma once

#include <cuda_runtime_api.h>

namespace tf::cuda::detail {
[[noreturn]] void fail(const char* file, int line, const char* expr, const char* msg);
}  // namespace tf::cuda::detail

// TF_CUDA_CHECK(cudaMalloc(...)): the call must return cudaSuccess.
#define TF_CUDA_CHECK(call)                                                                  \
  do {                                                                                       \
    const cudaError_t tf_cuda_err_ = (call);                                                 \
    if (tf_cuda_err_ != cudaSuccess) [[unlikely]]                                            \
      ::tf::cuda::detail::fail(__FILE__, __LINE__, #call, cudaGetErrorString(tf_cuda_err_)); \
  } while (0)

// TF_CUDA_REQUIRE(cond, "message"): a precondition of a launcher.
#define TF_CUDA_REQUIRE(cond, msg)                              \
  do {                                                          \
    if (!(cond)) [[unlikely]]                                   \
      ::tf::cuda::detail::fail(__FILE__, __LINE__, #cond, msg); \
  } while (0)
