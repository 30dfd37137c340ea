#include "runtime/lookup.h"

#include <algorithm>

namespace tf {

std::vector<int32_t> lookup_drafts(std::span<const int32_t> head, std::span<const int32_t> tail,
                                   int max_tokens, int min_n, int max_n) {
  const int64_t P = static_cast<int64_t>(head.size());
  const int64_t L = P + static_cast<int64_t>(tail.size());
  auto at = [&](int64_t i) { return i < P ? head[i] : tail[i - P]; };
  std::vector<int32_t> out;
  if (max_tokens <= 0) return out;
  for (int64_t n = std::min<int64_t>(max_n, L - 1); n >= std::max(min_n, 1); --n) {
    // Occurrences start at i <= L - n - 1 (one token follows them), latest first.
    for (int64_t i = L - n - 1; i >= 0; --i) {
      int64_t m = 0;
      while (m < n && at(i + m) == at(L - n + m)) ++m;
      if (m < n) continue;
      // Past the context's end the drafts go on with themselves: the continuation of a repeat
      // (j - L < out.size(), since i + n <= L - 1).
      for (int64_t j = i + n; static_cast<int>(out.size()) < max_tokens; ++j)
        out.push_back(j < L ? at(j) : out[j - L]);
      return out;
    }
  }
  return out;
}

}  // namespace tf
