// CUDA kernels of src/backends/cuda/ops.h. A row's arithmetic depends on the op's row width only,
// never on the number of rows: where the number of rows picks the launch shape or the kernel
// (token tiles, attention's cluster or one block per row), every choice computes a row with the
// same operations in the same order, so a row has the same bits in any batch.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "backends/cuda/check.h"
#include "backends/cuda/ops.h"

namespace tf::cuda {
namespace {

constexpr int kWarp = 32;

// Programmatic dependent launch (sm_90): every kernel is launched with programmatic stream
// serialization, so the next kernel on the stream is launched while this one runs instead of
// after it (a launch costs 1-2 us, and a decode step is hundreds of small kernels). Each kernel
// first lets the next one launch, then waits until the previous one has completed and its writes
// are visible: no kernel reads or writes anything before that wait, so the order of the work
// is the stream's order, as without the attribute. (Before sm_90: plain launches.)
__device__ __forceinline__ void pdl_launch_next() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}
__device__ __forceinline__ void pdl_enter() {
  pdl_launch_next();
  pdl_wait();
}

// Asks L2 for [p, p + bytes) (the bulk prefetch of sm_90; p 16-byte aligned, bytes a multiple of
// 16): no registers, no wait, nothing returned. The expert kernels call it between pdl_enter's two
// halves, for the shared expert's rows, which do not depend on the routing: the kernel before (the
// top-k) may still run. Weights are never written by a step, so reading them before the wait
// changes no result. Measured side by side (tools/device/ab_bench.sh, H200, 2026-12-04): tiny-next
// batch-1 decode +4%, the 80B-A3B shape unchanged; prefetching every matmul's rows too made the
// 80B shape's batch 1 4% slower (its matrices are larger than L2), so matmul does not.
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

bool pdl_supported() {
  static const bool on = [] {
    int dev = 0, major = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
           major >= 9;
  }();
  return on;
}

// Whether a sequence's recurrent states (the Gated DeltaNet's conv state and S) may be read before
// pdl_wait, while the kernels before it still run. True while `stream` is being captured into a
// CUDA graph: a graph launch starts after every earlier operation of its stream has completed
// (programmatic edges join kernels inside the graph only), so what wrote a state outside the
// graph (a rollback's copy, a resumed state's copy, the step before) is done, and inside one step
// a layer's states are written by that layer's own gdn_prep / delta rule launch only. Outside a
// graph (prompts, large steps) a copy kernel that wrote a state may be a few launches back and
// still running (each launch lets the next one start), so there the kernels wait first.
// The state's loads (16 KB per block for the 80B shape's S) then overlap the kernel before
// instead of following it.
bool states_settled(cudaStream_t stream) {
  if (stream == nullptr || !pdl_supported()) return false;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  TF_CUDA_CHECK(cudaStreamIsCapturing(stream, &st));
  return st == cudaStreamCaptureStatusActive;
}

// kernel<<<grid, block, smem, stream>>>(args...) with the programmatic-serialization attribute
// (on a stream of its own: the legacy default stream launches plainly).
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = stream != nullptr && pdl_supported() ? 1 : 0;
  TF_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...));
}

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
  pdl_enter();
  __shared__ float scratch[kNormThreads / kWarp];
  const float* xr = x + blockIdx.x * dim;
  float ss = 0;
  for (int64_t d = threadIdx.x; d < dim; d += kNormThreads) ss = fmaf(xr[d], xr[d], ss);
  ss = block_sum<kNormThreads>(ss, scratch);
  const float r = rsqrtf(ss / static_cast<float>(dim) + eps);
  float* yr = y + blockIdx.x * dim;
  for (int64_t d = threadIdx.x; d < dim; d += kNormThreads) yr[d] = xr[d] * r * (1.0f + w[d]);
}

__device__ __forceinline__ void load8(const float* p, float* out) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
  out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}

// Eight weights kept as loaded (16 bytes of bf16, 32 of f32) until their FMAs: half the registers
// of eight floats for bf16, so more loads can be in flight. load_stream loads evict-first
// (__ldcs): tiles of tokens reread their activations from the caches while the weights stream by
// (measured: prefill and batch 32 4-5% faster that way, one-token products 3% slower).
template <class W>
struct Raw8;
template <>
struct Raw8<__nv_bfloat16> {
  uint4 r;
  __device__ __forceinline__ void load(const __nv_bfloat16* p) {
    r = *reinterpret_cast<const uint4*>(p);
  }
  __device__ __forceinline__ void load_stream(const __nv_bfloat16* p) {
    r = __ldcs(reinterpret_cast<const uint4*>(p));
  }
  __device__ __forceinline__ float at(int i) const {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&r);
    const float2 f = __bfloat1622float2(h[i / 2]);
    return i % 2 ? f.y : f.x;
  }
};
template <>
struct Raw8<float> {
  float4 a, b;
  __device__ __forceinline__ void load(const float* p) {
    a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  }
  __device__ __forceinline__ void load_stream(const float* p) {
    a = __ldcs(reinterpret_cast<const float4*>(p)),
    b = __ldcs(reinterpret_cast<const float4*>(p) + 1);
  }
  __device__ __forceinline__ float at(int i) const {
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    return v[i];
  }
};

// Block (row group, token tile): warp w computes the kMatRows rows from (blockIdx.x * warps + w) *
// kMatRows for the tile's tokens blockIdx.y * kT + u (warp_rows: each x chunk loaded once for the
// warp's rows, kC chunks of 256 columns of every row loaded before their FMAs). Per (row, token)
// the sum is the same (lane l: k = 8 l + 256 j + i in order of j then i, then the xor tree),
// whatever the tile, the rows per warp or the chunks in flight: every product of the backend
// (matmul, the experts) sums a row that way. kT: tokens per tile, 1 for one-token products and
// bf16 products of up to kTokBlocks tokens (a block per token; fewer registers, more warps per
// SM), kTokTile otherwise.
constexpr int kWarpsPerBlock = 8;
constexpr int kTokTile = 8;
// bf16 products of 2 .. kTokBlocks tokens: one-token blocks side by side (matmul, kTokX). 16, not
// 8: verify steps of prompt-lookup drafts run 9-16 tokens (tiny-next's verify of 9 tokens took
// 3.07x a decode step in tiles, against 1.42x for 5).
constexpr int64_t kTokBlocks = 16;
constexpr int kMatRows = 4;
constexpr int kOneRows = 1;  // matmul's rows per warp for one token of bf16 weights
// warp_rows' `wait` when the caller has waited on the kernel before already.
struct Waited {
  __device__ __forceinline__ void operator()() const {}
};

// The calling warp's dots of nr weight rows wrow(q) [cols] with the nt token rows xrow(u) [cols]
// (matmul_kernel's arithmetic), into acc[q][u] (lane sums, before the xor tree). wrow, xrow:
// device callables int -> row pointer (rows at a stride, from tables, or from two matrices).
// wait(): called once, after the first kC chunks of weights are asked for and before any x is
// read (pdl_wait: the weights' first loads then overlap the kernel before; they must not be
// written by it).
template <class W, int kT, int kR, int kC, class WRow, class XRow, class Wait = Waited>
__device__ __forceinline__ void warp_rows(WRow wrow, int nr, int64_t cols, XRow xrow, int nt,
                                          float (&acc)[kR][kT], Wait wait = {}) {
  constexpr bool kMustWait = !std::is_same_v<Wait, Waited>;
  bool waited = !kMustWait;
  const int lane = threadIdx.x % kWarp;
  auto load_w = [](Raw8<W>& r, const W* p) {
    if constexpr (kT > 1)
      r.load_stream(p);
    else
      r.load(p);
  };
#pragma unroll
  for (int q = 0; q < kR; ++q)
#pragma unroll
    for (int u = 0; u < kT; ++u) acc[q][u] = 0;
  constexpr int64_t kStride = 8 * kWarp;
  int64_t k = 8 * lane;
  for (; k + (kC - 1) * kStride < cols; k += kC * kStride) {
    Raw8<W> wv[kC][kR];
#pragma unroll
    for (int c = 0; c < kC; ++c)
#pragma unroll
      for (int q = 0; q < kR; ++q)
        if (q < nr) load_w(wv[c][q], wrow(q) + k + c * kStride);
    if (kMustWait && !waited) wait(), waited = true;
#pragma unroll
    for (int u = 0; u < kT; ++u) {
      if (u >= nt) break;
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        float xv[8];
        load8(xrow(u) + k + c * kStride, xv);
#pragma unroll
        for (int q = 0; q < kR; ++q)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[q][u] = fmaf(wv[c][q].at(i), xv[i], acc[q][u]);
      }
    }
  }
  if (kMustWait && !waited) wait();
  if constexpr (kT == 1) {
    // The last 0 .. kC-1 chunks, up to kH at a time loaded before their FMAs (same order).
    constexpr int kH = kC > 2 ? kC / 2 : 1;
    for (; k < cols; k += kH * kStride) {
      Raw8<W> wt[kH][kR];
#pragma unroll
      for (int c = 0; c < kH; ++c)
#pragma unroll
        for (int q = 0; q < kR; ++q)
          if (q < nr && k + c * kStride < cols) wt[c][q].load(wrow(q) + k + c * kStride);
#pragma unroll
      for (int c = 0; c < kH; ++c) {
        if (k + c * kStride >= cols) break;
        float xv[8];
        load8(xrow(0) + k + c * kStride, xv);
#pragma unroll
        for (int q = 0; q < kR; ++q)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[q][0] = fmaf(wt[c][q].at(i), xv[i], acc[q][0]);
      }
    }
  } else {
    for (; k < cols; k += kStride) {
      Raw8<W> wv[kR];
#pragma unroll
      for (int q = 0; q < kR; ++q)
        if (q < nr) load_w(wv[q], wrow(q) + k);
#pragma unroll
      for (int u = 0; u < kT; ++u) {
        if (u >= nt) break;
        float xv[8];
        load8(xrow(u) + k, xv);
#pragma unroll
        for (int q = 0; q < kR; ++q)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[q][u] = fmaf(wv[q].at(i), xv[i], acc[q][u]);
      }
    }
  }
}

// kTokX: the grid is (token tile, row group) instead of (row group, token tile), so the blocks
// of one row group for every token tile run side by side and the later ones find its weights in
// L2 (bf16 products: one-token blocks of 2-16 tokens, and tiles of 8 while the row groups fit the
// grid's y dimension). kR: weight rows per warp.
template <class W, int kT, int kC, bool kTokX = false, int kR = kMatRows>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp, 2)
    matmul_kernel(const W* __restrict__ w, int64_t rows, int64_t cols, const float* __restrict__ x,
                  int64_t n, float* __restrict__ y) {
  // The wait comes in warp_rows, after each warp's first weight loads: blocks resident before
  // the kernel before has finished (programmatic launch) have those bytes on the way meanwhile.
  // H100, 2026-12-07, the 80B-A3B shape's batch-1 decode 484.0 / 483.3 -> 485.6 / 486.0 tok/s,
  // tiny-next 5221 -> 5267 / 5275 (docs/PERFORMANCE.md, "Products load their first weights").
  pdl_launch_next();
  const int64_t group = kTokX ? blockIdx.y : blockIdx.x, tile = kTokX ? blockIdx.x : blockIdx.y;
  const int64_t r0 = (group * (blockDim.x / kWarp) + threadIdx.x / kWarp) * kR;
  const int64_t t0 = tile * kT;
  if (r0 >= rows) return;
  const int nt = static_cast<int>(n - t0 < kT ? n - t0 : kT);
  const int nr = static_cast<int>(rows - r0 < kR ? rows - r0 : kR);
  const int lane = threadIdx.x % kWarp;
  float acc[kR][kT];
  const W* wr = w + r0 * cols;
  const float* xt = x + t0 * cols;
  warp_rows<W, kT, kR, kC>([wr, cols](int q) { return wr + q * cols; }, nr, cols,
                           [xt, cols](int u) { return xt + u * cols; }, nt, acc,
                           [] { pdl_wait(); });
#pragma unroll
  for (int q = 0; q < kR; ++q) {
#pragma unroll
    for (int u = 0; u < kT; ++u) {
      if (u >= nt) break;
      const float v = warp_sum(acc[q][u]);
      if (lane == 0 && q < nr) y[(t0 + u) * rows + r0 + q] = v;
    }
  }
}

// One-token products whose input row is a norm of the kernel before's output, formed by every
// block in shared memory (xs [cols]) with the bits of the norm kernel it replaces: that kernel's
// 256 threads (thread u: d = u + 256 m, its squares summed in m order, each warp's xor tree, the
// warps added in order) run by this block's warps in turn, so any block size gives the same bits.
// Then warp w computes row blockIdx.x warps + w against xs as matmul's one-token kernel does
// (warp_rows, kR 1, kC 4: the same bits). One launch and one wait fewer than norm, then product.

// add_rmsnorm_zc's row: v = x + r, then rmsnorm_zc(v) (weight nw, eps). The blocks also store their
// slices of v (x_out: x is read by every block, so v cannot go back to it) and of the normed row
// (xn), for the kernels after.
struct AddNormRow {
  const float *x, *r, *nw;
  float eps;
  float *x_out, *xn;
  static constexpr int kParts = kNormThreads / kWarp;
  __device__ __forceinline__ void operator()(float* xs, float* part, int64_t cols) const {
    const int tid = static_cast<int>(threadIdx.x), nthreads = static_cast<int>(blockDim.x);
    const int lane = tid % kWarp;
    for (int u0 = tid - lane; u0 < kNormThreads; u0 += nthreads) {  // add_rmsnorm_zc's warp u0/32
      float ss = 0;
      for (int64_t d = u0 + lane; d < cols; d += kNormThreads) {
        const float v = x[d] + r[d];
        xs[d] = v;
        ss = fmaf(v, v, ss);
      }
      ss = warp_sum(ss);
      if (lane == 0) part[u0 / kWarp] = ss;
    }
    __syncthreads();
    float total = 0;
#pragma unroll
    for (int q = 0; q < kParts; ++q) total += part[q];
    const float rs = rsqrtf(total / static_cast<float>(cols) + eps);
    for (int64_t d = static_cast<int64_t>(blockIdx.x) * nthreads + tid; d < cols;
         d += static_cast<int64_t>(gridDim.x) * nthreads) {
      const float v = x[d] + r[d];
      x_out[d] = v;
      xn[d] = v * rs * (1.0f + nw[d]);
    }
    for (int64_t d = tid; d < cols; d += nthreads) xs[d] = xs[d] * rs * (1.0f + nw[d]);
    __syncthreads();
  }
};

