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
// fp32, y [n, rows] fp32. cols must be a multiple of 8. One warp per 4 weight rows and tile of 8
// tokens (the rows' 16-byte weight loads are shared by the tile's tokens, a token's x chunk by the
// rows), one warp per row for a single token of bf16 weights; for each (row, token), lane l sums
// k = 8 l + 256 j + i (i < 8) in order of j then i, then a xor-shuffle tree over the 32 lanes.
// Tiles and rows per warp only decide which loads are shared, never a token's arithmetic.
// Each warp's first weight loads are issued before the wait on the kernel before (programmatic
// launch): w must not be written by a kernel still running on the stream (weights never are).
void matmul(DType wtype, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n,
            float* y, cudaStream_t stream);

// One-token products of bf16 weights whose input is a norm of the kernel before's output, in one
// launch: every block forms the normed row in shared memory with the norm kernel's bits, then the
// rows' products with matmul's bits. cols a multiple of 8, at most kNormRowMaxCols (with the
// partial sums: 32 KiB of shared memory).
inline constexpr int64_t kNormRowMaxCols = 8192;
// x_out = x + r, xn = rmsnorm_zc(x_out) (weight norm, eps: add_rmsnorm_zc's bits), y = w xn. Every
// block stores its slice of x_out and xn. x, r, x_out, xn [cols] (x_out must not be x), y [rows].
void matmul_add_rmsnorm(const void* w, int64_t rows, int64_t cols, const float* x, const float* r,
                        const float* norm, float eps, float* x_out, float* xn, float* y,
                        cudaStream_t stream);

// y = silu(g) * u, elementwise over n values (the SwiGLU of the MLPs and experts).
void silu_mul(const float* g, const float* u, int64_t n, float* y, cudaStream_t stream);

// NeoX rotary embedding, in place, on the first rotary_dim dims of each head: x [T, n_heads,
// head_dim], pos [T] (device), inv_freq [rotary_dim / 2] (device).
void rope_neox(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t rotary_dim,
               const float* inv_freq, const int64_t* pos, cudaStream_t stream);

// y[t] = embed[ids[t]] as fp32: embed [vocab, dim] in `etype`, ids [n] (device), y [n, dim].
void embed_rows(DType etype, const void* embed, int64_t dim, const int32_t* ids, int64_t n,
                float* y, cudaStream_t stream);

// The MTP head's fc input (qwen3-next.md §6): u[t] = [rmsnorm_zc(embed[ids[t]], w_embed) |
// rmsnorm_zc(hid[t], w_hidden)], u [n, 2 dim], hid [n, dim]: the same bits as embed_rows and
// rmsnorm_zc into the two halves, in one launch.
void mtp_input(DType etype, const void* embed, const int32_t* ids, const float* hid,
               const float* w_embed, const float* w_hidden, int64_t n, int64_t dim, float eps,
               float* u, cudaStream_t stream);

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
// Block (v-head, 32 value columns) of 8 warps, the state in registers across the tokens; warp w
// sums rows w Dk/8 .. (w+1) Dk/8 in ascending order, then the eight partials in warp order.
// Dk a multiple of 8, at most 128.
void delta_rule_recurrent(const float* q, const float* k, const float* v, const float* g,
                          const float* beta, int64_t T, int64_t Hk, int64_t Hv, int64_t Dk,
                          int64_t Dv, float* S, float* out, cudaStream_t stream);

// Causal GQA attention of T queries of one sequence over its cache, as cpu::attention: q
// [T, n_heads, D]; k_cache, v_cache [L, n_kv, D]; query t sees rows 0..pos[t] (pos on device).
// The keys in 8 contiguous chunks (ceil(L / 8) each; the split depends on L only, never on the
// batch), each in tiles of 128 keys with a running max (online softmax), the 8 partials joined in
// chunk order. Steps of up to 64 rows: a cluster of 8 blocks per (t, head), one per chunk,
// joining through distributed shared memory; longer ones: a block per (t, head) running the
// chunks in turn (the same bits). A score is a warp's dot: lane l sums dims l + 32 c in order,
// then the xor tree. D <= 512.
void attention(const float* q, int64_t T, const int64_t* pos, const float* k_cache,
               const float* v_cache, int64_t n_heads, int64_t n_kv, int64_t D, float scale,
               float* out, cudaStream_t stream);

