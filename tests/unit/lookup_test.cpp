// Prompt-lookup drafts (runtime/lookup.h): the longest of the last 2-4 tokens wins, then the most
// recent earlier occurrence; the drafts are the tokens after it, across the prompt/reply seam and
// past the context's end as a repeat.
#include "runtime/lookup.h"

#include <algorithm>
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

// The index catches up when asked: tokens appended one at a time and in runs, drafts asked only
// now and then, give the scan's drafts. (Checked to fail with the catch-up starting one token
// late: the first case's drafts came back empty.)
TEST(Lookup, IndexAskedNowAndThenEqualsTheScan) {
  {
    LookupIndex index;
    index.append(std::vector<int32_t>{5, 6, 7});
    EXPECT_TRUE(index.drafts(4).empty());
    index.append(8);  // gives "6 7" its follower; indexed only at the next drafts()
    index.append(std::vector<int32_t>{6, 7});
    EXPECT_EQ(index.drafts(4), (std::vector<int32_t>{8, 6, 7, 8}));
  }
  std::mt19937 rng(9);
  for (int alphabet : {3, 50, 1000}) {
    LookupIndex index;
    std::vector<int32_t> seq;
    int asked = 0;
    while (seq.size() < 600) {
      std::vector<int32_t> run(1 + rng() % 70);
      for (auto& t : run) t = static_cast<int32_t>(rng() % alphabet);
      if (seq.size() > 80 && rng() % 2 == 0) {  // a copy of an earlier stretch: lookups hold
        const size_t from = rng() % (seq.size() - run.size());
        std::copy_n(seq.begin() + static_cast<int64_t>(from), run.size(), run.begin());
      }
      seq.insert(seq.end(), run.begin(), run.end());
      if (run.size() % 2 == 0) {
        index.append(run);
      } else {
        for (int32_t t : run) index.append(t);
      }
      if (rng() % 3 == 0) continue;  // not asked this time
      ASSERT_EQ(index.drafts(8), lookup_drafts({}, seq, 8))
          << "alphabet " << alphabet << " length " << seq.size();
      ++asked;
    }
    EXPECT_GT(asked, 5);
  }
}

// A long context of many distinct n-grams (the table grows many times, between lookups and within
// one catch-up) still gives the scan's drafts.
TEST(Lookup, LongIndexEqualsTheScan) {
  std::mt19937 rng(17);
  LookupIndex index;
  std::vector<int32_t> seq;
  while (seq.size() < 6000) {
    std::vector<int32_t> run(1 + rng() % 300);
    for (auto& t : run) t = static_cast<int32_t>(rng() % 30000);
    if (seq.size() > 400 && rng() % 3 == 0) {  // an earlier stretch again: lookups hold
      const size_t from = rng() % (seq.size() - run.size());
      std::copy_n(seq.begin() + static_cast<int64_t>(from), run.size(), run.begin());
    }
    seq.insert(seq.end(), run.begin(), run.end());
    index.append(run);
    ASSERT_EQ(index.drafts(12), lookup_drafts({}, seq, 12)) << "length " << seq.size();
  }
}

// LookupHits: shadows resolve at their first draft that differs (or once all held), a lookup is
// promising only once one held kOpenHits tokens or the mean held per lookup reaches kMinMean,
// and the depth follows what held. (Checked to fail with promising() always true: the first
// EXPECT_FALSE; and with token() not resolving a shadow whose drafts all held: the depth 8.)
TEST(Lookup, HitsPromisingOnlyOnceLookupsHeld) {
  LookupHits h(8);
  EXPECT_FALSE(h.promising());  // nothing seen yet: never verify blind
  EXPECT_EQ(h.depth(), 8);
  h.shadow(V{1, 2, 3, 4});
  h.shadow(V{9, 9});  // one open at a time: ignored
  EXPECT_EQ(h.token(1), std::nullopt);
  EXPECT_FALSE(h.promising());  // one token held, kOpenHits = 2
  EXPECT_EQ(h.token(5), 1);     // resolved at the second draft
  EXPECT_TRUE(h.promising());   // one lookup, one draft held: a mean of 1 >= kMinMean
  EXPECT_EQ(h.depth(), 2);      // draft 2 was the first to fail
  // Prose-like: shadows that hold nothing pull the mean under kMinMean.
  for (int i = 0; i < 3; ++i) {
    h.shadow(V{7, 7});
    EXPECT_EQ(h.token(6), 0);
  }
  EXPECT_FALSE(h.promising());
  EXPECT_EQ(h.depth(), 1);
  // Copy-like: a shadow that holds two tokens is promising while still open.
  h.shadow(V{4});
  EXPECT_EQ(h.token(4), 1);  // all held: resolved, depth doubles
  EXPECT_EQ(h.depth(), 2);
  h.shadow(V{1, 2});
  EXPECT_EQ(h.token(1), std::nullopt);
  EXPECT_EQ(h.token(2), 2);  // all held
  EXPECT_EQ(h.depth(), 4);
  EXPECT_FALSE(h.promising());  // decayed mean 0.85 of the six
  h.shadow(V{3, 4, 5, 6});
  EXPECT_EQ(h.token(3), std::nullopt);
  EXPECT_EQ(h.token(4), std::nullopt);
  EXPECT_TRUE(h.promising());  // held 2, still open
  EXPECT_EQ(h.close(), 2);     // verified instead: what held so far counts, the depth stays
  EXPECT_EQ(h.depth(), 4);
  EXPECT_EQ(h.close(), std::nullopt);
  h.verified(4, 4);
  EXPECT_TRUE(h.promising());
  EXPECT_EQ(h.depth(), 8);
  h.verified(0, 8);
  EXPECT_EQ(h.depth(), 1);
}

}  // namespace
}  // namespace tf
