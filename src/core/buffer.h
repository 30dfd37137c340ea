// Followed buffers: every long-lived engine buffer (sequence states, kept snapshots, KV) is made
// through TrackedAllocator (host memory) or a device model's allocator (model/cuda_model.h), which
// tell a BufferObserver right after they allocate and right before they free. The residency owner
// is such an observer (join on create, leave before free), so no owner of a buffer can forget
// either step; with no observer the allocators are plain new/delete (cudaMalloc/cudaFree).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace tf {

// Where a followed buffer lives.
enum class BufferKind : uint8_t {
  kHost,    // host memory (pageable, or pinned by the device runtime)
  kDevice,  // device memory (cudaMalloc)
};

class BufferObserver {
 public:
  virtual ~BufferObserver() = default;
  // Called after [p, p + bytes) is allocated. Must not throw: a refusal (over budget, lock
  // failed) is the observer's to record; the buffer is used either way.
  virtual void on_create(const void* p, size_t bytes, BufferKind kind) noexcept = 0;
  // Called before [p, p + bytes) is freed; after it returns the observer never touches the range.
  virtual void on_release(const void* p, size_t bytes) noexcept = 0;
};

// A std allocator that reports to an observer (nullptr: none). The observer travels with the
// container on copy, move and swap, so a copy of a state (a snapshot) is followed too.
template <class T>
class TrackedAllocator {
 public:
  using value_type = T;
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;

  TrackedAllocator() noexcept = default;
  explicit TrackedAllocator(BufferObserver* o) noexcept : observer_(o) {}
  template <class U>
  TrackedAllocator(const TrackedAllocator<U>& other) noexcept : observer_(other.observer()) {}

  T* allocate(size_t n) {
    T* p = static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{64}));
    if (observer_) observer_->on_create(p, n * sizeof(T), BufferKind::kHost);
    return p;
  }
  void deallocate(T* p, size_t n) noexcept {
    if (observer_) observer_->on_release(p, n * sizeof(T));
    ::operator delete (p, std::align_val_t{64});
  }
  BufferObserver* observer() const noexcept { return observer_; }

  template <class U>
  bool operator==(const TrackedAllocator<U>& o) const noexcept {
    return observer_ == o.observer();
  }

 private:
  BufferObserver* observer_ = nullptr;
};

// The float buffer of sequence states and snapshots: 64-byte aligned, followed.
using FloatBuf = std::vector<float, TrackedAllocator<float>>;

}  // namespace tf
