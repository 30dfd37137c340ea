#include "backends/cpu/panel.h"

#include <algorithm>

#include "backends/cpu/simd.h"

// The tile loops carry explicit unroll pragmas: without them GCC 12 unrolls them too late to keep
// the accumulator arrays in registers (a store per fma, about 3x slower).

namespace tf::cpu {
namespace {

using simd::kLanes;

// Tiles of MR rows x 64 columns keep their accumulators in registers.
template <int MR, bool kNeg>
inline void panel_tile(const float* A, int64_t lda, const float* B, int64_t ldb, const float* Y0,
                       int64_t ld0, float* Y, int64_t ldy, int64_t c, int64_t N, int64_t K) {
  constexpr int NV = 4;
  simd::M m[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) m[v] = simd::mask_for(std::max<int64_t>(0, N - c - v * kLanes));
  simd::V acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      acc[r][v] =
          Y0 != nullptr ? simd::load(Y0 + r * ld0 + c + v * kLanes, m[v]) : simd::set1(0.0f);
  for (int64_t k = 0; k < K; ++k) {
    simd::V b[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) b[v] = simd::load(B + k * ldb + c + v * kLanes, m[v]);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const auto av = simd::set1(A[r * lda + k]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
#if defined(__AVX512F__)
        acc[r][v] = kNeg ? _mm512_fnmadd_ps(av, b[v], acc[r][v]) : simd::fma(av, b[v], acc[r][v]);
#else
        acc[r][v] = simd::fma(kNeg ? simd::set1(-A[r * lda + k]) : av, b[v], acc[r][v]);
#endif
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) simd::store(Y + r * ldy + c + v * kLanes, acc[r][v], m[v]);
}

template <bool kNeg>
void panel(const float* A, int64_t lda, const float* B, int64_t ldb, const float* Y0, int64_t ld0,
           float* Y, int64_t ldy, int64_t M, int64_t N, int64_t K) {
  for (int64_t c = 0; c < N; c += 4 * kLanes) {
    int64_t i = 0;
    auto y0 = [&](int64_t row) { return Y0 != nullptr ? Y0 + row * ld0 : nullptr; };
    for (; i + 6 <= M; i += 6)
      panel_tile<6, kNeg>(A + i * lda, lda, B, ldb, y0(i), ld0, Y + i * ldy, ldy, c, N, K);
    for (; i + 2 <= M; i += 2)
      panel_tile<2, kNeg>(A + i * lda, lda, B, ldb, y0(i), ld0, Y + i * ldy, ldy, c, N, K);
    for (; i < M; ++i)
      panel_tile<1, kNeg>(A + i * lda, lda, B, ldb, y0(i), ld0, Y + i * ldy, ldy, c, N, K);
  }
}

}  // namespace

void panel_gemm(const float* A, int64_t lda, const float* B, int64_t ldb, const float* Y0,
                int64_t ld0, float* Y, int64_t ldy, int64_t M, int64_t N, int64_t K) {
  panel<false>(A, lda, B, ldb, Y0, ld0, Y, ldy, M, N, K);
}

void panel_gemm_sub(const float* A, int64_t lda, const float* B, int64_t ldb, const float* Y0,
                    int64_t ld0, float* Y, int64_t ldy, int64_t M, int64_t N, int64_t K) {
  panel<true>(A, lda, B, ldb, Y0, ld0, Y, ldy, M, N, K);
}

}  // namespace tf::cpu
