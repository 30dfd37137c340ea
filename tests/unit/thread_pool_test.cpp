// The worker pool (core/thread_pool.h). In runtime_tests, so that scripts/test.sh runs it under
// ThreadSanitizer with the engine's threads.
#include <atomic>
#include <chrono>
#include <iterator>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

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

// Jobs published while the workers spin (back to back), while they fall asleep (gaps around the
// pool's 200 us spin) and long after (every worker asleep) all run every index once and return.
// Guards the hand-over between spinning and sleeping: with the caller's notify of sleeping workers
// never sent (`if (wake)` made `if (wake && n < 0)` in ThreadPool::parallel_for) the first job
// after a gap never starts and this test hangs until ctest's timeout; checked once.
TEST(ThreadPool, JobsRunWhetherTheWorkersSpinOrSleep) {
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    const int64_t n = 64;
    std::vector<int> hits(n, 0);
    const int gaps_us[] = {0, 0, 5, 150, 190, 200, 210, 250, 400, 2000, 20000};
    for (int round = 0; round < 200; ++round) {
      const int gap = gaps_us[round % std::size(gaps_us)];
      if (gap > 0) std::this_thread::sleep_for(std::chrono::microseconds(gap));
      pool.parallel_for(n, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;  // each index one thread's: no atomics
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], round + 1) << "round " << round;
    }
  }
}

// A pool destroyed right after a job, while its workers still spin, joins them and returns: a
// spinning worker sees stop_ only once it falls asleep. With stop_ left out of the sleeping
// worker's wait this hangs (checked once).
TEST(ThreadPool, DestroyedWhileItsWorkersSpin) {
  for (int i = 0; i < 50; ++i) {
    std::atomic<int> ran{0};
    ThreadPool pool(3);
    pool.parallel_for(3, 1, [&](int64_t b, int64_t e) { ran += static_cast<int>(e - b); });
    EXPECT_EQ(ran.load(), 3);
  }
}

}  // namespace
}  // namespace tf
