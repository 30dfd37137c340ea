#include "core/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tf {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0)
    n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  // Thread 0 is the caller; workers are 1..n-1.
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : threads_) t.join();
}

// Block `index` of n_threads over [0, n) in units of grain.
static void block_range(int64_t n, int64_t grain, int index, int n_threads, int64_t* b,
                        int64_t* e) {
  const int64_t units = (n + grain - 1) / grain;
  const int64_t per = units / n_threads, rem = units % n_threads;
  const int64_t ub = index * per + std::min<int64_t>(index, rem);
  const int64_t ue = ub + per + (index < rem ? 1 : 0);
  *b = std::min(n, ub * grain);
  *e = std::min(n, ue * grain);
}

void spin_step(int i) {
#if defined(__x86_64__)
  _mm_pause();
#endif
  if (i % 64 == 63) std::this_thread::yield();
}

namespace {

// Polls done() until it holds or `budget` has passed; true if it held.
template <class Done>
bool spin_until(Done done, std::chrono::microseconds budget) {
  const auto until = std::chrono::steady_clock::now() + budget;
  for (int i = 0;; ++i) {
    if (done()) return true;
    spin_step(i);
    if (i % 64 == 63 && std::chrono::steady_clock::now() > until) return false;
  }
}

}  // namespace

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (n_threads_ == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_grain_ = grain;
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    wake = sleepers_ > 0;
  }
  if (wake) cv_start_.notify_all();
  int64_t b, e;
  block_range(n, grain, 0, n_threads_, &b, &e);
  if (b < e) fn(b, e);
  auto done = [this] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(done, kSpin)) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_done_.wait(lock, done);
  }
}

void ThreadPool::wake() {
  const std::function<void(int64_t, int64_t)> nop = [](int64_t, int64_t) {};
  parallel_for(n_threads_, 1, nop);
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    auto started = [&] { return generation_.load(std::memory_order_acquire) != seen; };
    if (!spin_until(started, kSpin)) {
      std::unique_lock<std::mutex> lock(mu_);
      ++sleepers_;
      cv_start_.wait(lock, [&] { return stop_ || started(); });
      --sleepers_;
      if (stop_) return;
    }
    seen = generation_.load(std::memory_order_acquire);
    const std::function<void(int64_t, int64_t)>* job = job_;
    int64_t b, e;
    block_range(job_n_, job_grain_, index, n_threads_, &b, &e);
    if (b < e) (*job)(b, e);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // The caller may have stopped spinning: wake it (under the mutex, so that it is either
      // waiting already or will see pending_ == 0 before it waits).
      std::lock_guard<std::mutex> lock(mu_);
      cv_done_.notify_one();
    }
  }
}

}  // namespace tf
