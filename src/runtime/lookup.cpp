#include "runtime/lookup.h"

#include <algorithm>

namespace tf {
namespace {

// The drafts after an occurrence of the suffix that starts at `from` (i + n): the tokens up to
// the context's end, then the drafts themselves (the continuation of a repeat; j - L < out.size()
// since from <= L - 1).
template <class At>
std::vector<int32_t> follow(At at, int64_t L, int64_t from, int max_tokens) {
  std::vector<int32_t> out;
  for (int64_t j = from; static_cast<int>(out.size()) < max_tokens; ++j)
    out.push_back(j < L ? at(j) : out[j - L]);
  return out;
}

}  // namespace

std::vector<int32_t> lookup_drafts(std::span<const int32_t> head, std::span<const int32_t> tail,
                                   int max_tokens, int min_n, int max_n) {
  const int64_t P = static_cast<int64_t>(head.size());
  const int64_t L = P + static_cast<int64_t>(tail.size());
  auto at = [&](int64_t i) { return i < P ? head[i] : tail[i - P]; };
  if (max_tokens <= 0) return {};
  for (int64_t n = std::min<int64_t>(max_n, L - 1); n >= std::max(min_n, 1); --n) {
    // Occurrences start at i <= L - n - 1 (one token follows them), latest first.
    for (int64_t i = L - n - 1; i >= 0; --i) {
      int64_t m = 0;
      while (m < n && at(i + m) == at(L - n + m)) ++m;
      if (m == n) return follow(at, L, i + n, max_tokens);
    }
  }
  return {};
}

size_t LookupIndex::KeyHash::operator()(const Key& k) const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
  for (int32_t v : k) h = (h ^ static_cast<uint32_t>(v)) * 1099511628211ull;
  return static_cast<size_t>(h);
}

LookupIndex::Key LookupIndex::key(int64_t start, int n) const {
  Key k{};
  k[0] = n;
  for (int m = 0; m < n; ++m) k[1 + m] = toks_[start + m];
  return k;
}

std::vector<int32_t> LookupIndex::drafts(int max_tokens) {
  const int64_t L = static_cast<int64_t>(toks_.size());
  if (L - indexed_ > 64)
    latest_.reserve(latest_.size() + (kLookupMaxN - kLookupMinN + 1) * (L - indexed_));
  for (; indexed_ < L; ++indexed_) {
    // Token t = indexed_ gives the n-grams that end just before it a follower.
    const int64_t t = indexed_;
    for (int n = kLookupMinN; n <= kLookupMaxN && n <= t; ++n) latest_[key(t - n, n)] = t - n;
  }
  if (max_tokens <= 0) return {};
  for (int64_t n = std::min<int64_t>(kLookupMaxN, L - 1); n >= kLookupMinN; --n) {
    const auto it = latest_.find(key(L - n, static_cast<int>(n)));
    if (it != latest_.end())
      return follow([this](int64_t i) { return toks_[i]; }, L, it->second + n, max_tokens);
  }
  return {};
}

bool LookupHits::promising() const {
  return (!open_.empty() && held_ >= kOpenHits) || (n_ > 0 && sum_ >= kMinMean * n_);
}

void LookupHits::shadow(std::vector<int32_t> drafts) {
  if (!open_.empty() || drafts.empty()) return;
  open_ = std::move(drafts);
  held_ = 0;
}

std::optional<int> LookupHits::token(int32_t t) {
  if (open_.empty()) return std::nullopt;
  const int drafted = static_cast<int>(open_.size());
  if (t == open_[held_] && ++held_ < drafted) return std::nullopt;
  const std::optional<int> held = close();
  learn_depth(*held, drafted);
  return held;
}

std::optional<int> LookupHits::close() {
  if (open_.empty()) return std::nullopt;
  const int held = held_;
  open_.clear();
  held_ = 0;
  record(held);
  return held;
}

void LookupHits::verified(int accepted, int drafted) {
  record(accepted);
  learn_depth(accepted, drafted);
}

void LookupHits::learn_depth(int accepted, int drafted) {
  depth_ = accepted == drafted ? std::min(2 * depth_, max_) : std::max(1, accepted + 1);
}

void LookupHits::record(int accepted) {
  sum_ = kDecay * sum_ + accepted;
  n_ = kDecay * n_ + 1;
}

}  // namespace tf
