// CUDA ops against the CPU reference on fresh random inputs, and batch invariance on CUDA (a row's
// output is the same bits in any batch). Runs where a CUDA device is present; skips elsewhere (CI
// compiles it, the H200 machine runs it).
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

}  // namespace
}  // namespace tf
