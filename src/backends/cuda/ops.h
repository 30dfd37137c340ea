// Row-local ops and matrix products of the Qwen3-Next forward pass on CUDA, fp32 activations,
// bf16 or fp32 weights, fp32 accumulation. Every pointer is device memory; every call is
// enqueued on `stream` and returns at once.
//
// Determinism contract (architecture.md): each output element is computed by one fixed sequence
// of operations, the same whatever the number of rows n, the row it is in, or the launch shape
// chosen for n, so a token's result never depends on the other tokens of the batch. Reductions
// use a fixed per-lane order and a fixed shuffle tree; no atomics, no split-K that varies with n.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"

namespace tf::cuda {

// Zero-centred RMSNorm over `dim`: y = x * rsqrt(mean(x^2) + eps) * (1 + w). x, y: [n, dim]
// (in place ok); w: [dim] fp32.
void rmsnorm_zc(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* y,
                cudaStream_t stream);

// y[t, r] = sum_k w[r, k] * x[t, k]: w [rows, cols] row-major in `wtype` (bf16 or f32), x [n, cols]
// fp32, y [n, rows] fp32. cols must be a multiple of 8. One warp per output element: lane l sums
// k = 8 l + 256 j + i (i < 8) in order of j then i, then a xor-shuffle tree over the 32 lanes.
void matmul(DType wtype, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n,
            float* y, cudaStream_t stream);

// y = silu(g) * u, elementwise over n values (the SwiGLU of the MLPs and experts).
void silu_mul(const float* g, const float* u, int64_t n, float* y, cudaStream_t stream);

// NeoX rotary embedding, in place, on the first rotary_dim dims of each head: x [T, n_heads,
// head_dim], pos [T] (device), inv_freq [rotary_dim / 2] (device).
void rope_neox(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t rotary_dim,
               const float* inv_freq, const int64_t* pos, cudaStream_t stream);

// y[t] = embed[ids[t]] as fp32: embed [vocab, dim] in `etype`, ids [n] (device), y [n, dim].
void embed_rows(DType etype, const void* embed, int64_t dim, const int32_t* ids, int64_t n,
                float* y, cudaStream_t stream);

// Gated RMSNorm of Gated DeltaNet per row of `dim`: y = x * rsqrt(mean(x^2) + eps) * w * silu(z).
void rmsnorm_gated(const float* x, const float* z, const float* w, int64_t n, int64_t dim,
                   float eps, float* y, cudaStream_t stream);

// In place: x = x * rsqrt(sum(x^2) + eps) * scale for n rows of `dim`.
void l2norm_scale(float* x, int64_t n, int64_t dim, float eps, float scale, cudaStream_t stream);

// Causal depthwise conv + SiLU: out[t, c] = silu(sum_j w[c, j] * in[t + j, c]), j ascending.
// in: [(K - 1) + T, C]; w: [C, K]; out: [T, C].
void causal_conv_silu(const float* in, const float* w, int64_t T, int64_t C, int64_t K, float* out,
                      cudaStream_t stream);

// The gated delta rule, token by token, for T tokens of one sequence (decode, verify, and for now
// prefill too: the recurrence is exact and split-invariant). Shapes as cpu::DeltaArgs: q, k
// [T, Hk, Dk] (normed); v [T, Hv, Dv]; g, beta [T, Hv]; S [Hv, Dk, Dv] in/out; out [T, Hv, Dv].
// One block per v-head, one thread per value column: the column's sums run over i ascending.
void delta_rule_recurrent(const float* q, const float* k, const float* v, const float* g,
                          const float* beta, int64_t T, int64_t Hk, int64_t Hv, int64_t Dk,
                          int64_t Dv, float* S, float* out, cudaStream_t stream);

// Causal GQA attention of T queries of one sequence over its cache, as cpu::attention: q
// [T, n_heads, D]; k_cache, v_cache [L, n_kv, D]; query t sees rows 0..pos[t] (pos on device).
// One block per (t, head); keys in tiles of 128 with a running max (online softmax), each tile's
// keys accumulated in ascending order.
void attention(const float* q, int64_t T, const int64_t* pos, const float* k_cache,
               const float* v_cache, int64_t n_heads, int64_t n_kv, int64_t D, float scale,
               float* out, cudaStream_t stream);

// MoE routing per token: softmax over E logits (fp32), the top k (ties to the lower index), their
// weights renormalised over the k when `renorm`. logits [n, E]; experts, weights [n, k].
void route_topk(const float* logits, int64_t n, int64_t E, int64_t k, bool renorm, int32_t* experts,
                float* weights, cudaStream_t stream);

// Elementwise: x *= sigmoid(gate) over n values.
void mul_sigmoid(float* x, const float* gate, int64_t n, cudaStream_t stream);
// Elementwise: y += x over n values.
void add(float* y, const float* x, int64_t n, cudaStream_t stream);

// Gated DeltaNet input split, as the CPU model does it: P [n, Hk, 2 Dk + 2 r Dv] (per k-head
// [q Dk | k Dk | v r Dv | z r Dv]) and BA [n, Hk, 2 r] (per k-head [b r | a r]) into the conv
// channels xc [n, 2 Hk Dk + Hv Dv] ([q | k | v]), z [n, Hv, Dv], b, a [n, Hv].
void split_qkvz(const float* P, const float* BA, int64_t n, int64_t Hk, int64_t Dk, int64_t r,
                int64_t Dv, float* xc, float* z, float* b, float* a, cudaStream_t stream);

// Gated DeltaNet gates over n tokens: beta = sigmoid(b), g = neg_exp_a * softplus(a + dt_bias)
// (PyTorch's softplus, threshold 20). b, a, beta, g: [n, Hv]; dt_bias, neg_exp_a: [Hv].
void gdn_gates(const float* b, const float* a, const float* dt_bias, const float* neg_exp_a,
               int64_t n, int64_t Hv, float* beta, float* g, cudaStream_t stream);

// y[i] = x[idx[i]] for n rows of `dim` (idx on device).
void gather_rows(const float* x, const int32_t* idx, int64_t n, int64_t dim, float* y,
                 cudaStream_t stream);
// y[idx[i]] += w[i] * x[i] for n rows of `dim`; idx distinct within one call.
void scatter_add_scaled(const float* x, const int32_t* idx, const float* w, int64_t n, int64_t dim,
                        float* y, cudaStream_t stream);
// y[t] += sigmoid(gate[t]) * s[t] for n rows of `dim` (gate [n]).
void add_gated(const float* s, const float* gate, int64_t n, int64_t dim, float* y,
               cudaStream_t stream);

}  // namespace tf::cuda
