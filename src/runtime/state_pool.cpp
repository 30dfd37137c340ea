#include "runtime/state_pool.h"

#include <algorithm>

#include "core/check.h"

namespace tf {

namespace {
constexpr size_t kMaxEvictedKeys = 1 << 16;

// FNV-1a over the block's token ids, chained with the previous block's hash.
uint64_t chain(uint64_t h, std::span<const int32_t> block) {
  h ^= 0x9e3779b97f4a7c15ull;
  for (int32_t t : block) {
    h ^= static_cast<uint32_t>(t);
    h *= 0x100000001b3ull;
  }
  return h;
}
}  // namespace

const char* miss_reason_name(MissReason r) {
  switch (r) {
    case MissReason::kNone:
      return "none";
    case MissReason::kDisabled:
      return "disabled";
    case MissReason::kTooShort:
      return "too_short";
    case MissReason::kNoPrefix:
      return "no_prefix";
    case MissReason::kEvicted:
      return "evicted";
  }
  return "?";
}

StatePool::StatePool(size_t max_bytes, int64_t align) : max_bytes_(max_bytes), align_(align) {
  TF_CHECK(align > 0, "align {}", align);
  stats_.max_bytes = max_bytes;
}

std::vector<uint64_t> StatePool::prefix_keys(std::span<const int32_t> tokens, int64_t n) const {
  std::vector<uint64_t> keys;
  uint64_t h = 0xcbf29ce484222325ull;
  for (int64_t end = align_; end <= n; end += align_) {
    h = chain(h, tokens.subspan(end - align_, align_));
    keys.push_back(h);
  }
  return keys;
}

std::list<StatePool::Entry>::iterator StatePool::lookup(uint64_t key,
                                                        std::span<const int32_t> prefix) {
  auto [lo, hi] = index_.equal_range(key);
  for (auto it = lo; it != hi; ++it) {
    const std::vector<int32_t>& t = it->second->tokens;
    if (std::equal(t.begin(), t.end(), prefix.begin(), prefix.end())) return it->second;
  }
  return lru_.end();
}

bool StatePool::contains(std::span<const int32_t> tokens) const {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0 || n % align_ != 0) return false;
  const uint64_t key = prefix_keys(tokens, n).back();
  auto [lo, hi] = index_.equal_range(key);
  for (auto it = lo; it != hi; ++it) {
    const std::vector<int32_t>& t = it->second->tokens;
    if (std::equal(t.begin(), t.end(), tokens.begin(), tokens.end())) return true;
  }
  return false;
}

int64_t StatePool::find(std::span<const int32_t> tokens, int64_t max_len, SequenceState* out,
                        MissReason* reason, bool count) {
  auto miss = [&](MissReason r) {
    *reason = r;
    if (count) ++stats_.misses[static_cast<int>(r)];
    return int64_t{0};
  };
  const int64_t n = std::min<int64_t>(max_len, static_cast<int64_t>(tokens.size()));
  if (max_bytes_ == 0) return miss(MissReason::kDisabled);
  if (n < align_) return miss(MissReason::kTooShort);
  const std::vector<uint64_t> keys = prefix_keys(tokens, n);
  bool was_evicted = false;
  for (size_t k = keys.size(); k-- > 0;) {
    const int64_t len = static_cast<int64_t>(k + 1) * align_;
    auto it = lookup(keys[k], tokens.first(len));
    if (it == lru_.end()) {
      was_evicted = was_evicted || evicted_.count(keys[k]) > 0;
      continue;
    }
    lru_.splice(lru_.begin(), lru_, it);  // most recently used
    *out = it->state;                     // copy-on-resume
    *reason = MissReason::kNone;
    if (count) {
      ++stats_.hits;
      stats_.cached_tokens += len;
    }
    return len;
  }
  return miss(was_evicted ? MissReason::kEvicted : MissReason::kNoPrefix);
}

void StatePool::put(std::span<const int32_t> tokens, const SequenceState& state) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  TF_CHECK(n > 0 && n % align_ == 0 && state.n_past == n, "put {} tokens, n_past {}, align {}", n,
           state.n_past, align_);
  const uint64_t key = prefix_keys(tokens, n).back();
  auto it = lookup(key, tokens);
  if (it != lru_.end()) {
    lru_.splice(lru_.begin(), lru_, it);
    return;
  }
  // A copy's buffers hold exactly their size, so its bytes are known before copying.
  size_t bytes = n * sizeof(int32_t);
  for (const auto& a : state.attn) bytes += (a.k.size() + a.v.size()) * sizeof(float);
  for (const auto& d : state.delta) bytes += (d.conv.size() + d.S.size()) * sizeof(float);
  if (bytes > max_bytes_) return;
  while (stats_.bytes + bytes > max_bytes_) evict_one();
  lru_.push_front(Entry{std::vector<int32_t>(tokens.begin(), tokens.end()), state, key, bytes});
  index_.emplace(key, lru_.begin());
  evicted_.erase(key);
  stats_.bytes += bytes;
  stats_.entries = lru_.size();
  ++stats_.puts;
}

void StatePool::evict_one() {
  TF_CHECK(!lru_.empty(), "evict from an empty pool ({} bytes counted)", stats_.bytes);
  auto victim = std::prev(lru_.end());
  auto [lo, hi] = index_.equal_range(victim->key);
  for (auto it = lo; it != hi; ++it) {
    if (it->second == victim) {
      index_.erase(it);
      break;
    }
  }
  if (evicted_.size() >= kMaxEvictedKeys) evicted_.clear();
  evicted_.insert(victim->key);
  stats_.bytes -= victim->bytes;
  lru_.erase(victim);
  stats_.entries = lru_.size();
  ++stats_.evictions;
}

}  // namespace tf
