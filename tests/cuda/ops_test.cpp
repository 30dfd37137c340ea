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

// matmul_add_rmsnorm against add_rmsnorm_zc then matmul, bit for bit: x + r, the normed row and
// the product, at the 80B-A3B router's shape (513 x 2048: blocks of 8 rows, one partial) and a
// small one (37 x 96: fewer columns than the norm's 256 threads), 8 inputs each (a changed order of
// the sum of squares may still round to the same norm on one). A prologue whose threads sum the
// squares of contiguous runs of columns instead of add_rmsnorm_zc's strided ones fails it.
TEST_F(CudaOps, MatmulAddRmsnormEqualsTheTwoKernels) {
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{513, 2048}, {37, 96}}) {
    const auto wf = randn(rows * cols, 130), nw = randn(cols, 133);
    std::vector<uint16_t> w(rows * cols);
    for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(wf[i]);
    Dev<uint16_t> dw(w);
    Dev<float> dnw(nw);
    for (uint32_t seed = 0; seed < 8; ++seed) {
      const auto x = randn(cols, 131 + 2 * seed), r = randn(cols, 132 + 2 * seed);
      Dev<float> dr(r), x1(x), xo(cols), xn1(cols), y1(rows);
      cuda::matmul_add_rmsnorm(dw.p, rows, cols, x1.p, dr.p, dnw.p, 1e-6f, xo.p, xn1.p, y1.p,
                               nullptr);
      Dev<float> x2(x), xn2(cols), y2(rows);
      cuda::add_rmsnorm_zc(x2.p, dr.p, dnw.p, 1, cols, 1e-6f, xn2.p, nullptr);
      cuda::matmul(DType::kBF16, dw.p, rows, cols, xn2.p, 1, y2.p, nullptr);
      EXPECT_EQ(xo.host(), x2.host()) << rows << " " << seed;
      EXPECT_EQ(xn1.host(), xn2.host()) << rows << " " << seed;
      EXPECT_EQ(y1.host(), y2.host()) << rows << " " << seed;
      EXPECT_EQ(x1.host(), x) << rows << " " << seed;  // x itself untouched
    }
  }
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

// Prompt-sized steps (more than 64 rows) run attention as a block per (t, head) that walks the 8
// chunks itself; decode-sized ones as a cluster of 8 blocks. A row must have the same bits in
// both (prompt rows and decode rows of one position): 80 rows of a prompt at positions 220..299,
// against each row alone, with the output gate; and against the CPU within 1e-5.
TEST_F(CudaOps, AttentionPromptRowsEqualDecodeRows) {
  const int64_t T = 80, nh = 8, nkv = 2, D = 256, L = 300;
  const auto q = randn(T * nh * D, 120), kc = randn(L * nkv * D, 121), vc = randn(L * nkv * D, 122);
  const auto gate = randn(T * nh * D, 123);
  std::vector<int64_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = 220 + t;
  Dev<float> dq(q), dk(kc), dv(vc), dg(gate), dout(T * nh * D), dplain(T * nh * D);
  Dev<int64_t> dpos(pos);
  auto u = [](const float* p) { return reinterpret_cast<uint64_t>(p); };
  Dev<uint64_t> kt(std::vector<uint64_t>(T, u(dk.p))), vt(std::vector<uint64_t>(T, u(dv.p)));
  cuda::attention_table(dq.p, T, dpos.p, reinterpret_cast<const float* const*>(kt.p),
                        reinterpret_cast<const float* const*>(vt.p), nh, nkv, D, 0.0625f, dg.p,
                        dout.p, nullptr);
  const auto out = dout.host();
  for (int64_t t : {0, 1, 37, 79}) {
    Dev<float> o1(nh * D);
    cuda::attention_table(dq.p + t * nh * D, 1, dpos.p + t,
                          reinterpret_cast<const float* const*>(kt.p),
                          reinterpret_cast<const float* const*>(vt.p), nh, nkv, D, 0.0625f,
                          dg.p + t * nh * D, o1.p, nullptr);
    const auto one = o1.host();
    EXPECT_EQ(std::memcmp(one.data(), out.data() + t * nh * D, nh * D * sizeof(float)), 0)
        << "row " << t;
  }
  cuda::attention(dq.p, T, dpos.p, dk.p, dv.p, nh, nkv, D, 0.0625f, dplain.p, nullptr);
  std::vector<float> ref(T * nh * D);
  cpu::attention(q.data(), T, pos.data(), kc.data(), vc.data(), nh, nkv, D, 0.0625f, ref.data(),
                 nullptr);
  EXPECT_LT(rel_l2(dplain.host(), ref), 1e-5);
}

// Indices of l[0, n) by descending value, ties to the lower index (the routing's pick order).
std::vector<int> descending_order(const float* l, int64_t n) {
  std::vector<int> idx(n);
  for (int e = 0; e < n; ++e) idx[e] = e;
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return l[a] > l[b]; });
  return idx;
}

