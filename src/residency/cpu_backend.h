// The CPU mapping of residency (Linux): a member is locked with mlock (its pages stay in RAM: file
// pages of the mmap'd weights and the program text are not evicted, anonymous state is not
// swapped), unlocked with munlock before it is freed, and checked by the tick with mincore.
#pragma once

#include <sys/resource.h>

#include <vector>

#include "residency/backend.h"

namespace tf::residency {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(Faults* faults = nullptr);
  const char* name() const override { return "cpu"; }
  size_t granularity() const override { return page_; }
  bool supports(Memory m) const override { return m == Memory::kHost; }
  // Raises the soft RLIMIT_MEMLOCK to the hard one; unavailable when the hard limit is below
  // `host_bytes` and the process may not lock past it (no CAP_IPC_LOCK).
  Status prepare(size_t host_bytes) override;
  Status add(const Range& r) override;                                         // mlock
  void remove(const Range& member, const Range& exclusive) noexcept override;  // munlock
  Result<CheckResult> check(const Range& r) override;  // mincore; mlock of what was found out
  Result<TouchResult> touch(const Range& r) override;  // one byte of every page

 private:
  // Runs a system call, unless the fault hook fails it first (then errno is the injected value).
  template <class F>
  int sys(const char* call, F&& f);

  Faults* faults_;
  size_t page_;
};

// RLIMIT_MEMLOCK now: {soft, hard} in bytes (RLIM_INFINITY: unlimited).
struct MemlockLimit {
  rlim_t soft = 0, hard = 0;
};
MemlockLimit memlock_limit();
// "64 KiB", "unlimited".
std::string limit_string(rlim_t bytes);
// Whether this process may lock memory past RLIMIT_MEMLOCK (CAP_IPC_LOCK in its effective set).
bool can_lock_past_limit();

// The program's own code and read-only data: every readable, non-writable, private file mapping of
// an object that has executable code (the executable and its shared libraries), from
// /proc/self/maps. Under memory pressure the kernel evicts these file pages like the weights'.
std::vector<Range> program_ranges();

}  // namespace tf::residency
