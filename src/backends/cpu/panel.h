// Small row-major fp32 products for the CPU kernels (internal to backends/cpu): the chunked delta
// rule's [n, K] x [K, N] blocks. Each element is one fma per k in ascending k, starting from Y0's
// value (or 0), whatever the tile it falls in.
#pragma once

#include <cstdint>

namespace tf::cpu {

// Y[i, c] = Y0[i, c] + sum_k A[i, k] B[k, c] (Y0 null: from 0). A: [M, K], B: [K, N], Y, Y0:
// [M, N], row-major with the given row strides; Y may alias Y0.
void panel_gemm(const float* A, int64_t lda, const float* B, int64_t ldb, const float* Y0,
                int64_t ld0, float* Y, int64_t ldy, int64_t M, int64_t N, int64_t K);
// The same with Y0 - A B (one fnmadd per k).
void panel_gemm_sub(const float* A, int64_t lda, const float* B, int64_t ldb, const float* Y0,
                    int64_t ld0, float* Y, int64_t ldy, int64_t M, int64_t N, int64_t K);

}  // namespace tf::cpu
