// The CPU kernels: matmul's canonical per-element arithmetic (bit-exact against a scalar model of
// it, whatever the batch size, tile or threads), and the fused / vectorised ops (bitwise invariant
// to batch composition and threads, and accurate against double-precision references).
#include <cmath>
#include <cstring>
#include <numeric>

#include <gtest/gtest.h>

#include "backends/cpu/matmul.h"
#include "backends/cpu/moe.h"
#include "backends/cpu/ops.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/simd.h"
#include "unit/test_util.h"

namespace tf {
namespace {

using testing::random_vector;
using testing::rel_l2;

bool same_bits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// A random matrix stored in `dt`, with its f32 values.
struct TestMat {
  std::vector<float> f;  // values as f32 (after rounding to dt)
  std::vector<uint16_t> h;
  cpu::Mat m;
  TestMat(DType dt, int64_t rows, int64_t cols, uint32_t seed, float scale = 1.0f) {
    f = random_vector(rows * cols, seed, scale);
    if (dt != DType::kF32) {
      h.resize(f.size());
      for (size_t i = 0; i < f.size(); ++i) {
        h[i] = dt == DType::kBF16 ? f32_to_bf16(f[i])
                                  : std::bit_cast<uint16_t>(static_cast<_Float16>(f[i]));
        f[i] = dt == DType::kBF16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
      }
    }
    m = cpu::Mat{dt, dt == DType::kF32 ? static_cast<const void*>(f.data()) : h.data(), rows, cols};
  }
};

// The reduction of 16 lanes: (l_i + l_i+8), (+4), (+2), (+1).
float reduce_tree(const float* l) {
  float t[8], s[4];
  for (int i = 0; i < 8; ++i) t[i] = l[i] + l[i + 8];
  for (int i = 0; i < 4; ++i) s[i] = t[i] + t[i + 4];
  return (s[0] + s[2]) + (s[1] + s[3]);
}

// The canonical sequence of one element, written out in scalar code: 16 lanes, one fma per lane
// per block of 16 (zeros past K), then the tree (l_i + l_i+8), (+4), (+2), (+1).
float canonical_dot(const float* w, const float* x, int64_t K) {
  float l[16] = {};
  for (int64_t k0 = 0; k0 < K; k0 += 16) {
    for (int i = 0; i < 16; ++i) {
      const bool in = k0 + i < K;
      l[i] = std::fma(in ? w[k0 + i] : 0.0f, in ? x[k0 + i] : 0.0f, l[i]);
    }
  }
  return reduce_tree(l);
}

TEST(Kernels, MatmulIsTheCanonicalSequence) {
  ThreadPool pool2(2), pool3(3);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t cols : {5, 16, 75, 160, 2048}) {
      const int64_t rows = cols == 2048 ? 29 : 37;
      TestMat w(dt, rows, cols, 7 + cols);
      for (int64_t n : {1, 2, 3, 4, 5, 7, 9, 13, 50}) {
        const auto x = random_vector(n * cols, 100 + n);
        std::vector<float> ref(n * rows);
        for (int64_t t = 0; t < n; ++t)
          for (int64_t r = 0; r < rows; ++r)
            ref[t * rows + r] = canonical_dot(&w.f[r * cols], &x[t * cols], cols);
        for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2, &pool3}) {
          std::vector<float> y(n * rows, -1.0f);
          cpu::matmul(w.m, x.data(), n, y.data(), pool);
          ASSERT_TRUE(same_bits(y.data(), ref.data(), y.size()))
              << dtype_name(dt) << " cols " << cols << " n " << n << " threads "
              << (pool ? pool->size() : 1);
        }
      }
    }
  }
}