// Dynamic shared memory: xs [cols], then the row's partial sums [parts]. The rows' weights are
// asked of L2 before the wait on the kernel before (weights are never written by a step).
template <class Row>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp, 2)
    matmul_norm_kernel(const __nv_bfloat16* __restrict__ w, int64_t rows, int64_t cols, Row in,
                       float* __restrict__ y) {
  extern __shared__ float4 dyn_smem[];
  float* xs = reinterpret_cast<float*>(dyn_smem);
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  pdl_launch_next();
  if (lane == 0 && row < rows) prefetch_l2(w + row * cols, static_cast<uint32_t>(cols * 2));
  pdl_wait();
  in(xs, xs + cols, cols);
  if (row >= rows) return;
  float acc[1][1];
  const __nv_bfloat16* wr = w + row * cols;
  warp_rows<__nv_bfloat16, 1, 1, 4>([wr](int) { return wr; }, 1, cols, [xs](int) { return xs; }, 1,
                                    acc);
  const float v = warp_sum(acc[0][0]);
  if (lane == 0) y[row] = v;
}

// Gate and up rows of one expert as warp_rows' weight rows: q < kGroupRows is gate row i0 + q (gr:
// row i0), the others up row i0 + q - kGroupRows (ur); a missing last row (nr < kGroupRows)
// repeats row i0 and is not stored.
constexpr int kGroupRows = 2;
template <class W>
__device__ __forceinline__ auto gate_up_rows(const W* gr, const W* ur, int64_t H, int nr) {
  return [gr, ur, H, nr](int q) {
    const int r = q % kGroupRows < nr ? q % kGroupRows : 0;
    return (q < kGroupRows ? gr : ur) + r * H;
  };
}

// Block (row group, slot): slot = t kk + j with kk = k (+ 1 when the shared expert's weights
// sg, su, sd are given: slot j = k is the shared expert), or token t when experts == nullptr;
// warp w computes rows i0 = (blockIdx.x warps + w) kGroupRows .. of the slot's expert for gate and
// up (four weight rows, four chunks each in flight; matmul's order per row), then SiLU*mul.
template <class W>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp, 2)
    expert_gate_up_kernel(const W* __restrict__ wg, const W* __restrict__ wu,
                          const W* __restrict__ sg, const W* __restrict__ su, int64_t I, int64_t H,
                          const int32_t* __restrict__ experts, int64_t k,
                          const float* __restrict__ x, float* __restrict__ h) {
  const int64_t i0 =
      (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp) * kGroupRows;
  const int64_t kk = sg ? k + 1 : k, slot = blockIdx.y, t = slot / kk, j = slot % kk;
  const bool sh = sg && j == k;
  // The shared expert's rows are known before the routing is (the first token's slot only).
  if (sh && t == 0 && i0 < I && threadIdx.x % kWarp == 0) {
    const uint32_t bytes = (I - i0 < kGroupRows ? I - i0 : kGroupRows) * H * sizeof(W);
    prefetch_l2(sg + i0 * H, bytes);
    prefetch_l2(su + i0 * H, bytes);
  }
  pdl_wait();
  // The kernels after this one start only once every block is past this wait, that is once every
  // kernel before this one has completed: expert_down (ids_settled) and moe_combine
  // (routing_settled) read the routing before their own waits. Down's launch still overlaps this
  // kernel's dots.
  pdl_launch_next();
  if (i0 >= I) return;
  const int64_t e = experts && !sh ? experts[t * k + j] : 0;
  const int nr = static_cast<int>(I - i0 < kGroupRows ? I - i0 : kGroupRows);
  const W* gr = (sh ? sg : wg) + (e * I + i0) * H;
  const W* ur = (sh ? su : wu) + (e * I + i0) * H;
  const float* xt = x + t * H;
  float acc[2 * kGroupRows][1];
  warp_rows<W, 1, 2 * kGroupRows, 4>(
      gate_up_rows(gr, ur, H, nr), 2 * kGroupRows, H, [xt](int) { return xt; }, 1, acc);
#pragma unroll
  for (int q = 0; q < 2 * kGroupRows; ++q) acc[q][0] = warp_sum(acc[q][0]);
  if (threadIdx.x % kWarp == 0) {
#pragma unroll
    for (int q = 0; q < kGroupRows; ++q) {
      const float g = acc[q][0], up = acc[kGroupRows + q][0];
      if (q < nr) h[slot * I + i0 + q] = g / (1.0f + expf(-g)) * up;
    }
  }
}

// Block (row group, slot): warp w computes rows d = (blockIdx.x warps + w) kMatRows .. of the
// slot's expert (matmul's one-token arithmetic).
template <class W>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp, 2)
    expert_down_kernel(const W* __restrict__ wd, const W* __restrict__ sd, int64_t H, int64_t I,
                       const int32_t* __restrict__ experts, int64_t k, const float* __restrict__ h,
                       float* __restrict__ o, bool ids_settled) {
  pdl_launch_next();
  const int64_t d0 =
      (static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp) * kMatRows;
  const int64_t kk = sd ? k + 1 : k, slot = blockIdx.y, t = slot / kk, j = slot % kk;
  const bool sh = sd && j == k;
  if (!ids_settled) {
    if (sh && t == 0 && d0 < H && threadIdx.x % kWarp == 0)  // as in expert_gate_up_kernel
      prefetch_l2(sd + d0 * I, (H - d0 < kMatRows ? H - d0 : kMatRows) * I * sizeof(W));
    pdl_wait();
  }
  if (d0 >= H) return;
  // With ids_settled the expert id is final already (ops.h), read from L2 (__ldcg), and warp_rows
  // asks for the slot's first weights before waiting for h: the DRAM latency of the expert's
  // rows overlaps the gate+up kernel's tail instead of following it.
  const int64_t e = experts && !sh ? __ldcg(experts + t * k + j) : 0;
  const int nr = static_cast<int>(H - d0 < kMatRows ? H - d0 : kMatRows);
  float acc[kMatRows][1];
  const W* wr = (sh ? sd : wd) + (e * H + d0) * I;
  const float* hs = h + slot * I;
  if (ids_settled)
    warp_rows<W, 1, kMatRows, 2>([wr, I](int q) { return wr + q * I; }, nr, I,
                                 [hs](int) { return hs; }, 1, acc, [] { pdl_wait(); });
  else
    warp_rows<W, 1, kMatRows, 2>([wr, I](int q) { return wr + q * I; }, nr, I,
                                 [hs](int) { return hs; }, 1, acc);
#pragma unroll
  for (int q = 0; q < kMatRows; ++q) {
    const float v = warp_sum(acc[q][0]);
    if (threadIdx.x % kWarp == 0 && q < nr) o[slot * H + d0 + q] = v;
  }
}

// Groups the n k slots by expert (one block; thread e per expert): sorted [n k] holds the slots
// of expert 0 in ascending order, then expert 1's, ...; tiles [max_tiles] (expert, begin, count)
// cover each expert's slots in runs of kTokTile; *n_tiles the number used.
constexpr int kGroupThreads = 1024;
__global__ void moe_group_kernel(const int32_t* experts, int64_t slots, int64_t E,
                                 int32_t* __restrict__ sorted, int4* __restrict__ tiles,
                                 int32_t* __restrict__ n_tiles) {
  pdl_enter();
  __shared__ int32_t base[kGroupThreads], tbase[kGroupThreads];
  __shared__ int32_t ids[4096];  // the slots' experts, when they fit
  if (slots <= 4096) {
    for (int64_t i = threadIdx.x; i < slots; i += blockDim.x) ids[i] = experts[i];
    __syncthreads();
    experts = ids;
  }
  const int per = static_cast<int>((E + kGroupThreads - 1) / kGroupThreads);  // experts per thread
  const int e0 = threadIdx.x * per;
  int cnt = 0, tcnt = 0;
  for (int e = e0; e < e0 + per && e < E; ++e) {
    int c = 0;
    for (int64_t s = 0; s < slots; ++s) c += experts[s] == e;
    cnt += c;
    tcnt += (c + kTokTile - 1) / kTokTile;
  }
  // Exclusive prefix sums of (cnt, tcnt) over the threads: warp scans, then a scan of the warp
  // totals (integers: any order gives the same sums).
  __shared__ int32_t wa[kGroupThreads / kWarp], wb[kGroupThreads / kWarp];
  const int lane = threadIdx.x % kWarp, w = threadIdx.x / kWarp;
  int a = cnt, b = tcnt;
#pragma unroll
  for (int o = 1; o < kWarp; o *= 2) {
    const int na = __shfl_up_sync(0xffffffffu, a, o), nb = __shfl_up_sync(0xffffffffu, b, o);
    if (lane >= o) a += na, b += nb;
  }
  if (lane == kWarp - 1) wa[w] = a, wb[w] = b;
  __syncthreads();
  if (w == 0) {
    int x = wa[lane], y = wb[lane];
#pragma unroll
    for (int o = 1; o < kWarp; o *= 2) {
      const int nx = __shfl_up_sync(0xffffffffu, x, o), ny = __shfl_up_sync(0xffffffffu, y, o);
      if (lane >= o) x += nx, y += ny;
    }
    wa[lane] = x, wb[lane] = y;
    if (lane == kWarp - 1) *n_tiles = y;
  }
  __syncthreads();
  base[threadIdx.x] = a - cnt + (w > 0 ? wa[w - 1] : 0);
  tbase[threadIdx.x] = b - tcnt + (w > 0 ? wb[w - 1] : 0);
  int at = base[threadIdx.x], tile = tbase[threadIdx.x];
  for (int e = e0; e < e0 + per && e < E; ++e) {
    const int begin = at;
    for (int64_t s = 0; s < slots; ++s)
      if (experts[s] == e) sorted[at++] = static_cast<int32_t>(s);
    for (int b = begin; b < at; b += kTokTile)
      tiles[tile++] = make_int4(e, b, at - b < kTokTile ? at - b : kTokTile, 0);
  }
}

// A tile's slots, slot[u] = sorted[tl.y + u] for u < tl.z (0 past them), and each one's
// activation row, row[u] = base + (slot[u] / per) * stride.
__device__ __forceinline__ void tile_rows(const int32_t* __restrict__ sorted, int4 tl,
                                          const float* base, int64_t per, int64_t stride,
                                          int64_t (&slot)[kTokTile],
                                          const float* (&row)[kTokTile]) {
#pragma unroll
  for (int u = 0; u < kTokTile; ++u) {
    slot[u] = u < tl.z ? sorted[tl.y + u] : 0;
    row[u] = base + (slot[u] / per) * stride;
  }
}

// Block (row group, tile): the tile's slots (one expert) share each weight load. Gate and up:
// warp w takes rows i0 = (blockIdx.x warps + w) kGroupRows .. of both matrices, four weight rows
// (gate i0, i0 + 1, up i0, i0 + 1) with two chunks each in flight; down: four rows of wd. Per
// (row, slot) the sums are matmul's order, so the bits are the slot kernels'.
template <class W>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp, 2)
    grouped_gate_up_kernel(const W* __restrict__ wg, const W* __restrict__ wu, int64_t I, int64_t H,
                           int64_t k, const int32_t* __restrict__ sorted,
                           const int4* __restrict__ tiles, const int32_t* __restrict__ n_tiles,
                           const float* __restrict__ x, float* __restrict__ h) {
  pdl_enter();
  if (static_cast<int>(blockIdx.y) >= *n_tiles) return;
  const int64_t i0 =
      (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp) * kGroupRows;
  if (i0 >= I) return;
  const int4 tl = tiles[blockIdx.y];
  const float* xr[kTokTile];
  int64_t slot[kTokTile];
  tile_rows(sorted, tl, x, k, H, slot, xr);  // slot s reads its token's row x[s / k]
  const int nr = static_cast<int>(I - i0 < kGroupRows ? I - i0 : kGroupRows);
  const W* gr = wg + (tl.x * I + i0) * H;
  const W* ur = wu + (tl.x * I + i0) * H;
  float acc[2 * kGroupRows][kTokTile];
  warp_rows<W, kTokTile, 2 * kGroupRows, 2>(
      gate_up_rows(gr, ur, H, nr), 2 * kGroupRows, H, [&xr](int u) { return xr[u]; }, tl.z, acc);
#pragma unroll
  for (int q = 0; q < 2 * kGroupRows; ++q)
#pragma unroll
    for (int u = 0; u < kTokTile; ++u)
      if (u < tl.z) acc[q][u] = warp_sum(acc[q][u]);
  if (threadIdx.x % kWarp == 0) {
#pragma unroll
    for (int q = 0; q < kGroupRows; ++q)
#pragma unroll
      for (int u = 0; u < kTokTile; ++u)
        if (q < nr && u < tl.z) {
          const float g = acc[q][u], up = acc[kGroupRows + q][u];
          h[slot[u] * I + i0 + q] = g / (1.0f + expf(-g)) * up;
        }
  }
}

template <class W>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp, 2)
    grouped_down_kernel(const W* __restrict__ wd, int64_t H, int64_t I,
                        const int32_t* __restrict__ sorted, const int4* __restrict__ tiles,
                        const int32_t* __restrict__ n_tiles, const float* __restrict__ h,
                        float* __restrict__ o) {
  pdl_enter();
  if (static_cast<int>(blockIdx.y) >= *n_tiles) return;
  const int64_t d0 =
      (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp) * kMatRows;
  if (d0 >= H) return;
  const int4 tl = tiles[blockIdx.y];
  const float* hr[kTokTile];
  int64_t slot[kTokTile];
  tile_rows(sorted, tl, h, 1, I, slot, hr);  // slot s reads its own row h[s]
  const int nr = static_cast<int>(H - d0 < kMatRows ? H - d0 : kMatRows);
  const W* wr = wd + (tl.x * H + d0) * I;
  float acc[kMatRows][kTokTile];
  warp_rows<W, kTokTile, kMatRows, 2>([wr, I](int q) { return wr + q * I; }, nr, I,
                                      [&hr](int u) { return hr[u]; }, tl.z, acc);
#pragma unroll
  for (int q = 0; q < kMatRows; ++q)
#pragma unroll
    for (int u = 0; u < kTokTile; ++u) {
      if (u >= tl.z) continue;
      const float v = warp_sum(acc[q][u]);
      if (threadIdx.x % kWarp == 0 && q < nr) o[slot[u] * H + d0 + q] = v;
    }
}