// Routing against a plain reference: the same experts, weights within 1e-6.
TEST_F(CudaOps, RouteTopkAndEmbed) {
  const int64_t n = 9, E = 64, k = 10;
  const auto logits = randn(n * E, 20);
  // Rows at a stride of E + 1, as the model's [router | shared gate] product: the extra column
  // (larger than any logit) must not be picked.
  std::vector<float> strided;
  for (int64_t t = 0; t < n; ++t) {
    strided.insert(strided.end(), logits.begin() + t * E, logits.begin() + (t + 1) * E);
    strided.push_back(100.0f);
  }
  Dev<float> dl(strided), dw(n * k);
  Dev<int32_t> de(n * k);
  cuda::route_topk(dl.p, n, E, E + 1, k, true, de.p, dw.p, nullptr);
  const auto ex = de.host();
  const auto wt = dw.host();
  for (int64_t t = 0; t < n; ++t) {
    const float* l = &logits[t * E];
    const std::vector<int> idx = descending_order(l, E);
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

// The MTP head's fc input in one launch: each half the same bits as embed_rows then rmsnorm_zc.
TEST_F(CudaOps, MtpInputEqualsEmbedThenNorms) {
  const int64_t V = 40, H = 320;
  std::vector<uint16_t> eb(V * H);
  const auto ef = randn(V * H, 22);
  for (size_t i = 0; i < eb.size(); ++i) eb[i] = f32_to_bf16(ef[i]);
  const std::vector<int32_t> ids = {7, 0, 39, 7, 12};
  const int64_t n = static_cast<int64_t>(ids.size());
  const auto hid = randn(n * H, 23), we = randn(H, 24), wh = randn(H, 25);
  Dev<uint16_t> demb(eb);
  Dev<int32_t> dids(ids);
  Dev<float> dhid(hid), dwe(we), dwh(wh), du(n * 2 * H), de(n * H), dhn(n * H);
  cuda::mtp_input(DType::kBF16, demb.p, dids.p, dhid.p, dwe.p, dwh.p, n, H, 1e-6f, du.p, nullptr);
  cuda::embed_rows(DType::kBF16, demb.p, H, dids.p, n, de.p, nullptr);
  cuda::rmsnorm_zc(de.p, dwe.p, n, H, 1e-6f, de.p, nullptr);
  cuda::rmsnorm_zc(dhid.p, dwh.p, n, H, 1e-6f, dhn.p, nullptr);
  const auto u = du.host(), e = de.host(), hn = dhn.host();
  for (int64_t t = 0; t < n; ++t) {
    EXPECT_EQ(0, std::memcmp(&u[t * 2 * H], &e[t * H], H * 4)) << "embedding half, row " << t;
    EXPECT_EQ(0, std::memcmp(&u[t * 2 * H + H], &hn[t * H], H * 4)) << "hidden half, row " << t;
  }
}

std::vector<uint16_t> to_bf16(const std::vector<float>& f) {
  std::vector<uint16_t> b(f.size());
  for (size_t i = 0; i < f.size(); ++i) b[i] = f32_to_bf16(f[i]);
  return b;
}

// Matmul over 13 and 20 rows (one-token blocks; three token tiles of 8): every row equals that row
// alone, bit for bit.
// One-token products keep 4 chunks of 4 rows per warp in flight, tiles 2: a row must have the same
// bits in both.
TEST_F(CudaOps, MatmulTilesAreBatchInvariant) {
  // n = 13: one-token blocks side by side (up to 16 tokens); 20: tiles of 8 tokens per warp.
  for (const int64_t n : {13, 20}) {
    // cols: 8 full 256-chunks plus a ragged tail; 16 plus a tail (two rounds of 8 chunks).
    for (const auto& [rows, cols] :
         {std::pair<int64_t, int64_t>{333, 2056}, {333, 4104}, {4100, 2056}}) {
      const auto w = to_bf16(randn(rows * cols, 30));
      const auto x = randn(n * cols, 31);
      Dev<uint16_t> dw(w);
      Dev<float> dx(x), dy(n * rows);
      cuda::matmul(DType::kBF16, dw.p, rows, cols, dx.p, n, dy.p, nullptr);
      const auto y = dy.host();
      std::vector<float> ref(n * rows);
      cpu::matmul(cpu::Mat{DType::kBF16, w.data(), rows, cols}, x.data(), n, ref.data(), nullptr);
      EXPECT_LT(rel_l2(y, ref), 1e-6) << rows << " x " << cols;
      for (int64_t t : {int64_t{0}, int64_t{7}, int64_t{8}, n - 1}) {
        Dev<float> dx1(std::vector<float>(x.begin() + t * cols, x.begin() + (t + 1) * cols)),
            dy1(rows);
        cuda::matmul(DType::kBF16, dw.p, rows, cols, dx1.p, 1, dy1.p, nullptr);
        const auto y1 = dy1.host();
        EXPECT_EQ(std::memcmp(y1.data(), y.data() + t * rows, rows * sizeof(float)), 0)
            << n << " tokens, " << rows << " x " << cols << ", row " << t;
      }
    }
  }
}

// The indexed experts against a host reference (fp32 dots, silu, ascending-expert combine plus the
// gated shared expert): metric relative L2, tolerance 1e-5. Bitwise: the same as the matmul +
// silu_mul path per slot, and a token's output alone equals it inside the batch.
TEST_F(CudaOps, IndexedExpertsMatchReferenceAndAreBatchInvariant) {
  const int64_t E = 16, I = 64, H = 256, n = 5, k = 3;
  const auto wg = to_bf16(randn(E * I * H, 40)), wu = to_bf16(randn(E * I * H, 41));
  const auto wd = to_bf16(randn(E * H * I, 42));
  const auto x = randn(n * H, 43), sh = randn(n * H, 44), gate = randn(n, 45);
  const std::vector<int32_t> ex = {3, 0, 15, 7, 1, 9, 2, 14, 8, 0, 5, 11, 12, 4, 6};
  std::vector<float> w(n * k);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1f + 0.05f * static_cast<float>(i % 4);
  Dev<uint16_t> dg(wg), du(wu), dd(wd);
  Dev<float> dx(x), dsh(sh), dgate(gate), dw(w), dh(n * k * I), dout(n * k * H);
  Dev<float> dy(std::vector<float>(n * H, 0.0f));  // the residual: 0, so it becomes the output
  Dev<int32_t> dex(ex);
  cuda::expert_gate_up(DType::kBF16, dg.p, du.p, I, H, dex.p, k, dx.p, n, dh.p, nullptr);
  cuda::expert_down(DType::kBF16, dd.p, H, I, dex.p, k, dh.p, n, dout.p, nullptr);
  cuda::moe_combine(dout.p, dex.p, dw.p, n, k, H, dsh.p, false, dgate.p, 1, dy.p, nullptr, 0.0f,
                    nullptr, nullptr);
  const auto y = dy.host(), h = dh.host();
  std::vector<float> ref(n * H);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int> order(k);
    for (int j = 0; j < k; ++j) order[j] = j;
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return ex[t * k + a] < ex[t * k + b]; });
    std::vector<double> acc(H, 0.0);
    for (int j : order) {
      const int64_t e = ex[t * k + j];
      std::vector<float> hh(I);
      for (int64_t i = 0; i < I; ++i) {
        double gs = 0, us = 0;
        for (int64_t c = 0; c < H; ++c) {
          gs += bf16_to_f32(wg[(e * I + i) * H + c]) * double(x[t * H + c]);
          us += bf16_to_f32(wu[(e * I + i) * H + c]) * double(x[t * H + c]);
        }
        hh[i] = static_cast<float>(gs / (1 + std::exp(-gs)) * us);
      }
      for (int64_t d = 0; d < H; ++d) {
        double o = 0;
        for (int64_t i = 0; i < I; ++i) o += bf16_to_f32(wd[(e * H + d) * I + i]) * double(hh[i]);
        acc[d] += w[t * k + j] * o;
      }
    }
    const double gsig = 1 / (1 + std::exp(-double(gate[t])));
    for (int64_t d = 0; d < H; ++d)
      ref[t * H + d] = static_cast<float>(acc[d] + gsig * sh[t * H + d]);
  }
  EXPECT_LT(rel_l2(y, ref), 1e-5);

  // Grouped by expert (tiles of up to 8 slots of one expert): the same h and o, bit for bit.
  const int64_t mt = cuda::moe_max_tiles(n, k, E);
  Dev<int32_t> sorted(n * k), tiles(4 * mt + 1);
  Dev<float> gh(n * k * I), go(n * k * H);
  cuda::moe_group(dex.p, n, k, E, sorted.p, tiles.p, tiles.p + 4 * mt, nullptr);
  cuda::grouped_experts(DType::kBF16, dg.p, du.p, dd.p, I, H, k, E, n, sorted.p, tiles.p,
                        tiles.p + 4 * mt, dx.p, gh.p, go.p, nullptr);
  EXPECT_EQ(gh.host(), h);
  EXPECT_EQ(go.host(), dout.host());
  // Many slots per expert: 20 tokens all routed to experts 2 and 5 (in either order), 20 slots
  // each, so tiles of 8, 8 and 4 per expert.
  {
    const int64_t n2 = 20, k2 = 2;
    std::vector<int32_t> ex2(n2 * k2);
    for (int64_t t = 0; t < n2; ++t)
      ex2[t * k2] = t % 3 == 0 ? 5 : 2, ex2[t * k2 + 1] = t % 3 == 0 ? 2 : 5;
    const auto x2 = randn(n2 * H, 46);
    Dev<int32_t> dex2(ex2), s2(n2 * k2), t2(4 * cuda::moe_max_tiles(n2, k2, E) + 1);
    Dev<float> dx2(x2), h2(n2 * k2 * I), o2(n2 * k2 * H), hr(n2 * k2 * I), orf(n2 * k2 * H);
    const int64_t mt2 = cuda::moe_max_tiles(n2, k2, E);
    cuda::moe_group(dex2.p, n2, k2, E, s2.p, t2.p, t2.p + 4 * mt2, nullptr);
    cuda::grouped_experts(DType::kBF16, dg.p, du.p, dd.p, I, H, k2, E, n2, s2.p, t2.p,
                          t2.p + 4 * mt2, dx2.p, h2.p, o2.p, nullptr);
    cuda::expert_gate_up(DType::kBF16, dg.p, du.p, I, H, dex2.p, k2, dx2.p, n2, hr.p, nullptr);
    cuda::expert_down(DType::kBF16, dd.p, H, I, dex2.p, k2, hr.p, n2, orf.p, nullptr);
    EXPECT_EQ(h2.host(), hr.host());
    EXPECT_EQ(o2.host(), orf.host());
    const auto tl = t2.host();
    EXPECT_EQ(tl[4 * mt2], 6);
  }

  // Slot (t = 2, j = 1) against matmul + silu_mul on its expert's matrices: the same bits.
  const int64_t slot = 2 * k + 1, e = ex[slot];
  Dev<float> g1(I), u1(I);
  Dev<float> x1(std::vector<float>(x.begin() + 2 * H, x.begin() + 3 * H));
  cuda::matmul(DType::kBF16, dg.p + e * I * H, I, H, x1.p, 1, g1.p, nullptr);
  cuda::matmul(DType::kBF16, du.p + e * I * H, I, H, x1.p, 1, u1.p, nullptr);
  cuda::silu_mul(g1.p, u1.p, I, g1.p, nullptr);
  const auto h1 = g1.host();
  EXPECT_EQ(std::memcmp(h1.data(), h.data() + slot * I, I * sizeof(float)), 0);

  // Token 3 alone: the same bits as in the batch of 5.
  Dev<float> xa(std::vector<float>(x.begin() + 3 * H, x.begin() + 4 * H)), ha(k * I), oa(k * H),
      ya(std::vector<float>(H, 0.0f));
  cuda::expert_gate_up(DType::kBF16, dg.p, du.p, I, H, dex.p + 3 * k, k, xa.p, 1, ha.p, nullptr);
  cuda::expert_down(DType::kBF16, dd.p, H, I, dex.p + 3 * k, k, ha.p, 1, oa.p, nullptr);
  cuda::moe_combine(oa.p, dex.p + 3 * k, dw.p + 3 * k, 1, k, H, dsh.p + 3 * H, false, dgate.p + 3,
                    1, ya.p, nullptr, 0.0f, nullptr, nullptr);
  const auto y1 = ya.host();
  EXPECT_EQ(std::memcmp(y1.data(), y.data() + 3 * H, H * sizeof(float)), 0);
}

