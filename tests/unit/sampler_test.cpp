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
