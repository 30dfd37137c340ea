// CUDA kernels of src/backends/cuda/ops.h. Launch shapes depend on the op's row width only, never
// on the number of rows, so every row is computed by the same instructions in any batch.
#include <cuda_bf16.h>

#include <algorithm>

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

__global__ void silu_mul_kernel(const float* __restrict__ g, const float* __restrict__ u, int64_t n,
                                float* __restrict__ y) {
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

template <class E>
__global__ void embed_rows_kernel(const E* __restrict__ embed, int64_t dim,
                                  const int32_t* __restrict__ ids, float* __restrict__ y) {
  const E* row = embed + static_cast<int64_t>(ids[blockIdx.x]) * dim;
  float* out = y + blockIdx.x * dim;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    if constexpr (sizeof(E) == 2)
      out[d] = __bfloat162float(row[d]);
    else
      out[d] = row[d];
  }
}

// One block per row, as rmsnorm_zc.
__global__ void rmsnorm_gated_kernel(const float* __restrict__ x, const float* __restrict__ z,
                                     const float* __restrict__ w, int64_t dim, float eps,
                                     float* __restrict__ y) {
  __shared__ float scratch[kNormThreads / kWarp];
  const float* xr = x + blockIdx.x * dim;
  const float* zr = z + blockIdx.x * dim;
  float ss = 0;
  for (int64_t d = threadIdx.x; d < dim; d += kNormThreads) ss = fmaf(xr[d], xr[d], ss);
  ss = block_sum<kNormThreads>(ss, scratch);
  const float r = rsqrtf(ss / static_cast<float>(dim) + eps);
  float* yr = y + blockIdx.x * dim;
  for (int64_t d = threadIdx.x; d < dim; d += kNormThreads) {
    const float zz = zr[d];
    yr[d] = w[d] * (xr[d] * r) * (zz / (1.0f + expf(-zz)));
  }
}

__global__ void l2norm_scale_kernel(float* __restrict__ x, int64_t dim, float eps, float scale) {
  __shared__ float scratch[kNormThreads / kWarp];
  float* xr = x + blockIdx.x * dim;
  float ss = 0;
  for (int64_t d = threadIdx.x; d < dim; d += kNormThreads) ss = fmaf(xr[d], xr[d], ss);
  ss = block_sum<kNormThreads>(ss, scratch);
  const float r = rsqrtf(ss + eps);
  for (int64_t d = threadIdx.x; d < dim; d += kNormThreads) xr[d] = xr[d] * r * scale;
}

__global__ void causal_conv_silu_kernel(const float* __restrict__ in, const float* __restrict__ w,
                                        int64_t T, int64_t C, int64_t K, float* __restrict__ out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * C) return;
  const int64_t t = i / C, c = i % C;
  float acc = 0;
  for (int64_t j = 0; j < K; ++j) acc = fmaf(w[c * K + j], in[(t + j) * C + c], acc);
  out[i] = acc / (1.0f + expf(-acc));
}

// Block h, thread j < Dv: column j of head h's state S[h] [Dk, Dv].
__global__ void delta_rule_recurrent_kernel(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ g, const float* __restrict__ beta, int64_t T, int64_t Hk, int64_t Hv,
    int64_t Dk, int64_t Dv, float* __restrict__ S, float* __restrict__ out) {
  const int64_t h = blockIdx.x, r = Hv / Hk;
  float* Sh = S + h * Dk * Dv;
  for (int64_t j = threadIdx.x; j < Dv; j += blockDim.x) {
    for (int64_t t = 0; t < T; ++t) {
      const float* qt = q + (t * Hk + h / r) * Dk;
      const float* kt = k + (t * Hk + h / r) * Dk;
      const float decay = expf(g[t * Hv + h]), b = beta[t * Hv + h];
      float kv = 0;
      for (int64_t i = 0; i < Dk; ++i) kv = fmaf(Sh[i * Dv + j] * decay, kt[i], kv);
      const float d = b * (v[(t * Hv + h) * Dv + j] - kv);
      float o = 0;
      for (int64_t i = 0; i < Dk; ++i) {
        const float s = fmaf(kt[i], d, Sh[i * Dv + j] * decay);
        Sh[i * Dv + j] = s;
        o = fmaf(s, qt[i], o);
      }
      out[(t * Hv + h) * Dv + j] = o;
    }
  }
}

