// Row-local and sequence-mixing ops of the Qwen3-Next forward pass on the CPU, all in fp32.
// Formulas: ../shared/design/qwen3-next.md §3 (norms, attention, MoE) and §5 (chunked delta rule).
// Every op computes each output row/head with arithmetic that does not depend on the other rows of
// the batch or on the thread count (threads split heads or rows, never a reduction).
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace tf::cpu {

// Zero-centred RMSNorm over `dim`: y = x * rsqrt(mean(x^2) + eps) * (1 + w). x, y: [n, dim]; in
// place ok.
void rmsnorm_zc(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* y);

// Gated RMSNorm of Gated DeltaNet, per head over dim: y = (x * rsqrt(mean(x^2)+eps)) * w * silu(z).
// Plain weight (not 1 + w). x, z, y: [n, dim].
void rmsnorm_gated(const float* x, const float* z, const float* w, int64_t n, int64_t dim,
                   float eps, float* y);

// In-place L2 normalisation of n vectors of `dim`: x * rsqrt(sum(x^2) + eps) * scale.
void l2norm_scale(float* x, int64_t n, int64_t dim, float eps, float scale);

inline float silu(float x) {
  return x / (1.0f + __builtin_expf(-x));
}
inline float sigmoid(float x) {
  return 1.0f / (1.0f + __builtin_expf(-x));
}
// PyTorch's softplus with beta = 1, threshold = 20.
inline float softplus(float x) {
  return x > 20.0f ? x : __builtin_log1pf(__builtin_expf(x));
}

// The argmax of x[0, n), n >= 1: the lowest index of the largest value, NaN never chosen (0 when
// x[0] is NaN): the result of the plain scan `if (x[i] > x[best]) best = i`, in one pass of 16
// independent lanes (value and first index per lane, then the lanes joined), vectorised with or
// without AVX-512; n < 2^31. Greedy sampling's per-token cost on the host: `kernels_bench
// --benchmark_filter=Argmax` (docs/PERFORMANCE.md).
int64_t argmax(const float* x, int64_t n);

// The argmax of x[0, n) (lowest index on ties) and its softmax probability
// 1 / sum_i e^(x_i - x_max) (sum in the canonical 16-lane order): a draft head's confidence.
int64_t argmax_prob(const float* x, int64_t n, float* prob);

// Causal depthwise conv over T new rows, then SiLU: out[t, c] = silu(sum_j w[c, j] * in[t + j, c]),
// j = 0..K-1 in order (one fma each, from 0). in: [(K - 1) + T, C] (the K-1 previous inputs, oldest
// first, then the T new ones); w: [C, K] (tap K-1 multiplies the current row); out: [T, C].
void causal_conv_silu(const float* in, const float* w, int64_t T, int64_t C, int64_t K, float* out);

// NeoX rotary embedding on the first rotary_dim dims of each of n_heads heads of one token:
// pairs (i, i + rotary_dim/2). inv_freq: [rotary_dim/2]. x: [n_heads, head_dim], in place.
void rope_neox(float* x, int64_t n_heads, int64_t head_dim, int64_t rotary_dim,
               const float* inv_freq, int64_t pos);

// Causal GQA softmax attention for T query tokens of one sequence.
//   q: [T, n_heads, D] (post norm + RoPE); k_cache, v_cache: [L, n_kv, D] with L >= pos[T-1] + 1;
//   query t attends to cache rows 0..pos[t]. out: [T, n_heads, D]. scale = D^-0.5.
void attention(const float* q, int64_t T, const int64_t* pos, const float* k_cache,
               const float* v_cache, int64_t n_heads, int64_t n_kv, int64_t D, float scale,
               float* out, ThreadPool* pool);

// Gated delta rule over T tokens of one sequence, per v-head h (q/k head = h / (Hv / Hk)).
//   q, k: [T, Hk, Dk] (q already L2-normed and scaled, k L2-normed); v: [T, Hv, Dv];
//   g (log decay <= 0), beta: [T, Hv]; S: [Hv, Dk, Dv] fp32, in/out; out: [T, Hv, Dv].
//   S_hist (optional, recurrent form only): [T, Hv, Dk, Dv], receives S after each token, so a
//   verify pass can roll back to any of its positions.
struct DeltaArgs {
  const float* q;
  const float* k;
  const float* v;
  const float* g;
  const float* beta;
  int64_t T, Hk, Hv, Dk, Dv;
  float* S;
  float* out;
  float* S_hist = nullptr;
};
// Token recurrence (decode / verify): S = e^g S; d = beta (v - S^T k); S += k d^T; o = S^T q.
// Each token's arithmetic is the same whatever T is: T tokens in one call == T one-token calls.
void delta_rule_recurrent(const DeltaArgs& a, ThreadPool* pool);
// Chunked form (prefill), equal to the recurrence in exact arithmetic. Chunk boundaries fall at
// absolute positions that are multiples of `chunk`: the first token of this call is at absolute
// position `pos0`, so a prompt fed in pieces split at multiples of `chunk` computes exactly what
// one call over the whole prompt computes.
void delta_rule_chunked(const DeltaArgs& a, int64_t pos0, int64_t chunk, ThreadPool* pool);

}  // namespace tf::cpu