// A cluster of kCombineSplit blocks per token, block b taking dims b ceil(H / kCombineSplit) ..;
// the k slots ordered by expert index (thread j < k <= 64 finds its slot's rank). Slot j of token
// t is o[t kk + j] (kk = k, or k + 1 with the shared expert's output in slot k when shared_in_o).
// Thread i takes the block's dims i + kCombineThreads m (m ascending): the combine, x += it, the
// squares; a block tree, then the blocks' partial sums added in block order (distributed shared
// memory), then the norm.
constexpr int kCombineThreads = 256, kCombineSplit = 8;
__global__ void __cluster_dims__(kCombineSplit, 1, 1) __launch_bounds__(kCombineThreads)
    moe_combine_kernel(const float* __restrict__ o, const int32_t* __restrict__ experts,
                       const float* __restrict__ w, int64_t k, int64_t H,
                       const float* __restrict__ shared, bool shared_in_o,
                       const float* __restrict__ gate, int64_t gate_stride,
                       const float* __restrict__ x_in, float* __restrict__ x,
                       const float* __restrict__ norm, float eps, float* __restrict__ xn,
                       float* const* rows_out, bool routing_settled) {
  pdl_launch_next();
  if (!routing_settled) pdl_wait();  // else once the routing below is known (ops.h)
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  __shared__ int order[64], eid[64];
  __shared__ float wo[64];  // the weights in that order
  __shared__ float scratch[kCombineThreads / kWarp], part[1];
  const int64_t t = blockIdx.x / kCombineSplit, kk = shared_in_o ? k + 1 : k;
  const int b = static_cast<int>(cluster.block_rank());
  // The routing and the shared expert's gate: final before this kernel's wait when
  // routing_settled (__ldcg: from L2, where the kernels that wrote them left them).
  if (threadIdx.x < k) eid[threadIdx.x] = __ldcg(experts + t * k + threadIdx.x);
  __syncthreads();
  if (threadIdx.x < k) {  // the stable order of the ids: ties (none for top-k) by slot
    const int j = threadIdx.x, e = eid[j];
    int rank = 0;
    for (int i = 0; i < k; ++i) rank += eid[i] < e || (eid[i] == e && i < j);
    order[rank] = j;
    wo[rank] = __ldcg(w + t * k + j);
  }
  const bool has_sh = shared_in_o || shared != nullptr;
  const float gs = has_sh ? 1.0f / (1.0f + expf(-__ldcg(gate + t * gate_stride))) : 0.0f;
  pdl_wait();  // o (and shared) come from the kernels just before
  __syncthreads();
  const float* sh = shared_in_o ? o + (t * kk + k) * H : shared ? shared + t * H : nullptr;
  float* xr = x + t * H;
  const float* xi = x_in != nullptr ? x_in + t * H : xr;
  const int64_t per = (H + kCombineSplit - 1) / kCombineSplit;
  const int64_t d0 = b * per, d1 = d0 + per < H ? d0 + per : H;
  float ss = 0;
  for (int64_t d = d0 + threadIdx.x; d < d1; d += kCombineThreads) {
    // The sum in ascending expert order; the unrolled body issues its loads before its FMAs.
    float acc = 0;
#pragma unroll
    for (int jj = 0; jj < 16; ++jj)
      if (jj < k) acc = fmaf(o[(t * kk + order[jj]) * H + d], wo[jj], acc);
    for (int jj = 16; jj < k; ++jj) acc = fmaf(o[(t * kk + order[jj]) * H + d], wo[jj], acc);
    if (sh) acc = fmaf(gs, sh[d], acc);
    const float v = xi[d] + acc;
    xr[d] = v;
    ss = fmaf(v, v, ss);
  }
  if (norm == nullptr) return;  // the whole cluster
  ss = block_sum<kCombineThreads>(ss, scratch);
  if (threadIdx.x == 0) part[0] = ss;
  cluster.sync();
  float total = 0;
#pragma unroll
  for (int r = 0; r < kCombineSplit; ++r) total += cluster.map_shared_rank(part, r)[0];
  const float rs = rsqrtf(total / static_cast<float>(H) + eps);
  float* yr = xn + t * H;
  float* ro = rows_out != nullptr ? rows_out[t] : nullptr;
  for (int64_t d = d0 + threadIdx.x; d < d1; d += kCombineThreads) {
    const float v = xr[d] * rs * (1.0f + norm[d]);
    yr[d] = v;
    if (ro != nullptr) ro[d] = v;
  }
  cluster.sync();  // no block leaves while another may read its shared memory
}

// Block (token t, head): heads < n_heads take the query [D] and gate [D] of the stacked
// projection row qkv[t] = [per head query D | gate D ... | k (n_kv D) | v (n_kv D)], norm the query
// (rmsnorm_zc_kernel's arithmetic), rotate it (rope_neox_kernel's) into q [t, head] and copy the
// gate; the other n_kv heads norm and rotate k and write it and v into the caches kc[t] / vc[t]
// at row pos[t]. kNormThreads threads; D <= 1024.
__global__ void attn_prep_kernel(const float* __restrict__ qkv, int64_t n_heads, int64_t n_kv,
                                 int64_t D, int64_t half, const float* __restrict__ q_norm,
                                 const float* __restrict__ k_norm, float eps,
                                 const float* __restrict__ inv_freq,
                                 const int64_t* __restrict__ pos, float* __restrict__ q,
                                 float* __restrict__ gate, float* const* kc, float* const* vc) {
  pdl_enter();
  __shared__ float scratch[kNormThreads / kWarp];
  __shared__ float xs[1024];
  const int64_t t = blockIdx.x, hh = blockIdx.y;
  const int64_t W = n_heads * 2 * D + 2 * n_kv * D;
  const bool is_q = hh < n_heads;
  const int64_t j = hh - n_heads;  // kv head
  const float* src = qkv + t * W + (is_q ? hh * 2 * D : n_heads * 2 * D + j * D);
  const float* w = is_q ? q_norm : k_norm;
  float ss = 0;
  for (int64_t d = threadIdx.x; d < D; d += kNormThreads) ss = fmaf(src[d], src[d], ss);
  ss = block_sum<kNormThreads>(ss, scratch);
  const float r = rsqrtf(ss / static_cast<float>(D) + eps);
  for (int64_t d = threadIdx.x; d < D; d += kNormThreads) xs[d] = src[d] * r * (1.0f + w[d]);
  __syncthreads();
  float* dst = is_q ? q + (t * n_heads + hh) * D : kc[t] + pos[t] * n_kv * D + j * D;
  for (int64_t d = threadIdx.x; d < D; d += kNormThreads) {
    float out = xs[d];
    if (d < 2 * half) {
      const int64_t i = d < half ? d : d - half;
      const float ang = static_cast<float>(pos[t]) * inv_freq[i];
      float sn, cs;
      sincosf(ang, &sn, &cs);
      const float a = xs[i], b = xs[i + half];
      out = d < half ? a * cs - b * sn : b * cs + a * sn;
    }
    dst[d] = out;
  }
  if (is_q) {
    for (int64_t d = threadIdx.x; d < D; d += kNormThreads)
      gate[(t * n_heads + hh) * D + d] = src[D + d];
  } else {
    const float* vs = qkv + t * W + n_heads * 2 * D + n_kv * D + j * D;
    float* vd = vc[t] + pos[t] * n_kv * D + j * D;
    for (int64_t d = threadIdx.x; d < D; d += kNormThreads) vd[d] = vs[d];
  }
}

// One block per row: x += r, then rmsnorm_zc into xn (rmsnorm_zc_kernel's arithmetic).
__global__ void add_rmsnorm_zc_kernel(float* __restrict__ x, const float* __restrict__ r,
                                      const float* __restrict__ w, int64_t dim, float eps,
                                      float* __restrict__ y) {
  pdl_enter();
  __shared__ float scratch[kNormThreads / kWarp];
  float* xr = x + blockIdx.x * dim;
  const float* rr = r + blockIdx.x * dim;
  float ss = 0;
  for (int64_t d = threadIdx.x; d < dim; d += kNormThreads) {
    const float v = xr[d] + rr[d];
    xr[d] = v;
    ss = fmaf(v, v, ss);
  }
  ss = block_sum<kNormThreads>(ss, scratch);
  const float rs = rsqrtf(ss / static_cast<float>(dim) + eps);
  float* yr = y + blockIdx.x * dim;
  for (int64_t d = threadIdx.x; d < dim; d += kNormThreads) yr[d] = xr[d] * rs * (1.0f + w[d]);
}

__global__ void kv_append_kernel(const float* __restrict__ k, const float* __restrict__ v,
                                 int64_t row, const int64_t* __restrict__ pos, float* const* kc,
                                 float* const* vc) {
  pdl_enter();
  const int64_t t = blockIdx.x;
  float* kd = kc[t] + pos[t] * row;
  float* vd = vc[t] + pos[t] * row;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    kd[i] = k[t * row + i];
    vd[i] = v[t * row + i];
  }
}

// Block (channel group, sequence): thread c keeps the channel's last K-1 inputs in registers.
constexpr int kMaxConv = 8;
// One causal-conv step of a channel: window win (its last K-1 inputs), weights wc, new input xin;
// returns silu(sum_j wc[j] in_j), j ascending, and shifts xin into the window.
__device__ __forceinline__ float conv_step(float (&win)[kMaxConv], const float (&wc)[kMaxConv],
                                           int64_t K, float xin) {
  float acc = 0;
#pragma unroll
  for (int j = 0; j < kMaxConv; ++j)
    if (j < K) acc = fmaf(wc[j], j < K - 1 ? win[j] : xin, acc);
#pragma unroll
  for (int j = 0; j < kMaxConv - 1; ++j) {
    if (j < K - 2) win[j] = win[j + 1];
    if (j == K - 2) win[j] = xin;
  }
  return acc / (1.0f + expf(-acc));
}
__global__ void conv_silu_seqs_kernel(const float* __restrict__ xc,
                                      const int32_t* __restrict__ starts, float* const* state,
                                      float* const* hist, const float* __restrict__ w, int64_t C,
                                      int64_t K, int64_t kd, float* __restrict__ q,
                                      float* __restrict__ kk, float* __restrict__ v) {
  pdl_enter();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float* st = state[blockIdx.y];
  float* hs = hist != nullptr ? hist[blockIdx.y] : nullptr;  // [(K-1) + T, C] or none
  float win[kMaxConv], wc[kMaxConv];
#pragma unroll
  for (int j = 0; j < kMaxConv; ++j) {
    win[j] = j < K - 1 ? st[j * C + c] : 0.0f;
    wc[j] = j < K ? w[c * K + j] : 0.0f;
    if (hs != nullptr && j < K - 1) hs[j * C + c] = win[j];
  }
  const int64_t vd = C - 2 * kd, i0 = starts[blockIdx.y];
  for (int64_t i = i0; i < starts[blockIdx.y + 1]; ++i) {
    const float xin = xc[i * C + c];
    if (hs != nullptr) hs[(K - 1 + i - i0) * C + c] = xin;
    const float out = conv_step(win, wc, K, xin);
    if (c < kd)
      q[i * kd + c] = out;
    else if (c < 2 * kd)
      kk[i * kd + c - kd] = out;
    else
      v[i * vd + c - 2 * kd] = out;
  }
#pragma unroll
  for (int j = 0; j < kMaxConv; ++j)
    if (j < K - 1) st[j * C + c] = win[j];
}

__global__ void silu_mul_kernel(const float* __restrict__ g, const float* __restrict__ u, int64_t n,
                                float* __restrict__ y) {
  pdl_enter();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

// One block per token, one thread per (head, pair) of the rotary half.
__global__ void rope_neox_kernel(float* __restrict__ x, int64_t n_heads, int64_t head_dim,
                                 int64_t half, const float* __restrict__ inv_freq,
                                 const int64_t* __restrict__ pos) {
  pdl_enter();
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
  pdl_enter();
  const E* row = embed + static_cast<int64_t>(ids[blockIdx.x]) * dim;
  float* out = y + blockIdx.x * dim;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    if constexpr (sizeof(E) == 2)
      out[d] = __bfloat162float(row[d]);
    else
      out[d] = row[d];
  }
}

// Block (t, half): half 0 normalises embed[ids[t]] with w_e into u[t, 0:dim], half 1 hid[t] with
// w_h into u[t, dim:2 dim]; each rmsnorm_zc_kernel's arithmetic on embed_rows_kernel's floats.
template <class E>
__global__ void mtp_input_kernel(const E* __restrict__ embed, const int32_t* __restrict__ ids,
                                 const float* __restrict__ hid, const float* __restrict__ w_e,
                                 const float* __restrict__ w_h, int64_t dim, float eps,
                                 float* __restrict__ u) {
  pdl_enter();
  __shared__ float scratch[kNormThreads / kWarp];
  const int64_t t = blockIdx.x;
  const bool emb = blockIdx.y == 0;
  const E* er = emb ? embed + static_cast<int64_t>(ids[t]) * dim : nullptr;
  const float* hr = hid + t * dim;
  auto at = [&](int64_t d) -> float {
    if (!emb) return hr[d];
    if constexpr (sizeof(E) == 2)
      return __bfloat162float(er[d]);
    else
      return er[d];
  };
  float ss = 0;
  for (int64_t d = threadIdx.x; d < dim; d += kNormThreads) {
    const float x = at(d);
    ss = fmaf(x, x, ss);
  }
  ss = block_sum<kNormThreads>(ss, scratch);
  const float r = rsqrtf(ss / static_cast<float>(dim) + eps);
  const float* w = emb ? w_e : w_h;
  float* yr = u + t * 2 * dim + (emb ? 0 : dim);
  for (int64_t d = threadIdx.x; d < dim; d += kNormThreads) yr[d] = at(d) * r * (1.0f + w[d]);
}

