#include "backends/cpu/parallel.h"

#include <algorithm>

namespace tf::cpu {

void SpinBarrier::wait() {
  const uint32_t phase = phase_.load(std::memory_order_acquire);
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
    arrived_.store(0, std::memory_order_relaxed);
    // seq_cst on phase_ and sleepers_ (store then load here, increment then load in the sleeper)
    // so that a sleeper either sees the new phase or is seen and woken.
    phase_.store(phase + 1);
    if (sleepers_.load() > 0) phase_.notify_all();
    return;
  }
  // Spin for a few microseconds (the usual wait between running threads), then sleep: on a busy
  // machine the last thread may have been descheduled, and spinning would only delay it.
  for (int spins = 0; spins < kSpins; ++spins) {
    if (phase_.load(std::memory_order_acquire) != phase) return;
    spin_step(spins);
  }
  sleepers_.fetch_add(1);
  while (phase_.load() == phase) phase_.wait(phase);
  sleepers_.fetch_sub(1);
}

void parallel_region(ThreadPool* pool, const std::function<void(const Worker&)>& fn) {
  const int n = pool != nullptr ? pool->size() : 1;
  if (n <= 1) {
    fn(Worker{});
    return;
  }
  SpinBarrier barrier(n);
  // One index per thread: the pool gives block i of n equal blocks to thread i.
  pool->parallel_for(n, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) fn(Worker{static_cast<int>(i), n, &barrier});
  });
}

void split_range(int64_t n, int64_t grain, const Worker& w, int64_t* b, int64_t* e) {
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  const int64_t per = units / w.n, rem = units % w.n;
  const int64_t ub = w.id * per + std::min<int64_t>(w.id, rem);
  const int64_t ue = ub + per + (w.id < rem ? 1 : 0);
  *b = std::min(n, ub * grain);
  *e = std::min(n, ue * grain);
}

}  // namespace tf::cpu