// Block (t, head): thread l scores key tile0 + l; then every thread d < D accumulates
// sum_j p_j v[j, d] over the tile's keys in order, rescaled when the running max grows.
constexpr int kAttnTile = 128;
__global__ void attention_kernel(const float* __restrict__ q, const int64_t* __restrict__ pos,
                                 const float* __restrict__ kc, const float* __restrict__ vc,
                                 int64_t n_heads, int64_t n_kv, int64_t D, float scale,
                                 float* __restrict__ out) {
  extern __shared__ float smem[];  // q [D] | p [kAttnTile] | reduce scratch [kAttnTile / 32]
  float* qs = smem;
  float* p = smem + D;
  float* scratch = p + kAttnTile;
  const int64_t t = blockIdx.x / n_heads, h = blockIdx.x % n_heads, kvh = h / (n_heads / n_kv);
  const float* qv = q + (t * n_heads + h) * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) qs[d] = qv[d];
  __syncthreads();
  const int64_t L = pos[t] + 1;
  float m = -INFINITY, sum = 0;
  float acc[4] = {0, 0, 0, 0};  // dims threadIdx.x + 128 u, D <= 512
  for (int64_t tile = 0; tile < L; tile += kAttnTile) {
    const int64_t j = tile + threadIdx.x;
    float sc = -INFINITY;
    if (j < L) {
      const float* kj = kc + (j * n_kv + kvh) * D;
      float dot = 0;
      for (int64_t d = 0; d < D; ++d) dot = fmaf(qs[d], kj[d], dot);
      sc = dot * scale;
    }
    // Tile max by a fixed tree.
    float tm = sc;
#pragma unroll
    for (int o = kWarp / 2; o > 0; o /= 2) tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, o));
    if (threadIdx.x % kWarp == 0) scratch[threadIdx.x / kWarp] = tm;
    __syncthreads();
    tm = scratch[0];
    for (int w = 1; w < kAttnTile / kWarp; ++w) tm = fmaxf(tm, scratch[w]);
    __syncthreads();
    const float m_new = fmaxf(m, tm);
    const float pj = j < L ? expf(sc - m_new) : 0.0f;
    p[threadIdx.x] = pj;
    const float tsum = block_sum<kAttnTile>(pj, scratch);  // its barriers also publish p
    const float rescale = expf(m - m_new);
    sum = sum * rescale + tsum;
    const int64_t n = L - tile < kAttnTile ? L - tile : kAttnTile;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t d = threadIdx.x + u * kAttnTile;
      if (d >= D) continue;
      float a = acc[u] * rescale;
      for (int64_t jj = 0; jj < n; ++jj) a = fmaf(p[jj], vc[((tile + jj) * n_kv + kvh) * D + d], a);
      acc[u] = a;
    }
    m = m_new;
    __syncthreads();
  }
  float* o = out + (t * n_heads + h) * D;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int64_t d = threadIdx.x + u * kAttnTile;
    if (d < D) o[d] = acc[u] / sum;
  }
}

// One thread per token.
__global__ void route_topk_kernel(const float* __restrict__ logits, int64_t n, int64_t E, int64_t k,
                                  bool renorm, int32_t* __restrict__ experts,
                                  float* __restrict__ weights) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const float* l = logits + t * E;
  float m = -INFINITY;
  for (int64_t e = 0; e < E; ++e) m = fmaxf(m, l[e]);
  float sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += expf(l[e] - m);
  int32_t* ex = experts + t * k;
  float* wt = weights + t * k;
  float wsum = 0;
  for (int64_t s = 0; s < k; ++s) {
    int32_t best = -1;
    float bv = -INFINITY;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t u = 0; u < s; ++u) taken = taken || ex[u] == e;
      if (!taken && (best < 0 || l[e] > bv)) best = static_cast<int32_t>(e), bv = l[e];
    }
    ex[s] = best;
    wt[s] = expf(bv - m) / sum;
    wsum += wt[s];
  }
  if (renorm)
    for (int64_t s = 0; s < k; ++s) wt[s] /= wsum;
}

__global__ void mul_sigmoid_kernel(float* __restrict__ x, const float* __restrict__ gate,
                                   int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= 1.0f / (1.0f + expf(-gate[i]));
}

__global__ void add_kernel(float* __restrict__ y, const float* __restrict__ x, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i];
}

