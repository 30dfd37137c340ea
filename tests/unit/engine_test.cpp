// The engine on a small random model: batched == alone, bit for bit; cancellation; queue limits.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "runtime/engine.h"
#include "unit/engine_util.h"
#include "unit/test_util.h"

namespace tf {
namespace {

using testing::Collector;

class EngineTest : public testing::SmallModelTest {
 protected:
  std::vector<int32_t> prompt(int n, int seed) const {
    std::vector<int32_t> p(n);
    for (int i = 0; i < n; ++i) p[i] = (i * 13 + seed * 7 + 1) % 96;
    return p;
  }
  // Seven prompts of 1 .. 151 tokens.
  std::vector<std::vector<int32_t>> prompts() const {
    std::vector<std::vector<int32_t>> ps;
    for (int i = 0; i < 7; ++i) ps.push_back(prompt(1 + i * 25, i));
    return ps;
  }
  // Four requests at a time in steps of 100 tokens: prefill chunks share steps with decode rows.
  static EngineOptions batched() {
    EngineOptions o;
    o.scheduler.max_running = 4;
    o.scheduler.batch_tokens = 100;
    o.threads = 2;
    return o;
  }
  // Greedy tokens of each prompt, all submitted at once to an engine with these options.
  std::vector<std::vector<int32_t>> run(const std::vector<std::vector<int32_t>>& prompts,
                                        const EngineOptions& o, int max_tokens) {
    Engine engine(*model_, o);
    std::vector<std::unique_ptr<Collector>> cols;
    for (const auto& p : prompts) {
      cols.push_back(std::make_unique<Collector>());
      GenerationRequest r;
      r.prompt = p;
      r.max_tokens = max_tokens;
      Collector* c = cols.back().get();
      r.on_event = [c](const TokenEvent& e) { c->on_event(e); };
      EXPECT_TRUE(engine.submit(std::move(r)).is_ok());
    }
    std::vector<std::vector<int32_t>> out;
    for (auto& c : cols) {
      c->wait();
      EXPECT_EQ(c->reason, FinishReason::kLength);
      out.push_back(c->tokens);
    }
    return out;
  }
};

// Every request's greedy tokens are the same alone or among 6 others with chunked prefill sharing
// steps with decode rows. (Checked to fail by letting the scheduler cut prefill chunks off the
// 64-alignment: the 150-token prompt's tokens then change.)
TEST_F(EngineTest, BatchedEqualsAlone) {
  const std::vector<std::vector<int32_t>> prompts = this->prompts();
  EngineOptions alone_o;
  alone_o.scheduler.max_running = 1;
  alone_o.scheduler.batch_tokens = 4096;
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : prompts) alone.push_back(run({p}, alone_o, 12)[0]);
  const auto batched_run = run(prompts, batched(), 12);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(batched_run[i], alone[i]) << "request " << i;
    EXPECT_EQ(alone[i].size(), 12u);
  }
}

// Requests that want no logits (GenerationRequest::want_logits = false, as the server's) get
// their greedy tokens from argmax steps (Model::forward_argmax): the same tokens as requests that
// take the logits rows, alone or batched with chunked prefill, and beside requests that want
// logits (those steps take the rows for every request). Their events carry no logits, which shows
// the argmax steps ran. (Checked to fail with forward_argmax's rows read one row late: the
// first request's tokens change.)
TEST_F(EngineTest, ArgmaxStepsGiveTheSampledTokens) {
  const std::vector<std::vector<int32_t>> prompts = this->prompts();
  const EngineOptions o = batched();
  // want: 0 every request wants logits, 1 none, 2 every other one.
  std::vector<std::vector<testing::Reply>> runs;
  for (int want = 0; want < 3; ++want) {
    Engine engine(*model_, o);
    std::vector<GenerationRequest> reqs;
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerationRequest r;
      r.prompt = prompts[i];
      r.max_tokens = 10;
      r.want_logits = want == 0 || (want == 2 && i % 2 == 0);
      reqs.push_back(r);
    }
    runs.push_back(testing::run_all(engine, reqs));
  }
  const int64_t V = model_->config().vocab_size;
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(runs[0][i].tokens.size(), 10u) << "request " << i;
    EXPECT_EQ(runs[1][i].tokens, runs[0][i].tokens) << "request " << i << ", argmax steps";
    EXPECT_EQ(runs[2][i].tokens, runs[0][i].tokens) << "request " << i << ", mixed";
    for (const auto& row : runs[0][i].logits) EXPECT_EQ(static_cast<int64_t>(row.size()), V);
    for (const auto& row : runs[1][i].logits) EXPECT_TRUE(row.empty()) << "request " << i;
  }
}

// The engine's step accounting (EngineStats::step_seconds / model_seconds, which the drafting
// bench prints as host + model time per step): every step that ran a forward is counted, the
// model's share is positive and below the step's. (Checked to fail with Model::forward left out
// of the model's share: model_seconds stayed 0.)
TEST_F(EngineTest, StepsSplitIntoHostAndModelTime) {
  Engine engine(*model_, EngineOptions{});
  Collector c;
  GenerationRequest r;
  r.prompt = prompt(20, 1);
  r.max_tokens = 8;
  r.on_event = [&c](const TokenEvent& e) { c.on_event(e); };
  ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
  c.wait();
  // The last event leaves inside the last step's commit, before the step is counted.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (engine.stats().steps < 8 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.steps, 8u);  // the prompt's step (with the first token), then 7 decode steps
  EXPECT_GT(s.model_seconds, 0.0);
  EXPECT_GT(s.step_seconds, s.model_seconds);
}