// The bf16-products sequence of one element (--matmul-precision bf16), in scalar code: x rounded to
// bf16; 16 lanes, lane i adding, per block of 32 columns (zeros past K), the product of column
// 2i + 1 and then that of column 2i (as the ISA documents VDPBF16PS: each product exact, each
// addition rounded to fp32); then the fp32 sequence's tree.
float canonical_dot_bf16_inputs(const float* w, const float* x, int64_t K) {
  auto at = [&](const float* v, int64_t k) { return k < K ? v[k] : 0.0f; };
  auto xr = [&](int64_t k) { return bf16_to_f32(f32_to_bf16(at(x, k))); };
  float l[16] = {};
  for (int64_t k0 = 0; k0 < K; k0 += 32) {
    for (int i = 0; i < 16; ++i) {
      const int64_t e = k0 + 2 * i, o = e + 1;
      l[i] += at(w, o) * xr(o);
      l[i] += at(w, e) * xr(e);
    }
  }
  return reduce_tree(l);
}

// bf16 products: bit for bit the documented sequence for every batch size, tile and thread split
// (batch invariance, as with fp32 inputs), and within bf16 input rounding of the exact product.
// (Checked to fail with the kernel's x halves swapped in the conversion to bf16, and with this
// reference adding each pair even-then-odd: the processor follows the documented order.)
TEST(Kernels, MatmulBf16InputsIsTheCanonicalSequence) {
  ThreadPool pool2(2), pool3(3);
  for (int64_t cols : {5, 16, 31, 33, 75, 160, 2048}) {
    const int64_t rows = cols == 2048 ? 29 : 37;
    TestMat w(DType::kBF16, rows, cols, 17 + cols);
    w.m.bf16_inputs = true;
    for (int64_t n : {1, 2, 3, 4, 5, 7, 9, 13, 50}) {
      const auto x = random_vector(n * cols, 200 + n);
      std::vector<float> ref(n * rows);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
          const float* wr = &w.f[r * cols];
          const float* xt = &x[t * cols];
          ref[t * rows + r] = canonical_dot_bf16_inputs(wr, xt, cols);
          double exact = 0, bound = 0;
          for (int64_t k = 0; k < cols; ++k) {
            exact += double(wr[k]) * xt[k];
            bound += std::abs(double(wr[k]) * xt[k]);
          }
          // x's rounding to bf16 (8 significant bits) moves each product by at most 2^-8 of
          // itself; the fp32 sums add far less.
          ASSERT_NEAR(ref[t * rows + r], exact, bound * (1.0 / 256 + 1e-5)) << cols << " " << r;
        }
      }
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2, &pool3}) {
        std::vector<float> y(n * rows, -1.0f);
        cpu::matmul(w.m, x.data(), n, y.data(), pool);
        ASSERT_TRUE(same_bits(y.data(), ref.data(), y.size()))
            << "cols " << cols << " n " << n << " threads " << (pool ? pool->size() : 1);
      }
    }
  }
}

// Strided x / y and several products in one dispatch: the same bits as one matmul each, with fp32
// or bf16 inputs (products on the same input share its rounding to bf16: a and e).
TEST(Kernels, MatmulMultiMatchesSeparateProducts) {
  ThreadPool pool(2);
  for (bool bf16 : {false, true}) {
    TestMat a(DType::kBF16, 300, 64, 1), b(DType::kBF16, 7, 64, 2), c(DType::kF32, 50, 32, 3),
        e(DType::kBF16, 9, 64, 5);
    a.m.bf16_inputs = b.m.bf16_inputs = e.m.bf16_inputs = bf16;
    const int64_t n = 6, ldx = 100;
    const auto x = random_vector(n * ldx, 4);
    std::vector<float> ya(n * 300), yb(n * 7), yc(n * 60), ye(n * 9), ra(ya.size()), rb(yb.size()),
        rc(n * 50), re(ye.size());
    const cpu::MatmulJob jobs[] = {
        {a.m, x.data(), ldx, ya.data(), 0},
        {b.m, x.data() + 1, ldx, yb.data(), 0},
        {c.m, x.data() + 64, ldx, yc.data(), 60},
        {e.m, x.data(), ldx, ye.data(), 0},
    };
    cpu::matmul_multi(jobs, n, &pool);
    cpu::matmul(a.m, x.data(), ldx, n, ra.data(), 300, nullptr);
    cpu::matmul(b.m, x.data() + 1, ldx, n, rb.data(), 7, nullptr);
    cpu::matmul(c.m, x.data() + 64, ldx, n, rc.data(), 50, nullptr);
    cpu::matmul(e.m, x.data(), ldx, n, re.data(), 9, nullptr);
    EXPECT_TRUE(same_bits(ya.data(), ra.data(), ya.size())) << bf16;
    EXPECT_TRUE(same_bits(yb.data(), rb.data(), yb.size())) << bf16;
    EXPECT_TRUE(same_bits(ye.data(), re.data(), ye.size())) << bf16;
    for (int64_t t = 0; t < n; ++t) EXPECT_TRUE(same_bits(&yc[t * 60], &rc[t * 50], 50)) << t;
  }
}

