// CUDA kernels of src/backends/cuda/ops.h. Launch shapes depend on the op's row width only, never
// on the number of rows, so every row is computed by the same instructions in any batch.
#include <cuda_bf16.h>

#include "backends/cuda/check.h"
#include "backends/cuda/ops.h"

namespace tf::cuda {
namespace {

constexpr int kWarp = 32;

// Sum over the 32 lanes by a fixed xor-shuffle tree; every lane gets the total.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over a block of kThreads threads: per-warp trees, then warp 0 sums the warp totals in
// order. Every thread gets the total. `scratch`: kThreads / 32 floats of shared memory.
template <int kThreads>
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  v = warp_sum(v);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0;
#pragma unroll
  for (int w = 0; w < kThreads / kWarp; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

// One block per row. Thread i squares x[i], x[i + 256], ... in order, then the block tree.
constexpr int kNormThreads = 256;
__global__ void rmsnorm_zc_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                  int64_t dim, float eps, float* __restrict__ y) {
  __shared__ float scratch[kNormThreads / kWarp];
  const float* xr = x + blockIdx.x * dim;
  float ss = 0;
  for (int64_t d = threadIdx.x; d < dim; d += kNormThreads) ss = fmaf(xr[d], xr[d], ss);
  ss = block_sum<kNormThreads>(ss, scratch);
  const float r = rsqrtf(ss / static_cast<float>(dim) + eps);
  float* yr = y + blockIdx.x * dim;
  for (int64_t d = threadIdx.x; d < dim; d += kNormThreads) yr[d] = xr[d] * r * (1.0f + w[d]);
}

__device__ __forceinline__ void load8(const __nv_bfloat16* p, float* out) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);  // 8 bf16, 16-byte aligned
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void load8(const float* p, float* out) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
  out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}

// One warp per output y[t, r]; kWarpsPerBlock warps per block cover consecutive r of one t.
constexpr int kWarpsPerBlock = 8;
template <class W>
__global__ void matmul_kernel(const W* __restrict__ w, int64_t rows, int64_t cols,
                              const float* __restrict__ x, float* __restrict__ y) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  const int64_t t = blockIdx.y;
  if (r >= rows) return;
  const int lane = threadIdx.x % kWarp;
  const W* wr = w + r * cols;
  const float* xt = x + t * cols;
  float acc = 0, wv[8], xv[8];
  for (int64_t k = 8 * lane; k < cols; k += 8 * kWarp) {
    load8(wr + k, wv);
    load8(xt + k, xv);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc = fmaf(wv[i], xv[i], acc);
  }
  acc = warp_sum(acc);
  if (lane == 0) y[t * rows + r] = acc;
}

__global__ void silu_mul_kernel(const float* __restrict__ g, const float* __restrict__ u,
                                int64_t n, float* __restrict__ y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

// One block per token, one thread per (head, pair) of the rotary half.
__global__ void rope_neox_kernel(float* __restrict__ x, int64_t n_heads, int64_t head_dim,
                                 int64_t half, const float* __restrict__ inv_freq,
                                 const int64_t* __restrict__ pos) {
  const int64_t t = blockIdx.x;
  for (int64_t j = threadIdx.x; j < n_heads * half; j += blockDim.x) {
    const int64_t h = j / half, i = j % half;
    const float ang = static_cast<float>(pos[t]) * inv_freq[i];  // fp32 angle, as transformers
    float s, c;
    sincosf(ang, &s, &c);
    float* xh = x + (t * n_heads + h) * head_dim;
    const float a = xh[i], b = xh[i + half];
    xh[i] = a * c - b * s;
    xh[i + half] = b * c + a * s;
  }
}

}  // namespace

void rmsnorm_zc(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* y,
                cudaStream_t stream) {
  if (n == 0) return;
  rmsnorm_zc_kernel<<<static_cast<unsigned>(n), kNormThreads, 0, stream>>>(x, w, dim, eps, y);
  TF_CUDA_CHECK(cudaGetLastError());
}

void matmul(DType wtype, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n,
            float* y, cudaStream_t stream) {
  TF_CUDA_REQUIRE(cols % 8 == 0, "matmul: cols must be a multiple of 8");
  TF_CUDA_REQUIRE(n <= 65535, "matmul: more than 65535 rows in one launch");
  if (n == 0 || rows == 0) return;
  const dim3 grid(static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock),
                  static_cast<unsigned>(n));
  const unsigned threads = kWarpsPerBlock * kWarp;
  switch (wtype) {
    case DType::kBF16:
      matmul_kernel<<<grid, threads, 0, stream>>>(static_cast<const __nv_bfloat16*>(w), rows,
                                                  cols, x, y);
      break;
    case DType::kF32:
      matmul_kernel<<<grid, threads, 0, stream>>>(static_cast<const float*>(w), rows, cols, x, y);
      break;
    default:
      TF_CUDA_REQUIRE(false, "matmul: weight dtype not supported on CUDA (bf16, f32)");
  }
  TF_CUDA_CHECK(cudaGetLastError());
}

void silu_mul(const float* g, const float* u, int64_t n, float* y, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned threads = 256;
  silu_mul_kernel<<<static_cast<unsigned>((n + threads - 1) / threads), threads, 0, stream>>>(
      g, u, n, y);
  TF_CUDA_CHECK(cudaGetLastError());
}

void rope_neox(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t rotary_dim,
               const float* inv_freq, const int64_t* pos, cudaStream_t stream) {
  if (T == 0) return;
  rope_neox_kernel<<<static_cast<unsigned>(T), 128, 0, stream>>>(x, n_heads, head_dim,
                                                                 rotary_dim / 2, inv_freq, pos);
  TF_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tf::cuda