// One block per row, as rmsnorm_zc.
__global__ void rmsnorm_gated_kernel(const float* __restrict__ x, const float* __restrict__ z,
                                     const float* __restrict__ w, int64_t dim, float eps,
                                     float* __restrict__ y) {
  pdl_enter();
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

// Rows < rows_a are scaled by scale, the others by scale_b.
__global__ void l2norm_scale_kernel(float* __restrict__ x, int64_t dim, float eps, float scale,
                                    int64_t rows_a, float scale_b) {
  pdl_enter();
  if (static_cast<int64_t>(blockIdx.x) >= rows_a) scale = scale_b;
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
  pdl_enter();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * C) return;
  const int64_t t = i / C, c = i % C;
  float acc = 0;
  for (int64_t j = 0; j < K; ++j) acc = fmaf(w[c * K + j], in[(t + j) * C + c], acc);
  out[i] = acc / (1.0f + expf(-acc));
}

// The gated delta rule for head h and value columns j0 .. j0 + 31 over tokens t0 .. t1 (global
// token indices), the state Sh [Dk, Dv] held in registers across the tokens: warp w owns rows
// i = w Dk/8 + m (m < Dk/8) and lane l column j0 + l. Per token, with S decayed in place
// (S *= exp(g)): kv_j = sum_i S[i, j] k_i, each warp over its rows in ascending i, then the eight
// warp partials added in warp order; d_j = beta (v_j - kv_j); S[i, j] = fmaf(k_i, d_j, S[i, j]);
// o_j = sum_i S[i, j] q_i in the same order as kv. A fixed order whatever the batch or split.
// Eight warps, not four: shorter chains per thread (H100, 2026-12-06: tiny-next batch-1 decode
// 5153-5161 -> 5304-5319 tok/s, the 80B-A3B shape unchanged; sixteen warps measured the same
// again and would need Dk a multiple of 16).
constexpr int kDeltaWarps = 8, kDeltaMaxRows = 16;  // Dk <= 128, a multiple of 8
__device__ __forceinline__ void delta_block(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ g, const float* __restrict__ beta, int64_t t0, int64_t t1, int64_t Hk,
    int64_t Hv, int64_t Dk, int64_t Dv, int64_t h, int64_t j0, float* __restrict__ Sh,
    float* __restrict__ out, float* __restrict__ hist) {
  __shared__ float red[kDeltaWarps][kWarp];
  __shared__ float ks[kDeltaWarps * kDeltaMaxRows], qs[kDeltaWarps * kDeltaMaxRows];
  const int w = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t j = j0 + lane, rows = Dk / kDeltaWarps, i0 = w * rows, r = Hv / Hk;
  const bool live = j < Dv;
  float s[kDeltaMaxRows];
#pragma unroll
  for (int m = 0; m < kDeltaMaxRows; ++m) s[m] = m < rows && live ? Sh[(i0 + m) * Dv + j] : 0.0f;
  pdl_wait();  // q, k, v, g, beta come from the kernel before (a no-op if the caller waited)
  for (int64_t t = t0; t < t1; ++t) {
    const float* kt = k + (t * Hk + h / r) * Dk;
    const float* qt = q + (t * Hk + h / r) * Dk;
    for (int64_t i = threadIdx.x; i < Dk; i += blockDim.x) ks[i] = kt[i], qs[i] = qt[i];
    const float decay = expf(g[t * Hv + h]), b = beta[t * Hv + h];
    __syncthreads();
    float kv = 0;
#pragma unroll
    for (int m = 0; m < kDeltaMaxRows; ++m) {
      if (m < rows) {
        s[m] *= decay;
        kv = fmaf(s[m], ks[i0 + m], kv);
      }
    }
    red[w][lane] = kv;
    __syncthreads();
    kv = red[0][lane];
#pragma unroll
    for (int u = 1; u < kDeltaWarps; ++u) kv += red[u][lane];
    const float d = b * ((live ? v[(t * Hv + h) * Dv + j] : 0.0f) - kv);
    float o = 0;
#pragma unroll
    for (int m = 0; m < kDeltaMaxRows; ++m) {
      if (m < rows) {
        s[m] = fmaf(ks[i0 + m], d, s[m]);
        o = fmaf(s[m], qs[i0 + m], o);
      }
    }
    __syncthreads();  // every warp has read red, ks, qs
    red[w][lane] = o;
    __syncthreads();
    if (w == 0 && live) {
      o = red[0][lane];
#pragma unroll
      for (int u = 1; u < kDeltaWarps; ++u) o += red[u][lane];
      out[(t * Hv + h) * Dv + j] = o;
    }
    if (hist != nullptr) {  // S after token t, for a rollback to it
      float* ht = hist + (t - t0) * Hv * Dk * Dv;
#pragma unroll
      for (int m = 0; m < kDeltaMaxRows; ++m)
        if (m < rows && live) ht[(i0 + m) * Dv + j] = s[m];
    }
    __syncthreads();
  }
#pragma unroll
  for (int m = 0; m < kDeltaMaxRows; ++m)
    if (m < rows && live) Sh[(i0 + m) * Dv + j] = s[m];
}

// Block (head h, group of 32 value columns) [, sequence].
__global__ void delta_rule_recurrent_kernel(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ g, const float* __restrict__ beta, int64_t T, int64_t Hk, int64_t Hv,
    int64_t Dk, int64_t Dv, float* __restrict__ S, float* __restrict__ out) {
  pdl_enter();
  const int64_t groups = (Dv + kWarp - 1) / kWarp;
  const int64_t h = blockIdx.x / groups, j0 = (blockIdx.x % groups) * kWarp;
  delta_block(q, k, v, g, beta, 0, T, Hk, Hv, Dk, Dv, h, j0, S + h * Dk * Dv, out, nullptr);
}
__global__ void delta_rule_seqs_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                       const float* __restrict__ v, const float* __restrict__ g,
                                       const float* __restrict__ beta,
                                       const int32_t* __restrict__ starts, float* const* S,
                                       float* const* S_hist, int64_t Hk, int64_t Hv, int64_t Dk,
                                       int64_t Dv, bool early, float* __restrict__ out) {
  pdl_launch_next();
  if (!early) pdl_wait();  // else delta_block waits once its state is in registers
  const int64_t groups = (Dv + kWarp - 1) / kWarp;
  const int64_t h = blockIdx.x / groups, j0 = (blockIdx.x % groups) * kWarp;
  float* hist = S_hist != nullptr ? S_hist[blockIdx.y] : nullptr;
  delta_block(q, k, v, g, beta, starts[blockIdx.y], starts[blockIdx.y + 1], Hk, Hv, Dk, Dv, h, j0,
              S[blockIdx.y] + h * Dk * Dv, out, hist != nullptr ? hist + h * Dk * Dv : nullptr);
}

// Attention of query (t, head) over keys 0 .. L-1 (L = pos[t] + 1) in kAttnSplits contiguous
// chunks of ceil(L / kAttnSplits) keys (the split depends on L only, so a row's bits are the same
// in any batch). A chunk (attend_chunk) runs in tiles of kAttnTile keys with a running max (online
// softmax): scores by warps (warp w of W takes tile keys w + W i, four keys at once; lane l sums
// dims l + 32 c in ascending c, then the xor tree), the tile's max and sum by block trees, then
// warp w accumulates the same keys' values (lane l: dims l + 32 c; four keys' rows in flight) into
// its own partial, rescaled per tile; at the chunk's end the warps' partials are summed in warp
// order. (A block of 128 threads, thread u accumulating dims u + 128 i over every key of a tile in
// turn, had a few loads in flight: 122 us per layer at context 4096 on the 80B-A3B shape.) The
// chunks' partials (max m_s, sum l_s, unnormalised acc_s [D]) are joined in chunk order
// (attend_join): out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s (M = max_s m_s; empty
// chunks add 0). Decode-sized steps give each chunk a block of a cluster (the partials meet
// through distributed shared memory); prompts give a (t, head) one block that runs the chunks in
// turn: the same arithmetic, the same bits.
constexpr int kAttnSplits = 8;
constexpr int kAttnTile = 256, kAttnThreads = 256, kAttnMaxD = 512;
constexpr int kAttnDims = kAttnMaxD / kAttnThreads;  // dims per thread
// Steps of more rows than this take the one-block-per-(t, head) kernel.
constexpr int64_t kAttnClusterRows = 64;

// Keys [j0, j1) of one query for the calling block: m, sum and acc (dims threadIdx.x + 128 u) as
// above. qr: the lane's query dims lane + 32 c; p [kAttnTile], scratch [kAttnThreads / 32]: shared.
__device__ __forceinline__ void attend_chunk(const float (&qr)[kAttnMaxD / kWarp],
                                             const float* __restrict__ kc,
                                             const float* __restrict__ vc, int64_t n_kv,
                                             int64_t kvh, int64_t D, float scale, int64_t j0,
                                             int64_t j1, float* p, float* scratch, float& m,
                                             float& sum, float (&acc)[kAttnDims]) {
  const int w = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int nc = static_cast<int>((D - lane + kWarp - 1) / kWarp);  // lane's dims in a row
  constexpr int kWarps = kAttnThreads / kWarp;
  __shared__ float wpart[kWarps][kAttnMaxD];  // the warps' partials at the chunk's end
  m = -INFINITY, sum = 0;
  float accw[kAttnMaxD / kWarp];  // this warp's partial, lane's dims lane + 32 c
#pragma unroll
  for (int c = 0; c < kAttnMaxD / kWarp; ++c) accw[c] = 0;
  for (int64_t tile = j0; tile < j1; tile += kAttnTile) {
    const int n = static_cast<int>(j1 - tile < kAttnTile ? j1 - tile : kAttnTile);
    for (int base = w; base < n; base += 4 * kWarps) {
      float dot[4] = {0, 0, 0, 0};
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int jj = base + u * kWarps;
        if (jj >= n) break;  // warp-uniform
        const float* kr = kc + ((tile + jj) * n_kv + kvh) * D + lane;
#pragma unroll
        for (int c = 0; c < kAttnMaxD / kWarp; ++c)
          if (c < nc) dot[u] = fmaf(qr[c], kr[kWarp * c], dot[u]);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int jj = base + u * kWarps;
        if (jj >= n) break;
        const float v = warp_sum(dot[u]);
        if (lane == 0) p[jj] = v * scale;
      }
    }
    __syncthreads();
    const float sc = static_cast<int>(threadIdx.x) < n ? p[threadIdx.x] : -INFINITY;
    // Tile max by a fixed tree.
    float tm = sc;
#pragma unroll
    for (int o = kWarp / 2; o > 0; o /= 2) tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, o));
    if (lane == 0) scratch[w] = tm;
    __syncthreads();
    tm = scratch[0];
#pragma unroll
    for (int u = 1; u < kWarps; ++u) tm = fmaxf(tm, scratch[u]);
    __syncthreads();
    const float m_new = fmaxf(m, tm);
    const float pj = static_cast<int>(threadIdx.x) < n ? expf(sc - m_new) : 0.0f;
    p[threadIdx.x] = pj;
    const float tsum = block_sum<kAttnThreads>(pj, scratch);  // its barriers also publish p
    const float rescale = expf(m - m_new);
    sum = sum * rescale + tsum;
#pragma unroll
    for (int c = 0; c < kAttnMaxD / kWarp; ++c) accw[c] *= rescale;
    for (int base = w; base < n; base += 4 * kWarps) {
      float pv[4];
      float vv[4][kAttnMaxD / kWarp];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int jj = base + u * kWarps;
        pv[u] = jj < n ? p[jj] : 0.0f;
        const float* vr = vc + ((tile + (jj < n ? jj : base)) * n_kv + kvh) * D + lane;
#pragma unroll
        for (int c = 0; c < kAttnMaxD / kWarp; ++c) vv[u][c] = c < nc ? vr[kWarp * c] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (base + u * kWarps >= n) break;  // warp-uniform
#pragma unroll
        for (int c = 0; c < kAttnMaxD / kWarp; ++c) accw[c] = fmaf(pv[u], vv[u][c], accw[c]);
      }
    }
    m = m_new;
    __syncthreads();
  }
#pragma unroll
  for (int c = 0; c < kAttnMaxD / kWarp; ++c)
    if (c < nc) wpart[w][lane + kWarp * c] = accw[c];
  __syncthreads();
#pragma unroll
  for (int u = 0; u < kAttnDims; ++u) {
    const int64_t d = threadIdx.x + u * kAttnThreads;
    float a = 0;
    if (d < D) {
#pragma unroll
      for (int v = 0; v < kWarps; ++v) a += wpart[v][d];
    }
    acc[u] = a;
  }
  __syncthreads();  // wpart is free again (the next chunk of the block)
}

// The join of the kAttnSplits partials for one dim: ml(r) -> {m_r, l_r}, accd(r) -> acc_r[d];
// then the output gate, o * sigmoid(gate) (mul_sigmoid_kernel's arithmetic), when gate != null.
template <class ML, class Acc>
__device__ __forceinline__ float attend_join(ML ml, Acc accd, const float* gate) {
  float ms[kAttnSplits], M = -INFINITY;
#pragma unroll
  for (int r = 0; r < kAttnSplits; ++r) {
    ms[r] = ml(r)[0];
    M = fmaxf(M, ms[r]);
  }
  float num = 0, den = 0;
#pragma unroll
  for (int r = 0; r < kAttnSplits; ++r) {
    const float e = expf(ms[r] - M);
    num = fmaf(e, accd(r), num);
    den = fmaf(e, ml(r)[1], den);
  }
  const float a = num / den;
  return gate ? a * (1.0f / (1.0f + expf(-*gate))) : a;
}

