// memory_pressure: a second process that fills RAM, so the kernel evicts what it can (file pages:
// mmap'd weights, program text) the way another program's working set would. For the residency
// benchmark (bench/residency_idle.sh); not a test.
//
//   memory_pressure [--reserve-mib 1536] [--hold-ms 500] [--max-gib 0] [--thp 1]
//
// Safety on a shared machine: it sets its own oom_score_adj to 1000 (the OOM killer takes it
// first), fills in 64 MiB steps and stops as soon as MemAvailable falls to the reserve (or at
// --max-gib), holds for --hold-ms, then exits and the memory goes back. Prints one line:
//   filled 14.2 GiB in 3.10 s (MemAvailable 15.9 -> 1.5 GiB)
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

// MemAvailable in bytes (0 if unknown).
size_t mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  size_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  size_t reserve = size_t{1536} << 20, max_bytes = 0;
  int hold_ms = 500;
  bool thp = true;  // ask for transparent huge pages (the kernel compacts memory to make them)
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const double v = std::atof(argv[i + 1]);
    if (a == "--reserve-mib")
      reserve = static_cast<size_t>(v * 1048576);
    else if (a == "--hold-ms")
      hold_ms = static_cast<int>(v);
    else if (a == "--thp")
      thp = v != 0;
    else if (a == "--max-gib")
      max_bytes = static_cast<size_t>(v * 1073741824.0);
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (std::FILE* f = std::fopen("/proc/self/oom_score_adj", "w")) {
    std::fputs("1000", f);
    std::fclose(f);
  }
  const size_t step = size_t{64} << 20;
  const size_t before = mem_available();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<void*> chunks;
  size_t filled = 0;
  for (;;) {
    const size_t avail = mem_available();
    if (avail < reserve + step) break;
    if (max_bytes != 0 && filled + step > max_bytes) break;
    void* p = mmap(nullptr, step, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) break;
    if (thp)
      madvise(p, step, MADV_HUGEPAGE);  // fewer faults: the fill is bound by zeroing, not faulting

    std::memset(p, 0x5a, step);
    chunks.push_back(p);
    filled += step;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const size_t after = mem_available();
  std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
  std::printf("filled %.1f GiB in %.2f s (MemAvailable %.1f -> %.1f GiB)\n", filled / 1073741824.0,
              secs, before / 1073741824.0, after / 1073741824.0);
  for (void* p : chunks) munmap(p, step);
  return 0;
}
