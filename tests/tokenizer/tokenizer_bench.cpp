// Encode speed of TensorFold's tokenizer, one thread: tokenizer_bench TOKENIZER_DIR FILE...
// Each file is encoded whole, 3 times after a warm-up of its first 100 kB; the best time counts
// (the same protocol as tools/tokenizer_ref_hf.py bench and tools/tokenizer_ref_js.cjs --bench).
// Both wall time and this thread's CPU time are reported: on a shared machine the CPU-time figure
// is the one that does not depend on the neighbours' load.
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>

#include "core/file.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

static double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER_DIR FILE...\n", argv[0]);
    return 2;
  }
  auto t0 = std::chrono::steady_clock::now();
  auto tk = tf::tok::Tokenizer::load(argv[1]);
  if (!tk) {
    std::fprintf(stderr, "error: %s\n", tk.status().to_string().c_str());
    return 1;
  }
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("load %s: %.2f s\n", argv[1], load_s);
  for (int a = 2; a < argc; ++a) {
    auto file = tf::read_file(argv[a]);
    if (!file) {
      std::fprintf(stderr, "error: %s\n", file.status().to_string().c_str());
      return 1;
    }
    std::string text = tf::tok::utf8_lossy(*file);
    size_t warm = std::min<size_t>(text.size(), 100000);
    while (warm < text.size() && (static_cast<unsigned char>(text[warm]) & 0xC0) == 0x80) ++warm;
    (void)tk->encode(text.substr(0, warm));
    double best = 1e9, best_cpu = 1e9;
    size_t n = 0;
    for (int rep = 0; rep < 3; ++rep) {
      const auto s = std::chrono::steady_clock::now();
      const double c = thread_cpu_seconds();
      auto ids = tk->encode(text);
      best_cpu = std::min(best_cpu, thread_cpu_seconds() - c);
      best = std::min(best,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count());
      if (!ids) {
        std::fprintf(stderr, "error: %s\n", ids.status().to_string().c_str());
        return 1;
      }
      n = ids->size();
    }
    std::printf("%s: %.2f MB, %zu tokens, %.2f MB/s wall, %.2f MB/s CPU time (best of 3)\n",
                argv[a], text.size() / 1e6, n, text.size() / 1e6 / best,
                text.size() / 1e6 / best_cpu);
  }
  return 0;
}
