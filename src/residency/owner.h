// The residency owner: one per engine, it keeps the engine's buffers resident within a budget.
//
//   hold   (startup) the set is made from every buffer that exists then, or not at all;
//   join   a buffer made later enters the set: staged (committed at the next commit()) or at once;
//   leave  a buffer leaves before it is freed; a committed one's removal is committed at once;
//   follow the owner is the BufferObserver of the engine's allocators (core/buffer.h): buffers
//          join when made and leave before they are freed, so no owner of a buffer can forget;
//   tick   while idle (keepalive.h) the held ranges are checked and what was found out restored,
//          and a budgeted slice of them is read, so memory the kernel cannot see evicted (a virtual
//          machine's host reclaiming guest pages) is brought back in the tick, not in a request.
//
// Contract: ../shared/design/residency.md. Every public method is thread-safe.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <vector>

#include "core/buffer.h"
#include "residency/backend.h"

namespace tf::residency {

// An allocator for the owner's bookkeeping that calls Faults::before_alloc() first.
template <class T>
class HookedAllocator {
 public:
  using value_type = T;
  explicit HookedAllocator(Faults* f) noexcept : faults_(f) {}
  template <class U>
  HookedAllocator(const HookedAllocator<U>& o) noexcept : faults_(o.faults()) {}
  T* allocate(size_t n) {
    if (faults_) faults_->before_alloc();
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, size_t n) noexcept { std::allocator<T>().deallocate(p, n); }
  Faults* faults() const noexcept { return faults_; }
  template <class U>
  bool operator==(const HookedAllocator<U>& o) const noexcept {
    return faults_ == o.faults();
  }

 private:
  Faults* faults_;
};

enum class Join {
  kStage,   // enter the staging list; the next commit() makes it resident
  kCommit,  // made resident before join returns
};

struct OwnerOptions {
  size_t budget[kMemoryKinds] = {0, 0};  // bytes per Memory kind; every member counts once
  // Bytes each tick reads (Backend::touch), resuming where the last tick stopped; when the pages
  // come back cold, that tick reads the whole set. 0: no touching.
  size_t touch_per_tick = 0;
  Faults* faults = nullptr;  // tests only
};

struct Stats {
  struct PerMemory {
    size_t budget = 0;
    size_t held = 0;       // committed members' bytes
    size_t staged = 0;     // staged members' bytes
    uint64_t refused = 0;  // bytes of joins refused because they did not fit the budget
  };
  PerMemory memory[kMemoryKinds];
  size_t members = 0;  // committed + staged
  size_t staged_members = 0;
  uint64_t ticks = 0;
  uint64_t pages_checked = 0;    // by ticks, all together
  uint64_t pages_found_out = 0;  // by ticks: not resident when checked, then restored
  uint64_t pages_touched = 0;    // by ticks
  uint64_t touch_ns = 0;         // CPU time the ticks spent touching
  uint64_t cold_sweeps = 0;      // ticks that found touched pages cold and read the whole set
  // Outside the set: buffers made through the allocators that could not join (they are used,
  // unheld), and staged members whose commit failed (dropped from the set).
  uint64_t follow_failures = 0;
  uint64_t commit_failures = 0;
};

// What one tick did.
struct TickReport {
  uint64_t pages = 0, pages_found_out = 0;
  uint64_t pages_touched = 0, touch_ns = 0;
  bool cold = false;     // touched pages came back cold: the whole set was read
  bool stopped = false;  // `stop` was set: the tick ended early
  Status status;         // the first check or keepalive failure, if any
};

class Owner final : public BufferObserver {
 public:
  // hold: makes the startup set from `startup` (weights, state pool, scratch, program text). Error
  // (and nothing held, nothing left resident) when the set is over the budget or the facility is
  // unavailable; the caller then warns once and runs without residency.
  static Result<std::unique_ptr<Owner>> hold(std::unique_ptr<Backend> backend,
                                             const OwnerOptions& o, std::span<const Range> startup);
  // A set with no members (tests; hold() is the way in production).
  Owner(std::unique_ptr<Backend> backend, const OwnerOptions& o);
  // Every member leaves (committed removals are committed); call it before the buffers go.
  ~Owner() override;
  Owner(const Owner&) = delete;
  Owner& operator=(const Owner&) = delete;

  // Adds `r` to the set. All capacity (bookkeeping, backend objects) is taken before anything
  // changes: on any failure nothing is counted, staged or added, and a later join works. Past the
  // budget it refuses (kResourceExhausted) without counting the bytes. A zero-byte range is ok and
  // not added. `r` must not overlap a member (that is a bug: a CHECK).
  Status join(const Range& r, Join mode = Join::kStage);
  // Removes the member starting at `data`: a committed one is removed from the backend's set before
  // leave returns (so the caller may free right after); a staged one is just dropped; a buffer the
  // set never held: nothing happens.
  void leave(const void* data) noexcept;
  // Commits every staged member. A member whose commit fails is dropped from the set (the buffer is
  // used unheld); the first such failure is returned.
  Status commit();
  // The tick: checks every held range in pieces, releasing the lock between them, and makes
  // resident again what was found out; touches the next touch_per_tick bytes (all of the set when
  // they were cold); then the backend's keepalive. Ends early when *stop is set.
  TickReport tick(const std::atomic<bool>* stop = nullptr);

  Stats stats() const;
  enum class State { kNone, kStaged, kHeld };
  State state(const void* data) const;
  const Backend& backend() const { return *backend_; }

  // follow (BufferObserver): join staged on create (device buffers against the device budget);
  // leave before release.
  void on_create(const void* p, size_t bytes, BufferKind kind) noexcept override;
  void on_release(const void* p, size_t bytes) noexcept override;

 private:
  struct Member {
    size_t bytes = 0;
    Memory memory = Memory::kHost;
    const char* what = "buffer";
    bool committed = false;
    uint64_t id = 0;  // unique per join, so a tick resuming at an address sees a new buffer
  };
  using MemberAlloc = HookedAllocator<std::pair<const uintptr_t, Member>>;
  using Members = std::map<uintptr_t, Member, std::less<uintptr_t>, MemberAlloc>;
  // A position in the held set, between pieces: the member starting at `key` (if its id is still
  // `id`: not a new buffer at the same address), at `offset`.
  struct Cursor {
    uintptr_t key = 0;
    uint64_t id = 0;
    size_t offset = 0;
  };

  Range range_of(Members::const_iterator it) const;
  // Under mu_: the next piece of a held member at or after `c`, and `c` moved past it; false at the
  // end of the set.
  bool next_piece(Cursor& c, Range* piece) const;
  // The part of [r.begin, r.end), in whole units, that no committed member other than the one
  // starting at r.begin covers.
  Range exclusive(const Range& r) const;
  void remove_locked(Members::iterator it) noexcept;
  Stats::PerMemory& per(Memory m) { return stats_.memory[static_cast<int>(m)]; }

  std::unique_ptr<Backend> backend_;
  Faults* faults_;
  mutable std::mutex mu_;
  Members members_;                                            // guarded by mu_
  std::vector<uintptr_t, HookedAllocator<uintptr_t>> staged_;  // guarded by mu_
  Stats stats_;                                                // guarded by mu_
  uint64_t next_id_ = 1;                                       // guarded by mu_
  size_t touch_per_tick_;
  Cursor touch_cursor_;          // guarded by mu_
  double warm_ns_per_page_ = 0;  // guarded by mu_: what touching a warm page costs (0: not known)
};

}  // namespace tf::residency