TEST(Kernels, ParallelRegionBarrierOrdersPhases) {
  ThreadPool pool(3);
  std::vector<int> a(3, 0), b(3, 0);
  for (int rep = 0; rep < 200; ++rep) {
    cpu::parallel_region(&pool, [&](const cpu::Worker& w) {
      a[w.id] = rep;
      w.sync();
      b[w.id] = a[(w.id + 1) % w.n];  // written by another thread before the barrier
      w.sync();
    });
    for (int i = 0; i < 3; ++i) ASSERT_EQ(b[i], rep);
  }
}

// ---- MoE / FFN -------------------------------------------------------------------------------

struct MoeCase {
  int64_t H = 48, I = 24, Is = 40, E = 6, k = 2;
  std::vector<TestMat> mats;  // per expert gate, up, down; then shared gate, up, down; router
  std::vector<cpu::FfnMats> experts;
  cpu::FfnMats shared;
  std::vector<float> shared_gate;
  cpu::MoeArgs args;
  explicit MoeCase(DType dt, bool bf16_inputs = false) {
    mats.reserve(3 * E + 4);
    for (int64_t e = 0; e < E; ++e) {
      mats.emplace_back(dt, I, H, 10 + 3 * e, 0.3f);
      mats.emplace_back(dt, I, H, 11 + 3 * e, 0.3f);
      mats.emplace_back(dt, H, I, 12 + 3 * e, 0.3f);
    }
    mats.emplace_back(dt, Is, H, 90, 0.3f);
    mats.emplace_back(dt, Is, H, 91, 0.3f);
    mats.emplace_back(dt, H, Is, 92, 0.3f);
    mats.emplace_back(dt, E, H, 93, 0.5f);
    for (TestMat& m : mats) m.m.bf16_inputs = bf16_inputs;
    for (int64_t e = 0; e < E; ++e)
      experts.push_back({mats[3 * e].m, mats[3 * e + 1].m, mats[3 * e + 2].m});
    shared = {mats[3 * E].m, mats[3 * E + 1].m, mats[3 * E + 2].m};
    shared_gate = random_vector(H, 94, 0.2f);
    args.router = mats[3 * E + 3].m;
    args.experts = experts.data();
    args.top_k = k;
    args.norm_topk_prob = true;
    args.shared = &shared;
    args.shared_gate = shared_gate.data();
  }
  // Double-precision reference of one row.
  std::vector<double> reference(const float* x) const {
    auto ffn = [&](const std::vector<TestMat>& m, size_t base, int64_t I_, std::vector<double>* y,
                   double scale) {
      std::vector<double> h(I_);
      for (int64_t i = 0; i < I_; ++i) {
        double g = 0, u = 0;
        for (int64_t d = 0; d < H; ++d) {
          g += double(m[base].f[i * H + d]) * x[d];
          u += double(m[base + 1].f[i * H + d]) * x[d];
        }
        h[i] = g / (1 + std::exp(-g)) * u;
      }
      for (int64_t d = 0; d < H; ++d) {
        double s = 0;
        for (int64_t i = 0; i < I_; ++i) s += double(m[base + 2].f[d * I_ + i]) * h[i];
        (*y)[d] += scale * s;
      }
    };
    std::vector<double> logit(E), y(H, 0.0);
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t d = 0; d < H; ++d) logit[e] += double(mats[3 * E + 3].f[e * H + d]) * x[d];
    }
    const double mx = *std::max_element(logit.begin(), logit.end());
    double sum = 0;
    for (double& l : logit) sum += (l = std::exp(l - mx));
    std::vector<int64_t> idx(E);
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](int64_t i, int64_t j) { return logit[i] > logit[j]; });
    double wsum = 0;
    for (int64_t j = 0; j < k; ++j) wsum += logit[idx[j]];
    for (int64_t j = 0; j < k; ++j) ffn(mats, 3 * idx[j], I, &y, logit[idx[j]] / wsum);
    double gd = 0;
    for (int64_t d = 0; d < H; ++d) gd += double(shared_gate[d]) * x[d];
    ffn(mats, 3 * E, Is, &y, 1 / (1 + std::exp(-gd)));
    return y;
  }
};

