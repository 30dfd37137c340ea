// Parallel regions for the CPU kernels: one ThreadPool dispatch runs a whole multi-phase op, with
// spinning barriers between its phases (a pool dispatch costs ~10 us of wake-up; a barrier between
// running threads well under 1 us). Work is split by output index, never inside a reduction.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

#include "core/thread_pool.h"

namespace tf::cpu {

// A reusable barrier for the n threads of one region. wait() returns once all n have arrived.
class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void wait();

 private:
  static constexpr int kSpins = 2000;
  const int n_;
  std::atomic<int> arrived_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<uint32_t> phase_{0};
};

// The thread's place in a region.
struct Worker {
  int id = 0;  // 0 .. n-1
  int n = 1;
  SpinBarrier* barrier = nullptr;
  void sync() const {
    if (n > 1) barrier->wait();
  }
};

// Runs fn(worker) once on each of the pool's threads (or once, inline, without a pool), all at the
// same time, and returns when every call has returned.
void parallel_region(ThreadPool* pool, const std::function<void(const Worker&)>& fn);

// The part [b, e) of [0, n) that worker w owns when n items of equal cost are split evenly into
// contiguous blocks that are multiples of `grain` (except the last).
void split_range(int64_t n, int64_t grain, const Worker& w, int64_t* b, int64_t* e);

}  // namespace tf::cpu