// The caches are kc0 / vc0, or per token kt[t] / vt[t] when the tables are given. kClustered: a
// block per chunk in a cluster per (t, head); else a block per (t, head) running every chunk.
template <bool kClustered>
__device__ __forceinline__ void attention_body(
    const float* __restrict__ q, const int64_t* __restrict__ pos, const float* kc0,
    const float* vc0, const float* const* kt, const float* const* vt, int64_t n_heads, int64_t n_kv,
    int64_t D, float scale, const float* __restrict__ gate, float* __restrict__ out) {
  __shared__ float qs[kAttnMaxD], p[kAttnTile], scratch[kAttnThreads / kWarp];
  // The partials: this block's chunk (clustered), or every chunk.
  constexpr int kParts = kClustered ? 1 : kAttnSplits;
  __shared__ float acc_s[kParts][kAttnMaxD], ml[kParts][2];
  const int64_t th = kClustered ? blockIdx.x / kAttnSplits : blockIdx.x;
  const int64_t t = th / n_heads, h = th % n_heads, kvh = h / (n_heads / n_kv);
  const float* __restrict__ kc = kt ? kt[t] : kc0;
  const float* __restrict__ vc = vt ? vt[t] : vc0;
  const float* qv = q + (t * n_heads + h) * D;
  for (int64_t d = threadIdx.x; d < D; d += kAttnThreads) qs[d] = qv[d];
  const int64_t L = pos[t] + 1, chunk = (L + kAttnSplits - 1) / kAttnSplits;
  const int lane = threadIdx.x % kWarp;
  __syncthreads();
  float qr[kAttnMaxD / kWarp];
#pragma unroll
  for (int c = 0; c < kAttnMaxD / kWarp; ++c)
    qr[c] = lane + kWarp * c < D ? qs[lane + kWarp * c] : 0.0f;
  const int r0 = kClustered ? static_cast<int>(cooperative_groups::this_cluster().block_rank()) : 0;
  for (int r = r0; r < (kClustered ? r0 + 1 : kAttnSplits); ++r) {
    const int64_t j0 = r * chunk < L ? r * chunk : L;
    const int64_t j1 = j0 + chunk < L ? j0 + chunk : L;
    float m, sum, acc[kAttnDims];
    attend_chunk(qr, kc, vc, n_kv, kvh, D, scale, j0, j1, p, scratch, m, sum, acc);
    const int part = kClustered ? 0 : r;
#pragma unroll
    for (int u = 0; u < kAttnDims; ++u) {
      const int64_t d = threadIdx.x + u * kAttnThreads;
      if (d < D) acc_s[part][d] = acc[u];
    }
    if (threadIdx.x == 0) ml[part][0] = m, ml[part][1] = sum;
  }
  const float* g = gate ? gate + (t * n_heads + h) * D : nullptr;
  float* o = out + (t * n_heads + h) * D;
  if constexpr (kClustered) {
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    cluster.sync();
    const int64_t per = (D + kAttnSplits - 1) / kAttnSplits, d = r0 * per + threadIdx.x;
    if (threadIdx.x < per && d < D)
      o[d] = attend_join([&](int r) { return cluster.map_shared_rank(ml[0], r); },
                         [&](int r) { return cluster.map_shared_rank(acc_s[0], r)[d]; },
                         g ? g + d : nullptr);
    cluster.sync();  // no block leaves while another may read its shared memory
  } else {
    __syncthreads();
    for (int64_t d = threadIdx.x; d < D; d += kAttnThreads)
      o[d] = attend_join([&](int r) { return ml[r]; }, [&](int r) { return acc_s[r][d]; },
                         g ? g + d : nullptr);
  }
}
__global__ void __cluster_dims__(kAttnSplits, 1, 1) __launch_bounds__(kAttnThreads)
    attention_cluster_kernel(const float* __restrict__ q, const int64_t* __restrict__ pos,
                             const float* kc0, const float* vc0, const float* const* kt,
                             const float* const* vt, int64_t n_heads, int64_t n_kv, int64_t D,
                             float scale, const float* __restrict__ gate, float* __restrict__ out) {
  pdl_enter();
  attention_body<true>(q, pos, kc0, vc0, kt, vt, n_heads, n_kv, D, scale, gate, out);
}
__global__ void __launch_bounds__(kAttnThreads)
    attention_rows_kernel(const float* __restrict__ q, const int64_t* __restrict__ pos,
                          const float* kc0, const float* vc0, const float* const* kt,
                          const float* const* vt, int64_t n_heads, int64_t n_kv, int64_t D,
                          float scale, const float* __restrict__ gate, float* __restrict__ out) {
  pdl_enter();
  attention_body<false>(q, pos, kc0, vc0, kt, vt, n_heads, n_kv, D, scale, gate, out);
}

// One block of kRouteThreads per token; thread i holds logits e = i + kRouteThreads m (one for
// E <= 512). Floats compare as order-preserving unsigned keys, so "largest (logit, lower index)"
// is a max of keys, then a min of indices among the holders: per warp by two reductions, then
// over the warps' results (every warp redoes that join, so one barrier per pick: the warps'
// results go to one of two buffers by pick parity). The softmax max and sum by block trees.
constexpr int kRouteThreads = 512, kRouteWarps = kRouteThreads / kWarp;
__device__ __forceinline__ unsigned order_key(float v) {
  const unsigned b = __float_as_uint(v);
  return b & 0x80000000u ? ~b : b | 0x80000000u;
}
__device__ __forceinline__ float key_value(unsigned key) {
  return __uint_as_float(key & 0x80000000u ? key & 0x7fffffffu : ~key);
}
// The (key, index) of the largest of every thread's candidate (key 0 = none) in the block; rk, ri:
// kRouteWarps entries of shared memory, free to write (the caller's barrier discipline).
__device__ __forceinline__ void block_top(unsigned key, unsigned idx, unsigned* rk, unsigned* ri,
                                          unsigned* top, unsigned* at) {
  const int w = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  unsigned t = __reduce_max_sync(0xffffffffu, key);
  unsigned i = __reduce_min_sync(0xffffffffu, key == t && key != 0 ? idx : 0xffffffffu);
  if (lane == 0) rk[w] = t, ri[w] = i;
  __syncthreads();
  const unsigned k2 = lane < kRouteWarps ? rk[lane] : 0u;
  const unsigned i2 = lane < kRouteWarps ? ri[lane] : 0xffffffffu;
  t = __reduce_max_sync(0xffffffffu, k2);
  *at = __reduce_min_sync(0xffffffffu, k2 == t && k2 != 0 ? i2 : 0xffffffffu);
  *top = t;
}
// The picks of one token's logits l [E] by the calling block of kRouteThreads, one at a time;
// pick j and its weight to experts[j], weights[j].
__device__ __forceinline__ void scan_route(const float* __restrict__ l, int64_t E, int64_t k,
                                           bool renorm, int32_t* __restrict__ experts,
                                           float* __restrict__ weights) {
  __shared__ unsigned rk[2][kRouteWarps], ri[2][kRouteWarps];
  __shared__ float scratch[kRouteWarps];
  const int64_t e0 = threadIdx.x;
  const float v0 = e0 < E ? l[e0] : -INFINITY;
  float mx = v0;
  for (int64_t e = e0 + kRouteThreads; e < E; e += kRouteThreads) mx = fmaxf(mx, l[e]);
  unsigned top, at;
  block_top(e0 < E || mx > -INFINITY ? order_key(mx) : 0u, 0u, rk[0], ri[0], &top, &at);
  mx = key_value(top);
  float sum = e0 < E ? expf(v0 - mx) : 0.0f;
  for (int64_t e = e0 + kRouteThreads; e < E; e += kRouteThreads) sum += expf(l[e] - mx);
  sum = block_sum<kRouteThreads>(sum, scratch);  // its barriers also order rk[0]'s reuse
  float pv = INFINITY, wsum = 0, mine = 0;
  int pi = -1, mine_e = 0;
  for (int64_t s = 0; s < k; ++s) {
    // This thread's largest (logit, lower index) below the last pick (pv, pi).
    float bv = -INFINITY;
    int bi = -1;
    for (int64_t e = e0; e < E; e += kRouteThreads) {
      const float x = e == e0 ? v0 : l[e];
      const bool below = x < pv || (x == pv && e > pi);
      if (below && (bi < 0 || x > bv)) bv = x, bi = static_cast<int>(e);
    }
    block_top(bi < 0 ? 0u : order_key(bv), static_cast<unsigned>(bi), rk[s % 2], ri[s % 2], &top,
              &at);
    pv = key_value(top), pi = static_cast<int>(at);
    const float p = expf(pv - mx) / sum;
    wsum += p;
    if (threadIdx.x == s) mine = p, mine_e = pi;
  }
  // Thread j < k writes pick j (the weights renormalised over the k).
  if (threadIdx.x < k) {
    experts[threadIdx.x] = mine_e;
    weights[threadIdx.x] = renorm ? mine / wsum : mine;
  }
}
__global__ void __launch_bounds__(kRouteThreads)
    route_topk_kernel(const float* __restrict__ logits, int64_t E, int64_t ld, int64_t k,
                      bool renorm, int32_t* __restrict__ experts, float* __restrict__ weights) {
  pdl_enter();
  const int64_t t = blockIdx.x;
  scan_route(logits + t * ld, E, k, renorm, experts + t * k, weights + t * k);
}

// The same routing by ranks, for E <= kRouteThreads and k <= kRouteWarps (every model here: the
// 80B-A3B shape has 512 experts, top 10), in three barriers instead of one per pick. Thread e holds
// logit e. The k-th largest of the warps' maxima, tau, is a lower bound of the k-th largest logit
// (the k warps whose maxima are >= tau hold k entries >= tau), so every pick is among the
// candidates (key >= tau; a few dozen for real logits, all E at worst): a candidate's rank is the
// number of candidates above it (larger key, or equal key and lower index), and rank r < k is pick
// r. The softmax max, sum (a warp's xor tree, then the warps in order: block_sum's order) and the
// renormalising sum (the picks in rank order) are those of route_topk_kernel, so the two give the
// same bits (CudaOps.RouteTopkRanksEqualScan). Side by side on an H100 (2026-12-06, the 80B-A3B
// shape): batch-1 decode 461.5-461.9 -> 473.6-475.3 tok/s, batches 8 and 32 unchanged. Ranking
// costs candidates^2 / 512 steps a thread: a row of many equal logits (all 512 candidates: 33 us
// against the scan's 6) takes the scan instead, past kMaxRankCandidates.
constexpr int kMaxRankCandidates = 64;
__global__ void __launch_bounds__(kRouteThreads)
    route_rank_kernel(const float* __restrict__ logits, int64_t E, int64_t ld, int64_t k,
                      bool renorm, int32_t* __restrict__ experts, float* __restrict__ weights) {
  pdl_enter();
  __shared__ unsigned keys[kRouteThreads], wmax[kRouteWarps], cand[kRouteWarps];
  __shared__ float wsum_exp[kRouteWarps], picked[kRouteWarps];
  __shared__ int picked_e[kRouteWarps];
  const int64_t t = blockIdx.x;
  const int e = static_cast<int>(threadIdx.x), w = e / kWarp, lane = e % kWarp;
  const bool valid = e < E;
  const float v = valid ? logits[t * ld + e] : -INFINITY;
  const unsigned key = valid ? order_key(v) : 0u;
  keys[e] = key;
  const unsigned wm = __reduce_max_sync(0xffffffffu, key);
  if (lane == 0) wmax[w] = wm;
  __syncthreads();
  // Every warp: lane u < kRouteWarps ranks warp u's maximum among the maxima (ties to the lower
  // warp); tau is the one of rank k - 1, the softmax max the largest.
  const unsigned mine = lane < kRouteWarps ? wmax[lane] : 0u;
  int rank = 0;
#pragma unroll
  for (int u = 0; u < kRouteWarps; ++u) rank += wmax[u] > mine || (wmax[u] == mine && u < lane);
  const unsigned at = __ballot_sync(0xffffffffu, lane < kRouteWarps && rank == k - 1);
  const unsigned tau = __shfl_sync(0xffffffffu, mine, __ffs(at) - 1);
  const float mx = key_value(__reduce_max_sync(0xffffffffu, mine));
  const float p = valid ? expf(v - mx) : 0.0f;
  const float ws = warp_sum(p);
  const bool is_cand = valid && key >= tau;
  const unsigned cm = __ballot_sync(0xffffffffu, is_cand);
  if (lane == 0) wsum_exp[w] = ws, cand[w] = cm;
  __syncthreads();
  int n_cand = 0;
#pragma unroll
  for (int u = 0; u < kRouteWarps; ++u) n_cand += __popc(cand[u]);
  if (n_cand > kMaxRankCandidates) {  // block-uniform
    scan_route(logits + t * ld, E, k, renorm, experts + t * k, weights + t * k);
    return;
  }
  float sum = 0;
#pragma unroll
  for (int u = 0; u < kRouteWarps; ++u) sum += wsum_exp[u];
  if (is_cand) {
    int r = 0;
    for (int u = 0; u < kRouteWarps; ++u) {
      for (unsigned m = cand[u]; m != 0; m &= m - 1) {
        const int j = u * kWarp + __ffs(m) - 1;
        r += keys[j] > key || (keys[j] == key && j < e);
      }
    }
    if (r < k) picked[r] = p / sum, picked_e[r] = e;
  }
  __syncthreads();
  if (e < k) {
    float wsum = 0;
    for (int s = 0; s < k; ++s) wsum += picked[s];
    experts[t * k + e] = picked_e[e];
    weights[t * k + e] = renorm ? picked[e] / wsum : picked[e];
  }
}

// For the calling block of 256 threads over l[i0, i1): the max and the lowest index holding it
// (each thread's entries in order, then a tree that keeps the lower index on ties), in sv[0] and
// si[0] for every thread on return.
__device__ __forceinline__ void block_argmax(const float* __restrict__ l, int64_t i0, int64_t i1,
                                             float* sv, int* si) {
  float bv = -INFINITY;
  int bi = -1;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x)
    if (bi < 0 || l[i] > bv) bv = l[i], bi = static_cast<int>(i);
  sv[threadIdx.x] = bv, si[threadIdx.x] = bi;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o /= 2) {
    if (threadIdx.x < o) {
      const float ov = sv[threadIdx.x + o];
      const int oi = si[threadIdx.x + o];
      if (oi >= 0 && (si[threadIdx.x] < 0 || ov > sv[threadIdx.x] ||
                      (ov == sv[threadIdx.x] && oi < si[threadIdx.x])))
        sv[threadIdx.x] = ov, si[threadIdx.x] = oi;
    }
    __syncthreads();
  }
}
// sum exp(l_i - mx) over l[i0, i1) for the calling block: per-thread sums, then a tree in sv
// (which every thread must be done reading first). Every thread gets the total.
__device__ __forceinline__ float block_sum_exp(const float* __restrict__ l, int64_t i0, int64_t i1,
                                               float mx, float* sv) {
  float sum = 0;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) sum += expf(l[i] - mx);
  sv[threadIdx.x] = sum;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o /= 2) {
    if (threadIdx.x < o) sv[threadIdx.x] += sv[threadIdx.x + o];
    __syncthreads();
  }
  return sv[0];
}

