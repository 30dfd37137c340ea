// The matmul micro-kernels of the CPU backend (internal to backends/cpu).
//
// The canonical arithmetic of one output element y[t, r] = sum_k w[r, k] x[t, k]:
//   acc (16 fp32 lanes) = 0; for k0 = 0, 16, 32, ... : acc = fma(w[r, k0 + lane], x[t, k0 + lane],
//   acc) (lanes past K load zeros); y = reduce_add(acc) with the fixed tree of _mm512_reduce_add_ps
//   ((l_i + l_i+8), then + 4, + 2, + 1).
// Every kernel below computes each of its elements with exactly that sequence, whatever its tile
// shape R x T, so a result does not depend on the batch size, the tiling or the thread split.
//
// bf16 products (a bf16 Mat with bf16_inputs, --matmul-precision bf16) have a second canonical
// sequence: x is rounded to bf16 (round to nearest even) 32 columns at a time, and
//   acc (16 fp32 lanes) = 0; for k0 = 0, 32, 64, ... : acc = dpbf16(acc, w[r, k0 .. k0 + 31],
//   x[t, k0 .. k0 + 31]) (VDPBF16PS: lane i adds the product of columns k0 + 2i + 1, then that of
//   k0 + 2i, each addition rounded to fp32; columns past K load zeros); y = reduce_add(acc) with
//   the same tree.
// It is llama.cpp's arithmetic for bf16 weights: two products per lane per instruction on
// AVX512-BF16 (bench-mid prefill 1.27-1.48x), at the precision of bf16 inputs.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backends/cpu/matmul.h"
#include "core/dtype.h"

