#include "backends/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backends/cpu/gemm_kernels.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/simd.h"
#include "core/check.h"

namespace tf::cpu {
namespace {

// One expert's share of a step: the rows routed to it, in ascending row order.
struct Group {
  const FfnMats* f;
  int64_t n = 0;      // rows
  int64_t first = 0;  // index of its first row in `rows` (and in the [*, H] output buffer)
  int64_t h_off = 0;  // float offset of its [n, I] intermediate buffer
};

// Grow-only scratch of the calling thread, so that steady-state steps do not touch the allocator
// (a fresh mapping costs page faults on every step).
std::vector<float>& scratch(int which) {
  thread_local std::vector<float> bufs[4];
  return bufs[which];
}
float* scratch_floats(int which, int64_t n) {
  auto& v = scratch(which);
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

// h[t, i] = silu(h[t, i]) * u[t, i] over n rows of `cols`, row strides ldh, ldu.
void swiglu_rows(float* h, int64_t ldh, const float* u, int64_t ldu, int64_t n, int64_t cols) {
  for (int64_t t = 0; t < n; ++t) {
    float* hr = h + t * ldh;
    const float* ur = u + t * ldu;
    for (int64_t i = 0; i < cols; i += simd::kLanes) {
      const auto m = simd::mask_for(cols - i);
      const auto g = simd::load(hr + i, m);
      simd::store(hr + i, simd::mul(simd::silu(g), simd::load(ur + i, m)), m);
    }
  }
}

}  // namespace

void moe_ffn(const MoeArgs& a, const float* x, int64_t N, float* y, ThreadPool* pool) {
  if (N <= 0) return;
  const int64_t E = a.router.rows;
  const int64_t K = E > 0 ? a.top_k : 0;
  TF_CHECK(E == 0 || (a.experts != nullptr && K >= 1 && K <= E), "top_k {} of {} experts", a.top_k,
           E);
  TF_CHECK(E > 0 || a.shared != nullptr, "an MoE layer needs experts or a shared expert");
  const int64_t H = E > 0 ? a.router.cols : a.shared->gate.cols;
  const int64_t per_row = K + (a.shared != nullptr ? 1 : 0);  // output terms per row

  // Scratch sized for the worst case of the routing.
  const int64_t e_begin = a.expert_begin, e_end = a.expert_end < 0 ? E : a.expert_end;
  int64_t h_floats = a.shared != nullptr ? N * a.shared->gate.rows : 0;
  if (e_end > e_begin) h_floats += N * K * a.experts[e_begin].gate.rows;
  float* logits = scratch_floats(0, N * std::max<int64_t>(E, 1) + N);
  float* gate_logit = logits + N * std::max<int64_t>(E, 1);
  float* hbuf = scratch_floats(1, h_floats);
  float* obuf = scratch_floats(2, N * per_row * H);  // each group's [n, H] expert outputs
  std::vector<int32_t> rows(N * per_row);            // group-major: the rows of each group
  std::vector<int64_t> terms(N * per_row);           // row-major: obuf row of each term, by expert
  std::vector<float> weights(N * per_row);           // row-major: each term's weight
  std::vector<Group> groups;
  groups.reserve(E + 1);
  std::vector<int64_t> filled(N, 0);  // terms of each row (per_row unless experts are elsewhere)

  // Routing (one thread): softmax, top-k, then the groups in ascending expert order.
  auto route = [&] {
    std::vector<std::vector<std::pair<int32_t, float>>> chosen(E);  // expert -> (row, weight)
    std::vector<int64_t> idx(E);
    for (int64_t t = 0; t < N && E > 0; ++t) {
      float* p = logits + t * E;
      const float m = *std::max_element(p, p + E);
      float sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(p[e] - m));
      for (int64_t e = 0; e < E; ++e) p[e] /= sum;
      std::iota(idx.begin(), idx.end(), 0);
      std::partial_sort(idx.begin(), idx.begin() + K, idx.end(), [&](int64_t i, int64_t j) {
        return p[i] > p[j] || (p[i] == p[j] && i < j);
      });
      float wsum = 0;
      for (int64_t j = 0; j < K; ++j) wsum += p[idx[j]];
      for (int64_t j = 0; j < K; ++j) {
        const float wj = a.norm_topk_prob ? p[idx[j]] / wsum : p[idx[j]];
        chosen[idx[j]].emplace_back(static_cast<int32_t>(t), wj);
      }
    }
    int64_t at = 0, h_off = 0;
    auto add_group = [&](const FfnMats* f, const std::vector<std::pair<int32_t, float>>& rs) {
      groups.push_back(Group{f, static_cast<int64_t>(rs.size()), at, h_off});
      for (const auto& [t, wt] : rs) {
        rows[at] = t;
        terms[t * per_row + filled[t]] = at;
        weights[t * per_row + filled[t]] = wt;
        ++filled[t];
        ++at;
      }
      h_off += groups.back().n * f->gate.rows;
    };
    for (int64_t e = e_begin; e < e_end; ++e) {
      if (!chosen[e].empty()) add_group(&a.experts[e], chosen[e]);
    }
    if (a.shared != nullptr) {
      std::vector<std::pair<int32_t, float>> all(N);
      for (int64_t t = 0; t < N; ++t) {
        all[t] = {static_cast<int32_t>(t),
                  a.shared_gate != nullptr ? 1.0f / (1.0f + std::exp(-gate_logit[t])) : 1.0f};
      }
      add_group(a.shared, all);
    }
    TF_CHECK(h_off <= h_floats, "experts of unequal intermediate size ({} > {} floats)", h_off,
             h_floats);
  };

