#include "residency/owner.h"

#include <algorithm>

namespace tf::residency {
namespace {

// The tick checks held ranges in pieces of this size, releasing the owner's lock in between, so a
// leave (or a teardown) never waits long behind it.
constexpr size_t kTickPiece = size_t{64} << 20;
// A tick's slice is cold when its pages cost more than this, on average, to read. Measured on the
// development VM (8.8 GB locked, read in 64 MiB pieces): warm pages cost 15-300 ns (p50 20-140,
// TLB and cache misses), pages the host had reclaimed or aged 950-1700 ns (p50 1390) -- after
// another process filled the VM's RAM, and also after a few idle minutes.
constexpr uint64_t kColdNsPerPage = 800;

uintptr_t align_down(uintptr_t x, size_t g) {
  return x - x % g;
}
uintptr_t align_up(uintptr_t x, size_t g) {
  return align_down(x + g - 1, g);
}

}  // namespace

const char* memory_name(Memory m) {
  return m == Memory::kHost ? "host" : "device";
}

Owner::Owner(std::unique_ptr<Backend> backend, const OwnerOptions& o)
    : backend_(std::move(backend)),
      faults_(o.faults),
      members_(MemberAlloc(o.faults)),
      staged_(HookedAllocator<uintptr_t>(o.faults)),
      touch_per_tick_(o.touch_per_tick) {
  TF_CHECK(backend_ != nullptr, "the residency owner needs a backend");
  for (int k = 0; k < kMemoryKinds; ++k) stats_.memory[k].budget = o.budget[k];
}

Owner::~Owner() {
  std::lock_guard<std::mutex> lock(mu_);
  while (!members_.empty()) remove_locked(std::prev(members_.end()));
}

Result<std::unique_ptr<Owner>> Owner::hold(std::unique_ptr<Backend> backend, const OwnerOptions& o,
                                           std::span<const Range> startup) {
  size_t need[kMemoryKinds] = {0, 0};
  for (const Range& r : startup) need[static_cast<int>(r.memory)] += r.bytes;
  for (int k = 0; k < kMemoryKinds; ++k) {
    if (need[k] > o.budget[k]) {
      return Status(StatusCode::kResourceExhausted,
                    fmt::format("the startup set ({:.2f} GiB of {} memory) is over the residency "
                                "budget ({:.2f} GiB; see --residency-limit)",
                                need[k] / 1073741824.0, memory_name(static_cast<Memory>(k)),
                                o.budget[k] / 1073741824.0));
    }
  }
  TF_RETURN_IF_ERROR(backend->prepare(need[static_cast<int>(Memory::kHost)]));
  auto owner = std::make_unique<Owner>(std::move(backend), o);
  for (const Range& r : startup) {
    // On failure the owner's destructor removes what was committed: nothing stays resident.
    TF_RETURN_IF_ERROR(owner->join(r, Join::kCommit));
  }
  return owner;
}

Range Owner::range_of(Members::const_iterator it) const {
  return Range{reinterpret_cast<const void*>(it->first), it->second.bytes, it->second.memory,
               it->second.what};
}

Range Owner::exclusive(const Range& r) const {
  const size_t g = backend_->granularity();
  uintptr_t lo = align_down(r.begin(), g), hi = align_up(r.end(), g);
  // Members are disjoint and sorted by start, so their ends are sorted too: walk outwards from r
  // only while a neighbour still touches r's first (last) unit.
  for (auto it = members_.lower_bound(r.begin()); it != members_.begin();) {
    --it;
    if (it->first + it->second.bytes <= lo) break;
    if (it->second.committed) {
      lo += g;
      break;
    }
  }
  for (auto it = members_.upper_bound(r.begin()); it != members_.end(); ++it) {
    if (it->first >= hi) break;
    if (it->second.committed) {
      hi -= g;
      break;
    }
  }
  if (hi < lo) hi = lo;
  return Range{reinterpret_cast<const void*>(lo), hi - lo, r.memory, r.what};
}

Status Owner::join(const Range& r, Join mode) {
  if (r.bytes == 0) return Status::ok();
  TF_CHECK(r.data != nullptr, "join of a null range of {} bytes", r.bytes);
  if (!backend_->supports(r.memory)) {
    return Status::unsupported("the {} residency backend cannot hold {} memory", backend_->name(),
                               memory_name(r.memory));
  }
  std::lock_guard<std::mutex> lock(mu_);
  // A range overlapping a member is a bug of the caller (two live buffers cannot overlap).
  auto next = members_.lower_bound(r.begin());
  TF_CHECK(next == members_.end() || next->first >= r.end(), "{} [{}, +{}) overlaps a member",
           r.what, r.data, r.bytes);
  TF_CHECK(next == members_.begin() ||
               std::prev(next)->first + std::prev(next)->second.bytes <= r.begin(),
           "{} [{}, +{}) overlaps a member", r.what, r.data, r.bytes);

  Stats::PerMemory& pm = per(r.memory);
  if (r.bytes > pm.budget - (pm.held + pm.staged)) {  // held + staged <= budget, always
    pm.refused += r.bytes;
    return Status(
        StatusCode::kResourceExhausted,
        fmt::format("{} of {} bytes does not fit the {} residency budget ({} of {} "
                    "bytes taken)",
                    r.what, r.bytes, memory_name(r.memory), pm.held + pm.staged, pm.budget));
  }

  // 1. Capacity: the member's map node and, when staging, a slot in the staging list. Nothing of
  // the set changes here; a failure just returns.
  Members::node_type node;
  try {
    Members spare(members_.get_allocator());
    node =
        spare.extract(spare.emplace(r.begin(), Member{r.bytes, r.memory, r.what, false, 0}).first);
    if (mode == Join::kStage && staged_.size() == staged_.capacity())
      staged_.reserve(std::max<size_t>(16, 2 * staged_.capacity()));
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("no memory for the residency bookkeeping of {}", r.what));
  }
  // 2. The backend (a commit at once): on failure undo whatever part of r it made resident.
  if (mode == Join::kCommit) {
    if (Status s = backend_->add(r); !s) {
      backend_->remove(r, exclusive(r));
      return s;
    }
  }
  // 3. The change, which cannot fail: add, stage, count.
  node.mapped().committed = mode == Join::kCommit;
  node.mapped().id = next_id_++;
  members_.insert(std::move(node));
  if (mode == Join::kStage) {
    staged_.push_back(r.begin());
    pm.staged += r.bytes;
  } else {
    pm.held += r.bytes;
  }
  return Status::ok();
}

