// The NCCL communicator on one GPU (label cuda; skipped without a device): a group of one over the
// single-rank bootstrap, and the rank-order sum kernel against the CPU's rank-order sum, bit for
// bit. The multi-GPU run waits for a machine with several GPUs (docs/PERFORMANCE.md).
#include <cmath>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "comm/nccl_comm.h"
#include "comm/nccl_sum.h"

namespace tf {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

struct DeviceFloats {
  explicit DeviceFloats(size_t n) { EXPECT_EQ(cudaMalloc(&p, n * sizeof(float)), cudaSuccess); }
  ~DeviceFloats() { cudaFree(p); }
  float* p = nullptr;
};

TEST(NcclComm, SumKernelAddsInRankOrder) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int R = 5;
  const int64_t n = 10007;
  std::vector<float> g(R * n), want(n), got(n);
  for (int r = 0; r < R; ++r)
    for (int64_t i = 0; i < n; ++i)
      g[r * n + i] =
          std::sin(0.1f * static_cast<float>(i * (r + 1))) * std::ldexp(1.0f, r * 7 - 14);
  for (int64_t i = 0; i < n; ++i) {
    float acc = g[i];
    for (int r = 1; r < R; ++r) acc += g[r * n + i];
    want[i] = acc;
  }
  DeviceFloats dg(R * n), dx(n);
  ASSERT_EQ(cudaMemcpy(dg.p, g.data(), g.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  launch_sum_in_rank_order(dg.p, n, R, dx.p, nullptr);
  ASSERT_EQ(cudaMemcpy(got.data(), dx.p, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0);
}

TEST(NcclComm, GroupOfOne) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto boot = make_single_communicator();
  auto comm = make_nccl_communicator(*boot, 0);
  ASSERT_TRUE(comm) << comm.status().to_string();
  EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");
  Communicator& c = **comm;
  EXPECT_EQ(c.size(), 1);
  std::vector<float> h{1.5f, -2.25f, 3.0f}, back(3);
  DeviceFloats x(3), y(3);
  ASSERT_EQ(cudaMemcpy(x.p, h.data(), 3 * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_TRUE(c.all_reduce_sum(x.p, 3).is_ok());
  ASSERT_TRUE(c.all_gather(x.p, 3, y.p).is_ok());
  ASSERT_TRUE(c.broadcast(y.p, 3 * sizeof(float), 0).is_ok());
  ASSERT_TRUE(c.barrier().is_ok());
  ASSERT_EQ(cudaMemcpy(back.data(), y.p, 3 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, h);
}

}  // namespace
}  // namespace tf
