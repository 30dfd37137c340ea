#include "backends/cuda/check.h"

#include <cstdio>
#include <cstdlib>

namespace tf::cuda::detail {

void fail(const char* file, int line, const char* expr, const char* msg) {
  std::fprintf(stderr, "CUDA CHECK failed at %s:%d: %s: %s\n", file, line, expr, msg);
  std::fflush(stderr);
  std::abort();
}

}  // namespace tf::cuda::detail
