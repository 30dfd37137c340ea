// What "resident" means on one device: the residency owner (owner.h) decides which buffers are in
// the set and counts them against the budget; a Backend makes one buffer resident (join's commit),
// ends that (leave's commit) and keeps the set warm (the tick). Contract:
// ../shared/design/residency.md ("Linux mapping" lists what each backend does).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace tf::residency {

// Where a buffer lives; each kind has its own budget.
enum class Memory : uint8_t {
  kHost,    // host memory: locked (CPU) or pinned/registered (CUDA)
  kDevice,  // device memory: never evicted; only counted against the device budget
};
inline constexpr int kMemoryKinds = 2;
const char* memory_name(Memory m);  // "host", "device"

// One buffer of the set: [data, data + bytes). `what` names it in messages; a string literal.
struct Range {
  const void* data = nullptr;
  size_t bytes = 0;
  Memory memory = Memory::kHost;
  const char* what = "buffer";

  uintptr_t begin() const { return reinterpret_cast<uintptr_t>(data); }
  uintptr_t end() const { return begin() + bytes; }
};

// Test seam for fault injection. The owner calls before_alloc() before every allocation it makes
// for its own bookkeeping; backends call before_call() before every call into the system or the
// driver. Production code passes none.
class Faults {
 public:
  virtual ~Faults() = default;
  // May throw std::bad_alloc to fail the allocation that follows.
  virtual void before_alloc() {}
  // `call` names the call ("mlock", "munlock", "mincore", "setrlimit", "cudaHostRegister", ...).
  // A non-zero return fails the call with that errno (or driver error) instead of making it.
  virtual int before_call(const char* call) {
    (void)call;
    return 0;
  }
};

// The per-tick report of one checked range.
struct CheckResult {
  uint64_t pages = 0;            // pages looked at
  uint64_t pages_found_out = 0;  // of those, not resident (made resident again)
};

// What touching one range cost (the CPU tick's second half).
struct TouchResult {
  uint64_t pages = 0;  // pages read
  uint64_t cpu_ns =
      0;  // this thread's CPU time doing it (not wall time: preemption is not counted)
};

// Calls come from the owner under its lock: never two at once on one backend.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // The unit in which residency is granted: a page on the CPU, where two buffers that share a page
  // share its lock. The owner never ends residency of a unit another member still covers.
  virtual size_t granularity() const = 0;
  virtual bool supports(Memory m) const = 0;

  // Readies the facility for `host_bytes` of held host memory, before the startup set is made
  // (CPU: raise the soft RLIMIT_MEMLOCK to the hard one). Not ok: the facility is unavailable.
  virtual Status prepare(size_t host_bytes) = 0;
  // Makes `r` resident: the commit of a join. Not ok: the owner then calls remove() with the units
  // only `r` covered, so nothing of a failed add stays resident.
  virtual Status add(const Range& r) = 0;
  // Ends residency of `member` (the commit of a leave); `exclusive` is the part of it, in whole
  // units, that no other member covers (possibly empty). Called before the buffer is freed; once it
  // returns the backend never touches the range again.
  virtual void remove(const Range& member, const Range& exclusive) noexcept = 0;
  // The tick, for one held range (or a piece of one): checks it is resident and makes resident
  // again whatever was found out.
  virtual Result<CheckResult> check(const Range& r) = 0;
  // The tick, for one held range: reads it, so that memory the kernel keeps resident is also backed
  // where the kernel cannot see (the host of a virtual machine reclaims guest pages it sees unused,
  // locked or not, and the first access after that is a host fault). Default: nothing to do.
  virtual Result<TouchResult> touch(const Range&) { return TouchResult{}; }
  // The tick, once per tick after the ranges are checked (CUDA: a 16-byte copy on the engine's
  // stream, so the command path reaches the device).
  virtual Status keepalive() { return Status::ok(); }
};

}  // namespace tf::residency