void Owner::remove_locked(Members::iterator it) noexcept {
  Member& m = it->second;
  Stats::PerMemory& pm = per(m.memory);
  if (m.committed) {
    const Range r = range_of(it);
    backend_->remove(r, exclusive(r));  // committed before leave returns
    pm.held -= m.bytes;
  } else {
    staged_.erase(std::find(staged_.begin(), staged_.end(), it->first));
    pm.staged -= m.bytes;
  }
  members_.erase(it);
}

void Owner::leave(const void* data) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = members_.find(reinterpret_cast<uintptr_t>(data));
  if (it == members_.end()) return;  // never held (refused, failed, or not ours): nothing to do
  remove_locked(it);
}

Status Owner::commit() {
  std::lock_guard<std::mutex> lock(mu_);
  Status first;
  for (uintptr_t key : staged_) {
    auto it = members_.find(key);
    TF_CHECK(it != members_.end() && !it->second.committed, "staging list out of step");
    Member& m = it->second;
    Stats::PerMemory& pm = per(m.memory);
    const Range r = range_of(it);
    if (Status s = backend_->add(r); !s) {
      backend_->remove(r, exclusive(r));
      pm.staged -= m.bytes;
      ++stats_.commit_failures;
      members_.erase(it);
      if (first.is_ok()) first = s;
      continue;
    }
    m.committed = true;
    pm.staged -= m.bytes;
    pm.held += m.bytes;
  }
  staged_.clear();
  return first;
}