// MoE routing per token: softmax over E logits (fp32), the top k (ties to the lower index), their
// weights renormalised over the k when `renorm`. logits [n, ld] (the first E of each row);
// experts, weights [n, k].
// One block of 512 threads per token. For E <= 512 and k <= 16 the picks are ranked among the
// entries at or above the k-th largest of the 16 warps' maxima (three barriers); otherwise, or
// with `scan`, pick s is the largest (logit, lower index) below pick s-1, found by warp
// reductions and a join of the warps' results (thread i: e = i + 512 m; a barrier per pick).
// Both give the same bits. k <= E, k <= 512.
void route_topk(const float* logits, int64_t n, int64_t E, int64_t ld, int64_t k, bool renorm,
                int32_t* experts, float* weights, cudaStream_t stream, bool scan = false);

// ---- MoE experts read from device memory (no host round trip; capturable in a CUDA graph) ----
// Experts are packed: wg, wu [E, I, H] and wd [E, H, I] in `wtype` (bf16 or f32).
//
// Gate and up with SiLU*mul for each token t and slot j < k, expert e = experts[t k + j]
// (experts == nullptr: e = 0 and k = 1, a dense MLP or the shared expert):
//   h[t, j, i] = silu(wg[e, i] . x[t]) * (wu[e, i] . x[t]), x [n, H], h [n, k, I];
// each dot in matmul's order, so h equals matmul + silu_mul bit for bit.
// With shared_g / shared_u ([I, H], the shared expert, of width I too): each token gets a slot
// k after its k routed ones for the shared expert, h [n, k + 1, I].
void expert_gate_up(DType wtype, const void* wg, const void* wu, int64_t I, int64_t H,
                    const int32_t* experts, int64_t k, const float* x, int64_t n, float* h,
                    cudaStream_t stream, const void* shared_g = nullptr,
                    const void* shared_u = nullptr);
// Down: o[t, j] = wd[e] h[t, j] for each token and slot; h [n, k, I], o [n, k, H].
// With shared_d ([H, I]): slot k of each token is the shared expert's, h [n, k + 1, I] and o
// [n, k + 1, H].
// follows_gate_up: this launch comes right after expert_gate_up on the same stream, and
// `experts` was written before that launch. expert_gate_up lets the next kernel start only once
// every kernel before it has completed, so the ids can be read, and the experts' first weights
// asked for, while gate+up still runs.
void expert_down(DType wtype, const void* wd, int64_t H, int64_t I, const int32_t* experts,
                 int64_t k, const float* h, int64_t n, float* o, cudaStream_t stream,
                 const void* shared_d = nullptr, bool follows_gate_up = false);
// Grouped experts for many tokens: each expert's weights read once per tile of up to 8 of its
// slots (instead of once per slot). moe_group sorts the n k slots of `experts` by expert
// (ascending slots within one) into sorted [n k] and lists the tiles (int4 {expert, begin,
// count, 0}, moe_max_tiles(n, k, E) of room) and their number n_tiles (device) — one block, no
// host round trip. grouped_experts then computes h [n, k, I] and o [n, k, H] exactly as
// expert_gate_up + expert_down (the same bits: a slot's dots do not depend on its tile).
int64_t moe_max_tiles(int64_t n, int64_t k, int64_t E);
void moe_group(const int32_t* experts, int64_t n, int64_t k, int64_t E, int32_t* sorted,
               void* tiles, int32_t* n_tiles, cudaStream_t stream);
void grouped_experts(DType wtype, const void* wg, const void* wu, const void* wd, int64_t I,
                     int64_t H, int64_t k, int64_t E, int64_t n, const int32_t* sorted,
                     const void* tiles, const int32_t* n_tiles, const float* x, float* h, float* o,
                     cudaStream_t stream);
