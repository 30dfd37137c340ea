// Matrix products for the CPU backend: y = x W^T with weights in the checkpoint's dtype.
//
// Determinism contract: every output element y[t, r] is computed by the same instruction sequence
// (a 16-lane fp32 FMA accumulation over k in order, then one fixed horizontal reduction; or, for a
// Mat with bf16_inputs, bf16 dot products of column pairs, then the same reduction) whatever
// the number of rows n, the tile it falls in, or the thread count. So a token's result never
// depends on the other tokens of the batch (batch invariance) nor on the threads.
#pragma once

#include <cstdint>
#include <span>

#include "core/dtype.h"
#include "core/thread_pool.h"

namespace tf::cpu {

// Row-major matrix view [rows, cols]; row r begins at data + r * cols * dtype_size(dtype).
struct Mat {
  DType dtype = DType::kF32;
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;
  // bf16 weights only: products round x to bf16 and use bf16 dot products (the second canonical
  // sequence of backends/cpu/gemm_kernels.h; --matmul-precision bf16). Every product with this
  // matrix does, so batch invariance holds as with fp32 inputs.
  bool bf16_inputs = false;
  Mat row_slice(int64_t begin, int64_t count) const {
    return Mat{dtype, static_cast<const char*>(data) + begin * cols * dtype_size(dtype), count,
               cols, bf16_inputs};
  }
};

// y[t, r] = sum_k w[r, k] * x[t, k] for t < n, r < w.rows.
// x: [n, w.cols] f32 (row stride ldx), y: [n, w.rows] f32 (row stride ldy).
void matmul(const Mat& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
            ThreadPool* pool);
inline void matmul(const Mat& w, const float* x, int64_t n, float* y, ThreadPool* pool) {
  matmul(w, x, w.cols, n, y, w.rows, pool);
}

// Several products over the same n tokens in one parallel dispatch (e.g. q/k/v, or gate/up):
// y_j[t, r] = sum_k w_j[r, k] * x_j[t, k]. Each element is computed exactly as matmul computes it.
struct MatmulJob {
  Mat w;
  const float* x = nullptr;
  int64_t ldx = 0;  // 0: w.cols
  float* y = nullptr;
  int64_t ldy = 0;  // 0: w.rows
};
void matmul_multi(std::span<const MatmulJob> jobs, int64_t n, ThreadPool* pool);

// One dot product with the same arithmetic as one element of matmul (for tests).
float dot_row(const Mat& w, int64_t r, const float* x);

// Converts row r of w to f32 (embedding lookup).
void row_to_f32(const Mat& w, int64_t r, float* out);

}  // namespace tf::cpu