// Ties and many experts: the lower index wins a tie; experts as a stable sort would pick them.
// 700 experts: a thread of the kernel holds two logits (ties among the first 512 and past them).
TEST_F(CudaOps, RouteTopkTiesAndManyExperts) {
  for (const int64_t E : {512, 700}) {
    const int64_t n = 5, k = 10;
    auto logits = randn(n * E, 50);
    for (int64_t e = 100; e < 140; ++e) logits[E + e] = 7.0f;          // token 1: 40 tied maxima
    for (int64_t e = E - 30; e < E; e += 3) logits[3 * E + e] = 9.0f;  // token 3: ties at the end
    logits[3 * E + 40] = 9.0f;
    Dev<float> dl(logits), dw(n * k);
    Dev<int32_t> de(n * k);
    cuda::route_topk(dl.p, n, E, E, k, true, de.p, dw.p, nullptr);
    const auto ex = de.host();
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<int> idx = descending_order(&logits[t * E], E);
      for (int s = 0; s < k; ++s) EXPECT_EQ(ex[t * k + s], idx[s]) << E << " " << t << " " << s;
    }
  }
}

// The ranked picks (E <= 512, k <= 16) against the pick-by-pick scan, experts and weights bit for
// bit: random logits, ties across warps, every logit equal and ties in every warp (past 64
// candidates: the rank kernel's own scan), a row of one large logit, and E below a warp's
// multiple. Ranking without the index tie-break (r counting only larger keys) fails this test: two
// tied picks share a rank.
TEST_F(CudaOps, RouteTopkRanksEqualScan) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{512, 10}, {512, 16}, {64, 10},
                                                           {37, 3},   {6, 2},    {8, 8}};
  for (const auto& [E, k] : shapes) {
    const int64_t n = 6;
    auto logits = randn(n * E, static_cast<uint32_t>(70 + E + k));
    for (int64_t e = E / 4; e < E / 2; ++e) logits[E + e] = 3.0f;  // row 1: a tied block
    for (int64_t e = 0; e < E; ++e) logits[2 * E + e] = -1.5f;     // row 2: all equal
    logits[3 * E + E - 1] = 50.0f;                                 // row 3: one large logit
    for (int64_t e = 0; e < E; e += 5) logits[4 * E + e] = 2.5f;   // row 4: ties in every warp
    Dev<float> dl(logits), w1(n * k), w2(n * k);
    Dev<int32_t> e1(n * k), e2(n * k);
    cuda::route_topk(dl.p, n, E, E, k, true, e1.p, w1.p, nullptr);
    cuda::route_topk(dl.p, n, E, E, k, true, e2.p, w2.p, nullptr, /*scan=*/true);
    EXPECT_EQ(e1.host(), e2.host()) << E << " " << k;
    const auto a = w1.host(), b = w2.host();
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << E << " " << k;
    const auto ex = e1.host();
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<int> idx = descending_order(&logits[t * E], E);
      for (int s = 0; s < k; ++s) EXPECT_EQ(ex[t * k + s], idx[s]) << E << " " << t << " " << s;
    }
  }
}

