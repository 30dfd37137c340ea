// The kept-state pool and the engine around it, on a small random model:
//   - StatePool: longest exact prefix, copy-on-resume, LRU under a byte budget, miss reasons;
//   - property: random mixes of 1-16 requests (random prompts, lengths, arrival times, batch
//     budgets, thread counts, shared prefixes) give each request the tokens AND logits, bit for
//     bit, that it gets alone on an engine with no pool;
//   - multi-turn: random 5-10 turn chats resume every turn after the first from a kept state and
//     each turn equals the same request computed from scratch.
// Checked to fail: keeping states at positions that are not multiples of the delta-rule chunk
// (align_down in engine.cpp to 48 instead of kDeltaChunk) makes the resumed logits differ from the
// fresh ones in MultiTurnResumedEqualsFresh and RandomMixesEqualAlone; running a 1-token piece of a
// prompt with the recurrent form (DeltaForm::kAuto in the engine) fails RandomMixesEqualAlone.
#include <random>

#include <gtest/gtest.h>

#include "runtime/engine.h"
#include "runtime/state_pool.h"
#include "unit/engine_util.h"
#include "unit/test_util.h"

namespace tf {
namespace {

using testing::Collector;
using testing::same_bits;

class KeptStateTest : public testing::SmallModelTest {
 protected:
  // A state after `tokens`, computed by one prefill.
  SequenceState prefilled(const std::vector<int32_t>& tokens) const {
    SequenceState s = model_->new_state();
    std::vector<float> logits;
    const StepInput in{&s, tokens, false};
    model_->forward(std::span(&in, 1), &logits, nullptr);
    return s;
  }
  static std::vector<int32_t> random_tokens(std::mt19937& rng, int n) {
    std::uniform_int_distribution<int> tok(0, 95);
    std::vector<int32_t> t(n);
    for (auto& x : t) x = tok(rng);
    return t;
  }
  struct Result {
    std::vector<int32_t> tokens;
    std::vector<std::vector<float>> logits;
    int64_t n_cached;
    FinishReason reason;
  };
  // The request alone on a fresh engine with no pool.
  Result alone(const GenerationRequest& proto) {
    EngineOptions o;
    o.scheduler.max_running = 1;
    o.scheduler.batch_tokens = 4096;
    o.state_cache_bytes = 0;
    Engine engine(*model_, o);
    Collector c;
    GenerationRequest r = proto;
    r.on_event = c.callback();
    EXPECT_TRUE(engine.submit(std::move(r)).is_ok());
    c.wait();
    return Result{c.tokens, c.logits, c.n_cached, c.reason};
  }
};

TEST_F(KeptStateTest, PoolFindsTheLongestExactPrefixAndCopies) {
  std::mt19937 rng(1);
  const std::vector<int32_t> t = random_tokens(rng, 200);
  StatePool pool(size_t{1} << 30, 64);
  const std::vector<int32_t> t64(t.begin(), t.begin() + 64), t128(t.begin(), t.begin() + 128);
  pool.put(t64, prefilled(t64));
  pool.put(t128, prefilled(t128));
  EXPECT_EQ(pool.stats().entries, 2u);

  SequenceState got;
  MissReason why;
  EXPECT_EQ(pool.find(t, 200, &got, &why), 128);
  EXPECT_EQ(why, MissReason::kNone);
  EXPECT_EQ(got.n_past, 128);
  EXPECT_EQ(pool.find(t, 127, &got, &why), 64);  // the limit leaves tokens to feed
  EXPECT_EQ(got.n_past, 64);

  // The copy is the caller's: changing it leaves the kept state alone.
  got.delta[0].S[0] += 1.0f;
  SequenceState again;
  EXPECT_EQ(pool.find(t, 127, &again, &why), 64);
  EXPECT_EQ(again.delta[0].S, prefilled(t64).delta[0].S);

  // A prompt that differs inside the first 64 tokens shares nothing.
  std::vector<int32_t> other = t;
  other[10] = (other[10] + 1) % 96;
  EXPECT_EQ(pool.find(other, 200, &got, &why), 0);
  EXPECT_EQ(why, MissReason::kNoPrefix);
  // ... one that differs after 64 resumes at 64.
  other = t;
  other[100] = (other[100] + 1) % 96;
  EXPECT_EQ(pool.find(other, 200, &got, &why), 64);
  EXPECT_EQ(pool.find(std::vector<int32_t>(t.begin(), t.begin() + 40), 40, &got, &why), 0);
  EXPECT_EQ(why, MissReason::kTooShort);
  EXPECT_EQ(pool.stats().hits, 4u);
  EXPECT_EQ(pool.stats().misses[static_cast<int>(MissReason::kNoPrefix)], 1u);
  EXPECT_EQ(pool.stats().misses[static_cast<int>(MissReason::kTooShort)], 1u);
}

TEST_F(KeptStateTest, PoolEvictsLeastRecentlyUsedWithinItsBudget) {
  std::mt19937 rng(2);
  std::vector<std::vector<int32_t>> keys;
  for (int i = 0; i < 3; ++i) keys.push_back(random_tokens(rng, 64));
  const SequenceState s0 = prefilled(keys[0]);
  const size_t one = s0.bytes() + 64 * sizeof(int32_t);
  StatePool pool(2 * one + one / 2, 64);  // room for two
  pool.put(keys[0], s0);
  pool.put(keys[1], prefilled(keys[1]));
  SequenceState got;
  MissReason why;
  EXPECT_EQ(pool.find(keys[0], 64, &got, &why), 64);  // 0 is now the most recently used
  pool.put(keys[2], prefilled(keys[2]));              // evicts 1
  EXPECT_EQ(pool.stats().entries, 2u);
  EXPECT_EQ(pool.stats().evictions, 1u);
  EXPECT_LE(pool.stats().bytes, pool.stats().max_bytes);
  EXPECT_TRUE(pool.contains(keys[0]));
  EXPECT_FALSE(pool.contains(keys[1]));
  EXPECT_TRUE(pool.contains(keys[2]));
  EXPECT_EQ(pool.find(keys[1], 64, &got, &why), 0);
  EXPECT_EQ(why, MissReason::kEvicted);

  StatePool off(0, 64);
  off.put(keys[0], s0);  // a state larger than the budget is not kept
  EXPECT_EQ(off.stats().entries, 0u);
  EXPECT_EQ(off.find(keys[0], 64, &got, &why), 0);
  EXPECT_EQ(why, MissReason::kDisabled);
}

// Random mixes of 1-16 requests, with prompts that share prefixes (so some resume from states
// kept by others in the same mix), arriving at random times: every request's tokens and logits
// equal those it gets alone with no pool, bit for bit.
TEST_F(KeptStateTest, RandomMixesEqualAlone) {
  std::mt19937 rng(7);
  uint64_t hits = 0;
  for (int trial = 0; trial < (testing::kSanitized ? 3 : 6); ++trial) {
    const int n = std::uniform_int_distribution<int>(1, 16)(rng);
    const std::vector<int32_t> shared = random_tokens(rng, 150);
    std::vector<GenerationRequest> reqs(n);
    for (auto& r : reqs) {
      const int len = std::uniform_int_distribution<int>(1, 220)(rng);
      r.prompt = random_tokens(rng, len);
      if (rng() % 2) {  // a shared head of 64-150 tokens
        const int head = std::uniform_int_distribution<int>(64, 150)(rng);
        r.prompt.insert(r.prompt.begin(), shared.begin(), shared.begin() + head);
      }
      r.max_tokens = std::uniform_int_distribution<int>(1, 12)(rng);
    }
    EngineOptions o;
    o.scheduler.max_running = std::uniform_int_distribution<int>(1, 16)(rng);
    o.scheduler.batch_tokens = std::vector<int>{16, 64, 100, 512}[rng() % 4];
    o.threads = 1 + static_cast<int>(rng() % 2);
    std::vector<std::unique_ptr<Collector>> cols;
    {
      Engine engine(*model_, o);
      for (auto& r : reqs) {
        cols.push_back(std::make_unique<Collector>());
        GenerationRequest q = r;
        q.on_event = cols.back()->callback();
        ASSERT_TRUE(engine.submit(std::move(q)).is_ok());
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
      }
      for (auto& c : cols) c->wait();
      hits += engine.stats().pool.hits;
    }
    for (int i = 0; i < n; ++i) {
      const Result ref = alone(reqs[i]);
      ASSERT_EQ(cols[i]->tokens, ref.tokens) << "trial " << trial << " request " << i;
      ASSERT_EQ(cols[i]->logits.size(), ref.logits.size());
      for (size_t t = 0; t < ref.logits.size(); ++t) {
        ASSERT_TRUE(same_bits(cols[i]->logits[t], ref.logits[t]))
            << "trial " << trial << " request " << i << " token " << t << " (cached "
            << cols[i]->n_cached << ", prompt " << reqs[i].prompt.size() << ", " << n
            << " requests, parallel " << o.scheduler.max_running << ", batch "
            << o.scheduler.batch_tokens << ", threads " << o.threads << ")";
      }
    }
  }
  EXPECT_GT(hits, 0u);  // the mixes did resume from kept states
}

// Random 5-10 turn chats: each turn's prompt is the last turn's prompt + reply + a new message.
// Every turn after the first resumes from the state kept at the end of the last turn (prompt +
// reply, aligned down), and its tokens and logits equal the same request computed from scratch.
TEST_F(KeptStateTest, MultiTurnResumedEqualsFresh) {
  std::mt19937 rng(11);
  EngineOptions o;
  o.scheduler.batch_tokens = 100;
  o.threads = 2;
  Engine engine(*model_, o);
  for (int chat = 0; chat < 3; ++chat) {
    const int turns = std::uniform_int_distribution<int>(5, 10)(rng);
    std::vector<int32_t> convo = random_tokens(rng, 70);  // a "system prompt"
    for (int turn = 0; turn < turns; ++turn) {
      const std::vector<int32_t> msg = random_tokens(rng, 5 + static_cast<int>(rng() % 40));
      convo.insert(convo.end(), msg.begin(), msg.end());
      GenerationRequest r;
      r.prompt = convo;
      r.max_tokens = 3 + static_cast<int>(rng() % 30);
      r.stop_tokens = {static_cast<int32_t>(rng() % 96)};
      Collector c;
      GenerationRequest q = r;
      q.on_event = c.callback();
      ASSERT_TRUE(engine.submit(std::move(q)).is_ok());
      c.wait();
      testing::wait_idle(engine);  // the turn's state is kept before the next turn comes
      const Result ref = alone(r);
      ASSERT_EQ(c.tokens, ref.tokens) << "chat " << chat << " turn " << turn;
      for (size_t t = 0; t < ref.logits.size(); ++t)
        ASSERT_TRUE(same_bits(c.logits[t], ref.logits[t])) << "turn " << turn << " token " << t;
      EXPECT_EQ(c.reason, ref.reason);
      // The last turn's prompt + reply (+ stop token) is a prefix of this prompt, kept aligned.
      const int64_t P = static_cast<int64_t>(convo.size());
      if (turn > 0) {
        EXPECT_GT(c.n_cached, 0) << "turn " << turn;
        EXPECT_EQ(c.n_cached % kDeltaChunk, 0);
        EXPECT_GT(c.n_cached, P - static_cast<int64_t>(msg.size()) - kDeltaChunk - 1);
      }
      convo.insert(convo.end(), c.tokens.begin(), c.tokens.end());
      if (c.reason == FinishReason::kStop) convo.push_back(r.stop_tokens[0]);
    }
  }
  EXPECT_GT(engine.stats().keep_jobs, 0u);
}

}  // namespace
}  // namespace tf
