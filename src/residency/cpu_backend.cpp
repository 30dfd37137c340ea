#include "residency/cpu_backend.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <string>

namespace tf::residency {
namespace {

// The system calls themselves, not the libc wrappers: the sanitizer runtimes replace mlock and
// munlock with no-ops (they must not lock their shadow memory), which would make the ASan build
// test nothing. Our ranges are the program's own memory, never shadow.
int sys_mlock(const void* p, size_t n) {
  return static_cast<int>(syscall(SYS_mlock, p, n));
}
int sys_munlock(const void* p, size_t n) {
  return static_cast<int>(syscall(SYS_munlock, p, n));
}

}  // namespace

CpuBackend::CpuBackend(Faults* faults)
    : faults_(faults), page_(static_cast<size_t>(sysconf(_SC_PAGESIZE))) {}

template <class F>
int CpuBackend::sys(const char* call, F&& f) {
  if (faults_ != nullptr) {
    if (const int e = faults_->before_call(call); e != 0) {
      errno = e;
      return -1;
    }
  }
  return f();
}

MemlockLimit memlock_limit() {
  struct rlimit rl {};
  getrlimit(RLIMIT_MEMLOCK, &rl);
  return MemlockLimit{rl.rlim_cur, rl.rlim_max};
}

std::string limit_string(rlim_t bytes) {
  if (bytes == RLIM_INFINITY) return "unlimited";
  if (bytes >= (rlim_t{1} << 30)) return fmt::format("{:.1f} GiB", bytes / 1073741824.0);
  if (bytes >= (rlim_t{1} << 20)) return fmt::format("{:.1f} MiB", bytes / 1048576.0);
  return fmt::format("{} KiB", bytes / 1024);
}

bool can_lock_past_limit() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    unsigned long long caps = 0;
    if (std::sscanf(line.c_str(), "CapEff: %llx", &caps) == 1) return (caps >> 14) & 1;  // IPC_LOCK
  }
  return false;
}

Status CpuBackend::prepare(size_t host_bytes) {
  MemlockLimit lim = memlock_limit();
  if (lim.soft != lim.hard) {
    struct rlimit rl {
      lim.hard, lim.hard
    };
    if (sys("setrlimit", [&] { return setrlimit(RLIMIT_MEMLOCK, &rl); }) != 0) {
      return Status(
          StatusCode::kUnavailable,
          fmt::format("cannot raise the soft RLIMIT_MEMLOCK ({}) to the hard limit "
                      "({}): {}",
                      limit_string(lim.soft), limit_string(lim.hard), std::strerror(errno)));
    }
    lim.soft = lim.hard;
  }
  if (lim.hard != RLIM_INFINITY && lim.hard < host_bytes && !can_lock_past_limit()) {
    return Status(StatusCode::kUnavailable,
                  fmt::format("RLIMIT_MEMLOCK is {} and the set needs {:.1f} MiB (raise it: "
                              "`ulimit -l unlimited`, systemd LimitMEMLOCK=infinity, docker "
                              "--ulimit memlock=-1)",
                              limit_string(lim.hard), host_bytes / 1048576.0));
  }
  return Status::ok();
}

Status CpuBackend::add(const Range& r) {
  if (sys("mlock", [&] { return sys_mlock(r.data, r.bytes); }) == 0) return Status::ok();
  const int e = errno;
  const MemlockLimit lim = memlock_limit();
  return Status(e == EPERM ? StatusCode::kUnavailable : StatusCode::kResourceExhausted,
                fmt::format("mlock of {} ({:.1f} MiB) failed: {} (RLIMIT_MEMLOCK {}, hard {})",
                            r.what, r.bytes / 1048576.0, std::strerror(e), limit_string(lim.soft),
                            limit_string(lim.hard)));
}