// The batched state ops against the one-sequence ops, bit for bit: two sequences (3 tokens and 1)
// in one launch each of conv_silu_seqs, delta_rule_seqs, kv_append + attention_table.
TEST_F(CudaOps, SequenceTablesMatchPerSequenceOps) {
  const int64_t Hk = 2, Hv = 4, Dk = 32, Dv = 64, kd = Hk * Dk, C = 2 * kd + Hv * Dv, K = 4;
  const int64_t N = 4;
  const std::vector<int32_t> starts = {0, 3, 4};
  const auto xc = randn(N * C, 60), cw = randn(C * K, 61);
  const auto st0 = randn((K - 1) * C, 62), st1 = randn((K - 1) * C, 63);
  Dev<float> dxc(xc), dcw(cw), ds0(st0), ds1(st1), dq(N * kd), dk(N * kd), dv(N * Hv * Dv);
  Dev<int32_t> dstarts(starts);
  Dev<uint64_t> dtab(
      std::vector<uint64_t>{reinterpret_cast<uint64_t>(ds0.p), reinterpret_cast<uint64_t>(ds1.p)});
  // Sequence 0 keeps its history (as a verify step does), sequence 1 none.
  Dev<float> dh0((K - 1 + 3) * C);
  Dev<uint64_t> dhist(std::vector<uint64_t>{reinterpret_cast<uint64_t>(dh0.p), 0});
  cuda::conv_silu_seqs(dxc.p, dstarts.p, reinterpret_cast<float* const*>(dtab.p),
                       reinterpret_cast<float* const*>(dhist.p), dcw.p, 2, C, K, kd, dq.p, dk.p,
                       dv.p, nullptr);
  const auto q = dq.host(), kk = dk.host(), v = dv.host(), s0 = ds0.host(), s1 = ds1.host();
  {
    std::vector<float> want(st0);
    want.insert(want.end(), xc.begin(), xc.begin() + 3 * C);
    EXPECT_EQ(dh0.host(), want) << "conv history: the old state's rows, then the inputs";
  }
  for (int seq = 0; seq < 2; ++seq) {  // reference: causal_conv_silu on [state | tokens]
    const int64_t t0 = starts[seq], T = starts[seq + 1] - t0;
    std::vector<float> in(seq == 0 ? st0 : st1);
    in.insert(in.end(), xc.begin() + t0 * C, xc.begin() + (t0 + T) * C);
    Dev<float> din(in), dout(T * C);
    cuda::causal_conv_silu(din.p, dcw.p, T, C, K, dout.p, nullptr);
    const auto out = dout.host();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const float got = c < kd       ? q[(t0 + t) * kd + c]
                          : c < 2 * kd ? kk[(t0 + t) * kd + c - kd]
                                       : v[(t0 + t) * Hv * Dv + c - 2 * kd];
        ASSERT_EQ(got, out[t * C + c]) << seq << " " << t << " " << c;
      }
    const auto& snew = seq == 0 ? s0 : s1;
    EXPECT_EQ(std::memcmp(snew.data(), in.data() + T * C, (K - 1) * C * sizeof(float)), 0);
  }

  std::vector<float> g(N * Hv), beta(N * Hv);
  for (size_t i = 0; i < g.size(); ++i) g[i] = -0.1f * (i % 7), beta[i] = 0.2f + 0.1f * (i % 5);
  const auto S0 = randn(Hv * Dk * Dv, 64), S1 = randn(Hv * Dk * Dv, 65);
  Dev<float> dg(g), db(beta), dS0(S0), dS1(S1), dout(N * Hv * Dv);
  Dev<uint64_t> dSt(
      std::vector<uint64_t>{reinterpret_cast<uint64_t>(dS0.p), reinterpret_cast<uint64_t>(dS1.p)});
  Dev<float> dSh(3 * Hv * Dk * Dv);  // sequence 0's states after each of its 3 tokens
  Dev<uint64_t> dShist(std::vector<uint64_t>{reinterpret_cast<uint64_t>(dSh.p), 0});
  cuda::delta_rule_seqs(
      dq.p, dk.p, dv.p, dg.p, db.p, dstarts.p, reinterpret_cast<float* const*>(dSt.p),
      reinterpret_cast<float* const*>(dShist.p), 2, Hk, Hv, Dk, Dv, dout.p, nullptr);
  {
    const auto hist = dSh.host();
    for (int64_t t = 0; t < 3; ++t) {  // the state after t + 1 tokens alone
      Dev<float> rS(S0), ro((t + 1) * Hv * Dv);
      cuda::delta_rule_recurrent(dq.p, dk.p, dv.p, dg.p, db.p, t + 1, Hk, Hv, Dk, Dv, rS.p, ro.p,
                                 nullptr);
      const auto want = rS.host();
      EXPECT_EQ(std::memcmp(hist.data() + t * Hv * Dk * Dv, want.data(), want.size() * 4), 0)
          << "state history after token " << t;
    }
  }
  Dev<float> rS0(S0), rS1(S1), rout(N * Hv * Dv);
  cuda::delta_rule_recurrent(dq.p, dk.p, dv.p, dg.p, db.p, 3, Hk, Hv, Dk, Dv, rS0.p, rout.p,
                             nullptr);
  cuda::delta_rule_recurrent(dq.p + 3 * kd, dk.p + 3 * kd, dv.p + 3 * Hv * Dv, dg.p + 3 * Hv,
                             db.p + 3 * Hv, 1, Hk, Hv, Dk, Dv, rS1.p, rout.p + 3 * Hv * Dv,
                             nullptr);
  EXPECT_EQ(dout.host(), rout.host());
  EXPECT_EQ(dS0.host(), rS0.host());
  EXPECT_EQ(dS1.host(), rS1.host());

  // Attention: sequence A (2 tokens at positions 5, 6 over a 7-row cache) and B (1 token at 2).
  const int64_t nh = 4, nkv = 2, D = 64, row = nkv * D, cap = 16;
  const auto cA = randn(cap * row, 66), vA = randn(cap * row, 67);
  const auto cB = randn(cap * row, 68), vB = randn(cap * row, 69);
  const auto qa = randn(3 * nh * D, 70), knew = randn(3 * row, 71), vnew = randn(3 * row, 72);
  const std::vector<int64_t> pos = {5, 6, 2};
  Dev<float> dcA(cA), dvA(vA), dcB(cB), dvB(vB), dqa(qa), dkn(knew), dvn(vnew), dao(3 * nh * D);
  Dev<int64_t> dpos(pos);
  auto u = [](const float* p) { return reinterpret_cast<uint64_t>(p); };
  Dev<uint64_t> kt(std::vector<uint64_t>{u(dcA.p), u(dcA.p), u(dcB.p)});
  Dev<uint64_t> vt(std::vector<uint64_t>{u(dvA.p), u(dvA.p), u(dvB.p)});
  cuda::kv_append(dkn.p, dvn.p, 3, row, dpos.p, reinterpret_cast<float* const*>(kt.p),
                  reinterpret_cast<float* const*>(vt.p), nullptr);
  cuda::attention_table(dqa.p, 3, dpos.p, reinterpret_cast<const float* const*>(kt.p),
                        reinterpret_cast<const float* const*>(vt.p), nh, nkv, D, 0.125f, nullptr,
                        dao.p, nullptr);
  std::vector<float> rcA(cA), rvA(vA), rcB(cB), rvB(vB);
  for (int i = 0; i < 2; ++i)
    for (int64_t j = 0; j < row; ++j)
      rcA[pos[i] * row + j] = knew[i * row + j], rvA[pos[i] * row + j] = vnew[i * row + j];
  for (int64_t j = 0; j < row; ++j)
    rcB[pos[2] * row + j] = knew[2 * row + j], rvB[pos[2] * row + j] = vnew[2 * row + j];
  EXPECT_EQ(dcA.host(), rcA);
  EXPECT_EQ(dvB.host(), rvB);
  Dev<float> ra(2 * nh * D), rb(nh * D);
  cuda::attention(dqa.p, 2, dpos.p, dcA.p, dvA.p, nh, nkv, D, 0.125f, ra.p, nullptr);
  cuda::attention(dqa.p + 2 * nh * D, 1, dpos.p + 2, dcB.p, dvB.p, nh, nkv, D, 0.125f, rb.p,
                  nullptr);
  auto all = ra.host();
  const auto b1 = rb.host();
  all.insert(all.end(), b1.begin(), b1.end());
  EXPECT_EQ(dao.host(), all);
}