// With bf16 products too: 24 rows put more than 4 on most experts, so the batched call multiplies
// x rounded once (kern::XRows::bf16, gathered per expert) and a row alone rounds on the fly; the
// bits must agree. (Checked to fail with the rounded rows read without the expert's gather.)
TEST(Kernels, MoeMatchesReferenceAndIsBatchAndThreadInvariant) {
  for (const auto& [dt, bf16] :
       {std::pair{DType::kF32, false}, {DType::kBF16, false}, {DType::kBF16, true}}) {
    MoeCase c(dt, bf16);
    const int64_t N = 24, H = c.H;
    const auto x = random_vector(N * H, 5);
    std::vector<float> batched(N * H);
    cpu::moe_ffn(c.args, x.data(), N, batched.data(), nullptr);
    for (int64_t t = 0; t < N; ++t) {
      const auto ref = c.reference(&x[t * H]);
      std::vector<float> reff(ref.begin(), ref.end());
      // bf16 inputs: each product within 2^-8 of its terms' sum; the rows, a few hundredths.
      EXPECT_LT(rel_l2(&batched[t * H], reff.data(), H), bf16 ? 3e-2 : 1e-5) << "row " << t;
      std::vector<float> alone(H);
      cpu::moe_ffn(c.args, &x[t * H], 1, alone.data(), nullptr);
      EXPECT_TRUE(same_bits(alone.data(), &batched[t * H], H)) << "row " << t;
    }
    for (int threads : {2, 3}) {
      ThreadPool pool(threads);
      std::vector<float> y(N * H);
      cpu::moe_ffn(c.args, x.data(), N, y.data(), &pool);
      EXPECT_TRUE(same_bits(y.data(), batched.data(), y.size())) << threads;
      // Rows in another order and beside other rows: each row's bits stay.
      std::vector<float> x2(3 * H), y2(3 * H);
      std::copy_n(&x[7 * H], H, &x2[0]);
      std::copy_n(&x[2 * H], H, &x2[H]);
      std::copy_n(&x[7 * H], H, &x2[2 * H]);
      cpu::moe_ffn(c.args, x2.data(), 3, y2.data(), &pool);
      EXPECT_TRUE(same_bits(&y2[0], &batched[7 * H], H));
      EXPECT_TRUE(same_bits(&y2[H], &batched[2 * H], H));
      EXPECT_TRUE(same_bits(&y2[2 * H], &batched[7 * H], H));
    }
  }
}

TEST(Kernels, DenseFfnMatchesReference) {
  MoeCase c(DType::kBF16);
  const int64_t N = 9, H = c.H, I = c.Is;
  const auto x = random_vector(N * H, 8);
  std::vector<float> y(N * H), y1(H);
  ThreadPool pool(2);
  cpu::ffn(c.shared, x.data(), N, y.data(), &pool);
  for (int64_t t = 0; t < N; ++t) {
    std::vector<double> h(I);
    for (int64_t i = 0; i < I; ++i) {
      double g = 0, u = 0;
      for (int64_t d = 0; d < H; ++d) {
        g += double(c.mats[3 * c.E].f[i * H + d]) * x[t * H + d];
        u += double(c.mats[3 * c.E + 1].f[i * H + d]) * x[t * H + d];
      }
      h[i] = g / (1 + std::exp(-g)) * u;
    }
    std::vector<float> ref(H);
    for (int64_t d = 0; d < H; ++d) {
      double s = 0;
      for (int64_t i = 0; i < I; ++i) s += double(c.mats[3 * c.E + 2].f[d * I + i]) * h[i];
      ref[d] = static_cast<float>(s);
    }
    EXPECT_LT(rel_l2(&y[t * H], ref.data(), H), 1e-5) << t;
    cpu::ffn(c.shared, &x[t * H], 1, y1.data(), nullptr);
    EXPECT_TRUE(same_bits(y1.data(), &y[t * H], H)) << t;
  }
}

