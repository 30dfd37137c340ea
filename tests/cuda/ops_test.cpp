// CUDA ops against the CPU reference on fresh random inputs, and batch invariance on CUDA (a row's
// output is the same bits in any batch). Runs where a CUDA device is present; skips elsewhere (CI
// compiles it, the H200 machine runs it).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backends/cpu/matmul.h"
#include "backends/cpu/ops.h"
#include "backends/cuda/check.h"
#include "backends/cuda/ops.h"

namespace tf {
namespace {

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// A device copy of a host vector, freed at scope exit.
template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(const std::vector<T>& h) : n(h.size()) {
    TF_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)));
    TF_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  explicit Dev(size_t count) : n(count) {
    TF_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)));
  }
  ~Dev() { cudaFree(p); }
  std::vector<T> host() const {
    std::vector<T> h(n);
    TF_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// ||a - b|| / ||b||
double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * double(a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
  }
};

// Metric: relative L2 against the CPU op; tolerance 1e-6 (fp32 with another summation order).
TEST_F(CudaOps, RmsNormMatchesCpu) {
  const int64_t n = 5, dim = 2048;
  const auto x = randn(n * dim, 1), w = randn(dim, 2);
  std::vector<float> ref(n * dim);
  cpu::rmsnorm_zc(x.data(), w.data(), n, dim, 1e-6f, ref.data());
  Dev<float> dx(x), dw(w), dy(n * dim);
  cuda::rmsnorm_zc(dx.p, dw.p, n, dim, 1e-6f, dy.p, nullptr);
  EXPECT_LT(rel_l2(dy.host(), ref), 1e-6);
}

// Metric: relative L2 against the CPU matmul on the same bf16 weights; tolerance 1e-6. Then batch
// invariance: row 3 of a 7-row product has the same bits as that row alone.
TEST_F(CudaOps, MatmulBf16MatchesCpuAndIsBatchInvariant) {
  const int64_t rows = 1000, cols = 2048, n = 7;
  const auto wf = randn(rows * cols, 3), x = randn(n * cols, 4);
  std::vector<uint16_t> w(rows * cols);
  for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(wf[i]);
  std::vector<float> ref(n * rows);
  cpu::matmul(cpu::Mat{DType::kBF16, w.data(), rows, cols}, x.data(), n, ref.data(), nullptr);
  Dev<uint16_t> dw(w);
  Dev<float> dx(x), dy(n * rows);
  cuda::matmul(DType::kBF16, dw.p, rows, cols, dx.p, n, dy.p, nullptr);
  const std::vector<float> y = dy.host();
  EXPECT_LT(rel_l2(y, ref), 1e-6);

  Dev<float> dx1(std::vector<float>(x.begin() + 3 * cols, x.begin() + 4 * cols)), dy1(rows);
  cuda::matmul(DType::kBF16, dw.p, rows, cols, dx1.p, 1, dy1.p, nullptr);
  const std::vector<float> y1 = dy1.host();
  EXPECT_EQ(std::memcmp(y1.data(), y.data() + 3 * rows, rows * sizeof(float)), 0);
}

// Metric: max absolute difference against the CPU ops; tolerance 1e-5 (expf / sincosf ulps).
TEST_F(CudaOps, SiluMulAndRopeMatchCpu) {
  const int64_t n = 4096;
  const auto g = randn(n, 5), u = randn(n, 6);
  Dev<float> dg(g), du(u), dy(n);
  cuda::silu_mul(dg.p, du.p, n, dy.p, nullptr);
  const auto y = dy.host();
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y[i], cpu::silu(g[i]) * u[i], 1e-5) << i;

  const int64_t T = 3, heads = 4, D = 64, rd = 16;
  auto x = randn(T * heads * D, 7);
  std::vector<float> inv(rd / 2);
  for (int64_t i = 0; i < rd / 2; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / rd);
  const std::vector<int64_t> pos = {0, 17, 4000};
  Dev<float> dxr(x), dinv(inv);
  Dev<int64_t> dpos(pos);
  cuda::rope_neox(dxr.p, T, heads, D, rd, dinv.p, dpos.p, nullptr);
  const auto got = dxr.host();
  for (int64_t t = 0; t < T; ++t)
    cpu::rope_neox(&x[t * heads * D], heads, D, rd, inv.data(), pos[t]);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(got[i], x[i], 1e-5) << i;
}

