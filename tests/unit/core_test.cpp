#include <atomic>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace tf {
namespace {

TEST(ThreadPool, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 7}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 5, 16, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, 4, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
    }
  }
}

TEST(Status, ResultCarriesValueOrError) {
  Result<int> ok = 5;
  EXPECT_TRUE(ok.is_ok());
  EXPECT_EQ(*ok, 5);
  Result<int> bad = Status::invalid("x {}", 3);
  EXPECT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().message(), "x 3");
  EXPECT_EQ(bad.status().to_string(), "invalid argument: x 3");
}

TEST(DType, Bf16RoundTripAndRounding) {
  for (float f : {0.0f, 1.0f, -2.5f, 3.140625f, 0x1p-100f, 65536.0f}) {
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(f)), f) << f;  // exactly representable values
  }
  // 1 + 2^-8 is halfway between two bf16 values: round to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
}

}  // namespace
}  // namespace tf