// One block per row; ties to the lower index. prob: the argmax's softmax probability,
// 1 / sum_i exp(l_i - max).
__global__ void argmax_rows_kernel(const float* __restrict__ logits, int64_t V,
                                   int32_t* __restrict__ out, float* __restrict__ prob) {
  pdl_enter();
  __shared__ float sv[256];
  __shared__ int si[256];
  const float* l = logits + blockIdx.x * V;
  block_argmax(l, 0, V, sv, si);
  if (threadIdx.x == 0) out[blockIdx.x] = si[0];
  if (prob == nullptr) return;
  const float mx = sv[0];
  __syncthreads();
  const float total = block_sum_exp(l, 0, V, mx, sv);
  if (threadIdx.x == 0) prob[blockIdx.x] = 1.0f / total;
}

// Two stages for long rows (argmax_rows with `work`). Stage 1, block (b, row): the chunk
// [b c, (b + 1) c) of the row, c = kArgmaxChunk: its max, the lowest index holding it, and
// sum exp(l - max) over the chunk, to part[row, b] = {max, index bits, sum}.
constexpr int64_t kArgmaxChunk = 2048;
__global__ void argmax_part_kernel(const float* __restrict__ logits, int64_t V, bool want_sum,
                                   float* __restrict__ part) {
  pdl_enter();
  __shared__ float sv[256];
  __shared__ int si[256];
  const float* l = logits + blockIdx.y * V;
  const int64_t i0 = blockIdx.x * kArgmaxChunk, i1 = min(V, i0 + kArgmaxChunk);
  block_argmax(l, i0, i1, sv, si);
  float* p = part + (blockIdx.y * gridDim.x + blockIdx.x) * 3;
  const float mx = sv[0];
  if (threadIdx.x == 0) p[0] = mx, p[1] = __int_as_float(si[0]);
  if (!want_sum) return;
  __syncthreads();
  const float total = block_sum_exp(l, i0, i1, mx, sv);
  if (threadIdx.x == 0) p[2] = total;
}
// Stage 2, one thread per row: the chunks in order (the first holding the max has its lowest
// index), and sum_b s_b exp(m_b - max) in chunk order.
__global__ void argmax_join_kernel(const float* __restrict__ part, int64_t n, int64_t B,
                                   int32_t* __restrict__ out, float* __restrict__ prob) {
  pdl_enter();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= n) return;
  const float* p = part + row * B * 3;
  float mx = p[0];
  int idx = __float_as_int(p[1]);
  for (int64_t b = 1; b < B; ++b)
    if (p[3 * b] > mx) mx = p[3 * b], idx = __float_as_int(p[3 * b + 1]);
  out[row] = idx;
  if (prob == nullptr) return;
  float sum = 0;
  for (int64_t b = 0; b < B; ++b) sum += p[3 * b + 2] * expf(p[3 * b] - mx);
  prob[row] = 1.0f / sum;
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
template <class T>
__global__ void fill_uniform_kernel(T* __restrict__ p, int64_t n, uint64_t seed, float scale,
                                    float offset) {
  // No early launch of the kernel after: it may be a product that reads its weights (these)
  // before its wait.
  pdl_wait();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t z = mix64(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i));
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    const float x = (2.0f * u - 1.0f) * scale + offset;
    if constexpr (sizeof(T) == 2)
      p[i] = __float2bfloat16(x);
    else
      p[i] = x;
  }
}

__global__ void mul_sigmoid_kernel(float* __restrict__ x, const float* __restrict__ gate,
                                   int64_t n) {
  pdl_enter();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= 1.0f / (1.0f + expf(-gate[i]));
}

__global__ void add_kernel(float* __restrict__ y, const float* __restrict__ x, int64_t n) {
  pdl_enter();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i];
}

// One block per token, threads over the k-heads' groups.
__global__ void split_qkvz_kernel(const float* __restrict__ P, const float* __restrict__ BA,
                                  int64_t Hk, int64_t Dk, int64_t r, int64_t Dv,
                                  float* __restrict__ xc, float* __restrict__ z,
                                  float* __restrict__ b, float* __restrict__ a) {
  pdl_enter();
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

// split_qkvz and gdn_gates in one pass over PB [n, Hk G + Hk 2r] (the stacked in_qkvz | in_ba
// projection): the same values as the two kernels.
// Block (token t, k-head group).
__global__ void split_qkvz_gates_kernel(const float* __restrict__ PB, int64_t Hk, int64_t Dk,
                                        int64_t r, int64_t Dv, const float* __restrict__ dt_bias,
                                        const float* __restrict__ neg_exp_a, float* __restrict__ xc,
                                        float* __restrict__ z, float* __restrict__ beta,
                                        float* __restrict__ g) {
  pdl_enter();
  const int64_t t = blockIdx.x, grp = blockIdx.y, G = 2 * Dk + 2 * r * Dv, kd = Hk * Dk;
  const int64_t Hv = Hk * r, C = 2 * kd + Hv * Dv, W = Hk * G + Hk * 2 * r;
  const float* P = PB + t * W + grp * G;
  for (int64_t o = threadIdx.x; o < G; o += blockDim.x) {
    const float x = P[o];
    if (o < Dk)
      xc[t * C + grp * Dk + o] = x;
    else if (o < 2 * Dk)
      xc[t * C + kd + grp * Dk + o - Dk] = x;
    else if (o < 2 * Dk + r * Dv)
      xc[t * C + 2 * kd + grp * r * Dv + o - 2 * Dk] = x;
    else
      z[(t * Hv + grp * r) * Dv + o - 2 * Dk - r * Dv] = x;
  }
  const float* BA = PB + t * W + Hk * G + grp * 2 * r;
  for (int64_t o = threadIdx.x; o < r; o += blockDim.x) {
    const int64_t i = grp * r + o;
    const float b = BA[o], a = BA[r + o];
    beta[t * Hv + i] = 1.0f / (1.0f + expf(-b));
    const float x = a + dt_bias[i];
    g[t * Hv + i] = neg_exp_a[i] * (x > 20.0f ? x : log1pf(expf(x)));
  }
}

// Block (head slot, sequence) of kPrepThreads threads: slots < Hk are q heads, then Hk k heads,
// then Hv v heads; thread i < Dh (Dk or Dv) owns the head's conv channel c and walks the
// sequence's tokens as conv_silu_seqs_kernel does (same sums); a q or k head's outputs are then
// l2-normed per token as l2norm_scale_kernel (the squares by a block tree: the same bits, the
// missing lanes adding zeros); a v head also copies its z row and computes its gates.
constexpr int kPrepThreads = 128;
__global__ void __launch_bounds__(kPrepThreads)
    gdn_prep_kernel(const float* __restrict__ PB, const int32_t* __restrict__ starts,
                    float* const* state, float* const* hist, const float* __restrict__ w,
                    int64_t Hk, int64_t Dk, int64_t r, int64_t Dv, int64_t K,
                    const float* __restrict__ dt_bias, const float* __restrict__ neg_exp_a,
                    float q_scale, float* __restrict__ q, float* __restrict__ kk,
                    float* __restrict__ v, float* __restrict__ z, float* __restrict__ beta,
                    float* __restrict__ g, bool early) {
  pdl_launch_next();
  if (!early) pdl_wait();  // else after the conv state and weights are loaded
  __shared__ float scratch[kPrepThreads / kWarp];
  const int64_t kd = Hk * Dk, Hv = Hk * r, C = 2 * kd + Hv * Dv, G = 2 * Dk + 2 * r * Dv;
  const int64_t W = Hk * G + Hk * 2 * r, slot = blockIdx.x, seq = blockIdx.y;
  const int kind = slot < Hk ? 0 : slot < 2 * Hk ? 1 : 2;  // q, k, v
  const int64_t hh = kind == 0 ? slot : kind == 1 ? slot - Hk : slot - 2 * Hk;
  const int64_t i = threadIdx.x, Dh = kind == 2 ? Dv : Dk;
  const bool live = i < Dh;
  // The channel's column in PB's row and in the conv's [q | k | v] order.
  const int64_t grp = kind == 2 ? hh / r : hh, j = kind == 2 ? hh % r : 0;
  const int64_t col = grp * G + (kind == 0 ? i : kind == 1 ? Dk + i : 2 * Dk + j * Dv + i);
  const int64_t c = kind == 0 ? hh * Dk + i : kind == 1 ? kd + hh * Dk + i : 2 * kd + hh * Dv + i;
  float* st = state[seq];
  float* hs = hist != nullptr ? hist[seq] : nullptr;  // [(K-1) + T, C] or none
  float win[kMaxConv], wc[kMaxConv];
#pragma unroll
  for (int m = 0; m < kMaxConv; ++m) {
    win[m] = live && m < K - 1 ? st[m * C + c] : 0.0f;
    wc[m] = live && m < K ? w[c * K + m] : 0.0f;
  }
  pdl_wait();  // PB comes from the kernel before; nothing is written before this
#pragma unroll
  for (int m = 0; m < kMaxConv; ++m)
    if (live && hs != nullptr && m < K - 1) hs[m * C + c] = win[m];
  const int64_t t0 = starts[seq], t1 = starts[seq + 1];
  for (int64_t t = t0; t < t1; ++t) {
    const float* P = PB + t * W;
    const float xin = live ? P[col] : 0.0f;
    if (live && hs != nullptr) hs[(K - 1 + t - t0) * C + c] = xin;
    const float out = conv_step(win, wc, K, xin);
    if (kind == 2) {
      if (live) {
        v[(t * Hv + hh) * Dv + i] = out;
        z[(t * Hv + hh) * Dv + i] = P[grp * G + 2 * Dk + r * Dv + j * Dv + i];
      }
      if (i == 0) {  // split_qkvz_gates_kernel's gates
        const float* BA = P + Hk * G + grp * 2 * r;
        const float b = BA[j], a = BA[r + j];
        beta[t * Hv + hh] = 1.0f / (1.0f + expf(-b));
        const float x = a + dt_bias[hh];
        g[t * Hv + hh] = neg_exp_a[hh] * (x > 20.0f ? x : log1pf(expf(x)));
      }
    } else {
      const float ss = block_sum<kPrepThreads>(fmaf(out, out, 0.0f), scratch);
      const float rn = rsqrtf(ss + 1e-6f);
      if (live) {
        if (kind == 0)
          q[(t * Hk + hh) * Dk + i] = out * rn * q_scale;
        else
          kk[(t * Hk + hh) * Dk + i] = out * rn * 1.0f;
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kMaxConv; ++m)
    if (live && m < K - 1) st[m * C + c] = win[m];
}

__global__ void gdn_gates_kernel(const float* __restrict__ b, const float* __restrict__ a,
                                 const float* __restrict__ dt_bias,
                                 const float* __restrict__ neg_exp_a, int64_t n, int64_t Hv,
                                 float* __restrict__ beta, float* __restrict__ g) {
  pdl_enter();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * Hv) return;
  const int64_t h = i % Hv;
  beta[i] = 1.0f / (1.0f + expf(-b[i]));
  const float x = a[i] + dt_bias[h];
  g[i] = neg_exp_a[h] * (x > 20.0f ? x : log1pf(expf(x)));
}

__global__ void gather_rows_kernel(const float* __restrict__ x, const int32_t* __restrict__ idx,
                                   int64_t dim, float* __restrict__ y) {
  pdl_enter();
  const float* src = x + static_cast<int64_t>(idx[blockIdx.x]) * dim;
  float* dst = y + blockIdx.x * dim;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) dst[d] = src[d];
}

// Segment blockIdx.y, strided over the blocks of x: float4 when both ends allow it.
__global__ void copy_segments_kernel(const uint64_t* __restrict__ segs) {
  pdl_enter();
  float* dst = reinterpret_cast<float*>(segs[3 * blockIdx.y]);
  const float* src = reinterpret_cast<const float*>(segs[3 * blockIdx.y + 1]);
  const int64_t n = static_cast<int64_t>(segs[3 * blockIdx.y + 2]);
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0 &&
      n % 4 == 0) {
    float4* d4 = reinterpret_cast<float4*>(dst);
    const float4* s4 = reinterpret_cast<const float4*>(src);
    for (int64_t i = start; i < n / 4; i += stride) d4[i] = s4[i];
  } else {
    for (int64_t i = start; i < n; i += stride) dst[i] = src[i];
  }
}

// Row blockIdx.x between a contiguous [n, dim] block and per-row pointers (null: skipped).
__global__ void store_rows_kernel(const float* __restrict__ x, int64_t dim, float* const* dst) {
  pdl_enter();
  float* d = dst[blockIdx.x];
  if (d == nullptr) return;
  const float* src = x + blockIdx.x * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) d[i] = src[i];
}
__global__ void load_rows_kernel(const float* const* src, int64_t dim, float* __restrict__ y) {
  pdl_enter();
  const float* s = src[blockIdx.x];
  float* d = y + blockIdx.x * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) d[i] = s[i];
}

__global__ void scatter_add_scaled_kernel(const float* __restrict__ x,
                                          const int32_t* __restrict__ idx,
                                          const float* __restrict__ w, int64_t dim,
                                          float* __restrict__ y) {
  pdl_enter();
  float* dst = y + static_cast<int64_t>(idx[blockIdx.x]) * dim;
  const float* src = x + blockIdx.x * dim;
  const float wi = w[blockIdx.x];
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) dst[d] = fmaf(src[d], wi, dst[d]);
}

__global__ void add_gated_kernel(const float* __restrict__ s, const float* __restrict__ gate,
                                 int64_t dim, float* __restrict__ y) {
  pdl_enter();
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
  launch(rmsnorm_zc_kernel, static_cast<unsigned>(n), kNormThreads, 0, stream, x, w, dim, eps, y);
  TF_CUDA_CHECK(cudaGetLastError());
}

// A warp per row, blocks of 8 warps; shared memory: the row, then `parts` partial sums.
template <class Row>
void launch_matmul_norm(const void* w, int64_t rows, int64_t cols, const Row& in, int64_t parts,
                        float* y, cudaStream_t stream) {
  if (rows == 0) return;
  launch(matmul_norm_kernel<Row>,
         static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock),
         kWarpsPerBlock * kWarp, static_cast<size_t>(cols + parts) * sizeof(float), stream,
         static_cast<const __nv_bfloat16*>(w), rows, cols, in, y);
  TF_CUDA_CHECK(cudaGetLastError());
}