// The MoE output joined to the residual, and normed for the next layer, per token: y = the sum
// over the k slots in ascending expert index of w[t, j] o[t, j] (fmaf from 0, the CPU model's
// order), then y = fmaf(sigmoid(gate[t gate_stride]), shared[t], y) when there is a shared
// expert; x[t] += y (x[t] = x_in[t] + y when x_in is given); then, when `norm` is given, xn[t] =
// rmsnorm_zc(x[t]) (weight norm [H]), also stored to rows_out[t] where that table (device, [n]) and
// its entry are not null (the MTP head's hidden rows: store_rows without its launch).
// o [n, k, H], experts, w [n, k], shared [n, H] or none, x, xn [n, H]. shared_in_o: o is [n, k + 1,
// H] with the shared expert's output in slot k (then `shared` is not read). A cluster of 8 blocks
// per token; the norm's sum of squares is the 8 blocks' partials added in block order.
// routing_settled: this launch comes right after expert_down, which came right after
// expert_gate_up (see expert_down), and experts, w and gate were written before expert_gate_up's
// launch: the kernel reads and orders the routing before waiting for o.
void moe_combine(const float* o, const int32_t* experts, const float* w, int64_t n, int64_t k,
                 int64_t H, const float* shared, bool shared_in_o, const float* gate,
                 int64_t gate_stride, float* x, const float* norm, float eps, float* xn,
                 cudaStream_t stream, const float* x_in = nullptr, float* const* rows_out = nullptr,
                 bool routing_settled = false);

// The attention block's row-local work in one kernel, from the stacked projection qkv [n, nh 2 D +
// 2 n_kv D] (per head [query D | gate D], then k, then v): q = rope(rmsnorm_zc(query, q_norm))
// [n, nh, D], gate [n, nh, D], and k = rope(rmsnorm_zc(k, k_norm)) and v written into the caches
// kc[t] / vc[t] at row pos[t] (as kv_append). The same bits as the separate ops.
void attn_prep(const float* qkv, int64_t n, int64_t n_heads, int64_t n_kv, int64_t D,
               int64_t rotary_dim, const float* q_norm, const float* k_norm, float eps,
               const float* inv_freq, const int64_t* pos, float* q, float* gate, float* const* kc,
               float* const* vc, cudaStream_t stream);
// l2norm_scale over n_q rows scaled by q_scale followed by n_k rows scaled by 1 (x [n_q + n_k,
// dim]): the Gated DeltaNet's q and k in one launch.
void l2norm_scale_qk(float* x, int64_t n_q, int64_t n_k, int64_t dim, float eps, float q_scale,
                     cudaStream_t stream);

// x += r, then xn = rmsnorm_zc(x): the residual add fused with the next norm (bitwise the same as
// add then rmsnorm_zc). x, r, xn [n, dim].
void add_rmsnorm_zc(float* x, const float* r, const float* w, int64_t n, int64_t dim, float eps,
                    float* xn, cudaStream_t stream);

// ---- batched sequence state ops (one launch for every sequence of a step) ----
// Per-token cache rows: for token t, kc[t] / vc[t] (device pointer tables) are its sequence's
// caches [capacity, n_kv, D]; row pos[t] is written with k[t], v[t] ([n, n_kv D]).
void kv_append(const float* k, const float* v, int64_t n, int64_t row, const int64_t* pos,
               float* const* kc, float* const* vc, cudaStream_t stream);
// attention() with each token's caches from the pointer tables kc[t], vc[t]; with `gate` [T,
// n_heads, D], the output is multiplied by sigmoid(gate) (as mul_sigmoid).
void attention_table(const float* q, int64_t T, const int64_t* pos, const float* const* kc,
                     const float* const* vc, int64_t n_heads, int64_t n_kv, int64_t D, float scale,
                     const float* gate, float* out, cudaStream_t stream);
// Causal conv + SiLU over nseq sequences: sequence s owns tokens starts[s] .. starts[s+1] of xc
// [n, C] and its conv state state[s] [K-1, C] (updated to its last K-1 inputs). One thread per
// (sequence, channel) walks the tokens in order; the sums are causal_conv_silu's. The output
// channels [q | k | v] go to q [n, kd], k [n, kd], v [n, C - 2 kd]. K <= 8.
// hist (nullptr, or a table whose entries may be null): sequence s's window [(K-1) + T_s, C], its
// old state's rows then its tokens' inputs, so that the state after any of its tokens can be
// restored (a verify step's rollback: rows j .. j + K-2 are the state after j tokens).
void conv_silu_seqs(const float* xc, const int32_t* starts, float* const* state, float* const* hist,
                    const float* w, int64_t nseq, int64_t C, int64_t K, int64_t kd, float* q,
                    float* k, float* v, cudaStream_t stream);
