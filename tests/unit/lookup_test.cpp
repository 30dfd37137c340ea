// Prompt-lookup drafts (runtime/lookup.h): the longest of the last 2-4 tokens wins, then the most
// recent earlier occurrence; the drafts are the tokens after it, across the prompt/reply seam and
// past the context's end as a repeat.
#include "runtime/lookup.h"

#include <random>

#include <gtest/gtest.h>

namespace tf {
namespace {

using V = std::vector<int32_t>;

TEST(Lookup, TokensAfterTheLatestLongestMatch) {
  // Context 1 2 3 4 5 | 9 2 3: the suffix "2 3" (n = 2) occurred at 1; "9 2 3" (n = 3) never.
  EXPECT_EQ(lookup_drafts(V{1, 2, 3, 4, 5}, V{9, 2, 3}, 5), (V{4, 5, 9, 2, 3}));
  // Past the context's end the repeat goes on: 4 5 9 2 3, then 4 5 again.
  EXPECT_EQ(lookup_drafts(V{1, 2, 3, 4, 5}, V{9, 2, 3}, 7), (V{4, 5, 9, 2, 3, 4, 5}));
  EXPECT_EQ(lookup_drafts(V{1, 2, 3, 4, 5}, V{9, 2, 3}, 2), (V{4, 5}));
  // The latest occurrence of "7 8" is the one followed by 6 (after the seam).
  EXPECT_EQ(lookup_drafts(V{7, 8, 5, 7}, V{8, 6, 7, 8}, 1), (V{6}));
  // A longer match wins over a later shorter one: "1 2 3" at 0 beats "2 3" at 5.
  EXPECT_EQ(lookup_drafts(V{1, 2, 3, 4, 0, 2, 3, 9, 1, 2, 3}, V{}, 3), (V{4, 0, 2}));
  // A repeating run drafts its own continuation.
  EXPECT_EQ(lookup_drafts(V{}, V{5, 6, 5, 6, 5, 6}, 5), (V{5, 6, 5, 6, 5}));
}

TEST(Lookup, NothingWithoutAMatchOrRoom) {
  EXPECT_TRUE(lookup_drafts(V{1, 2, 3}, V{4, 5}, 8).empty());  // no bigram repeats
  EXPECT_TRUE(lookup_drafts(V{1, 2, 3}, V{1, 2}, 0).empty());  // no room
  EXPECT_TRUE(lookup_drafts(V{}, V{}, 8).empty());
  EXPECT_TRUE(lookup_drafts(V{4}, V{4}, 8).empty());  // one token repeats: below the minimum n
  // min_n 1: the single token matches.
  EXPECT_EQ(lookup_drafts(V{4, 7}, V{4}, 3, 1, 4), (V{7, 4, 7}));
}

// The index gives the scan's drafts after every token of random sequences over small alphabets
// (many repeats, n-grams of every length matching), for several depths. Checked to fail with the
// index keeping the first occurrence of an n-gram instead of the latest.
TEST(Lookup, IndexEqualsTheScan) {
  std::mt19937 rng(4);
  for (int alphabet : {2, 3, 5, 40}) {
    LookupIndex index;
    std::vector<int32_t> seq;
    for (int i = 0; i < 400; ++i) {
      const int32_t t = static_cast<int32_t>(rng() % alphabet);
      seq.push_back(t);
      index.append(t);
      for (int max_tokens : {1, 4, 12})
        ASSERT_EQ(index.drafts(max_tokens), lookup_drafts({}, seq, max_tokens))
            << "alphabet " << alphabet << " length " << seq.size() << " max " << max_tokens;
    }
  }
}

}  // namespace
}  // namespace tf