void matmul_add_rmsnorm(const void* w, int64_t rows, int64_t cols, const float* x, const float* r,
                        const float* norm, float eps, float* x_out, float* xn, float* y,
                        cudaStream_t stream) {
  TF_CUDA_REQUIRE(cols % 8 == 0 && cols <= kNormRowMaxCols,
                  "matmul_add_rmsnorm: cols must be a multiple of 8, at most 8192");
  launch_matmul_norm(w, rows, cols, AddNormRow{x, r, norm, eps, x_out, xn}, AddNormRow::kParts, y,
                     stream);
}

void matmul(DType wtype, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n,
            float* y, cudaStream_t stream) {
  TF_CUDA_REQUIRE(cols % 8 == 0, "matmul: cols must be a multiple of 8");
  TF_CUDA_REQUIRE(n <= 65535 * int64_t{kTokTile}, "matmul: too many rows in one launch");
  if (n == 0 || rows == 0) return;
  // One token of bf16 weights: 4 chunks of 4 rows per warp in flight; tiles of tokens and f32
  // weights: 2 (registers). bf16 steps of 2-8 tokens (verify steps, small batches) run the
  // one-token blocks side by side instead of tiles of 8 tokens per warp, which took 2-2.5x the
  // time of one token on small matrices (H200, 2026-12-04, tools/device/ab_bench.sh: tiny-next
  // batch 8 +54%, the 80B-A3B shape's batch 8 +12%, verify steps of 2-5 tokens 6-22% cheaper;
  // batch 1, 32 and prefill unchanged). None of it changes a row's arithmetic.
  const bool one = n == 1;
  // One token of bf16 weights: a warp per row (kOneRows), four times the warps of kMatRows rows
  // each, so that small matrices still keep enough loads in flight (H100, 2026-12-05, the 80B-A3B
  // shape's batch-1 decode 443-446 -> 458-459 tok/s, out_proj 8.53 -> 8.31 us, q_proj 13.2 ->
  // 12.4 us; steps of 2-16 tokens keep four rows per warp, which share each x chunk: one row per
  // warp made batch 8 12% slower).
  const int rpw = one && wtype == DType::kBF16 ? kOneRows : kMatRows;
  // Warps per block: 8, or fewer when that leaves under ~2 blocks per SM of an H200 (132 SMs)
  // for a one-tile product.
  const int64_t warps_needed = (rows + rpw - 1) / rpw;
  const int64_t wpb =
      n > kTokTile ? kWarpsPerBlock : std::clamp<int64_t>(warps_needed / 264, 1, kWarpsPerBlock);
  const int64_t per_block = wpb * rpw;
  const int64_t groups = (rows + per_block - 1) / per_block;
  const dim3 grid(static_cast<unsigned>(groups),
                  static_cast<unsigned>((n + kTokTile - 1) / kTokTile));
  const unsigned threads = static_cast<unsigned>(wpb * kWarp);
  switch (wtype) {
    case DType::kBF16: {
      using B = __nv_bfloat16;
      const auto* wb = static_cast<const B*>(w);
      if (one)
        launch(matmul_kernel<B, 1, 4, false, kOneRows>, grid, threads, 0, stream, wb, rows, cols, x,
               n, y);
      else if (n <= kTokBlocks && groups <= 65535)
        launch(matmul_kernel<B, 1, 4, true>, dim3(static_cast<unsigned>(n), grid.x), threads, 0,
               stream, wb, rows, cols, x, n, y);
      else if (groups <= 65535)  // the tiles of a row group side by side: its weights via L2
        launch(matmul_kernel<B, kTokTile, 2, true>, dim3(grid.y, grid.x), threads, 0, stream, wb,
               rows, cols, x, n, y);
      else
        launch(matmul_kernel<B, kTokTile, 2>, grid, threads, 0, stream, wb, rows, cols, x, n, y);
      break;
    }
    case DType::kF32: {
      const auto* wf = static_cast<const float*>(w);
      if (one)
        launch(matmul_kernel<float, 1, 2>, grid, threads, 0, stream, wf, rows, cols, x, n, y);
      else
        launch(matmul_kernel<float, kTokTile, 2>, grid, threads, 0, stream, wf, rows, cols, x, n,
               y);
      break;
    }
    default:
      TF_CUDA_REQUIRE(false, "matmul: weight dtype not supported on CUDA (bf16, f32)");
  }
  TF_CUDA_CHECK(cudaGetLastError());
}

void expert_gate_up(DType wtype, const void* wg, const void* wu, int64_t I, int64_t H,
                    const int32_t* experts, int64_t k, const float* x, int64_t n, float* h,
                    cudaStream_t stream, const void* shared_g, const void* shared_u) {
  TF_CUDA_REQUIRE(H % 8 == 0, "expert_gate_up: H must be a multiple of 8");
  if (!experts) k = 1, shared_g = shared_u = nullptr;
  const int64_t kk = shared_g ? k + 1 : k;
  TF_CUDA_REQUIRE(n * kk <= 65535, "expert_gate_up: too many slots in one launch");
  if (n == 0 || I == 0) return;
  const int64_t per_block = kWarpsPerBlock * kGroupRows;
  const dim3 grid(static_cast<unsigned>((I + per_block - 1) / per_block),
                  static_cast<unsigned>(n * kk));
  const unsigned threads = kWarpsPerBlock * kWarp;
  if (wtype == DType::kBF16) {
    using B = __nv_bfloat16;
    launch(expert_gate_up_kernel<B>, grid, threads, 0, stream, static_cast<const B*>(wg),
           static_cast<const B*>(wu), static_cast<const B*>(shared_g),
           static_cast<const B*>(shared_u), I, H, experts, k, x, h);
  } else if (wtype == DType::kF32) {
    launch(expert_gate_up_kernel<float>, grid, threads, 0, stream, static_cast<const float*>(wg),
           static_cast<const float*>(wu), static_cast<const float*>(shared_g),
           static_cast<const float*>(shared_u), I, H, experts, k, x, h);
  } else {
    TF_CUDA_REQUIRE(false, "expert_gate_up: bf16 or f32 weights");
  }
  TF_CUDA_CHECK(cudaGetLastError());
}

void expert_down(DType wtype, const void* wd, int64_t H, int64_t I, const int32_t* experts,
                 int64_t k, const float* h, int64_t n, float* o, cudaStream_t stream,
                 const void* shared_d, bool follows_gate_up) {
  TF_CUDA_REQUIRE(I % 8 == 0, "expert_down: I must be a multiple of 8");
  if (!experts) k = 1, shared_d = nullptr;
  const int64_t kk = shared_d ? k + 1 : k;
  TF_CUDA_REQUIRE(n * kk <= 65535, "expert_down: too many slots in one launch");
  if (n == 0 || H == 0) return;
  const int64_t per_block = kWarpsPerBlock * kMatRows;
  const dim3 grid(static_cast<unsigned>((H + per_block - 1) / per_block),
                  static_cast<unsigned>(n * kk));
  const unsigned threads = kWarpsPerBlock * kWarp;
  if (wtype == DType::kBF16)
    launch(expert_down_kernel<__nv_bfloat16>, grid, threads, 0, stream,
           static_cast<const __nv_bfloat16*>(wd), static_cast<const __nv_bfloat16*>(shared_d), H, I,
           experts, k, h, o, follows_gate_up);
  else if (wtype == DType::kF32)
    launch(expert_down_kernel<float>, grid, threads, 0, stream, static_cast<const float*>(wd),
           static_cast<const float*>(shared_d), H, I, experts, k, h, o, follows_gate_up);
  else
    TF_CUDA_REQUIRE(false, "expert_down: bf16 or f32 weights");
  TF_CUDA_CHECK(cudaGetLastError());
}

int64_t moe_max_tiles(int64_t n, int64_t k, int64_t E) {
  return (n * k + kTokTile - 1) / kTokTile + std::min(E, n * k);
}

void moe_group(const int32_t* experts, int64_t n, int64_t k, int64_t E, int32_t* sorted,
               void* tiles, int32_t* n_tiles, cudaStream_t stream) {
  if (n == 0) return;
  launch(moe_group_kernel, 1, kGroupThreads, 0, stream, experts, n * k, E, sorted,
         static_cast<int4*>(tiles), n_tiles);
  TF_CUDA_CHECK(cudaGetLastError());
}

void grouped_experts(DType wtype, const void* wg, const void* wu, const void* wd, int64_t I,
                     int64_t H, int64_t k, int64_t E, int64_t n, const int32_t* sorted,
                     const void* tiles, const int32_t* n_tiles, const float* x, float* h, float* o,
                     cudaStream_t stream) {
  TF_CUDA_REQUIRE(H % 8 == 0 && I % 8 == 0, "grouped_experts: H and I multiples of 8");
  const int64_t mt = moe_max_tiles(n, k, E);
  TF_CUDA_REQUIRE(mt <= 65535, "grouped_experts: too many tiles in one launch");
  if (n == 0) return;
  const unsigned threads = kWarpsPerBlock * kWarp;
  const int64_t up_rows = kWarpsPerBlock * kGroupRows, down_rows = kWarpsPerBlock * kMatRows;
  const dim3 g1(static_cast<unsigned>((I + up_rows - 1) / up_rows), static_cast<unsigned>(mt));
  const dim3 g2(static_cast<unsigned>((H + down_rows - 1) / down_rows), static_cast<unsigned>(mt));
  const int4* tl = static_cast<const int4*>(tiles);
  if (wtype == DType::kBF16) {
    using B = __nv_bfloat16;
    launch(grouped_gate_up_kernel<B>, g1, threads, 0, stream, static_cast<const B*>(wg),
           static_cast<const B*>(wu), I, H, k, sorted, tl, n_tiles, x, h);
    launch(grouped_down_kernel<B>, g2, threads, 0, stream, static_cast<const B*>(wd), H, I, sorted,
           tl, n_tiles, h, o);
  } else if (wtype == DType::kF32) {
    launch(grouped_gate_up_kernel<float>, g1, threads, 0, stream, static_cast<const float*>(wg),
           static_cast<const float*>(wu), I, H, k, sorted, tl, n_tiles, x, h);
    launch(grouped_down_kernel<float>, g2, threads, 0, stream, static_cast<const float*>(wd), H, I,
           sorted, tl, n_tiles, h, o);
  } else {
    TF_CUDA_REQUIRE(false, "grouped_experts: bf16 or f32 weights");
  }
  TF_CUDA_CHECK(cudaGetLastError());
}

void moe_combine(const float* o, const int32_t* experts, const float* w, int64_t n, int64_t k,
                 int64_t H, const float* shared, bool shared_in_o, const float* gate,
                 int64_t gate_stride, float* x, const float* norm, float eps, float* xn,
                 cudaStream_t stream, const float* x_in, float* const* rows_out,
                 bool routing_settled) {
  TF_CUDA_REQUIRE(k <= 64, "moe_combine: at most 64 experts per token");
  if (n == 0) return;
  launch(moe_combine_kernel, static_cast<unsigned>(n * kCombineSplit), kCombineThreads, 0, stream,
         o, experts, w, k, H, shared, shared_in_o, gate, gate_stride, x_in, x, norm, eps, xn,
         rows_out, routing_settled);
  TF_CUDA_CHECK(cudaGetLastError());
}

void attn_prep(const float* qkv, int64_t n, int64_t n_heads, int64_t n_kv, int64_t D,
               int64_t rotary_dim, const float* q_norm, const float* k_norm, float eps,
               const float* inv_freq, const int64_t* pos, float* q, float* gate, float* const* kc,
               float* const* vc, cudaStream_t stream) {
  TF_CUDA_REQUIRE(D <= 1024 && rotary_dim <= D, "attn_prep: head_dim above 1024");
  if (n == 0) return;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(n_heads + n_kv));
  launch(attn_prep_kernel, grid, kNormThreads, 0, stream, qkv, n_heads, n_kv, D, rotary_dim / 2,
         q_norm, k_norm, eps, inv_freq, pos, q, gate, kc, vc);
  TF_CUDA_CHECK(cudaGetLastError());
}

void l2norm_scale_qk(float* x, int64_t n_q, int64_t n_k, int64_t dim, float eps, float q_scale,
                     cudaStream_t stream) {
  if (n_q + n_k == 0) return;
  launch(l2norm_scale_kernel, static_cast<unsigned>(n_q + n_k), kNormThreads, 0, stream, x, dim,
         eps, q_scale, n_q, 1.0f);
  TF_CUDA_CHECK(cudaGetLastError());
}

void add_rmsnorm_zc(float* x, const float* r, const float* w, int64_t n, int64_t dim, float eps,
                    float* xn, cudaStream_t stream) {
  if (n == 0) return;
  launch(add_rmsnorm_zc_kernel, static_cast<unsigned>(n), kNormThreads, 0, stream, x, r, w, dim,
         eps, xn);
  TF_CUDA_CHECK(cudaGetLastError());
}

void kv_append(const float* k, const float* v, int64_t n, int64_t row, const int64_t* pos,
               float* const* kc, float* const* vc, cudaStream_t stream) {
  if (n == 0) return;
  launch(kv_append_kernel, static_cast<unsigned>(n), 256, 0, stream, k, v, row, pos, kc, vc);
  TF_CUDA_CHECK(cudaGetLastError());
}

void conv_silu_seqs(const float* xc, const int32_t* starts, float* const* state, float* const* hist,
                    const float* w, int64_t nseq, int64_t C, int64_t K, int64_t kd, float* q,
                    float* k, float* v, cudaStream_t stream) {
  TF_CUDA_REQUIRE(K >= 1 && K <= kMaxConv, "conv_silu_seqs: kernel width 1..8");
  if (nseq == 0) return;
  const dim3 grid(static_cast<unsigned>((C + 127) / 128), static_cast<unsigned>(nseq));
  launch(conv_silu_seqs_kernel, grid, 128, 0, stream, xc, starts, state, hist, w, C, K, kd, q, k,
         v);
  TF_CUDA_CHECK(cudaGetLastError());
}

