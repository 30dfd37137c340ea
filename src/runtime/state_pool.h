// The kept-state pool: snapshots of sequence states keyed by the exact token prefix they hold, so
// that the next turn of a chat resumes where the last one ended and prefills only the rest.
//
// Every kept state was computed by prefill (chunked delta rule, chunks ending at absolute multiples
// of kDeltaChunk) and holds a prefix whose length is a multiple of `align` (= kDeltaChunk), so a
// request resumed from it computes exactly what a fresh prefill of its whole prompt computes
// (architecture.md, determinism contract). A resumed request gets its own copy of the state
// (copy-on-resume for the KV cache and the recurrent state alike: nothing is shared).
//
// Entries are evicted least-recently-used first to keep the bytes they hold (SequenceState::bytes)
// within a budget. Their buffers come from the FloatBufs of the states put in, so the residency
// owner that follows those follows the pool too. Not thread-safe: the engine thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "model/model.h"

namespace tf {

// Why a lookup found nothing (a label of the /metrics miss counter).
enum class MissReason {
  kNone,      // a hit
  kDisabled,  // the pool's budget is 0
  kTooShort,  // the prompt is too short to have a kept prefix (<= align tokens)
  kNoPrefix,  // no entry holds a prefix of the prompt
  kEvicted,   // the longest prefix that was once kept has been evicted
};
const char* miss_reason_name(MissReason r);  // "disabled", "too_short", "no_prefix", "evicted"

struct StatePoolStats {
  uint64_t hits = 0, cached_tokens = 0, puts = 0, evictions = 0;
  uint64_t misses[5] = {};  // indexed by MissReason
  size_t entries = 0, bytes = 0, max_bytes = 0;
};

class StatePool {
 public:
  StatePool(size_t max_bytes, int64_t align);

  // The longest kept prefix of `tokens` no longer than `max_len`. On a hit returns its length and
  // copies its state into *out; on a miss returns 0, leaves *out alone and sets *reason. `count`:
  // whether the lookup counts in the hit/miss statistics (the engine's own lookups do not).
  int64_t find(std::span<const int32_t> tokens, int64_t max_len, SequenceState* out,
               MissReason* reason, bool count = true);
  // Keeps a copy of `state`, the state after `tokens` (state.n_past == tokens.size(), a positive
  // multiple of align). An existing entry for the same tokens is only marked used. Evicts the
  // least recently used entries to fit; a state larger than the whole budget is not kept.
  void put(std::span<const int32_t> tokens, const SequenceState& state);
  bool contains(std::span<const int32_t> tokens) const;

  const StatePoolStats& stats() const { return stats_; }
  int64_t align() const { return align_; }

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    SequenceState state;
    uint64_t key;
    size_t bytes;
  };
  // Hashes of tokens[0 : k * align] for k = 1 .. n / align (a chain over align-token blocks).
  std::vector<uint64_t> prefix_keys(std::span<const int32_t> tokens, int64_t n) const;
  // The entry holding exactly `prefix` (whose chain hash is `key`), or lru_.end().
  std::list<Entry>::iterator lookup(uint64_t key, std::span<const int32_t> prefix);
  void evict_one();

  size_t max_bytes_;
  int64_t align_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_multimap<uint64_t, std::list<Entry>::iterator> index_;
  std::unordered_set<uint64_t> evicted_;  // keys evicted (bounded), to tell kEvicted from kNoPrefix
  StatePoolStats stats_;
};

}  // namespace tf