// ---- element-wise and sequence ops -------------------------------------------------------------

TEST(Kernels, VectorExpAndSiluAreAccurate) {
  double worst_exp = 0, worst_silu = 0;
  for (float v = -87.0f; v < 88.0f; v += 0.0123f) {
    float in[16], e[16], s[16];
    for (int i = 0; i < 16; ++i) in[i] = v + 0.0007f * i;
    cpu::simd::store(e, cpu::simd::exp(cpu::simd::load(in, cpu::simd::mask_for(16))),
                     cpu::simd::mask_for(16));
    cpu::simd::store(s, cpu::simd::silu(cpu::simd::load(in, cpu::simd::mask_for(16))),
                     cpu::simd::mask_for(16));
    for (int i = 0; i < 16; ++i) {
      const double x = in[i], re = std::exp(x), rs = x / (1 + std::exp(-x));
      worst_exp = std::max(worst_exp, std::abs(e[i] - re) / re);
      if (rs != 0) worst_silu = std::max(worst_silu, std::abs(s[i] - rs) / std::abs(rs));
    }
  }
  EXPECT_LT(worst_exp, 2.5e-7);  // ~2 ulp
  EXPECT_LT(worst_silu, 5e-7);
  float in[16] = {NAN, INFINITY, -INFINITY, 1000.0f, -1000.0f, 0.0f}, out[16];
  cpu::simd::store(out, cpu::simd::exp(cpu::simd::load(in, cpu::simd::mask_for(6))),
                   cpu::simd::mask_for(6));
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_GT(out[1], 3e38f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_GT(out[3], 3e38f);
  EXPECT_EQ(out[4], 0.0f);
  EXPECT_EQ(out[5], 1.0f);
}

TEST(Kernels, NormsMatchReference) {
  const int64_t n = 5, dim = 75;
  const auto x = random_vector(n * dim, 1), w = random_vector(dim, 2, 0.1f),
             z = random_vector(n * dim, 3);
  std::vector<float> y(n * dim), g(n * dim), l = x;
  cpu::rmsnorm_zc(x.data(), w.data(), n, dim, 1e-6f, y.data());
  cpu::rmsnorm_gated(x.data(), z.data(), w.data(), n, dim, 1e-6f, g.data());
  cpu::l2norm_scale(l.data(), n, dim, 1e-6f, 0.5f);
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t d = 0; d < dim; ++d) ss += double(x[i * dim + d]) * x[i * dim + d];
    std::vector<float> ry(dim), rg(dim), rl(dim);
    for (int64_t d = 0; d < dim; ++d) {
      const double xv = x[i * dim + d], zv = z[i * dim + d];
      ry[d] = static_cast<float>(xv / std::sqrt(ss / dim + 1e-6) * (1 + w[d]));
      rg[d] = static_cast<float>(w[d] * xv / std::sqrt(ss / dim + 1e-6) * zv / (1 + std::exp(-zv)));
      rl[d] = static_cast<float>(xv / std::sqrt(ss + 1e-6) * 0.5);
    }
    EXPECT_LT(rel_l2(&y[i * dim], ry.data(), dim), 1e-6);
    EXPECT_LT(rel_l2(&g[i * dim], rg.data(), dim), 1e-6);
    EXPECT_LT(rel_l2(&l[i * dim], rl.data(), dim), 1e-6);
    // One row alone: the same bits.
    std::vector<float> y1(dim);
    cpu::rmsnorm_zc(&x[i * dim], w.data(), 1, dim, 1e-6f, y1.data());
    EXPECT_TRUE(same_bits(y1.data(), &y[i * dim], dim));
  }
}

