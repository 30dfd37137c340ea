// Fused SwiGLU feed-forward and mixture-of-experts ops: the router, every chosen expert and the
// shared expert of a layer run in one parallel region (one pool dispatch, two barriers), instead of
// three matmuls (three dispatches) per expert.
//
// Determinism: each matrix product element has matmul's canonical arithmetic; threads split the
// expert's intermediate rows (gate/up) and the hidden rows (down), never a reduction; each row's
// output sums its experts in ascending expert index, the shared expert last, with one fma per term.
#pragma once

#include <cstdint>

#include "backends/cpu/matmul.h"
#include "core/thread_pool.h"

namespace tf::cpu {

// down(silu(gate x) * up x). gate, up: [I, H]; down: [H, I].
struct FfnMats {
  Mat gate, up;
  Mat down;
};

struct MoeArgs {
  Mat router;                          // [E, H]; no routed experts when E == 0
  const FfnMats* experts = nullptr;    // [E]
  int64_t top_k = 0;                   // experts per row, <= E
  bool norm_topk_prob = true;          // renormalise the k chosen probabilities to sum 1
  const FfnMats* shared = nullptr;     // optional expert that every row uses
  const float* shared_gate = nullptr;  // [H]: shared weight sigmoid(x . shared_gate); null: 1
  // Expert parallelism: only experts in [expert_begin, expert_end) are computed (the others'
  // matrices may be empty); the routing still sees all E (end < 0: E). A row with none of its
  // top_k here gets only the shared expert's term.
  int64_t expert_begin = 0, expert_end = -1;
};

// For each row t of x [N, H]:
//   p = softmax(router x_t) in fp32; the top_k largest p (ties: lower index first), divided by
//   their sum if norm_topk_prob; y_t = sum over the chosen e in ascending e of p_e * ffn_e(x_t),
//   then + sigmoid(x_t . shared_gate) * shared(x_t). y: [N, H], may not alias x.
void moe_ffn(const MoeArgs& a, const float* x, int64_t N, float* y, ThreadPool* pool);

// y = ffn(x) for every row: a dense SwiGLU MLP in one parallel region. y may not alias x.
void ffn(const FfnMats& f, const float* x, int64_t N, float* y, ThreadPool* pool);

}  // namespace tf::cpu