// gdn_prep against the three ops it fuses (split_qkvz_gates, conv_silu_seqs, l2norm_scale_qk),
// bit for bit: outputs, conv states and the verify history, two sequences (3 tokens and 1) in one
// launch. Dk = 32 < the block's 128 threads, so the missing lanes' zeros are in the norm's tree.
TEST_F(CudaOps, GdnPrepMatchesSeparateOps) {
  const int64_t Hk = 2, Dk = 32, r = 2, Dv = 64, K = 4, N = 4, Hv = Hk * r, kd = Hk * Dk;
  const int64_t C = 2 * kd + Hv * Dv, W = Hk * (2 * Dk + 2 * r * Dv) + Hk * 2 * r;
  const std::vector<int32_t> starts = {0, 3, 4};
  const auto PB = randn(N * W, 110), cw = randn(C * K, 111), dtb = randn(Hv, 112);
  const auto st0 = randn((K - 1) * C, 113), st1 = randn((K - 1) * C, 114);
  std::vector<float> nea(Hv);
  for (int64_t i = 0; i < Hv; ++i) nea[i] = -1.0f - 0.5f * static_cast<float>(i);
  const float qs = 1.0f / std::sqrt(static_cast<float>(Dk));
  Dev<float> dPB(PB), dcw(cw), ddtb(dtb), dnea(nea);
  Dev<int32_t> dstarts(starts);
  auto u = [](const float* p) { return reinterpret_cast<uint64_t>(p); };
  // Fused.
  Dev<float> a0(st0), a1(st1), ah((K - 1 + 3) * C), aqk(2 * N * kd), av(N * Hv * Dv),
      az(N * Hv * Dv), ab(N * Hv), ag(N * Hv);
  Dev<uint64_t> at(std::vector<uint64_t>{u(a0.p), u(a1.p)}), ath(std::vector<uint64_t>{u(ah.p), 0});
  cuda::gdn_prep(dPB.p, dstarts.p, reinterpret_cast<float* const*>(at.p),
                 reinterpret_cast<float* const*>(ath.p), dcw.p, 2, Hk, Dk, r, Dv, K, ddtb.p, dnea.p,
                 qs, aqk.p, aqk.p + N * kd, av.p, az.p, ab.p, ag.p, nullptr);
  // Separate.
  Dev<float> b0(st0), b1(st1), bh((K - 1 + 3) * C), bqk(2 * N * kd), bv(N * Hv * Dv),
      bz(N * Hv * Dv), bb(N * Hv), bg(N * Hv), xc(N * C);
  Dev<uint64_t> bt(std::vector<uint64_t>{u(b0.p), u(b1.p)}), bth(std::vector<uint64_t>{u(bh.p), 0});
  cuda::split_qkvz_gates(dPB.p, N, Hk, Dk, r, Dv, ddtb.p, dnea.p, xc.p, bz.p, bb.p, bg.p, nullptr);
  cuda::conv_silu_seqs(xc.p, dstarts.p, reinterpret_cast<float* const*>(bt.p),
                       reinterpret_cast<float* const*>(bth.p), dcw.p, 2, C, K, kd, bqk.p,
                       bqk.p + N * kd, bv.p, nullptr);
  cuda::l2norm_scale_qk(bqk.p, N * Hk, N * Hk, Dk, 1e-6f, qs, nullptr);
  EXPECT_EQ(aqk.host(), bqk.host());
  EXPECT_EQ(av.host(), bv.host());
  EXPECT_EQ(az.host(), bz.host());
  EXPECT_EQ(ab.host(), bb.host());
  EXPECT_EQ(ag.host(), bg.host());
  EXPECT_EQ(a0.host(), b0.host());
  EXPECT_EQ(a1.host(), b1.host());
  EXPECT_EQ(ah.host(), bh.host());
}

