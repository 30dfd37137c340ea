// The tick's clock: a thread that, every `period`, commits the owner's staged members and, while
// the engine is idle and a request came within `keep_warm`, ticks the owner (check the held ranges,
// restore what was found out, the backend's keepalive) and then wakes the engine's worker pool.
// A request re-arms it (arm()); stop() returns at once even with a tick pending.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "residency/owner.h"

namespace tf::residency {

struct KeepaliveOptions {
  std::chrono::milliseconds period{1000};
  std::chrono::milliseconds keep_warm{std::chrono::minutes(10)};
};

class Keepalive {
 public:
  // `wake` runs after each tick (the engine wakes its worker pool); `busy` says whether requests
  // are running (then no tick, only commits). Either may be empty. The window starts armed.
  Keepalive(Owner& owner, const KeepaliveOptions& o, std::function<void()> wake,
            std::function<bool()> busy);
  ~Keepalive();  // stop()
  Keepalive(const Keepalive&) = delete;
  Keepalive& operator=(const Keepalive&) = delete;

  // A request arrived or finished: ticks go on for keep_warm from now; a running tick stops after
  // its current piece (the request needs the CPU).
  void arm();
  // Ends the thread: a pending tick is dropped, a running one stops after its current piece.
  // Idempotent.
  void stop();

 private:
  using Clock = std::chrono::steady_clock;
  void loop();

  Owner& owner_;
  KeepaliveOptions o_;
  std::function<void()> wake_;
  std::function<bool()> busy_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> interrupt_{false};  // set by stop() and arm(): a running tick ends early
  std::atomic<Clock::rep> last_arm_;
  std::thread thread_;
};

}  // namespace tf::residency