#if defined(__AVX512F__)
#include <immintrin.h>
// GCC 12's AVX-512 intrinsics (_mm512_reduce_add_ps, masked loads) trip its own uninitialized-value
// warnings on the intrinsic headers' internals; they are false positives. (This header is internal
// to backends/cpu.)
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace tf::cpu::kern {

constexpr int kLanes = 16;

// Token t's input row is base + (idx ? idx[t] : t) * ld.
struct XRows {
  const float* base = nullptr;
  int64_t ld = 0;
  const int32_t* idx = nullptr;
  // Optional, for bf16 products over more than 4 tokens: the same rows rounded to bf16
  // (round_rows_bf16), row i at bf16 + i * bf16_ld, indexed like base. A product's caller rounds
  // its input once; without them each call rounds its token blocks itself (the same bits), which
  // a product split into many row ranges repeats for every range.
  const uint16_t* bf16 = nullptr;
  int64_t bf16_ld = 0;
  const float* row(int64_t t) const { return base + (idx != nullptr ? idx[t] : t) * ld; }
  const uint16_t* row_bf16(int64_t t) const {
    return bf16 + (idx != nullptr ? idx[t] : t) * bf16_ld;
  }
};

#if defined(__AVX512F__)
using Vec = __m512;
using Mask = __mmask16;
inline Vec vzero() {
  return _mm512_setzero_ps();
}
template <DType D>
inline Vec load_w(const void* base, int64_t k) {
  if constexpr (D == DType::kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(base) + k);
  } else {
    const __m256i h = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + k));
    if constexpr (D == DType::kBF16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return _mm512_cvtph_ps(h);
    }
  }
}
template <DType D>
inline Vec load_w_tail(const void* base, int64_t k, Mask m) {
  if constexpr (D == DType::kF32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(base) + k);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(base) + k);
    if constexpr (D == DType::kBF16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return _mm512_cvtph_ps(h);
    }
  }
}
inline Vec load_x(const float* x, int64_t k) {
  return _mm512_loadu_ps(x + k);
}
inline Vec load_x_tail(const float* x, int64_t k, Mask m) {
  return _mm512_maskz_loadu_ps(m, x + k);
}
inline Vec fma(Vec a, Vec b, Vec c) {
  return _mm512_fmadd_ps(a, b, c);
}
inline float hsum(Vec v) {
  return _mm512_reduce_add_ps(v);
}
inline Mask tail_mask(int64_t left) {
  return left >= kLanes ? Mask(0xffff) : Mask((1u << left) - 1);
}
// out[i] = hsum(v[i]) for 16 vectors at once, with hsum's exact tree (and so its bits): the four
// levels (l_i + l_i+8), (+4), (+2), (+1) run on two vectors' worth of lanes per add.
inline void hsum16(const Vec* v, float* out) {
  Vec w[8], x[4], y[2];
  for (int i = 0; i < 8; ++i) {  // w_i = [t(v_2i) 0..7 | t(v_2i+1) 0..7]
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  for (int j = 0; j < 4; ++j) {  // x_j = [s(v_4j) 0..3 | s(v_4j+1) | s(v_4j+2) | s(v_4j+3)]
    x[j] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * j], w[2 * j + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(w[2 * j], w[2 * j + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  for (int k = 0; k < 2; ++k) {  // 128-bit lane L of y_k: [u(v_8k+L) 0,1 | u(v_8k+4+L) 0,1]
    y[k] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * k], x[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(x[2 * k], x[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // Lane L: [r(v_L), r(v_4+L), r(v_8+L), r(v_12+L)]; element 4L + m holds r(v_4m+L).
  const Vec r = _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, r));
}
#endif
#if defined(__AVX512BF16__)
// 32 bf16 values: columns k .. k + 31 of a weight row, or of an input row rounded to bf16.
using Pairs = __m512bh;
inline Pairs load_w_pairs(const void* base, int64_t k) {
  return reinterpret_cast<Pairs>(_mm512_loadu_si512(static_cast<const uint16_t*>(base) + k));
}
inline Pairs load_w_pairs_tail(const void* base, int64_t k, int64_t left) {
  const __mmask32 m = left >= 32 ? ~__mmask32{0} : (__mmask32{1} << left) - 1;
  return reinterpret_cast<Pairs>(
      _mm512_maskz_loadu_epi16(m, static_cast<const uint16_t*>(base) + k));
}
// x[k .. k + 31] rounded to bf16 (element j is column k + j).
inline Pairs load_x_pairs(const float* x, int64_t k) {
  return _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + k + kLanes), _mm512_loadu_ps(x + k));
}
inline Pairs load_x_pairs_tail(const float* x, int64_t k, int64_t left) {
  const Mask lo = tail_mask(left), hi = left > kLanes ? tail_mask(left - kLanes) : Mask(0);
  return _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + k + kLanes),
                             _mm512_maskz_loadu_ps(lo, x + k));
}
inline Vec dot_pairs(Pairs w, Pairs x, Vec acc) {
  return _mm512_dpbf16_ps(acc, w, x);
}
// dst[k .. k + min(32, left)) = x[...] rounded to bf16, exactly as load_x_pairs rounds them.
inline void store_x_pairs(const float* x, int64_t k, int64_t left, uint16_t* dst) {
  if (left >= 2 * kLanes) {
    _mm512_storeu_si512(dst + k, reinterpret_cast<__m512i>(load_x_pairs(x, k)));
  } else {
    const __mmask32 m = (__mmask32{1} << left) - 1;
    _mm512_mask_storeu_epi16(dst + k, m, reinterpret_cast<__m512i>(load_x_pairs_tail(x, k, left)));
  }
}
#elif !defined(__AVX512F__)
// Portable fallback with the same shape: 16 lanes, FMA per lane, the same reduction tree.
struct Vec {
  float v[kLanes];
};
using Mask = int64_t;  // number of valid lanes
inline Vec vzero() {
  return Vec{};
}
template <DType D>
inline Vec load_w_tail(const void* base, int64_t k, Mask n) {
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
template <DType D>
inline Vec load_w(const void* base, int64_t k) {
  return load_w_tail<D>(base, k, kLanes);
}
inline Vec load_x_tail(const float* x, int64_t k, Mask n) {
  Vec r{};
  for (int i = 0; i < kLanes && i < n; ++i) r.v[i] = x[k + i];
  return r;
}
inline Vec load_x(const float* x, int64_t k) {
  return load_x_tail(x, k, kLanes);
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
inline void hsum16(const Vec* v, float* out) {
  for (int i = 0; i < kLanes; ++i) out[i] = hsum(v[i]);
}
#endif
#if !defined(__AVX512BF16__)
// bf16 products without AVX512-BF16: the same pairs, the values kept as floats (exact: bf16 is a
// float's top half), each pair's products added to its lane as the ISA documents VDPBF16PS (the
// odd column's product, then the even one's, each addition rounded; denormals are not flushed).
struct Pairs {
  float v[2 * kLanes];
};
inline Pairs load_w_pairs_tail(const void* base, int64_t k, int64_t left) {
  Pairs p{};
  for (int j = 0; j < 2 * kLanes && j < left; ++j)
    p.v[j] = bf16_to_f32(static_cast<const uint16_t*>(base)[k + j]);
  return p;
}
inline Pairs load_w_pairs(const void* base, int64_t k) {
  return load_w_pairs_tail(base, k, 2 * kLanes);
}
inline Pairs load_x_pairs_tail(const float* x, int64_t k, int64_t left) {
  Pairs p{};
  for (int j = 0; j < 2 * kLanes && j < left; ++j) p.v[j] = bf16_to_f32(f32_to_bf16(x[k + j]));
  return p;
}
inline Pairs load_x_pairs(const float* x, int64_t k) {
  return load_x_pairs_tail(x, k, 2 * kLanes);
}
inline void store_x_pairs(const float* x, int64_t k, int64_t left, uint16_t* dst) {
  for (int j = 0; j < 2 * kLanes && j < left; ++j) dst[k + j] = f32_to_bf16(x[k + j]);
}
inline Vec dot_pairs(Pairs w, Pairs x, Vec acc) {
  static_assert(sizeof(Vec) == kLanes * sizeof(float));
  float a[kLanes];
  std::memcpy(a, &acc, sizeof(a));
  for (int i = 0; i < kLanes; ++i) {
    a[i] += w.v[2 * i + 1] * x.v[2 * i + 1];  // a product of two bf16 is exact in fp32
    a[i] += w.v[2 * i] * x.v[2 * i];
  }
  std::memcpy(&acc, a, sizeof(a));
  return acc;
}
#endif

// out[i] = hsum(v[i]) for n vectors, 16 at a time.
inline void hsum_many(const Vec* v, int n, float* out) {
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) hsum16(v + i, out + i);
  if (n - i < 6) {  // a few: one by one is cheaper than a padded batch
    for (; i < n; ++i) out[i] = hsum(v[i]);
  } else if (i < n) {
    Vec rest[kLanes];
    float r[kLanes];
    for (int j = 0; j < kLanes; ++j) rest[j] = i + j < n ? v[i + j] : vzero();
    hsum16(rest, r);
    for (int j = 0; i + j < n; ++j) out[i + j] = r[j];
  }
}

// x rows already rounded to bf16 (XRows::bf16, by round_rows_bf16: the rounding load_x_pairs does
// on the fly, so the bits are the same).
inline Pairs load_x_pairs(const uint16_t* x, int64_t k) {
  return load_w_pairs(x, k);
}
inline Pairs load_x_pairs_tail(const uint16_t* x, int64_t k, int64_t left) {
  return load_w_pairs_tail(x, k, left);
}

// R weight rows x T tokens, all K: y[t * ldy + r] for r < R, t < T.
// kAhead: while it streams its rows, the tile asks L2 for the R rows after them at the same
// column (one tile ahead), so that the next tile's rows, each a fresh 4 KiB page for the hardware
// prefetcher, do not start on DRAM misses. Prefetches change no result.
// P: bf16 products (D must be kBF16): 32 columns a step, pairs of columns per lane; x rows are
// floats, or (X = uint16_t) already rounded to bf16.
template <DType D, bool P, int R, int T, bool kAhead = false, class X = float>
inline void tile(const char* w, int64_t w_stride, int64_t K, const X* const* x, float* y,
                 int64_t ldy) {
  static_assert(!P || D == DType::kBF16, "bf16 products need bf16 weights");
  static_assert(P || std::is_same_v<X, float>, "fp32 products take float inputs");
  Vec acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = vzero();
  if constexpr (P) {
    const int64_t K32 = K - K % (2 * kLanes);
    for (int64_t k = 0; k < K32; k += 2 * kLanes) {
      if constexpr (kAhead)  // a step is one cache line of each row
        for (int r = 0; r < R; ++r) __builtin_prefetch(w + (R + r) * w_stride + k * 2, 0, 2);
      Pairs xv[T];
      for (int t = 0; t < T; ++t) xv[t] = load_x_pairs(x[t], k);
      for (int r = 0; r < R; ++r) {
        const Pairs wv = load_w_pairs(w + r * w_stride, k);
        for (int t = 0; t < T; ++t) acc[r][t] = dot_pairs(wv, xv[t], acc[r][t]);
      }
    }
    if (K32 < K) {
      Pairs xv[T];
      for (int t = 0; t < T; ++t) xv[t] = load_x_pairs_tail(x[t], K32, K - K32);
      for (int r = 0; r < R; ++r) {
        const Pairs wv = load_w_pairs_tail(w + r * w_stride, K32, K - K32);
        for (int t = 0; t < T; ++t) acc[r][t] = dot_pairs(wv, xv[t], acc[r][t]);
      }
    }
  } else {
    const int64_t K16 = K - K % kLanes;
    constexpr int64_t kElt = D == DType::kF32 ? 4 : 2;  // bytes per weight
    for (int64_t k = 0; k < K16; k += kLanes) {
      if constexpr (kAhead) {
        if (k * kElt % 64 == 0)  // once per cache line
          for (int r = 0; r < R; ++r) __builtin_prefetch(w + (R + r) * w_stride + k * kElt, 0, 2);
      }
      Vec xv[T];
      for (int t = 0; t < T; ++t) xv[t] = load_x(x[t], k);
      for (int r = 0; r < R; ++r) {
        const Vec wv = load_w<D>(w + r * w_stride, k);
        for (int t = 0; t < T; ++t) acc[r][t] = fma(wv, xv[t], acc[r][t]);
      }
    }
    if (K16 < K) {
      const Mask m = tail_mask(K - K16);
      Vec xv[T];
      for (int t = 0; t < T; ++t) xv[t] = load_x_tail(x[t], K16, m);
      for (int r = 0; r < R; ++r) {
        const Vec wv = load_w_tail<D>(w + r * w_stride, K16, m);
        for (int t = 0; t < T; ++t) acc[r][t] = fma(wv, xv[t], acc[r][t]);
      }
    }
  }
  float out[R * T];
  hsum_many(&acc[0][0], R * T, out);
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[t * ldy + r] = out[r * T + t];
}

// Rows [r0, r1) of w (row stride w_stride bytes, K columns) times n tokens: y[t * ldy + r - r0].
// Tiles: n <= 3 streams rows 8 at a time, n = 4 6 at a time (decode and verify: bandwidth);
// otherwise token blocks that stay in L2 are swept by 6-row x 4-token tiles (prefill: the 6 weight
// rows stay in L1 across the block).
// P: bf16 products (D = kBF16 only).
template <DType D, bool P = false>
void gemm(const char* w, int64_t w_stride, int64_t K, int64_t r0, int64_t r1, const XRows& x,
          int64_t n, float* y, int64_t ldy);

// bf16 / bf16 products / f16 / f32 instantiations live in gemm_kernels.cpp.
extern template void gemm<DType::kF32, false>(const char*, int64_t, int64_t, int64_t, int64_t,
                                              const XRows&, int64_t, float*, int64_t);
extern template void gemm<DType::kBF16, false>(const char*, int64_t, int64_t, int64_t, int64_t,
                                               const XRows&, int64_t, float*, int64_t);
extern template void gemm<DType::kBF16, true>(const char*, int64_t, int64_t, int64_t, int64_t,
                                              const XRows&, int64_t, float*, int64_t);
extern template void gemm<DType::kF16, false>(const char*, int64_t, int64_t, int64_t, int64_t,
                                              const XRows&, int64_t, float*, int64_t);

// out[i * K + k] = x[i * ldx + k] rounded to bf16 for i < n, k < K: what a bf16 product's tiles
// multiply (XRows::bf16).
void round_rows_bf16(const float* x, int64_t ldx, int64_t n, int64_t K, uint16_t* out);

// The same for a Mat of any dtype (bf16 products where w.bf16_inputs): rows [r0, r1) of w,
// y[t * ldy + r - r0].
void gemm_rows(const Mat& w, const XRows& x, int64_t n, float* y, int64_t ldy, int64_t r0,
               int64_t r1);

}  // namespace tf::cpu::kern