// argmax_rows (ties to the lower index) and fill_uniform's range.
TEST_F(CudaOps, ArgmaxAndFill) {
  const int64_t n = 3, V = 151936;
  auto l = randn(n * V, 80);
  l[0 * V + 151935] = 9.0f;
  l[1 * V + 77] = 9.0f, l[1 * V + 78] = 9.0f;
  l[2 * V + 0] = 9.0f;
  Dev<float> dl(l);
  Dev<int32_t> out(n);
  Dev<float> prob(n);
  cuda::argmax_rows(dl.p, n, V, out.p, nullptr, prob.p);
  EXPECT_EQ(out.host(), (std::vector<int32_t>{151935, 77, 0}));
  const auto p = prob.host();
  for (int64_t t = 0; t < n; ++t) {  // softmax probability of the argmax, in double on the host
    double sum = 0;
    for (int64_t i = 0; i < V; ++i) sum += std::exp(double(l[t * V + i]) - 9.0);
    EXPECT_NEAR(p[t], 1.0 / sum, 1e-6 / sum) << t;
  }
  // The two-stage form (rows split over blocks): the same indices, the probability within
  // float rounding; and the ties across its chunks (151935 and 0 sit in the last and first).
  Dev<float> work(cuda::argmax_work_floats(n, V)), prob2(n);
  Dev<int32_t> out2(n);
  cuda::argmax_rows(dl.p, n, V, out2.p, nullptr, prob2.p, work.p);
  EXPECT_EQ(out2.host(), (std::vector<int32_t>{151935, 77, 0}));
  const auto p2 = prob2.host();
  for (int64_t t = 0; t < n; ++t) EXPECT_NEAR(p2[t], p[t], 1e-5 * p[t]) << t;
  l[1 * V + 4000] = 9.0f;  // a tie in a later chunk than 77's: 77 stays
  Dev<float> dl2(l);
  cuda::argmax_rows(dl2.p, n, V, out2.p, nullptr, nullptr, work.p);
  EXPECT_EQ(out2.host()[1], 77);

  Dev<float> f(100000);
  cuda::fill_uniform(DType::kF32, f.p, 100000, 7, 0.5f, 2.0f, nullptr);
  const auto fv = f.host();
  double mean = 0;
  for (float x : fv) {
    ASSERT_GE(x, 1.5f);
    ASSERT_LT(x, 2.5f);
    mean += x / 100000.0;
  }
  EXPECT_NEAR(mean, 2.0, 0.01);
}

