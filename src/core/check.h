// CHECK: the first error tier. A failed CHECK is a bug in TensorFold (never bad input): it prints
// file:line, the condition and a formatted message, then aborts. Bad input gets a Status instead.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

namespace tf::detail {
[[noreturn]] inline void check_failed(const char* file, int line, const char* cond,
                                      const std::string& msg) {
  std::fprintf(stderr, "CHECK failed at %s:%d: %s %s\n", file, line, cond, msg.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace tf::detail

// TF_CHECK(cond, "fmt {}", args...): abort with file:line when cond is false.
#define TF_CHECK(cond, ...)                                                                 \
  do {                                                                                      \
    if (!(cond)) [[unlikely]] {                                                             \
      ::tf::detail::check_failed(__FILE__, __LINE__, #cond, ::fmt::format("" __VA_ARGS__)); \
    }                                                                                       \
  } while (0)