TEST(Kernels, CausalConvMatchesReferenceAndSplits) {
  const int64_t T = 9, C = 37, K = 4;
  const auto in = random_vector((K - 1 + T) * C, 1), w = random_vector(C * K, 2, 0.5f);
  std::vector<float> out(T * C);
  cpu::causal_conv_silu(in.data(), w.data(), T, C, K, out.data());
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> ref(C);
    for (int64_t c = 0; c < C; ++c) {
      double s = 0;
      for (int64_t j = 0; j < K; ++j) s += double(w[c * K + j]) * in[(t + j) * C + c];
      ref[c] = static_cast<float>(s / (1 + std::exp(-s)));
    }
    EXPECT_LT(rel_l2(&out[t * C], ref.data(), C), 1e-6) << t;
    // Token t alone, from its own window: the same bits.
    std::vector<float> one(C);
    cpu::causal_conv_silu(&in[t * C], w.data(), 1, C, K, one.data());
    EXPECT_TRUE(same_bits(one.data(), &out[t * C], C)) << t;
  }
}

// The batch (6 tokens on 3 threads) runs the query heads in pairs that share their key and value
// loads, each token alone runs them one by one: the same bits either way. Checked to fail when the
// paired path sums the value rows in reverse key order.
TEST(Kernels, AttentionMatchesReferenceAndIsQueryInvariant) {
  const int64_t T = 6, nh = 4, nkv = 2, D = 40, L = 20;
  const auto q = random_vector(T * nh * D, 1), k = random_vector(L * nkv * D, 2),
             v = random_vector(L * nkv * D, 3);
  std::vector<int64_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = L - T + t;
  std::vector<float> out(T * nh * D);
  ThreadPool pool(3);
  cpu::attention(q.data(), T, pos.data(), k.data(), v.data(), nh, nkv, D, 0.2f, out.data(), &pool);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t kvh = h / (nh / nkv);
      std::vector<double> s(pos[t] + 1);
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j <= pos[t]; ++j) {
        double d = 0;
        for (int64_t e = 0; e < D; ++e)
          d += double(q[(t * nh + h) * D + e]) * k[(j * nkv + kvh) * D + e];
        mx = std::max(mx, s[j] = d * 0.2);
      }
      for (double& e : s) sum += (e = std::exp(e - mx));
      std::vector<float> ref(D);
      for (int64_t e = 0; e < D; ++e) {
        double o = 0;
        for (int64_t j = 0; j <= pos[t]; ++j) o += s[j] * v[(j * nkv + kvh) * D + e];
        ref[e] = static_cast<float>(o / sum);
      }
      EXPECT_LT(rel_l2(&out[(t * nh + h) * D], ref.data(), D), 1e-6);
    }
    std::vector<float> one(nh * D);
    cpu::attention(&q[t * nh * D], 1, &pos[t], k.data(), v.data(), nh, nkv, D, 0.2f, one.data(),
                   nullptr);
    EXPECT_TRUE(same_bits(one.data(), &out[t * nh * D], nh * D)) << t;
  }
}

