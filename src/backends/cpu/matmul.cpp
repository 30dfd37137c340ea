#include "backends/cpu/matmul.h"

#include <cstring>

#include "core/check.h"

#if defined(__AVX512F__)
#include <immintrin.h>
// GCC 12's AVX-512 intrinsics (_mm512_reduce_add_ps, masked loads) trip its own uninitialized-value
// warnings on the intrinsic headers' internals; they are false positives.
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace tf::cpu {
namespace {

constexpr int kLanes = 16;

#if defined(__AVX512F__)
using Vec = __m512;
inline Vec vzero() {
  return _mm512_setzero_ps();
}
// Load 16 weights starting at p (element index) as f32; `mask` selects the valid tail lanes.
template <DType D>
inline Vec load_w(const void* base, int64_t k, __mmask16 mask) {
  if constexpr (D == DType::kF32) {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(base) + k);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(base) + k);
    if constexpr (D == DType::kBF16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return _mm512_cvtph_ps(h);
    }
  }
}
inline Vec load_x(const float* x, int64_t k, __mmask16 mask) {
  return _mm512_maskz_loadu_ps(mask, x + k);
}
inline Vec fma(Vec a, Vec b, Vec c) {
  return _mm512_fmadd_ps(a, b, c);
}
inline float hsum(Vec v) {
  return _mm512_reduce_add_ps(v);
}
inline __mmask16 tail_mask(int64_t left) {
  return left >= kLanes ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
}
#else
// Portable fallback with the same shape: 16 lanes, FMA per lane, pairwise reduction.
struct Vec {
  float v[kLanes];
};
inline Vec vzero() {
  return Vec{};
}
using Mask = int64_t;  // number of valid lanes
template <DType D>
inline Vec load_w(const void* base, int64_t k, Mask n) {
  Vec r{};
  for (int i = 0; i < kLanes && i < n; ++i) {
    if constexpr (D == DType::kF32)
      r.v[i] = static_cast<const float*>(base)[k + i];
    else if constexpr (D == DType::kBF16)
      r.v[i] = bf16_to_f32(static_cast<const uint16_t*>(base)[k + i]);
    else
      r.v[i] = f16_to_f32(static_cast<const uint16_t*>(base)[k + i]);
  }
  return r;
}
inline Vec load_x(const float* x, int64_t k, Mask n) {
  Vec r{};
  for (int i = 0; i < kLanes && i < n; ++i) r.v[i] = x[k + i];
  return r;
}
inline Vec fma(Vec a, Vec b, Vec c) {
  for (int i = 0; i < kLanes; ++i) c.v[i] = __builtin_fmaf(a.v[i], b.v[i], c.v[i]);
  return c;
}
inline float hsum(Vec v) {
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) v.v[i] += v.v[i + w];
  return v.v[0];
}
inline Mask tail_mask(int64_t left) {
  return left;
}
#endif

// Tile of R weight rows x T tokens: R*T accumulators, each the canonical per-element sequence.
template <DType D, int R, int T>
inline void tile(const char* w, int64_t w_stride, int64_t K, const float* x, int64_t ldx, float* y,
                 int64_t ldy) {
  Vec acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = vzero();
  for (int64_t k = 0; k < K; k += kLanes) {
    const auto m = tail_mask(K - k);
    Vec xv[T];
    for (int t = 0; t < T; ++t) xv[t] = load_x(x + t * ldx, k, m);
    for (int r = 0; r < R; ++r) {
      const Vec wv = load_w<D>(w + r * w_stride, k, m);
      for (int t = 0; t < T; ++t) acc[r][t] = fma(wv, xv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[t * ldy + r] = hsum(acc[r][t]);
}

// Rows [r0, r1) for all n tokens.
template <DType D>
void matmul_rows(const Mat& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
                 int64_t r0, int64_t r1) {
  const int64_t stride = w.cols * static_cast<int64_t>(dtype_size(D));
  const char* base = static_cast<const char*>(w.data);
  const int64_t K = w.cols;
  constexpr int kR = 4, kT = 4;
  int64_t r = r0;
  for (; r + kR <= r1; r += kR) {
    const char* wr = base + r * stride;
    int64_t t = 0;
    for (; t + kT <= n; t += kT)
      tile<D, kR, kT>(wr, stride, K, x + t * ldx, ldx, y + t * ldy + r, ldy);
    for (; t < n; ++t) tile<D, kR, 1>(wr, stride, K, x + t * ldx, ldx, y + t * ldy + r, ldy);
  }
  for (; r < r1; ++r) {
    const char* wr = base + r * stride;
    int64_t t = 0;
    for (; t + kT <= n; t += kT)
      tile<D, 1, kT>(wr, stride, K, x + t * ldx, ldx, y + t * ldy + r, ldy);
    for (; t < n; ++t) tile<D, 1, 1>(wr, stride, K, x + t * ldx, ldx, y + t * ldy + r, ldy);
  }
}

template <DType D>
void matmul_impl(const Mat& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
                 ThreadPool* pool) {
  // Split output rows in blocks of 16; each block costs about n * 16 * cols FMAs.
  const int64_t grain = 16;
  if (pool == nullptr || w.rows * w.cols * n < (int64_t{1} << 15)) {
    matmul_rows<D>(w, x, ldx, n, y, ldy, 0, w.rows);
    return;
  }
  pool->parallel_for(w.rows, grain,
                     [&](int64_t b, int64_t e) { matmul_rows<D>(w, x, ldx, n, y, ldy, b, e); });
}

}  // namespace

void matmul(const Mat& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
            ThreadPool* pool) {
  if (n <= 0 || w.rows <= 0) return;
  switch (w.dtype) {
    case DType::kF32:
      return matmul_impl<DType::kF32>(w, x, ldx, n, y, ldy, pool);
    case DType::kBF16:
      return matmul_impl<DType::kBF16>(w, x, ldx, n, y, ldy, pool);
    case DType::kF16:
      return matmul_impl<DType::kF16>(w, x, ldx, n, y, ldy, pool);
  }
}

float dot_row(const Mat& w, int64_t r, const float* x) {
  float y = 0;
  matmul(w.row_slice(r, 1), x, w.cols, 1, &y, 1, nullptr);
  return y;
}

void row_to_f32(const Mat& w, int64_t r, float* out) {
  TF_CHECK(r >= 0 && r < w.rows, "row {} of {}", r, w.rows);
  const int64_t K = w.cols;
  switch (w.dtype) {
    case DType::kF32:
      std::memcpy(out, static_cast<const float*>(w.data) + r * K, K * sizeof(float));
      return;
    case DType::kBF16: {
      const auto* p = static_cast<const uint16_t*>(w.data) + r * K;
      for (int64_t k = 0; k < K; ++k) out[k] = bf16_to_f32(p[k]);
      return;
    }
    case DType::kF16: {
      const auto* p = static_cast<const uint16_t*>(w.data) + r * K;
      for (int64_t k = 0; k < K; ++k) out[k] = f16_to_f32(p[k]);
      return;
    }
  }
}

}  // namespace tf::cpu