TEST_F(EngineTest, CancelAndQueueFull) {
  EngineOptions o;
  o.scheduler.max_running = 1;
  o.scheduler.max_queue = 1;  // one running + one waiting
  Engine engine(*model_, o);
  Collector a, b;
  GenerationRequest ra;
  ra.prompt = prompt(5, 1);
  ra.max_tokens = 1 << 20;
  ra.on_event = [&](const TokenEvent& e) { a.on_event(e); };
  auto ida = engine.submit(std::move(ra));
  ASSERT_TRUE(ida.is_ok());
  // Wait until a runs, then fill the queue with b; a third is refused.
  while (engine.stats().running == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  GenerationRequest rb;
  rb.prompt = prompt(5, 2);
  rb.max_tokens = 3;
  rb.on_event = [&](const TokenEvent& e) { b.on_event(e); };
  ASSERT_TRUE(engine.submit(std::move(rb)).is_ok());
  GenerationRequest rc;
  rc.prompt = prompt(5, 3);
  auto idc = engine.submit(std::move(rc));
  ASSERT_FALSE(idc.is_ok());
  EXPECT_EQ(idc.status().code(), StatusCode::kResourceExhausted);
  engine.cancel(*ida);
  a.wait();
  EXPECT_EQ(a.reason, FinishReason::kCancelled);
  b.wait();  // b runs once a is gone
  EXPECT_EQ(b.reason, FinishReason::kLength);
  EXPECT_EQ(b.tokens.size(), 3u);
  EXPECT_EQ(engine.stats().running, 0u);
}

// Chained steps on the CPU (EngineOptions::chain_on_host: the step after a plain greedy decode
// step is launched, its tokens taken from the step before, before this one's tokens are read,
// emitted and committed; on the CPU each launch runs at once): the unchained engine's tokens for
// requests that stop mid-chain at a stop token (the row launched after it is dropped), at
// max_tokens of 1-3, at the context limit, 7 at once or 2 at a time behind a queue, and a request
// cancelled while a chained step is launched. The device runs the same bookkeeping
// (tests/cuda/engine_test.cpp). Checked to fail: a build whose chained launch fed each row the
// host's last token (not the step before's) gave other tokens; one that committed the rows of
// requests already finished stopped with map::at.
TEST_F(EngineTest, ChainedStepsEqualUnchained) {
  std::vector<GenerationRequest> reqs = testing::argmax_requests(prompts(), 30);  // they chain
  EngineOptions o = batched();
  o.ctx_size = 170;  // the 151-token prompt meets the context limit before max_tokens
  o.state_cache_bytes = 0;
  // Each request stops at its free-running reply's token 3 + 2i, some at max_tokens 1, 2, 3.
  {
    Engine plain(*model_, o);
    const std::vector<testing::Reply> free_run = testing::run_all(plain, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_FALSE(free_run[i].tokens.empty());
      const size_t at = std::min(free_run[i].tokens.size() - 1, 3 + 2 * i);
      reqs[i].stop_tokens = {free_run[i].tokens[at]};
      if (i % 3 == 2) reqs[i].max_tokens = 1 + static_cast<int>(i / 3) % 3;
    }
  }
  for (int running : {7, 2}) {
    o.scheduler.max_running = running;
    o.chain = false;
    Engine plain(*model_, o);
    o.chain = o.chain_on_host = true;
    Engine chained(*model_, o);
    const std::vector<testing::Reply> want = testing::run_all(plain, reqs);
    const std::vector<testing::Reply> got = testing::run_all(chained, reqs);
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(got[i].tokens, want[i].tokens) << running << " at once, request " << i;
    EXPECT_EQ(plain.stats().chained_steps, 0u);
    EXPECT_GT(chained.stats().chained_steps, 5u) << running << " at once";
  }
  // Cancelled while a chained step is launched: the 20th token's event holds the engine thread
  // until the cancel is in, so the request ends at the step after it, with the unchained reply's
  // first 20 or 21 tokens.
  EngineOptions oc = batched();
  oc.scheduler.max_running = 1;
  oc.chain = oc.chain_on_host = true;
  Engine chained(*model_, oc);
  Collector c;
  std::mutex mu;
  std::condition_variable cv;
  size_t seen = 0;
  bool cancelled = false;
  GenerationRequest r;
  r.prompt = prompt(9, 4);
  r.max_tokens = 40;
  r.want_logits = false;
  GenerationRequest same = r;
  r.on_event = [&](const TokenEvent& e) {
    c.on_event(e);
    std::unique_lock<std::mutex> lock(mu);
    if (++seen == 20) {
      cv.notify_all();
      cv.wait(lock, [&] { return cancelled; });
    }
  };
  auto id = chained.submit(std::move(r));
  ASSERT_TRUE(id.is_ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return seen >= 20; });
    chained.cancel(*id);
    cancelled = true;
    cv.notify_all();
  }
  c.wait();
  EXPECT_EQ(c.reason, FinishReason::kCancelled);
  EXPECT_GT(chained.stats().chained_steps, 10u);
  Engine plain(*model_, batched());
  const std::vector<int32_t> want = testing::run_all(plain, {same})[0].tokens;
  ASSERT_GE(c.tokens.size(), 20u);
  ASSERT_LE(c.tokens.size(), 21u);
  EXPECT_TRUE(std::equal(c.tokens.begin(), c.tokens.end(), want.begin()));
}

TEST_F(EngineTest, BadRequests) {
  EngineOptions o;
  o.ctx_size = 8;
  Engine engine(*model_, o);
  GenerationRequest r;
  EXPECT_EQ(engine.submit(r).status().code(), StatusCode::kInvalidArgument);
  r.prompt = {1, 2, 96};
  EXPECT_EQ(engine.submit(r).status().code(), StatusCode::kInvalidArgument);
  r.prompt = prompt(8, 1);
  EXPECT_EQ(engine.submit(r).status().code(), StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace tf
