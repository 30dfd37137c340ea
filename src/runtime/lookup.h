// Prompt-lookup drafts (as vLLM's "ngram" speculator and llama.cpp's lookup decoding, after
// Saxena's prompt lookup decoding): when the last n tokens of a sequence occurred earlier in it,
// the tokens that followed that occurrence are a free guess at what comes next. A reply that copies
// or quotes its prompt (code edits, extraction, summaries that repeat names) drafts long runs this
// way without running any drafter; the target's verify step decides, so the tokens never change.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace tf {

// n-gram lengths tried, longest first.
inline constexpr int kLookupMinN = 2, kLookupMaxN = 4;
static_assert(kLookupMaxN < 8, "LookupIndex keeps n in three bits");

// The context is `head` followed by `tail` (a prompt and the reply so far, whose last token is the
// next one fed). For n = max_n down to min_n: the most recent earlier occurrence of the context's
// last n tokens (not the suffix itself) followed by at least one token; returns `max_tokens` of
// the tokens after it, the context repeating itself past its end (after "5 6 5 6" the drafts are
// "5 6 5 6 .."), or nothing when no n matches. A scan of the context: the reference for
// LookupIndex.
std::vector<int32_t> lookup_drafts(std::span<const int32_t> head, std::span<const int32_t> tail,
                                   int max_tokens, int min_n = kLookupMinN,
                                   int max_n = kLookupMaxN);

// lookup_drafts (kLookupMinN .. kLookupMaxN) over a sequence that grows a token at a time, in
// O(max_n) per token and per lookup instead of a scan of the context: the latest start of every
// n-gram that has a token after it, by its tokens. The n-grams are indexed when drafts() is
// called, not when tokens are appended, so a request that never asks (a batch above
// --draft-max-streams, a reply that ends first) never pays for its prompt's index.
// The table is open addressing over the token array itself: a slot holds an n-gram's latest start
// and its n with hash bits, and the tokens are compared in place, so an insert allocates nothing
// (a node-based map allocated one per n-gram: its first lookup cost 9.4-11.0 us for a 100-token
// prompt and 262-282 us for 2000 on the development VM against 1.25-1.35 and 24-26 us now,
// `bench/lookup_bench`; docs/PERFORMANCE.md, "The prompt-lookup index without a node per n-gram").
class LookupIndex {
 public:
  void append(int32_t token) { toks_.push_back(token); }
  void append(std::span<const int32_t> tokens) {
    toks_.insert(toks_.end(), tokens.begin(), tokens.end());
  }
  // lookup_drafts(tokens so far, {}, max_tokens); indexes the tokens appended since the last call
  // first.
  std::vector<int32_t> drafts(int max_tokens);
  size_t size() const { return toks_.size(); }

 private:
  // start + 1 (0: empty); tag: the hash's high bits with n in the low 3.
  struct Slot {
    int32_t start1 = 0;
    uint32_t tag = 0;
  };
  uint64_t hash(int64_t start, int n) const;
  static uint32_t tag_of(uint64_t h, int n) {
    return (static_cast<uint32_t>(h >> 32) & ~7u) | static_cast<uint32_t>(n);
  }
  // The slot of the n-gram toks_[start, start + n): its own, or the empty one where it would go.
  size_t find(int64_t start, int n, uint64_t h) const;
  // Records `start` as the n-gram's latest; drafts() has made room first.
  void insert(int64_t start, int n);
  void grow(size_t capacity);
  std::vector<int32_t> toks_;
  std::vector<Slot> slots_;  // a power of two, at most half full
  size_t used_ = 0;
  int64_t indexed_ = 0;  // toks_[0, indexed_) are indexed (the n-grams before each)
};

// Whether a sequence's prompt lookups hold, learned at no cost: a lookup that matched but is not
// verified is a shadow, checked against the tokens that come next; a verified one counts the drafts
// the target accepted. An engine verifies a request's lookups only once they have been seen to
// hold (promising()), so a reply where 2-4-token matches rarely continue (prose) never pays for a
// verify row of up to draft_lookup + 1 tokens to find that out. Before, a fresh engine's first
// sweep verified one such row of 12 drafts on the drafting bench's prose (1 accepted), and the
// lookup prior's probes verified more later (docs/PERFORMANCE.md, "Lookups verified only where
// they have been seen to hold").
class LookupHits {
 public:
  // A shadow that has held this many tokens so far is promising, or the decayed mean of accepted
  // drafts per lookup (shadows and verified lookups) once it is at least kMinMean.
  static constexpr int kOpenHits = 2;
  static constexpr double kMinMean = 1.0, kDecay = 0.8;

  LookupHits() = default;
  explicit LookupHits(int max_depth) : max_(max_depth), depth_(max_depth) {}
  bool promising() const;
  // Drafts to ask of the next lookup: max_depth at first; after a lookup (shadow or verified)
  // that held all its drafts, twice as many (up to max_depth); after one whose draft j + 1 was
  // the first to fail, j + 1.
  int depth() const { return depth_; }
  // A lookup that matched and will not be verified: its drafts are checked against the tokens
  // that follow. Ignored while a shadow is open (it resolves first).
  void shadow(std::vector<int32_t> drafts);
  // The next token of the sequence: resolves the open shadow at its first draft that differs or
  // once all held. Returns the drafts that held when it resolved the shadow.
  std::optional<int> token(int32_t t);
  // A lookup is verified this step: the open shadow closes with what it held so far (returned, as
  // by token(); its drafts overlap the verified ones', and the depth stays), then verified()
  // records the verified one once the target has judged its drafts.
  std::optional<int> close();
  void verified(int accepted, int drafted);

 private:
  void record(int accepted);
  void learn_depth(int accepted, int drafted);
  int max_ = 0, depth_ = 0;
  std::vector<int32_t> open_;  // the open shadow's drafts (empty: none)
  int held_ = 0;               // of them, those that held so far
  double sum_ = 0, n_ = 0;     // decayed sums of accepted drafts and of lookups
};

}  // namespace tf
