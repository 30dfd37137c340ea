// Element-wise fp32 vector math for the CPU kernels (internal to backends/cpu). Every function is a
// pure function of each lane's input, so a vector and a masked tail give the same bits per element.
#pragma once

#include <cmath>
#include <cstdint>

#include "backends/cpu/gemm_kernels.h"

namespace tf::cpu::simd {

using kern::kLanes;

using V = kern::Vec;
using M = kern::Mask;

#if defined(__AVX512F__)
inline M mask_for(int64_t left) {
  return left >= kLanes ? M(0xffff) : M((1u << left) - 1);
}
inline V load(const float* p, M m) {
  return _mm512_maskz_loadu_ps(m, p);
}
inline void store(float* p, V v, M m) {
  _mm512_mask_storeu_ps(p, m, v);
}
inline V set1(float x) {
  return _mm512_set1_ps(x);
}
inline V add(V a, V b) {
  return _mm512_add_ps(a, b);
}
inline V sub(V a, V b) {
  return _mm512_sub_ps(a, b);
}
inline V mul(V a, V b) {
  return _mm512_mul_ps(a, b);
}
inline V fma(V a, V b, V c) {
  return _mm512_fmadd_ps(a, b, c);
}

// e^x with a max error of about 1 ulp; inputs are clamped to [-103.97, 88.72] (so the result
// saturates at ~FLT_MAX and 0); NaN stays NaN (min/max return their second operand on NaN).
inline V exp(V x) {
  const V log2e = _mm512_set1_ps(1.44269504088896341f);
  const V ln2_hi = _mm512_set1_ps(0.693359375f), ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
  x = _mm512_min_ps(_mm512_set1_ps(88.7228394f), x);
  x = _mm512_max_ps(_mm512_set1_ps(-103.972694f), x);
  const V n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT);
  V r = _mm512_fnmadd_ps(n, ln2_hi, x);
  r = _mm512_fnmadd_ps(n, ln2_lo, r);
  // e^r on |r| <= ln2/2: Cephes' degree-6 polynomial.
  V p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const V r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, r);
  p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}
// x * sigmoid(x) = x / (1 + e^-x)
inline V silu(V x) {
  const V e = exp(_mm512_sub_ps(_mm512_setzero_ps(), x));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}
#else
// Portable fallback: one lane at a time through the same formulas in scalar code.
inline M mask_for(int64_t left) {
  return left;
}
inline V load(const float* p, M m) {
  V r{};
  for (int i = 0; i < kLanes && i < m; ++i) r.v[i] = p[i];
  return r;
}
inline void store(float* p, V v, M m) {
  for (int i = 0; i < kLanes && i < m; ++i) p[i] = v.v[i];
}
inline V set1(float x) {
  V r;
  for (float& e : r.v) e = x;
  return r;
}
inline V add(V a, V b) {
  for (int i = 0; i < kLanes; ++i) a.v[i] += b.v[i];
  return a;
}
inline V sub(V a, V b) {
  for (int i = 0; i < kLanes; ++i) a.v[i] -= b.v[i];
  return a;
}
inline V mul(V a, V b) {
  for (int i = 0; i < kLanes; ++i) a.v[i] *= b.v[i];
  return a;
}
inline V fma(V a, V b, V c) {
  for (int i = 0; i < kLanes; ++i) c.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
  return c;
}
inline V exp(V x) {
  for (float& e : x.v) e = std::exp(e);
  return x;
}
inline V silu(V x) {
  for (float& e : x.v) e = e / (1.0f + std::exp(-e));
  return x;
}
#endif

}  // namespace tf::cpu::simd