// Metric: relative L2 against the CPU ops; tolerance 1e-6.
TEST_F(CudaOps, NormsAndConvMatchCpu) {
  const int64_t n = 6, dim = 128, C = 96, K = 4, T = 5;
  const auto x = randn(n * dim, 8), z = randn(n * dim, 9), w = randn(dim, 10);
  std::vector<float> ref(n * dim);
  cpu::rmsnorm_gated(x.data(), z.data(), w.data(), n, dim, 1e-6f, ref.data());
  Dev<float> dx(x), dz(z), dw(w), dy(n * dim);
  cuda::rmsnorm_gated(dx.p, dz.p, dw.p, n, dim, 1e-6f, dy.p, nullptr);
  EXPECT_LT(rel_l2(dy.host(), ref), 1e-6);

  std::vector<float> l2 = x;
  cpu::l2norm_scale(l2.data(), n, dim, 1e-6f, 0.5f);
  cuda::l2norm_scale(dx.p, n, dim, 1e-6f, 0.5f, nullptr);
  EXPECT_LT(rel_l2(dx.host(), l2), 1e-6);

  const auto in = randn((K - 1 + T) * C, 11), cw = randn(C * K, 12);
  std::vector<float> cref(T * C);
  cpu::causal_conv_silu(in.data(), cw.data(), T, C, K, cref.data());
  Dev<float> din(in), dcw(cw), dout(T * C);
  cuda::causal_conv_silu(din.p, dcw.p, T, C, K, dout.p, nullptr);
  EXPECT_LT(rel_l2(dout.host(), cref), 1e-6);
}