// delta_rule_recurrent over nseq sequences (tokens starts[s] .. starts[s+1], state S[s]); each
// value column's arithmetic is delta_rule_recurrent's. S_hist (nullptr, or a table whose
// entries may be null): sequence s's states after each of its tokens, [T_s, Hv, Dk, Dv] (for a
// verify step's rollback). While the stream is being captured into a CUDA graph, each block reads
// its part of S before waiting on the kernel before (ops.cu, states_settled); so does gdn_prep
// with the conv state.
void delta_rule_seqs(const float* q, const float* k, const float* v, const float* g,
                     const float* beta, const int32_t* starts, float* const* S,
                     float* const* S_hist, int64_t nseq, int64_t Hk, int64_t Hv, int64_t Dk,
                     int64_t Dv, float* out, cudaStream_t stream);

// out[t] = argmax of logits row t [V] (ties to the lower index). logits [n, V]. With `prob`
// [n]: also the argmax's softmax probability, 1 / sum_i exp(l_i - max) (the drafting gate).
// With `work` (argmax_work_floats(n, V) floats): each row split over blocks of 2048 entries and
// joined in chunk order (the same index; prob summed in another order), for long rows.
void argmax_rows(const float* logits, int64_t n, int64_t V, int32_t* out, cudaStream_t stream,
                 float* prob = nullptr, float* work = nullptr);
int64_t argmax_work_floats(int64_t n, int64_t V);

// Fills n weights with uniform values in [-scale, scale) + offset from a counter hash of (seed, i):
// dummy weights generated on the device. `dtype` bf16 or f32.
void fill_uniform(DType dtype, void* p, int64_t n, uint64_t seed, float scale, float offset,
                  cudaStream_t stream);

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

// split_qkvz then gdn_gates in one kernel, from the stacked projection PB [n, Hk G + Hk 2 r]
// (G = 2 Dk + 2 r Dv: per token the in_qkvz row, then the in_ba row): xc, z, beta, g as there.
void split_qkvz_gates(const float* PB, int64_t n, int64_t Hk, int64_t Dk, int64_t r, int64_t Dv,
                      const float* dt_bias, const float* neg_exp_a, float* xc, float* z,
                      float* beta, float* g, cudaStream_t stream);

// A Gated DeltaNet layer's row-local work before the delta rule, for nseq sequences in one
// launch, bitwise split_qkvz_gates, then conv_silu_seqs (state, hist as there), then
// l2norm_scale_qk (eps 1e-6, q scaled by q_scale): from the stacked projection PB [n, Hk G +
// Hk 2 r] to q, k [n, Hk Dk], v, z [n, Hk r Dv], beta, g [n, Hk r]. One block per (head,
// sequence). Dk, Dv <= kGdnPrepMaxDim, K <= 8.
inline constexpr int64_t kGdnPrepMaxDim = 128;
void gdn_prep(const float* PB, const int32_t* starts, float* const* state, float* const* hist,
              const float* conv_w, int64_t nseq, int64_t Hk, int64_t Dk, int64_t r, int64_t Dv,
              int64_t K, const float* dt_bias, const float* neg_exp_a, float q_scale, float* q,
              float* k, float* v, float* z, float* beta, float* g, cudaStream_t stream);

// Copies n segments of floats, segs [n, 3] (device) = {dst, src, count} each (the pointers as
// 8-byte words; 16-byte aligned with count a multiple of 4, or not: both work); segments must not
// overlap. One launch for what would be n cudaMemcpyAsync calls (a verify step's rollback).
void copy_segments(const uint64_t* segs, int64_t n, cudaStream_t stream);

// Rows between a contiguous block x / y [n, dim] and per-row device pointers (tables on the
// device): store_rows writes row i to dst[i] (skipped where null), load_rows reads row i from
// src[i].
void store_rows(const float* x, int64_t n, int64_t dim, float* const* dst, cudaStream_t stream);
void load_rows(const float* const* src, int64_t n, int64_t dim, float* y, cudaStream_t stream);
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
