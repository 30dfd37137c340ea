#include <map>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/sampler.h"

namespace tf {
namespace {

TEST(Sampler, GreedyPicksArgmaxLowestOnTies) {
  std::vector<float> l = {0.1f, 3.0f, 3.0f, -1.0f};
  EXPECT_EQ(argmax(l), 1);
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.sample(l), 1);
}

TEST(Sampler, SameSeedSameTokens) {
  std::vector<float> l = {1.0f, 1.1f, 0.9f, 1.05f, 0.2f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  Sampler a(p), b(p);
  std::vector<int> ta, tb;
  for (int i = 0; i < 50; ++i) ta.push_back(a.sample(l)), tb.push_back(b.sample(l));
  EXPECT_EQ(ta, tb);
  std::map<int, int> counts;
  for (int t : ta) counts[t]++;
  EXPECT_GE(counts.size(), 3u);  // it really samples
}

TEST(Sampler, TopKAndTopPRestrictTheSupport) {
  std::vector<float> l = {5.0f, 4.0f, 0.0f, -1.0f, -2.0f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  Sampler k(p);
  for (int i = 0; i < 200; ++i) EXPECT_LT(k.sample(l), 2);
  p.top_k = 0;
  p.top_p = 0.5f;  // token 0 alone has ~72% of the mass
  Sampler tp(p);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(tp.sample(l), 0);
}

}  // namespace
}  // namespace tf

namespace tf {
namespace {

// OpenAI's rule: logit -= count * frequency_penalty + presence_penalty for tokens already sampled.
TEST(Sampler, PenaltiesDiscourageRepeats) {
  std::vector<float> l = {2.0f, 1.5f, 0.0f};
  Sampler plain(SamplingParams{});
  EXPECT_EQ(plain.sample(l), 0);
  EXPECT_EQ(plain.sample(l), 0);
  SamplingParams p;
  p.presence_penalty = 1.0f;  // greedy, so the pick is deterministic
  Sampler pen(p);
  EXPECT_EQ(pen.sample(l), 0);  // 2.0 vs 1.5
  EXPECT_EQ(pen.sample(l), 1);  // 1.0 vs 1.5
  EXPECT_EQ(pen.sample(l), 0);  // 1.0 vs 0.5: presence counts once
  p.presence_penalty = 0.0f;
  p.frequency_penalty = 0.4f;
  Sampler freq(p);
  EXPECT_EQ(freq.sample(l), 0);  // 2.0
  EXPECT_EQ(freq.sample(l), 0);  // 1.6 vs 1.5
  EXPECT_EQ(freq.sample(l), 1);  // 1.2 vs 1.5
}

}  // namespace
}  // namespace tf