// Metric: relative L2 of outputs and final state against cpu::delta_rule_recurrent; tolerance
// 1e-5. Then split invariance: 5 tokens in one call == 2 then 3, bit for bit (the property that
// lets kept states sit at any position on CUDA).
TEST_F(CudaOps, DeltaRuleRecurrentMatchesCpuAndSplits) {
  const int64_t T = 5, Hk = 2, Hv = 4, Dk = 128, Dv = 128;
  auto q = randn(T * Hk * Dk, 13), k = randn(T * Hk * Dk, 14);
  cpu::l2norm_scale(q.data(), T * Hk, Dk, 1e-6f, 1.0f / std::sqrt(128.0f));
  cpu::l2norm_scale(k.data(), T * Hk, Dk, 1e-6f, 1.0f);
  const auto v = randn(T * Hv * Dv, 15);
  std::vector<float> g(T * Hv), beta(T * Hv);
  for (size_t i = 0; i < g.size(); ++i) g[i] = -0.1f * (i % 7), beta[i] = 0.2f + 0.1f * (i % 5);
  auto S = randn(Hv * Dk * Dv, 16);
  std::vector<float> Sref = S, oref(T * Hv * Dv);
  cpu::delta_rule_recurrent({q.data(), k.data(), v.data(), g.data(), beta.data(), T, Hk, Hv, Dk, Dv,
                             Sref.data(), oref.data()},
                            nullptr);
  Dev<float> dq(q), dk(k), dv(v), dg(g), db(beta), dS(S), dout(T * Hv * Dv);
  cuda::delta_rule_recurrent(dq.p, dk.p, dv.p, dg.p, db.p, T, Hk, Hv, Dk, Dv, dS.p, dout.p,
                             nullptr);
  const auto out = dout.host(), Sgot = dS.host();
  EXPECT_LT(rel_l2(out, oref), 1e-5);
  EXPECT_LT(rel_l2(Sgot, Sref), 1e-5);

  Dev<float> dS2(S), dout2(T * Hv * Dv);
  cuda::delta_rule_recurrent(dq.p, dk.p, dv.p, dg.p, db.p, 2, Hk, Hv, Dk, Dv, dS2.p, dout2.p,
                             nullptr);
  cuda::delta_rule_recurrent(dq.p + 2 * Hk * Dk, dk.p + 2 * Hk * Dk, dv.p + 2 * Hv * Dv,
                             dg.p + 2 * Hv, db.p + 2 * Hv, 3, Hk, Hv, Dk, Dv, dS2.p,
                             dout2.p + 2 * Hv * Dv, nullptr);
  const auto out2 = dout2.host(), S2 = dS2.host();
  EXPECT_EQ(std::memcmp(out2.data(), out.data(), out.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(S2.data(), Sgot.data(), S2.size() * sizeof(float)), 0);
}

// Metric: relative L2 against cpu::attention; tolerance 1e-5 (online vs two-pass softmax). Then
// batch invariance: query 1 alone has the same bits as in the 3-query call.
TEST_F(CudaOps, AttentionMatchesCpuAndIsBatchInvariant) {
  const int64_t T = 3, nh = 8, nkv = 2, D = 256, L = 300;
  const auto q = randn(T * nh * D, 17), kc = randn(L * nkv * D, 18), vc = randn(L * nkv * D, 19);
  const std::vector<int64_t> pos = {0, 150, 299};
  const float scale = 1.0f / 16.0f;
  std::vector<float> ref(T * nh * D);
  cpu::attention(q.data(), T, pos.data(), kc.data(), vc.data(), nh, nkv, D, scale, ref.data(),
                 nullptr);
  Dev<float> dq(q), dk(kc), dv(vc), dout(T * nh * D);
  Dev<int64_t> dpos(pos);
  cuda::attention(dq.p, T, dpos.p, dk.p, dv.p, nh, nkv, D, scale, dout.p, nullptr);
  const auto out = dout.host();
  EXPECT_LT(rel_l2(out, ref), 1e-5);

  Dev<float> dout1(nh * D);
  cuda::attention(dq.p + nh * D, 1, dpos.p + 1, dk.p, dv.p, nh, nkv, D, scale, dout1.p, nullptr);
  const auto out1 = dout1.host();
  EXPECT_EQ(std::memcmp(out1.data(), out.data() + nh * D, nh * D * sizeof(float)), 0);
}

// Routing against a plain reference: the same experts, weights within 1e-6.
TEST_F(CudaOps, RouteTopkAndEmbed) {
  const int64_t n = 9, E = 64, k = 10;
  const auto logits = randn(n * E, 20);
  Dev<float> dl(logits), dw(n * k);
  Dev<int32_t> de(n * k);
  cuda::route_topk(dl.p, n, E, k, true, de.p, dw.p, nullptr);
  const auto ex = de.host();
  const auto wt = dw.host();
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int> idx(E);
    for (int e = 0; e < E; ++e) idx[e] = e;
    const float* l = &logits[t * E];
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return l[a] > l[b]; });
    double m = *std::max_element(l, l + E), sum = 0, wsum = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(l[e] - m);
    for (int s = 0; s < k; ++s) wsum += std::exp(l[idx[s]] - m) / sum;
    for (int s = 0; s < k; ++s) {
      EXPECT_EQ(ex[t * k + s], idx[s]) << t << " " << s;
      EXPECT_NEAR(wt[t * k + s], std::exp(l[idx[s]] - m) / sum / wsum, 1e-6);
    }
  }

  const int64_t V = 50, dim = 64;
  const auto ef = randn(V * dim, 21);
  std::vector<uint16_t> eb(V * dim);
  for (size_t i = 0; i < eb.size(); ++i) eb[i] = f32_to_bf16(ef[i]);
  const std::vector<int32_t> ids = {3, 49, 0, 3};
  Dev<uint16_t> demb(eb);
  Dev<int32_t> dids(ids);
  Dev<float> drows(ids.size() * dim);
  cuda::embed_rows(DType::kBF16, demb.p, dim, dids.p, static_cast<int64_t>(ids.size()), drows.p,
                   nullptr);
  const auto rows = drows.host();
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t d = 0; d < dim; ++d)
      EXPECT_EQ(rows[t * dim + d], bf16_to_f32(eb[ids[t] * dim + d]));
}

}  // namespace
}  // namespace tf
