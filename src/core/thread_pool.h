// A fixed pool of worker threads for data-parallel loops.
//
// Determinism: parallel_for splits an index range into contiguous blocks; each index is computed by
// exactly one thread with code that does not depend on the split. Callers split OUTPUT rows or
// columns, never a reduction, so results are bit-identical for any thread count.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tf {

class ThreadPool {
 public:
  // n_threads <= 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end) over contiguous blocks that cover [0, n), in parallel, and returns when
  // all are done. Blocks are multiples of `grain` (except the last). Not reentrant.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // Wake every worker once (the residency tick uses it to keep the pool's stacks warm).
  void wake();

 private:
  void worker(int index);

  // After a job, workers (and the caller, for the job's end) poll for up to kSpin, yielding the
  // core every 64 pauses, before sleeping on the condition variables: a decode step dispatches a
  // few dozen jobs, microseconds apart, and waking a sleeping thread costs tens of microseconds on
  // our 2-vCPU VM (tiny-next decoded about 2x slower on two threads than on one;
  // docs/PERFORMANCE.md, "Workers that wait spinning"). An idle pool sleeps after kSpin.
  static constexpr std::chrono::microseconds kSpin{200};

  int n_threads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  // The job, written by the caller before it bumps generation_ (release) and read by the
  // workers after they see the new generation (acquire).
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0, job_grain_ = 1;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  int sleepers_ = 0;  // workers waiting on cv_start_ (under mu_)
  bool stop_ = false;
};

// Step i (0, 1, 2, ...) of a polling loop: a pause, and every 64th step a yield of the core, so
// that a thread waiting for it runs when threads outnumber cores (tests in parallel, a second
// process); alone on the core the yield returns at once. The pool's polls and the CPU kernels'
// barrier (backends/cpu/parallel.h) wait with it.
void spin_step(int i);

}  // namespace tf