struct DeltaCase {
  int64_t T, Hk = 2, Hv = 4, Dk = 24, Dv = 40;
  std::vector<float> q, k, v, g, beta, S0;
  DeltaCase(int64_t T_, uint32_t seed) : T(T_) {
    q = random_vector(T * Hk * Dk, seed);
    k = random_vector(T * Hk * Dk, seed + 1);
    cpu::l2norm_scale(q.data(), T * Hk, Dk, 1e-6f, 0.2f);
    cpu::l2norm_scale(k.data(), T * Hk, Dk, 1e-6f, 1.0f);
    v = random_vector(T * Hv * Dv, seed + 2);
    g = random_vector(T * Hv, seed + 3, 0.3f);
    beta = random_vector(T * Hv, seed + 4);
    for (auto& x : g) x = -std::abs(x);
    for (auto& x : beta) x = 1 / (1 + std::exp(-x));
    S0 = random_vector(Hv * Dk * Dv, seed + 5, 0.5f);
  }
  cpu::DeltaArgs args(int64_t t0, int64_t n, float* S, float* out) {
    return {q.data() + t0 * Hk * Dk,
            k.data() + t0 * Hk * Dk,
            v.data() + t0 * Hv * Dv,
            g.data() + t0 * Hv,
            beta.data() + t0 * Hv,
            n,
            Hk,
            Hv,
            Dk,
            Dv,
            S,
            out};
  }
  // The recurrence in double precision: outputs [T, Hv, Dv] and the final state.
  void reference(std::vector<double>* out, std::vector<double>* S) const {
    S->assign(S0.begin(), S0.end());
    out->assign(T * Hv * Dv, 0.0);
    const int64_t r = Hv / Hk;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < Hv; ++h) {
        double* s = S->data() + h * Dk * Dv;
        const float* kt = &k[(t * Hk + h / r) * Dk];
        const float* qt = &q[(t * Hk + h / r) * Dk];
        const double dec = std::exp(double(g[t * Hv + h])), b = beta[t * Hv + h];
        for (int64_t i = 0; i < Dk * Dv; ++i) s[i] *= dec;
        for (int64_t j = 0; j < Dv; ++j) {
          double kv = 0;
          for (int64_t i = 0; i < Dk; ++i) kv += s[i * Dv + j] * kt[i];
          const double d = b * (v[(t * Hv + h) * Dv + j] - kv);
          double o = 0;
          for (int64_t i = 0; i < Dk; ++i) {
            s[i * Dv + j] += kt[i] * d;
            o += s[i * Dv + j] * qt[i];
          }
          (*out)[(t * Hv + h) * Dv + j] = o;
        }
      }
    }
  }
};

std::vector<float> to_float(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

// Verify passes run k+1 tokens through the recurrence at once: each token must get the bits of a
// one-token decode step.
TEST(Kernels, DeltaRecurrentMatchesReferenceAndStepwise) {
  const int64_t T = 7;
  DeltaCase c(T, 21);
  std::vector<double> rout, rS;
  c.reference(&rout, &rS);
  ThreadPool pool(3);
  std::vector<float> S1 = c.S0, o1(T * c.Hv * c.Dv);
  cpu::delta_rule_recurrent(c.args(0, T, S1.data(), o1.data()), &pool);
  EXPECT_LT(rel_l2(o1.data(), to_float(rout).data(), o1.size()), 1e-5);
  EXPECT_LT(rel_l2(S1.data(), to_float(rS).data(), S1.size()), 1e-5);
  std::vector<float> S2 = c.S0, o2(o1.size());
  for (int64_t t = 0; t < T; ++t) {
    cpu::delta_rule_recurrent(c.args(t, 1, S2.data(), o2.data() + t * c.Hv * c.Dv), nullptr);
  }
  EXPECT_TRUE(same_bits(o1.data(), o2.data(), o1.size()));
  EXPECT_TRUE(same_bits(S1.data(), S2.data(), S1.size()));
}

TEST(Kernels, DeltaChunkedMatchesReference) {
  for (int64_t T : {1, 5, 16, 37}) {
    DeltaCase c(T, 31 + T);
    std::vector<double> rout, rS;
    c.reference(&rout, &rS);
    std::vector<float> S = c.S0, o(T * c.Hv * c.Dv);
    ThreadPool pool(2);
    cpu::delta_rule_chunked(c.args(0, T, S.data(), o.data()), /*pos0=*/3, 16, &pool);
    EXPECT_LT(rel_l2(o.data(), to_float(rout).data(), o.size()), 1e-5) << T;
    EXPECT_LT(rel_l2(S.data(), to_float(rS).data(), S.size()), 1e-5) << T;
    std::vector<float> S1 = c.S0, o1(o.size());
    cpu::delta_rule_chunked(c.args(0, T, S1.data(), o1.data()), 3, 16, nullptr);
    EXPECT_TRUE(same_bits(o.data(), o1.data(), o.size())) << T;
  }
}

}  // namespace
}  // namespace tf
