// Prompt-lookup drafts (as vLLM's "ngram" speculator and llama.cpp's lookup decoding, after
// Saxena's prompt lookup decoding): when the last n tokens of a sequence occurred earlier in it,
// the tokens that followed that occurrence are a free guess at what comes next. A reply that copies
// or quotes its prompt (code edits, extraction, summaries that repeat names) drafts long runs this
// way without running any drafter; the target's verify step decides, so the tokens never change.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace tf {

// n-gram lengths tried, longest first.
inline constexpr int kLookupMinN = 2, kLookupMaxN = 4;

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
// n-gram that has a token after it, by its tokens.
class LookupIndex {
 public:
  void append(int32_t token);
  void append(std::span<const int32_t> tokens) {
    for (int32_t t : tokens) append(t);
  }
  // lookup_drafts(tokens so far, {}, max_tokens).
  std::vector<int32_t> drafts(int max_tokens) const;
  size_t size() const { return toks_.size(); }

 private:
  using Key = std::array<int32_t, kLookupMaxN + 1>;  // n, then the n tokens (unused: 0)
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  Key key(int64_t start, int n) const;
  std::vector<int32_t> toks_;
  std::unordered_map<Key, int64_t, KeyHash> latest_;  // n-gram -> its latest start with a follower
};

}  // namespace tf
