#include "backends/cpu/gemm_kernels.h"

#include <algorithm>
#include <type_traits>
#include <vector>

namespace tf::cpu::kern {
namespace {

// Token t's input row rounded to bf16 (bf16 products over many tokens).
struct XRowsBf16 {
  const XRows* x;
  const uint16_t* row(int64_t t) const { return x->row_bf16(t); }
};

// Rows [r, r + R) x tokens [t, t + T) (rows counted from w and y) with those tokens' x rows.
template <DType D, bool P, int R, int T, bool kAhead = false, class XR = XRows>
inline void run_tile(const char* w, int64_t w_stride, int64_t K, int64_t r, const XR& x, int64_t t,
                     float* y, int64_t ldy) {
  std::remove_cvref_t<decltype(*x.row(0))> const* xp[T];
  for (int i = 0; i < T; ++i) xp[i] = x.row(t + i);
  tile<D, P, R, T, kAhead>(w + r * w_stride, w_stride, K, xp, y + t * ldy + r, ldy);
}

// All tokens [t0, t1) of rows [r, r + R): 4-token tiles and a narrower last one.
template <DType D, bool P, int R, class XR>
inline void row_tile_tokens(const char* w, int64_t w_stride, int64_t K, int64_t r, int64_t rows,
                            const XR& x, int64_t t0, int64_t t1, float* y, int64_t ldy) {
  // While this row tile sweeps the tokens, pull the next R rows (contiguous) towards L2, a slice
  // per 4-token tile, so that the next sweep does not start on a DRAM miss.
  const char* next = w + (r + R) * w_stride;
  const int64_t next_lines = (std::min<int64_t>(R, rows - r - R) * w_stride) / 64;
  const int64_t n_tiles = (t1 - t0 + 3) / 4;
  const int64_t per_tile = next_lines > 0 ? (next_lines + n_tiles - 1) / n_tiles : 0;
  int64_t line = 0;
  int64_t t = t0;
  for (; t + 4 <= t1; t += 4) {
    for (int64_t e = std::min(next_lines, line + per_tile); line < e; ++line)
      __builtin_prefetch(next + line * 64, 0, 2);
    run_tile<D, P, R, 4, false, XR>(w, w_stride, K, r, x, t, y, ldy);
  }
  switch (t1 - t) {
    case 3:
      return run_tile<D, P, R, 3, false, XR>(w, w_stride, K, r, x, t, y, ldy);
    case 2:
      return run_tile<D, P, R, 2, false, XR>(w, w_stride, K, r, x, t, y, ldy);
    case 1:
      return run_tile<D, P, R, 1, false, XR>(w, w_stride, K, r, x, t, y, ldy);
    default:
      return;
  }
}

// Few tokens (decode, verify passes of a few drafts): every row is read once, R rows at a time
// with all T tokens (R x T accumulators, T inputs and a weight vector in the 32 registers).
// Rows of kAheadRowBytes or more (each row of a tile its own 4 KiB page, or half of one) have the
// tiles ask L2 for the next tile's rows (tile's kAhead): side by side on bench-mid, decode +3-13%
// (docs/PERFORMANCE.md, "Decode tiles ask for the next tile's rows"); narrower rows (tiny-next's
// 256-640 bytes: a tile is one or two sequential pages) are left to the hardware prefetcher,
// where the prefetches cost 1-4%.
constexpr int64_t kAheadRowBytes = 2048;
template <DType D, bool P, int T, int R = 8>
void gemm_few(const char* w, int64_t w_stride, int64_t K, int64_t rows, const XRows& x, float* y,
              int64_t ldy) {
  int64_t r = 0;
  if (w_stride >= kAheadRowBytes) {
    for (; r + R <= rows; r += R) run_tile<D, P, R, T, true>(w, w_stride, K, r, x, 0, y, ldy);
  } else {
    for (; r + R <= rows; r += R) run_tile<D, P, R, T>(w, w_stride, K, r, x, 0, y, ldy);
  }
  for (; r + 2 <= rows; r += 2) run_tile<D, P, 2, T>(w, w_stride, K, r, x, 0, y, ldy);
  for (; r < rows; ++r) run_tile<D, P, 1, T>(w, w_stride, K, r, x, 0, y, ldy);
}

}  // namespace

template <DType D, bool P>
void gemm(const char* w, int64_t w_stride, int64_t K, int64_t r0, int64_t r1, const XRows& x,
          int64_t n, float* y, int64_t ldy) {
  if (r1 <= r0 || n <= 0) return;
  // The helpers index rows from 0: rebase w on row r0 (y already starts at row r0).
  w += r0 * w_stride;
  const int64_t rows = r1 - r0;
  switch (n) {
    case 1:
      return gemm_few<D, P, 1>(w, w_stride, K, rows, x, y, ldy);
    case 2:
      return gemm_few<D, P, 2>(w, w_stride, K, rows, x, y, ldy);
    case 3:
      return gemm_few<D, P, 3>(w, w_stride, K, rows, x, y, ldy);
    case 4:  // a verify pass of 3 drafts: 6-row tiles (8 x 4 accumulators would spill)
      return gemm_few<D, P, 4, 6>(w, w_stride, K, rows, x, y, ldy);
    default:
      break;
  }
  // Token blocks of ~384 KiB of x (L2-resident while the weight rows stream past once per block).
  const int64_t tb = std::max<int64_t>(4, (96 * 1024 / std::max<int64_t>(K, 1)) / 4 * 4);
  // Every row tile over tokens [t0, t1) of xr, into yt (whose row t is token t of xr).
  auto sweep = [&](const auto& xr, int64_t t0, int64_t t1, float* yt) {
    int64_t r = 0;
    for (; r + 6 <= rows; r += 6)
      row_tile_tokens<D, P, 6>(w, w_stride, K, r, rows, xr, t0, t1, yt, ldy);
    for (; r + 2 <= rows; r += 2)
      row_tile_tokens<D, P, 2>(w, w_stride, K, r, rows, xr, t0, t1, yt, ldy);
    for (; r < rows; ++r) row_tile_tokens<D, P, 1>(w, w_stride, K, r, rows, xr, t0, t1, yt, ldy);
  };
  for (int64_t t0 = 0; t0 < n; t0 += tb) {
    const int64_t t1 = std::min(n, t0 + tb);
    if constexpr (P) {
      // The x rows rounded to bf16 once (as the tiles would round them, so the same bits): a 6 x
      // 4 tile's step then loads 4 x vectors instead of converting 8 (docs/PERFORMANCE.md, "bf16
      // products"). The caller's (matmul_multi, moe_ffn: once per product), or this block's own.
      if (x.bf16 != nullptr) {
        sweep(XRowsBf16{&x}, t0, t1, y);
        continue;
      }
      thread_local std::vector<uint16_t> xb;
      xb.resize((t1 - t0) * K);
      for (int64_t t = t0; t < t1; ++t)
        round_rows_bf16(x.row(t), K, 1, K, xb.data() + (t - t0) * K);
      const XRows block{nullptr, 0, nullptr, xb.data(), K};
      sweep(XRowsBf16{&block}, 0, t1 - t0, y + t0 * ldy);
    } else {
      sweep(x, t0, t1, y);
    }
  }
}

template void gemm<DType::kF32, false>(const char*, int64_t, int64_t, int64_t, int64_t,
                                       const XRows&, int64_t, float*, int64_t);
template void gemm<DType::kBF16, false>(const char*, int64_t, int64_t, int64_t, int64_t,
                                        const XRows&, int64_t, float*, int64_t);
template void gemm<DType::kBF16, true>(const char*, int64_t, int64_t, int64_t, int64_t,
                                       const XRows&, int64_t, float*, int64_t);
template void gemm<DType::kF16, false>(const char*, int64_t, int64_t, int64_t, int64_t,
                                       const XRows&, int64_t, float*, int64_t);

void round_rows_bf16(const float* x, int64_t ldx, int64_t n, int64_t K, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < K; k += 2 * kLanes) store_x_pairs(x + i * ldx, k, K - k, out + i * K);
}

void gemm_rows(const Mat& w, const XRows& x, int64_t n, float* y, int64_t ldy, int64_t r0,
               int64_t r1) {
  const char* base = static_cast<const char*>(w.data);
  const int64_t stride = w.cols * static_cast<int64_t>(dtype_size(w.dtype));
  switch (w.dtype) {
    case DType::kF32:
      return gemm<DType::kF32>(base, stride, w.cols, r0, r1, x, n, y, ldy);
    case DType::kBF16:
      if (w.bf16_inputs)
        return gemm<DType::kBF16, true>(base, stride, w.cols, r0, r1, x, n, y, ldy);
      return gemm<DType::kBF16, false>(base, stride, w.cols, r0, r1, x, n, y, ldy);
    case DType::kF16:
      return gemm<DType::kF16>(base, stride, w.cols, r0, r1, x, n, y, ldy);
  }
}

}  // namespace tf::cpu::kern