void CpuBackend::remove(const Range&, const Range& exclusive) noexcept {
  if (exclusive.bytes == 0) return;
  // munlock fails only for a range that is not mapped, which the owner's leave-before-free rule
  // rules out; there is nothing to undo either way.
  (void)sys("munlock", [&] { return sys_munlock(exclusive.data, exclusive.bytes); });
}

Result<CheckResult> CpuBackend::check(const Range& r) {
  const uintptr_t lo = r.begin() - r.begin() % page_;
  const uintptr_t hi = (r.end() + page_ - 1) / page_ * page_;
  const size_t n = (hi - lo) / page_;
  std::vector<unsigned char> in_core(n);
  void* base = reinterpret_cast<void*>(lo);
  if (sys("mincore", [&] { return mincore(base, hi - lo, in_core.data()); }) != 0) {
    return Status(StatusCode::kInternal,
                  fmt::format("mincore of {} failed: {}", r.what, std::strerror(errno)));
  }
  CheckResult res{n, 0};
  for (size_t i = 0; i < n;) {
    if (in_core[i] & 1) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < n && !(in_core[j] & 1)) ++j;
    res.pages_found_out += j - i;
    // Locked pages are not evicted; one found out lost its lock. Locking it again brings it back.
    const void* run = reinterpret_cast<const void*>(lo + i * page_);
    if (sys("mlock", [&] { return sys_mlock(run, (j - i) * page_); }) != 0) {
      return Status(StatusCode::kResourceExhausted,
                    fmt::format("mlock of {} pages of {} found out failed: {}", j - i, r.what,
                                std::strerror(errno)));
    }
    i = j;
  }
  return res;
}

Result<TouchResult> CpuBackend::touch(const Range& r) {
  auto thread_ns = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
  };
  const uint64_t t0 = thread_ns();
  const auto* p = static_cast<const char*>(r.data);
  // The first byte of the range, then the first byte of each later page. Relaxed atomic loads: a
  // held state buffer may be written by the engine at the same time (the values are not used).
  const size_t first = (page_ - r.begin() % page_) % page_;
  char sum = __atomic_load_n(p, __ATOMIC_RELAXED);
  uint64_t pages = 1;
  for (size_t off = first == 0 ? page_ : first; off < r.bytes; off += page_, ++pages)
    sum ^= __atomic_load_n(p + off, __ATOMIC_RELAXED);
  asm volatile("" : : "r"(sum));  // keep the loads
  return TouchResult{pages, thread_ns() - t0};
}

std::vector<Range> program_ranges() {
  struct Line {
    uintptr_t begin, end;
    std::string perms, path;
  };
  std::vector<Line> lines;
  std::map<std::string, bool> has_code;
  std::ifstream in("/proc/self/maps");
  std::string text;
  while (std::getline(in, text)) {
    uintptr_t b = 0, e = 0;
    char perms[8] = {};
    int path_at = 0;
    if (std::sscanf(text.c_str(), "%" SCNxPTR "-%" SCNxPTR " %7s %*s %*s %*s %n", &b, &e, perms,
                    &path_at) < 3 ||
        path_at <= 0 || static_cast<size_t>(path_at) >= text.size()) {
      continue;
    }
    std::string path = text.substr(path_at);
    // Only files: not [heap], [stack], [vdso], and not a file deleted since it was mapped.
    if (path.empty() || path[0] != '/' || path.find(" (deleted)") != std::string::npos) continue;
    if (perms[2] == 'x') has_code[path] = true;
    lines.push_back(Line{b, e, perms, std::move(path)});
  }
  std::vector<Range> out;
  for (const Line& l : lines) {
    const bool readable = l.perms[0] == 'r', writable = l.perms[1] == 'w', priv = l.perms[3] == 'p';
    if (readable && !writable && priv && has_code.count(l.path)) {
      out.push_back(Range{reinterpret_cast<const void*>(l.begin), l.end - l.begin, Memory::kHost,
                          "program text"});
    }
  }
  return out;
}

}  // namespace tf::residency
