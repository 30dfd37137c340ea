#include "residency/keepalive.h"

#include <spdlog/spdlog.h>

namespace tf::residency {

Keepalive::Keepalive(Owner& owner, const KeepaliveOptions& o, std::function<void()> wake,
                     std::function<bool()> busy)
    : owner_(owner),
      o_(o),
      wake_(std::move(wake)),
      busy_(std::move(busy)),
      last_arm_(Clock::now().time_since_epoch().count()) {
  TF_CHECK(o_.period.count() > 0, "the residency tick period must be positive");
  thread_ = std::thread([this] { loop(); });
}

Keepalive::~Keepalive() {
  stop();
}

void Keepalive::arm() {
  last_arm_.store(Clock::now().time_since_epoch().count());
  interrupt_ = true;
}

void Keepalive::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    interrupt_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Keepalive::loop() {
  bool warned_commit = false, warned_tick = false;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (cv_.wait_for(lock, o_.period, [&] { return stop_.load(); })) break;
    lock.unlock();
    if (Status s = owner_.commit(); !s && !warned_commit) {
      warned_commit = true;  // later ones only count (tensorfold_residency_unheld_buffers_total)
      spdlog::warn("residency: a buffer could not be held and is used unheld: {}", s.message());
    }
    const Clock::time_point last{Clock::duration(last_arm_.load())};
    const bool armed = Clock::now() - last < o_.keep_warm;
    interrupt_ = false;  // then stop_ again: a stop() just before this line is not lost
    if (armed && !stop_ && !(busy_ && busy_())) {
      const TickReport r = owner_.tick(&interrupt_);
      if (!r.status.is_ok() && !warned_tick) {
        warned_tick = true;
        spdlog::warn("residency: tick: {}", r.status.message());
      }
      if (r.pages_found_out > 0)
        spdlog::info("residency: tick found {} pages out and made them resident again",
                     r.pages_found_out);
      if (r.cold) {
        spdlog::info(
            "residency: tick found held pages cold (reclaimed outside this kernel) and "
            "read {} pages back in {:.2f} s of CPU",
            r.pages_touched, r.touch_ns / 1e9);
      }
      if (!r.stopped && wake_) wake_();
    }
    lock.lock();
  }
}

}  // namespace tf::residency
