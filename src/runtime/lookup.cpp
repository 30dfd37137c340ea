#include "runtime/lookup.h"

#include <algorithm>
#include <bit>

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

uint64_t LookupIndex::hash(int64_t start, int n) const {
  uint64_t h = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(n + 1);
  for (int m = 0; m < n; ++m)
    h = (h ^ static_cast<uint32_t>(toks_[start + m])) * 0xff51afd7ed558ccdull;
  return h ^ (h >> 29);
}

size_t LookupIndex::find(int64_t start, int n, uint64_t h) const {
  const size_t mask = slots_.size() - 1;
  const uint32_t tag = tag_of(h, n);
  for (size_t i = h & mask;; i = (i + 1) & mask) {  // linear probing; never full
    const Slot& s = slots_[i];
    if (s.start1 == 0) return i;
    if (s.tag == tag && std::equal(toks_.begin() + start, toks_.begin() + start + n,
                                   toks_.begin() + (s.start1 - 1)))
      return i;
  }
}

void LookupIndex::grow(size_t capacity) {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{});
  for (const Slot& s : old) {
    if (s.start1 == 0) continue;
    const int64_t start = s.start1 - 1;
    const int n = static_cast<int>(s.tag & 7u);
    slots_[find(start, n, hash(start, n))] = s;
  }
}

void LookupIndex::insert(int64_t start, int n) {
  const uint64_t h = hash(start, n);
  Slot& s = slots_[find(start, n, h)];
  used_ += s.start1 == 0;
  s = Slot{static_cast<int32_t>(start + 1), tag_of(h, n)};  // the latest start
}

std::vector<int32_t> LookupIndex::drafts(int max_tokens) {
  const int64_t L = static_cast<int64_t>(toks_.size());
  // Room for every n-gram of the tokens not indexed yet, so that the table stays at most half
  // full through the inserts below (a prompt's first lookup: one growth).
  const size_t want = used_ + static_cast<size_t>(kLookupMaxN - kLookupMinN + 1) * (L - indexed_);
  if (2 * want > slots_.size()) grow(std::bit_ceil(std::max<size_t>(64, 2 * want)));
  for (; indexed_ < L; ++indexed_) {
    // Token t = indexed_ gives the n-grams that end just before it a follower.
    const int64_t t = indexed_;
    for (int n = kLookupMinN; n <= kLookupMaxN && n <= t; ++n) insert(t - n, n);
  }
  if (max_tokens <= 0 || slots_.empty()) return {};
  for (int64_t n = std::min<int64_t>(kLookupMaxN, L - 1); n >= kLookupMinN; --n) {
    const int64_t start = L - n;
    const Slot& s = slots_[find(start, static_cast<int>(n), hash(start, static_cast<int>(n)))];
    if (s.start1 != 0)
      return follow([this](int64_t i) { return toks_[i]; }, L, s.start1 - 1 + n, max_tokens);
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