bool Owner::next_piece(Cursor& c, Range* piece) const {
  auto it = members_.lower_bound(c.key);
  while (it != members_.end() && !it->second.committed) ++it;
  if (it == members_.end()) return false;
  const Member& m = it->second;
  const size_t off = (it->first == c.key && m.id == c.id) ? c.offset : 0;
  // Device memory is neither checked nor read from the host: one piece, whatever its size.
  const size_t n =
      m.memory == Memory::kDevice ? m.bytes - off : std::min(kTickPiece, m.bytes - off);
  *piece = Range{reinterpret_cast<const void*>(it->first + off), n, m.memory, m.what};
  if (off + n < m.bytes)
    c = Cursor{it->first, m.id, off + n};
  else
    c = Cursor{it->first + 1, 0, 0};
  return true;
}

TickReport Owner::tick(const std::atomic<bool>* stop) {
  TickReport rep;
  auto stopped = [&] {
    if (stop != nullptr && stop->load()) rep.stopped = true;
    return rep.stopped;
  };
  // 1. Check every held range: resident (for the kernel), or made resident again.
  for (Cursor c; !stopped();) {
    std::lock_guard<std::mutex> lock(mu_);
    Range piece;
    if (!next_piece(c, &piece)) break;
    auto res = backend_->check(piece);
    if (res) {
      rep.pages += res->pages;
      rep.pages_found_out += res->pages_found_out;
    } else if (rep.status.is_ok()) {
      rep.status = res.status();
    }
  }
  // 2. Touch the next touch_per_tick bytes, going round the set across ticks. Pages that come back
  // cold were reclaimed where the kernel cannot see (a virtual machine's host): the rest of the set
  // is likely cold too, so this tick reads all of it, once, rather than the next request.
  if (touch_per_tick_ > 0) {
    size_t budget = touch_per_tick_, done = 0;
    bool wrapped = false;
    while (!stopped()) {
      std::lock_guard<std::mutex> lock(mu_);
      const size_t held = per(Memory::kHost).held;  // device memory is not read from here
      Range piece;
      if (!next_piece(touch_cursor_, &piece)) {
        touch_cursor_ = Cursor{};
        if (wrapped) break;  // nothing held
        wrapped = true;
        continue;
      }
      if (piece.memory == Memory::kDevice) continue;
      auto res = backend_->touch(piece);
      if (!res) {
        if (rep.status.is_ok()) rep.status = res.status();
        break;
      }
      rep.pages_touched += res->pages;
      rep.touch_ns += res->cpu_ns;
      done += piece.bytes;
      if (done >= held) break;
      if (done >= budget) {
        // The slice came back cold: so is the rest, likely; read it now, not in the next request.
        if (!rep.cold && rep.touch_ns > kColdNsPerPage * rep.pages_touched) {
          rep.cold = true;
          budget = held;
          continue;
        }
        break;
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!rep.stopped) {
    if (Status s = backend_->keepalive(); !s && rep.status.is_ok()) rep.status = s;
  }
  ++stats_.ticks;
  stats_.pages_checked += rep.pages;
  stats_.pages_found_out += rep.pages_found_out;
  stats_.pages_touched += rep.pages_touched;
  stats_.touch_ns += rep.touch_ns;
  stats_.cold_sweeps += rep.cold;
  return rep;
}

Stats Owner::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.members = members_.size();
  s.staged_members = staged_.size();
  return s;
}

Owner::State Owner::state(const void* data) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = members_.find(reinterpret_cast<uintptr_t>(data));
  if (it == members_.end()) return State::kNone;
  return it->second.committed ? State::kHeld : State::kStaged;
}

void Owner::on_create(const void* p, size_t bytes, BufferKind kind) noexcept {
  const Range r = kind == BufferKind::kDevice ? Range{p, bytes, Memory::kDevice, "device buffer"}
                                              : Range{p, bytes, Memory::kHost, "state buffer"};
  Status s;
  try {
    s = join(r, Join::kStage);
  } catch (...) {  // building the error message itself ran out of memory
    s = Status(StatusCode::kResourceExhausted, "");
  }
  if (!s) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.follow_failures;
  }
}

void Owner::on_release(const void* p, size_t) noexcept {
  leave(p);
}

}  // namespace tf::residency