// One block per token, threads over the k-heads' groups.
__global__ void split_qkvz_kernel(const float* __restrict__ P, const float* __restrict__ BA,
                                  int64_t Hk, int64_t Dk, int64_t r, int64_t Dv,
                                  float* __restrict__ xc, float* __restrict__ z,
                                  float* __restrict__ b, float* __restrict__ a) {
  const int64_t t = blockIdx.x, G = 2 * Dk + 2 * r * Dv, kd = Hk * Dk, Hv = Hk * r;
  const int64_t C = 2 * kd + Hv * Dv;
  for (int64_t i = threadIdx.x; i < Hk * G; i += blockDim.x) {
    const int64_t grp = i / G, o = i % G;
    const float x = P[t * Hk * G + i];
    if (o < Dk)
      xc[t * C + grp * Dk + o] = x;
    else if (o < 2 * Dk)
      xc[t * C + kd + grp * Dk + o - Dk] = x;
    else if (o < 2 * Dk + r * Dv)
      xc[t * C + 2 * kd + grp * r * Dv + o - 2 * Dk] = x;
    else
      z[(t * Hv + grp * r) * Dv + o - 2 * Dk - r * Dv] = x;
  }
  for (int64_t i = threadIdx.x; i < Hk * 2 * r; i += blockDim.x) {
    const int64_t grp = i / (2 * r), o = i % (2 * r);
    const float x = BA[t * Hk * 2 * r + i];
    if (o < r)
      b[t * Hv + grp * r + o] = x;
    else
      a[t * Hv + grp * r + o - r] = x;
  }
}

__global__ void gdn_gates_kernel(const float* __restrict__ b, const float* __restrict__ a,
                                 const float* __restrict__ dt_bias,
                                 const float* __restrict__ neg_exp_a, int64_t n, int64_t Hv,
                                 float* __restrict__ beta, float* __restrict__ g) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * Hv) return;
  const int64_t h = i % Hv;
  beta[i] = 1.0f / (1.0f + expf(-b[i]));
  const float x = a[i] + dt_bias[h];
  g[i] = neg_exp_a[h] * (x > 20.0f ? x : log1pf(expf(x)));
}

__global__ void gather_rows_kernel(const float* __restrict__ x, const int32_t* __restrict__ idx,
                                   int64_t dim, float* __restrict__ y) {
  const float* src = x + static_cast<int64_t>(idx[blockIdx.x]) * dim;
  float* dst = y + blockIdx.x * dim;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) dst[d] = src[d];
}

__global__ void scatter_add_scaled_kernel(const float* __restrict__ x,
                                          const int32_t* __restrict__ idx,
                                          const float* __restrict__ w, int64_t dim,
                                          float* __restrict__ y) {
  float* dst = y + static_cast<int64_t>(idx[blockIdx.x]) * dim;
  const float* src = x + blockIdx.x * dim;
  const float wi = w[blockIdx.x];
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) dst[d] = fmaf(src[d], wi, dst[d]);
}

__global__ void add_gated_kernel(const float* __restrict__ s, const float* __restrict__ gate,
                                 int64_t dim, float* __restrict__ y) {
  const float gs = 1.0f / (1.0f + expf(-gate[blockIdx.x]));
  const float* src = s + blockIdx.x * dim;
  float* dst = y + blockIdx.x * dim;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) dst[d] = fmaf(gs, src[d], dst[d]);
}

unsigned blocks_for(int64_t n, unsigned threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
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
      matmul_kernel<<<grid, threads, 0, stream>>>(static_cast<const __nv_bfloat16*>(w), rows, cols,
                                                  x, y);
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
  silu_mul_kernel<<<blocks_for(n, threads), threads, 0, stream>>>(g, u, n, y);
  TF_CUDA_CHECK(cudaGetLastError());
}

void rope_neox(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t rotary_dim,
               const float* inv_freq, const int64_t* pos, cudaStream_t stream) {
  if (T == 0) return;
  rope_neox_kernel<<<static_cast<unsigned>(T), 128, 0, stream>>>(x, n_heads, head_dim,
                                                                 rotary_dim / 2, inv_freq, pos);
  TF_CUDA_CHECK(cudaGetLastError());
}

void embed_rows(DType etype, const void* embed, int64_t dim, const int32_t* ids, int64_t n,
                float* y, cudaStream_t stream) {
  if (n == 0) return;
  TF_CUDA_REQUIRE(etype == DType::kBF16 || etype == DType::kF32, "embed_rows: bf16 or f32");
  if (etype == DType::kBF16)
    embed_rows_kernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(embed), dim, ids, y);
  else
    embed_rows_kernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(
        static_cast<const float*>(embed), dim, ids, y);
  TF_CUDA_CHECK(cudaGetLastError());
}

void rmsnorm_gated(const float* x, const float* z, const float* w, int64_t n, int64_t dim,
                   float eps, float* y, cudaStream_t stream) {
  if (n == 0) return;
  rmsnorm_gated_kernel<<<static_cast<unsigned>(n), kNormThreads, 0, stream>>>(x, z, w, dim, eps, y);
  TF_CUDA_CHECK(cudaGetLastError());
}