  // bf16 products over more than 4 rows: x rounded to bf16 once (kern::XRows::bf16) for the
  // router and every group's gate and up, which would each round their rows per call.
  const bool round_x =
      N > 4 && (a.router.bf16_inputs || (a.shared != nullptr && a.shared->gate.bf16_inputs) ||
                (e_end > e_begin && a.experts[e_begin].gate.bf16_inputs));
  thread_local std::vector<uint16_t> x_rounded;
  if (round_x) {
    if (static_cast<int64_t>(x_rounded.size()) < N * H) x_rounded.resize(N * H);
    kern::round_rows_bf16(x, H, N, H, x_rounded.data());
  }
  const uint16_t* xb = round_x ? x_rounded.data() : nullptr;
  const int64_t xb_ld = round_x ? H : 0;

  parallel_region(pool, [&](const Worker& wk) {
    const kern::XRows xs{x, H, nullptr, xb, xb_ld};
    // 1. Router logits (split by expert) and the shared gate's logit (worker 0).
    if (E > 0) {
      int64_t e0, e1;
      split_range(E, 8, wk, &e0, &e1);
      kern::gemm_rows(a.router, xs, N, logits + e0, E, e0, e1);
    }
    if (wk.id == 0 && a.shared != nullptr && a.shared_gate != nullptr) {
      kern::gemm_rows(Mat{DType::kF32, a.shared_gate, 1, H}, xs, N, gate_logit, 1, 0, 1);
    }
    wk.sync();
    if (wk.id == 0) route();
    wk.sync();
    // 2. gate and up over this worker's intermediate rows of every group, then silu(gate) * up.
    std::vector<float>& upbuf = scratch(3);
    for (const Group& g : groups) {
      const int64_t I = g.f->gate.rows;
      int64_t i0, i1;
      split_range(I, 16, wk, &i0, &i1);
      if (i0 >= i1) continue;
      const kern::XRows xg{x, H, rows.data() + g.first, xb, xb_ld};
      float* h = hbuf + g.h_off;
      if (static_cast<int64_t>(upbuf.size()) < g.n * (i1 - i0)) upbuf.resize(g.n * (i1 - i0));
      kern::gemm_rows(g.f->gate, xg, g.n, h + i0, I, i0, i1);
      kern::gemm_rows(g.f->up, xg, g.n, upbuf.data(), i1 - i0, i0, i1);
      swiglu_rows(h + i0, I, upbuf.data(), i1 - i0, g.n, i1 - i0);
    }
    wk.sync();
    // 3. down over this worker's hidden rows of every group, then each row's weighted sum.
    int64_t d0, d1;
    split_range(H, 16, wk, &d0, &d1);
    if (d0 >= d1) return;
    for (const Group& g : groups) {
      const int64_t I = g.f->gate.rows;
      const kern::XRows hg{hbuf + g.h_off, I, nullptr};
      kern::gemm_rows(g.f->down, hg, g.n, obuf + g.first * H + d0, H, d0, d1);
    }
    for (int64_t t = 0; t < N; ++t) {
      const int64_t* tt = terms.data() + t * per_row;
      const float* wt = weights.data() + t * per_row;
      for (int64_t d = d0; d < d1; d += simd::kLanes) {
        const auto m = simd::mask_for(d1 - d);
        auto acc = simd::set1(0.0f);
        for (int64_t j = 0; j < filled[t]; ++j) {
          acc = simd::fma(simd::load(obuf + tt[j] * H + d, m), simd::set1(wt[j]), acc);
        }
        simd::store(y + t * H + d, acc, m);
      }
    }
  });
}

void ffn(const FfnMats& f, const float* x, int64_t N, float* y, ThreadPool* pool) {
  MoeArgs a;
  a.shared = &f;
  moe_ffn(a, x, N, y, pool);
}

}  // namespace tf::cpu
