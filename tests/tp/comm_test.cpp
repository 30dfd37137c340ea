// The MPI communicator, run under `mpirun -np N` (ctest label tp). Each rank's data is a known
// function of (rank, i), so every rank can compute the expected results itself.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "comm/mpi_comm.h"

namespace tf {
namespace {

Communicator* g_comm = nullptr;

// Values with many mantissa bits and mixed magnitudes, so the order of additions shows in the bits.
float value(int rank, int64_t i) {
  return std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(rank)) *
         std::pow(10.0f, static_cast<float>((i + rank) % 7) - 3.0f);
}

TEST(MpiComm, AllReduceSumIsTheRankOrderSumOnEveryRank) {
  const int R = g_comm->size();
  for (int64_t n : {1, 7, 4096, 100003}) {
    // Every rank's addends, computed once (a vectorised and a scalar sinf may differ in a bit).
    std::vector<float> v(R * n);
    for (int r = 0; r < R; ++r)
      for (int64_t i = 0; i < n; ++i) v[r * n + i] = value(r, i);
    std::vector<float> x(v.begin() + g_comm->rank() * n, v.begin() + (g_comm->rank() + 1) * n);
    std::vector<float> want(n);
    for (int64_t i = 0; i < n; ++i) {
      float acc = v[i];
      for (int r = 1; r < R; ++r) acc += v[r * n + i];  // ((x0 + x1) + x2) + ...
      want[i] = acc;
    }
    ASSERT_TRUE(g_comm->all_reduce_sum(x.data(), n).is_ok());
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(std::memcmp(&x[i], &want[i], sizeof(float)), 0)
          << "n = " << n << ", i = " << i << ": " << x[i] << " vs " << want[i];
  }
}

TEST(MpiComm, AllGatherIsRankMajor) {
  const int R = g_comm->size();
  const int64_t n = 333;
  std::vector<float> v(R * n), recv(R * n);
  for (int r = 0; r < R; ++r)
    for (int64_t i = 0; i < n; ++i) v[r * n + i] = value(r, i);
  ASSERT_TRUE(g_comm->all_gather(v.data() + g_comm->rank() * n, n, recv.data()).is_ok());
  EXPECT_EQ(recv, v);
}

TEST(MpiComm, BroadcastFromEveryRoot) {
  for (int root = 0; root < g_comm->size(); ++root) {
    std::vector<int64_t> v(5, g_comm->rank() == root ? 1000 + root : -1);
    ASSERT_TRUE(g_comm->broadcast(v.data(), v.size() * sizeof(int64_t), root).is_ok());
    for (int64_t x : v) EXPECT_EQ(x, 1000 + root);
  }
  EXPECT_TRUE(g_comm->barrier().is_ok());
}

// Not a check: the latency of one decode-step all-reduce (tiny-next: 320 floats), for
// docs/PERFORMANCE.md.
TEST(MpiComm, ReportsAllReduceLatency) {
  std::vector<float> x(320, 1.0f);
  ASSERT_TRUE(g_comm->barrier().is_ok());
  const auto t0 = std::chrono::steady_clock::now();
  const int reps = 2000;
  for (int i = 0; i < reps; ++i) ASSERT_TRUE(g_comm->all_reduce_sum(x.data(), 320).is_ok());
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  if (g_comm->rank() == 0)
    std::printf("all_reduce_sum of 320 floats over %d ranks: %.1f us\n", g_comm->size(), us / reps);
}

TEST(SingleComm, IsTheIdentity) {
  auto one = make_single_communicator();
  std::vector<float> x{1.5f, -2.0f}, g(2);
  ASSERT_TRUE(one->all_reduce_sum(x.data(), 2).is_ok());
  EXPECT_EQ(x, (std::vector<float>{1.5f, -2.0f}));
  ASSERT_TRUE(one->all_gather(x.data(), 2, g.data()).is_ok());
  EXPECT_EQ(g, x);
  EXPECT_FALSE(one->broadcast(x.data(), 8, 1).is_ok());
}

}  // namespace
}  // namespace tf

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto comm = tf::make_mpi_communicator();
  if (!comm) {
    std::fprintf(stderr, "%s\n", comm.status().to_string().c_str());
    return 1;
  }
  tf::g_comm = comm->get();
  // Only rank 0 prints gtest's report; every rank runs every test (they are collective).
  if (tf::g_comm->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  comm->reset();
  tf::mpi_finalize();
  return rc;
}