void l2norm_scale(float* x, int64_t n, int64_t dim, float eps, float scale, cudaStream_t stream) {
  if (n == 0) return;
  l2norm_scale_kernel<<<static_cast<unsigned>(n), kNormThreads, 0, stream>>>(x, dim, eps, scale);
  TF_CUDA_CHECK(cudaGetLastError());
}

void causal_conv_silu(const float* in, const float* w, int64_t T, int64_t C, int64_t K, float* out,
                      cudaStream_t stream) {
  if (T * C == 0) return;
  causal_conv_silu_kernel<<<blocks_for(T * C, 256), 256, 0, stream>>>(in, w, T, C, K, out);
  TF_CUDA_CHECK(cudaGetLastError());
}

void delta_rule_recurrent(const float* q, const float* k, const float* v, const float* g,
                          const float* beta, int64_t T, int64_t Hk, int64_t Hv, int64_t Dk,
                          int64_t Dv, float* S, float* out, cudaStream_t stream) {
  if (T == 0) return;
  const unsigned threads = static_cast<unsigned>(std::min<int64_t>(Dv, 256));
  delta_rule_recurrent_kernel<<<static_cast<unsigned>(Hv), threads, 0, stream>>>(
      q, k, v, g, beta, T, Hk, Hv, Dk, Dv, S, out);
  TF_CUDA_CHECK(cudaGetLastError());
}

void attention(const float* q, int64_t T, const int64_t* pos, const float* k_cache,
               const float* v_cache, int64_t n_heads, int64_t n_kv, int64_t D, float scale,
               float* out, cudaStream_t stream) {
  if (T == 0) return;
  TF_CUDA_REQUIRE(D <= 4 * kAttnTile, "attention: head_dim above 512");
  const size_t smem = (D + kAttnTile + kAttnTile / kWarp) * sizeof(float);
  attention_kernel<<<static_cast<unsigned>(T * n_heads), kAttnTile, smem, stream>>>(
      q, pos, k_cache, v_cache, n_heads, n_kv, D, scale, out);
  TF_CUDA_CHECK(cudaGetLastError());
}

void route_topk(const float* logits, int64_t n, int64_t E, int64_t k, bool renorm, int32_t* experts,
                float* weights, cudaStream_t stream) {
  if (n == 0) return;
  route_topk_kernel<<<blocks_for(n, 128), 128, 0, stream>>>(logits, n, E, k, renorm, experts,
                                                            weights);
  TF_CUDA_CHECK(cudaGetLastError());
}

void mul_sigmoid(float* x, const float* gate, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  mul_sigmoid_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(x, gate, n);
  TF_CUDA_CHECK(cudaGetLastError());
}

void add(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(y, x, n);
  TF_CUDA_CHECK(cudaGetLastError());
}

void split_qkvz(const float* P, const float* BA, int64_t n, int64_t Hk, int64_t Dk, int64_t r,
                int64_t Dv, float* xc, float* z, float* b, float* a, cudaStream_t stream) {
  if (n == 0) return;
  split_qkvz_kernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(P, BA, Hk, Dk, r, Dv, xc, z, b,
                                                                  a);
  TF_CUDA_CHECK(cudaGetLastError());
}

void gdn_gates(const float* b, const float* a, const float* dt_bias, const float* neg_exp_a,
               int64_t n, int64_t Hv, float* beta, float* g, cudaStream_t stream) {
  if (n == 0) return;
  gdn_gates_kernel<<<blocks_for(n * Hv, 256), 256, 0, stream>>>(b, a, dt_bias, neg_exp_a, n, Hv,
                                                                beta, g);
  TF_CUDA_CHECK(cudaGetLastError());
}

void gather_rows(const float* x, const int32_t* idx, int64_t n, int64_t dim, float* y,
                 cudaStream_t stream) {
  if (n == 0) return;
  gather_rows_kernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(x, idx, dim, y);
  TF_CUDA_CHECK(cudaGetLastError());
}

void scatter_add_scaled(const float* x, const int32_t* idx, const float* w, int64_t n, int64_t dim,
                        float* y, cudaStream_t stream) {
  if (n == 0) return;
  scatter_add_scaled_kernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(x, idx, w, dim, y);
  TF_CUDA_CHECK(cudaGetLastError());
}

void add_gated(const float* s, const float* gate, int64_t n, int64_t dim, float* y,
               cudaStream_t stream) {
  if (n == 0) return;
  add_gated_kernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(s, gate, dim, y);
  TF_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tf::cuda
