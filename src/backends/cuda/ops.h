// Row-local ops and matrix products of the Qwen3-Next forward pass on CUDA, fp32 activations,
// bf16 or fp32 weights, fp32 accumulation. Every pointer is device memory; every call is
// enqueued on `stream` and returns at once.
//
// Determinism contract (architecture.md): each output element is computed by one fixed sequence
// of operations, the same whatever the number of rows n, the row it is in, or the launch shape
// chosen for n, so a token's result never depends on the other tokens of the batch. Reductions
// use a fixed per-lane order and a fixed shuffle tree; no atomics, no split-K that varies with n.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"

namespace tf::cuda {

// Zero-centred RMSNorm over `dim`: y = x * rsqrt(mean(x^2) + eps) * (1 + w). x, y: [n, dim]
// (in place ok); w: [dim] fp32.
void rmsnorm_zc(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* y,
                cudaStream_t stream);

// y[t, r] = sum_k w[r, k] * x[t, k]: w [rows, cols] row-major in `wtype` (bf16 or f32), x [n, cols]
// fp32, y [n, rows] fp32. cols must be a multiple of 8. One warp per output element: lane l sums
// k = 8 l + 256 j + i (i < 8) in order of j then i, then a xor-shuffle tree over the 32 lanes.
void matmul(DType wtype, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n,
            float* y, cudaStream_t stream);

// y = silu(g) * u, elementwise over n values (the SwiGLU of the MLPs and experts).
void silu_mul(const float* g, const float* u, int64_t n, float* y, cudaStream_t stream);

// NeoX rotary embedding, in place, on the first rotary_dim dims of each head: x [T, n_heads,
// head_dim], pos [T] (device), inv_freq [rotary_dim / 2] (device).
void rope_neox(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t rotary_dim,
               const float* inv_freq, const int64_t* pos, cudaStream_t stream);

}  // namespace tf::cuda