void delta_rule_seqs(const float* q, const float* k, const float* v, const float* g,
                     const float* beta, const int32_t* starts, float* const* S,
                     float* const* S_hist, int64_t nseq, int64_t Hk, int64_t Hv, int64_t Dk,
                     int64_t Dv, float* out, cudaStream_t stream) {
  if (nseq == 0) return;
  TF_CUDA_REQUIRE(Dk % kDeltaWarps == 0 && Dk <= kDeltaWarps * kDeltaMaxRows,
                  "delta rule: Dk must be a multiple of 8, at most 128");
  const dim3 grid(static_cast<unsigned>(Hv * ((Dv + kWarp - 1) / kWarp)),
                  static_cast<unsigned>(nseq));
  launch(delta_rule_seqs_kernel, grid, kDeltaWarps * kWarp, 0, stream, q, k, v, g, beta, starts, S,
         S_hist, Hk, Hv, Dk, Dv, states_settled(stream), out);
  TF_CUDA_CHECK(cudaGetLastError());
}

void argmax_rows(const float* logits, int64_t n, int64_t V, int32_t* out, cudaStream_t stream,
                 float* prob, float* work) {
  if (n == 0) return;
  if (work == nullptr) {
    launch(argmax_rows_kernel, static_cast<unsigned>(n), 256, 0, stream, logits, V, out, prob);
  } else {
    const int64_t B = (V + kArgmaxChunk - 1) / kArgmaxChunk;
    launch(argmax_part_kernel, dim3(static_cast<unsigned>(B), static_cast<unsigned>(n)), 256, 0,
           stream, logits, V, prob != nullptr, work);
    launch(argmax_join_kernel, blocks_for(n, 128), 128, 0, stream, work, n, B, out, prob);
  }
  TF_CUDA_CHECK(cudaGetLastError());
}

int64_t argmax_work_floats(int64_t n, int64_t V) {
  return n * ((V + kArgmaxChunk - 1) / kArgmaxChunk) * 3;
}

void fill_uniform(DType dtype, void* p, int64_t n, uint64_t seed, float scale, float offset,
                  cudaStream_t stream) {
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65536));
  if (dtype == DType::kBF16)
    launch(fill_uniform_kernel<__nv_bfloat16>, blocks, 256, 0, stream,
           static_cast<__nv_bfloat16*>(p), n, seed, scale, offset);
  else if (dtype == DType::kF32)
    launch(fill_uniform_kernel<float>, blocks, 256, 0, stream, static_cast<float*>(p), n, seed,
           scale, offset);
  else
    TF_CUDA_REQUIRE(false, "fill_uniform: bf16 or f32");
  TF_CUDA_CHECK(cudaGetLastError());
}

void silu_mul(const float* g, const float* u, int64_t n, float* y, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned threads = 256;
  launch(silu_mul_kernel, blocks_for(n, threads), threads, 0, stream, g, u, n, y);
  TF_CUDA_CHECK(cudaGetLastError());
}

void rope_neox(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t rotary_dim,
               const float* inv_freq, const int64_t* pos, cudaStream_t stream) {
  if (T == 0) return;
  launch(rope_neox_kernel, static_cast<unsigned>(T), 128, 0, stream, x, n_heads, head_dim,
         rotary_dim / 2, inv_freq, pos);
  TF_CUDA_CHECK(cudaGetLastError());
}

void mtp_input(DType etype, const void* embed, const int32_t* ids, const float* hid,
               const float* w_embed, const float* w_hidden, int64_t n, int64_t dim, float eps,
               float* u, cudaStream_t stream) {
  if (n == 0) return;
  TF_CUDA_REQUIRE(etype == DType::kBF16 || etype == DType::kF32, "mtp_input: bf16 or f32");
  const dim3 grid(static_cast<unsigned>(n), 2);
  if (etype == DType::kBF16)
    launch(mtp_input_kernel<__nv_bfloat16>, grid, kNormThreads, 0, stream,
           static_cast<const __nv_bfloat16*>(embed), ids, hid, w_embed, w_hidden, dim, eps, u);
  else
    launch(mtp_input_kernel<float>, grid, kNormThreads, 0, stream, static_cast<const float*>(embed),
           ids, hid, w_embed, w_hidden, dim, eps, u);
  TF_CUDA_CHECK(cudaGetLastError());
}

void embed_rows(DType etype, const void* embed, int64_t dim, const int32_t* ids, int64_t n,
                float* y, cudaStream_t stream) {
  if (n == 0) return;
  TF_CUDA_REQUIRE(etype == DType::kBF16 || etype == DType::kF32, "embed_rows: bf16 or f32");
  if (etype == DType::kBF16)
    launch(embed_rows_kernel<__nv_bfloat16>, static_cast<unsigned>(n), 256, 0, stream,
           static_cast<const __nv_bfloat16*>(embed), dim, ids, y);
  else
    launch(embed_rows_kernel<float>, static_cast<unsigned>(n), 256, 0, stream,
           static_cast<const float*>(embed), dim, ids, y);
  TF_CUDA_CHECK(cudaGetLastError());
}

void rmsnorm_gated(const float* x, const float* z, const float* w, int64_t n, int64_t dim,
                   float eps, float* y, cudaStream_t stream) {
  if (n == 0) return;
  launch(rmsnorm_gated_kernel, static_cast<unsigned>(n), kNormThreads, 0, stream, x, z, w, dim, eps,
         y);
  TF_CUDA_CHECK(cudaGetLastError());
}

void l2norm_scale(float* x, int64_t n, int64_t dim, float eps, float scale, cudaStream_t stream) {
  if (n == 0) return;
  launch(l2norm_scale_kernel, static_cast<unsigned>(n), kNormThreads, 0, stream, x, dim, eps, scale,
         n, scale);
  TF_CUDA_CHECK(cudaGetLastError());
}

void causal_conv_silu(const float* in, const float* w, int64_t T, int64_t C, int64_t K, float* out,
                      cudaStream_t stream) {
  if (T * C == 0) return;
  launch(causal_conv_silu_kernel, blocks_for(T * C, 256), 256, 0, stream, in, w, T, C, K, out);
  TF_CUDA_CHECK(cudaGetLastError());
}

void delta_rule_recurrent(const float* q, const float* k, const float* v, const float* g,
                          const float* beta, int64_t T, int64_t Hk, int64_t Hv, int64_t Dk,
                          int64_t Dv, float* S, float* out, cudaStream_t stream) {
  if (T == 0) return;
  TF_CUDA_REQUIRE(Dk % kDeltaWarps == 0 && Dk <= kDeltaWarps * kDeltaMaxRows,
                  "delta rule: Dk must be a multiple of 8, at most 128");
  const unsigned blocks = static_cast<unsigned>(Hv * ((Dv + kWarp - 1) / kWarp));
  launch(delta_rule_recurrent_kernel, blocks, kDeltaWarps * kWarp, 0, stream, q, k, v, g, beta, T,
         Hk, Hv, Dk, Dv, S, out);
  TF_CUDA_CHECK(cudaGetLastError());
}

namespace {
// Steps of up to kAttnClusterRows rows: a cluster of kAttnSplits blocks per (t, head); longer ones
// (prompts): a block per (t, head). The same bits either way.
void launch_attention(const float* q, int64_t T, const int64_t* pos, const float* kc0,
                      const float* vc0, const float* const* kt, const float* const* vt,
                      int64_t n_heads, int64_t n_kv, int64_t D, float scale, const float* gate,
                      float* out, cudaStream_t stream) {
  if (T == 0) return;
  TF_CUDA_REQUIRE(D <= kAttnMaxD, "attention: head_dim above 512");
  if (T <= kAttnClusterRows)
    launch(attention_cluster_kernel, static_cast<unsigned>(T * n_heads * kAttnSplits), kAttnThreads,
           0, stream, q, pos, kc0, vc0, kt, vt, n_heads, n_kv, D, scale, gate, out);
  else
    launch(attention_rows_kernel, static_cast<unsigned>(T * n_heads), kAttnThreads, 0, stream, q,
           pos, kc0, vc0, kt, vt, n_heads, n_kv, D, scale, gate, out);
  TF_CUDA_CHECK(cudaGetLastError());
}
}  // namespace

void attention(const float* q, int64_t T, const int64_t* pos, const float* k_cache,
               const float* v_cache, int64_t n_heads, int64_t n_kv, int64_t D, float scale,
               float* out, cudaStream_t stream) {
  launch_attention(q, T, pos, k_cache, v_cache, nullptr, nullptr, n_heads, n_kv, D, scale, nullptr,
                   out, stream);
}

void attention_table(const float* q, int64_t T, const int64_t* pos, const float* const* kc,
                     const float* const* vc, int64_t n_heads, int64_t n_kv, int64_t D, float scale,
                     const float* gate, float* out, cudaStream_t stream) {
  launch_attention(q, T, pos, nullptr, nullptr, kc, vc, n_heads, n_kv, D, scale, gate, out, stream);
}

void route_topk(const float* logits, int64_t n, int64_t E, int64_t ld, int64_t k, bool renorm,
                int32_t* experts, float* weights, cudaStream_t stream, bool scan) {
  TF_CUDA_REQUIRE(k <= kRouteThreads && k <= E, "route_topk: k above the experts");
  if (n == 0) return;
  const bool ranks = !scan && E <= kRouteThreads && k <= kRouteWarps;
  launch(ranks ? route_rank_kernel : route_topk_kernel, static_cast<unsigned>(n), kRouteThreads, 0,
         stream, logits, E, ld, k, renorm, experts, weights);
  TF_CUDA_CHECK(cudaGetLastError());
}

void mul_sigmoid(float* x, const float* gate, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch(mul_sigmoid_kernel, blocks_for(n, 256), 256, 0, stream, x, gate, n);
  TF_CUDA_CHECK(cudaGetLastError());
}

void add(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch(add_kernel, blocks_for(n, 256), 256, 0, stream, y, x, n);
  TF_CUDA_CHECK(cudaGetLastError());
}

void split_qkvz(const float* P, const float* BA, int64_t n, int64_t Hk, int64_t Dk, int64_t r,
                int64_t Dv, float* xc, float* z, float* b, float* a, cudaStream_t stream) {
  if (n == 0) return;
  launch(split_qkvz_kernel, static_cast<unsigned>(n), 256, 0, stream, P, BA, Hk, Dk, r, Dv, xc, z,
         b, a);
  TF_CUDA_CHECK(cudaGetLastError());
}

void split_qkvz_gates(const float* PB, int64_t n, int64_t Hk, int64_t Dk, int64_t r, int64_t Dv,
                      const float* dt_bias, const float* neg_exp_a, float* xc, float* z,
                      float* beta, float* g, cudaStream_t stream) {
  if (n == 0) return;
  launch(split_qkvz_gates_kernel, dim3(static_cast<unsigned>(n), static_cast<unsigned>(Hk)), 256, 0,
         stream, PB, Hk, Dk, r, Dv, dt_bias, neg_exp_a, xc, z, beta, g);
  TF_CUDA_CHECK(cudaGetLastError());
}

void gdn_prep(const float* PB, const int32_t* starts, float* const* state, float* const* hist,
              const float* conv_w, int64_t nseq, int64_t Hk, int64_t Dk, int64_t r, int64_t Dv,
              int64_t K, const float* dt_bias, const float* neg_exp_a, float q_scale, float* q,
              float* k, float* v, float* z, float* beta, float* g, cudaStream_t stream) {
  TF_CUDA_REQUIRE(K <= kMaxConv, "gdn_prep: conv kernel above 8");
  static_assert(kGdnPrepMaxDim == kPrepThreads);
  TF_CUDA_REQUIRE(Dk <= kPrepThreads && Dv <= kPrepThreads, "gdn_prep: head dims above 128");
  if (nseq == 0) return;
  const dim3 grid(static_cast<unsigned>(2 * Hk + Hk * r), static_cast<unsigned>(nseq));
  launch(gdn_prep_kernel, grid, kPrepThreads, 0, stream, PB, starts, state, hist, conv_w, Hk, Dk, r,
         Dv, K, dt_bias, neg_exp_a, q_scale, q, k, v, z, beta, g, states_settled(stream));
  TF_CUDA_CHECK(cudaGetLastError());
}

void gdn_gates(const float* b, const float* a, const float* dt_bias, const float* neg_exp_a,
               int64_t n, int64_t Hv, float* beta, float* g, cudaStream_t stream) {
  if (n == 0) return;
  launch(gdn_gates_kernel, blocks_for(n * Hv, 256), 256, 0, stream, b, a, dt_bias, neg_exp_a, n, Hv,
         beta, g);
  TF_CUDA_CHECK(cudaGetLastError());
}

void copy_segments(const uint64_t* segs, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  TF_CUDA_REQUIRE(n <= 65535, "copy_segments: too many segments in one launch");
  launch(copy_segments_kernel, dim3(32, static_cast<unsigned>(n)), 256, 0, stream, segs);
  TF_CUDA_CHECK(cudaGetLastError());
}

void store_rows(const float* x, int64_t n, int64_t dim, float* const* dst, cudaStream_t stream) {
  if (n == 0) return;
  launch(store_rows_kernel, static_cast<unsigned>(n), 256, 0, stream, x, dim, dst);
  TF_CUDA_CHECK(cudaGetLastError());
}

void load_rows(const float* const* src, int64_t n, int64_t dim, float* y, cudaStream_t stream) {
  if (n == 0) return;
  launch(load_rows_kernel, static_cast<unsigned>(n), 256, 0, stream, src, dim, y);
  TF_CUDA_CHECK(cudaGetLastError());
}

void gather_rows(const float* x, const int32_t* idx, int64_t n, int64_t dim, float* y,
                 cudaStream_t stream) {
  if (n == 0) return;
  launch(gather_rows_kernel, static_cast<unsigned>(n), 256, 0, stream, x, idx, dim, y);
  TF_CUDA_CHECK(cudaGetLastError());
}

void scatter_add_scaled(const float* x, const int32_t* idx, const float* w, int64_t n, int64_t dim,
                        float* y, cudaStream_t stream) {
  if (n == 0) return;
  launch(scatter_add_scaled_kernel, static_cast<unsigned>(n), 256, 0, stream, x, idx, w, dim, y);
  TF_CUDA_CHECK(cudaGetLastError());
}

void add_gated(const float* s, const float* gate, int64_t n, int64_t dim, float* y,
               cudaStream_t stream) {
  if (n == 0) return;
  launch(add_gated_kernel, static_cast<unsigned>(n), 256, 0, stream, s, gate, dim, y);
  TF_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tf::cuda