// The fused kernels against the ops they replace, bit for bit: attn_prep (split, q/k norms, rope,
// cache append), attention_table with the output gate (attention + mul_sigmoid), l2norm_scale_qk
// (two l2norm_scale), and the shared expert as slot k of the expert kernels (ffn + moe_combine).
TEST_F(CudaOps, FusedKernelsMatchSeparateOps) {
  const int64_t n = 3, nh = 4, nkv = 2, D = 64, rd = 16, W = nh * 2 * D + 2 * nkv * D, cap = 8;
  const auto qkv = randn(n * W, 90), qn = randn(D, 91), kn = randn(D, 92);
  std::vector<float> inv(rd / 2);
  for (int64_t i = 0; i < rd / 2; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / rd);
  const std::vector<int64_t> pos = {0, 5, 7};
  Dev<float> dqkv(qkv), dqn(qn), dkn(kn), dinv(inv), q(n * nh * D), gate(n * nh * D);
  Dev<float> kc(cap * nkv * D), vc(cap * nkv * D), kc2(cap * nkv * D), vc2(cap * nkv * D);
  TF_CUDA_CHECK(cudaMemset(kc.p, 0, kc.n * 4));
  TF_CUDA_CHECK(cudaMemset(vc.p, 0, vc.n * 4));
  TF_CUDA_CHECK(cudaMemset(kc2.p, 0, kc.n * 4));
  TF_CUDA_CHECK(cudaMemset(vc2.p, 0, vc.n * 4));
  Dev<int64_t> dpos(pos);
  auto u = [](const float* p) { return reinterpret_cast<uint64_t>(p); };
  Dev<uint64_t> kt(std::vector<uint64_t>(n, u(kc.p))), vt(std::vector<uint64_t>(n, u(vc.p)));
  Dev<uint64_t> kt2(std::vector<uint64_t>(n, u(kc2.p))), vt2(std::vector<uint64_t>(n, u(vc2.p)));
  cuda::attn_prep(dqkv.p, n, nh, nkv, D, rd, dqn.p, dkn.p, 1e-6f, dinv.p, dpos.p, q.p, gate.p,
                  reinterpret_cast<float* const*>(kt.p), reinterpret_cast<float* const*>(vt.p),
                  nullptr);
  // The separate ops: split by copies, norms, ropes, kv_append.
  Dev<float> q2(n * nh * D), g2(n * nh * D), k2(n * nkv * D), v2(n * nkv * D);
  const size_t rb = D * 4;
  for (int64_t t = 0; t < n; ++t) {
    TF_CUDA_CHECK(cudaMemcpy2D(q2.p + t * nh * D, rb, dqkv.p + t * W, 2 * rb, rb, nh,
                               cudaMemcpyDeviceToDevice));
    TF_CUDA_CHECK(cudaMemcpy2D(g2.p + t * nh * D, rb, dqkv.p + t * W + D, 2 * rb, rb, nh,
                               cudaMemcpyDeviceToDevice));
    TF_CUDA_CHECK(cudaMemcpy(k2.p + t * nkv * D, dqkv.p + t * W + nh * 2 * D, nkv * rb,
                             cudaMemcpyDeviceToDevice));
    TF_CUDA_CHECK(cudaMemcpy(v2.p + t * nkv * D, dqkv.p + t * W + nh * 2 * D + nkv * D, nkv * rb,
                             cudaMemcpyDeviceToDevice));
  }
  cuda::rmsnorm_zc(q2.p, dqn.p, n * nh, D, 1e-6f, q2.p, nullptr);
  cuda::rmsnorm_zc(k2.p, dkn.p, n * nkv, D, 1e-6f, k2.p, nullptr);
  cuda::rope_neox(q2.p, n, nh, D, rd, dinv.p, dpos.p, nullptr);
  cuda::rope_neox(k2.p, n, nkv, D, rd, dinv.p, dpos.p, nullptr);
  cuda::kv_append(k2.p, v2.p, n, nkv * D, dpos.p, reinterpret_cast<float* const*>(kt2.p),
                  reinterpret_cast<float* const*>(vt2.p), nullptr);
  EXPECT_EQ(q.host(), q2.host());
  EXPECT_EQ(gate.host(), g2.host());
  EXPECT_EQ(kc.host(), kc2.host());
  EXPECT_EQ(vc.host(), vc2.host());

  Dev<float> o1(n * nh * D), o2(n * nh * D);
  cuda::attention_table(q.p, n, dpos.p, reinterpret_cast<const float* const*>(kt.p),
                        reinterpret_cast<const float* const*>(vt.p), nh, nkv, D, 0.125f, gate.p,
                        o1.p, nullptr);
  cuda::attention_table(q.p, n, dpos.p, reinterpret_cast<const float* const*>(kt.p),
                        reinterpret_cast<const float* const*>(vt.p), nh, nkv, D, 0.125f, nullptr,
                        o2.p, nullptr);
  cuda::mul_sigmoid(o2.p, gate.p, n * nh * D, nullptr);
  EXPECT_EQ(o1.host(), o2.host());

  const auto x = randn(10 * 128, 93);
  Dev<float> a(x), b1(std::vector<float>(x.begin(), x.begin() + 4 * 128)),
      b2(std::vector<float>(x.begin() + 4 * 128, x.end()));
  cuda::l2norm_scale_qk(a.p, 4, 6, 128, 1e-6f, 0.25f, nullptr);
  cuda::l2norm_scale(b1.p, 4, 128, 1e-6f, 0.25f, nullptr);
  cuda::l2norm_scale(b2.p, 6, 128, 1e-6f, 1.0f, nullptr);
  auto ab = b1.host();
  const auto bb = b2.host();
  ab.insert(ab.end(), bb.begin(), bb.end());
  EXPECT_EQ(a.host(), ab);

  const int64_t E = 8, I = 64, H = 128, k = 2;
  const auto wg = to_bf16(randn(E * I * H, 94)), wu = to_bf16(randn(E * I * H, 95));
  const auto wd = to_bf16(randn(E * H * I, 96));
  const auto sg = to_bf16(randn(I * H, 97)), su = to_bf16(randn(I * H, 98));
  const auto sd = to_bf16(randn(H * I, 99));
  const auto xe = randn(H, 100), gl = randn(1, 101);
  const std::vector<int32_t> ex = {6, 1};
  const std::vector<float> w = {0.7f, 0.3f};
  Dev<uint16_t> dg(wg), du(wu), dd(wd), dsg(sg), dsu(su), dsd(sd);
  // The gate at a stride of 3 (as in the model's [router | gate] rows); a residual x0 and the
  // next layer's norm nw.
  const std::vector<float> glr = {0.5f, 0.25f, gl[0]};
  const auto x0 = randn(H, 102), nw = randn(H, 103);
  Dev<float> dx(xe), dgl(glr), dw(w), h(3 * I), o(3 * H), y(x0), yn(H), dnw(nw);
  Dev<int32_t> dex(ex);
  cuda::expert_gate_up(DType::kBF16, dg.p, du.p, I, H, dex.p, k, dx.p, 1, h.p, nullptr, dsg.p,
                       dsu.p);
  cuda::expert_down(DType::kBF16, dd.p, H, I, dex.p, k, h.p, 1, o.p, nullptr, dsd.p);
  cuda::moe_combine(o.p, dex.p, dw.p, 1, k, H, nullptr, true, dgl.p + 2, 3, y.p, dnw.p, 1e-6f, yn.p,
                    nullptr);
  Dev<float> h2(2 * I), oo(2 * H), sh_h(I), sh(H), y2(std::vector<float>(H, 0.0f));
  cuda::expert_gate_up(DType::kBF16, dg.p, du.p, I, H, dex.p, k, dx.p, 1, h2.p, nullptr);
  cuda::expert_down(DType::kBF16, dd.p, H, I, dex.p, k, h2.p, 1, oo.p, nullptr);
  cuda::expert_gate_up(DType::kBF16, dsg.p, dsu.p, I, H, nullptr, 1, dx.p, 1, sh_h.p, nullptr);
  cuda::expert_down(DType::kBF16, dsd.p, H, I, nullptr, 1, sh_h.p, 1, sh.p, nullptr);
  cuda::moe_combine(oo.p, dex.p, dw.p, 1, k, H, sh.p, false, dgl.p + 2, 1, y2.p, nullptr, 0.0f,
                    nullptr, nullptr);
  // x0 + the separate path's MoE output, bit for bit; the fused norm against the CPU's.
  const auto moe_out = y2.host();
  std::vector<float> want(H);
  for (int64_t d = 0; d < H; ++d) want[d] = x0[d] + moe_out[d];
  EXPECT_EQ(y.host(), want);
  std::vector<float> ref(H);
  cpu::rmsnorm_zc(want.data(), nw.data(), 1, H, 1e-6f, ref.data());
  EXPECT_LT(rel_l2(yn.host(), ref), 1e-6);

  // The model's launches: on a stream of their own (programmatic launch), expert_down reading
  // the ids before its wait (follows_gate_up) and moe_combine the routing (routing_settled):
  // the same bits. (A build whose early path read each slot's id from the next slot failed here.)
  cudaStream_t st;
  TF_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  Dev<float> h3(3 * I), o3(3 * H), y3(x0), yn3(H);
  cuda::expert_gate_up(DType::kBF16, dg.p, du.p, I, H, dex.p, k, dx.p, 1, h3.p, st, dsg.p, dsu.p);
  cuda::expert_down(DType::kBF16, dd.p, H, I, dex.p, k, h3.p, 1, o3.p, st, dsd.p,
                    /*follows_gate_up=*/true);
  cuda::moe_combine(o3.p, dex.p, dw.p, 1, k, H, nullptr, true, dgl.p + 2, 3, y3.p, dnw.p, 1e-6f,
                    yn3.p, st, nullptr, nullptr, /*routing_settled=*/true);
  TF_CUDA_CHECK(cudaStreamSynchronize(st));
  TF_CUDA_CHECK(cudaStreamDestroy(st));
  EXPECT_EQ(o3.host(), o.host());
  EXPECT_EQ(y3.host(), y.host());
  EXPECT_EQ(yn3.host(), yn.host());
}

}  // namespace
}  // namespace tf
