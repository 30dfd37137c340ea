// The runtime Engine with the model on the device (Model::use_cuda, the CLI's --device cuda), on
// models/tiny-next:
//   - greedy replies to the golden chat prompts (tests/golden/tiny_next/reference.json: ids from
//     transformers' tokenizer) and to random prompts equal the CPU engine's token for token, or
//     the first divergence sits
//     where the two logits rows (each within a relative L2 of 1e-4 of the other) differ by more
//     than the CPU row's top-2 margin: a near tie that fp32 summation order decides;
//   - the determinism contract on the device: turns of multi-turn chats resumed from kept states
//     (device-to-device copies), run beside other requests, give the same tokens and logits, bit
//     for bit, as the same request alone on a fresh engine with no pool.
// Checked to fail (on the H200, 2026-12-03): cloning a kept state with its caches one row short
// (n_past - 1 rows copied in CudaSequenceState::clone) makes ResumedAndBatchedEqualAlone abort
// on the resumed state (the next cache growth copies rows the clone does not have). Skips
// without a CUDA device.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "cuda/device_fixture.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "unit/engine_util.h"

namespace tf {
namespace {

using testing::Reply;
using testing::run_all;
using testing::same_bits;

class EngineOnDevice : public testing::TinyNextOnDevice {
 protected:
  std::vector<int32_t> stops() const {
    std::vector<int32_t> s;
    for (int64_t id : cpu_->config().eos_token_ids) s.push_back(static_cast<int32_t>(id));
    return s;
  }
};

TEST_F(EngineOnDevice, GreedyRepliesMatchCpuEngine) {
  std::vector<std::vector<int32_t>> prompts = golden_prompts();
  ASSERT_GE(prompts.size(), 4u);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(cpu_->config().vocab_size) - 1);
  for (int n : {1, 40, 150}) {
    prompts.emplace_back(n);
    for (auto& t : prompts.back()) t = d(rng);
  }
  std::vector<GenerationRequest> reqs;
  for (const auto& p : prompts) {
    GenerationRequest r;
    r.prompt = p;
    r.max_tokens = 48;
    r.stop_tokens = stops();
    reqs.push_back(r);
  }
  EngineOptions o;
  o.scheduler.max_running = 4;
  o.threads = 2;
  Engine ce(*cpu_, o), ge(*gpu_, o);
  const std::vector<Reply> want = run_all(ce, reqs), got = run_all(ge, reqs);
  const int64_t V = cpu_->config().vocab_size;
  int equal = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Reply &c = want[i], &g = got[i];
    size_t t = 0;
    while (t < c.tokens.size() && t < g.tokens.size() && c.tokens[t] == g.tokens[t]) ++t;
    if (t == c.tokens.size() && t == g.tokens.size()) {
      ++equal;
      continue;
    }
    // A divergence at token t: both rows were sampled after the same tokens, so they must be
    // close, and their difference must exceed the CPU row's margin between its top two.
    ASSERT_LT(t, c.tokens.size()) << "request " << i << ": the device reply is longer";
    ASSERT_LT(t, g.tokens.size()) << "request " << i << ": the device reply is shorter";
    const std::vector<float>&cr = c.logits[t], &gr = g.logits[t];
    double num = 0, den = 0, diff = 0;
    for (int64_t v = 0; v < V; ++v) {
      num += (double(gr[v]) - cr[v]) * (double(gr[v]) - cr[v]), den += double(cr[v]) * cr[v];
      diff = std::max(diff, std::abs(double(gr[v]) - cr[v]));
    }
    EXPECT_LT(std::sqrt(num / den), 1e-4) << "request " << i << " token " << t;
    std::vector<float> top = cr;
    std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
    EXPECT_LT(top[0] - top[1], 2 * diff)
        << "request " << i << " token " << t << ": a divergence the logits do not explain";
  }
  EXPECT_GE(equal, static_cast<int>(reqs.size()) - 1) << "replies equal to the CPU's";

  // The same requests wanting no logits (as the server's): argmax steps, the rows' argmax taken
  // on the device (CudaModel::forward_greedy), must give the tokens the host's sampler took from
  // the device's rows above, and events without logits.
  for (auto& r : reqs) r.want_logits = false;
  Engine ae(*gpu_, o);
  const std::vector<Reply> argmax = run_all(ae, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(argmax[i].tokens, got[i].tokens) << "request " << i << ", argmax steps";
    for (const auto& row : argmax[i].logits) EXPECT_TRUE(row.empty()) << "request " << i;
  }
}

// Chained steps (EngineOptions::chain: the next greedy step launched, its tokens read on the
// device, before the engine reads and commits this one's) give the unchained engine's tokens for
// requests that stop mid-chain on a stop token (the row launched after it is dropped), end at
// max_tokens of 1-3 or more, and run 8 at once or 2 at a time behind a queue. Checked to fail: a
// build whose chained steps read the tokens from the host's table (not copied on the device) gave
// other tokens here.
TEST_F(EngineOnDevice, ChainedStepsEqualUnchained) {
  std::vector<std::vector<int32_t>> prompts = golden_prompts();
  std::mt19937 rng(9);
  for (int n : {1, 7, 60, 130})
    prompts.push_back(testing::random_tokens(rng, cpu_->config().vocab_size, n));
  EngineOptions o;
  o.threads = 2;
  o.chain = false;
  o.state_cache_bytes = 0;  // no keep jobs: two engines share the model, one steps at a time
  std::vector<GenerationRequest> reqs = testing::argmax_requests(prompts, 40);
  // Stop tokens that occur mid-reply: each request stops at its own reply's token 4 + 3i (or its
  // first later occurrence), some requests at max_tokens 1, 2 and 3 instead.
  {
    o.scheduler.max_running = 8;
    Engine plain(*gpu_, o);
    const std::vector<Reply> free_run = run_all(plain, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      const size_t at = std::min(free_run[i].tokens.size() - 1, 4 + 3 * i);
      reqs[i].stop_tokens = {free_run[i].tokens[at]};
      if (i % 4 == 3) reqs[i].max_tokens = 1 + static_cast<int>(i / 4) % 3;
    }
  }
  for (int running : {8, 2}) {
    o.scheduler.max_running = running;
    o.chain = false;
    Engine plain(*gpu_, o);
    o.chain = true;
    Engine chained(*gpu_, o);
    const std::vector<Reply> want = run_all(plain, reqs), got = run_all(chained, reqs);
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(got[i].tokens, want[i].tokens) << running << " at once, request " << i;
    EXPECT_EQ(plain.stats().chained_steps, 0u);
    EXPECT_GT(chained.stats().chained_steps, 10u) << running << " at once";
  }
}

// Chained steps on a drafting engine (MTP head, prompt lookup, adaptive): four requests at once
// chain behind the stream gate, then one at a time chain their plain steps between drafts; the
// chained steps' head tokens reach the states by Model::set_chained_token, so the drafts made
// after a chain come from the right head rows. Replies equal the plain unchained engine's. A
// build whose set_chained_token left the placeholder must fail the model test
// (CudaModelTest.ChainedGreedyEqualsStepByStep); here it would only lower the acceptance.
TEST_F(EngineOnDevice, ChainedDraftingEqualsPlain) {
  const std::vector<GenerationRequest> reqs = testing::argmax_requests(golden_prompts(), 48);
  EngineOptions o;
  o.threads = 2;
  o.state_cache_bytes = 0;  // no keep jobs: two engines share the model, one steps at a time
  for (int running : {4, 1}) {
    o.scheduler.max_running = running;
    o.draft_max = 0;
    o.chain = false;
    Engine plain(*gpu_, o);
    o.draft_max = 3;
    o.draft_lookup = 12;
    o.chain = true;
    Engine chained(*gpu_, o);
    const std::vector<Reply> want = run_all(plain, reqs);
    std::vector<Reply> got;
    if (running == 1) {  // one at a time, so that nothing waits (a queue stops the chain)
      for (const auto& r : reqs) got.push_back(run_all(chained, {r})[0]);
    } else {
      got = run_all(chained, reqs);
    }
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(got[i].tokens, want[i].tokens) << running << " at once, request " << i;
    EXPECT_GT(chained.stats().chained_steps, 10u) << running << " at once";
  }
}

TEST_F(EngineOnDevice, ResumedAndBatchedEqualAlone) {
  std::mt19937 rng(5);
  auto random_tokens = [&](int n) {
    return testing::random_tokens(rng, cpu_->config().vocab_size, n);
  };
  EngineOptions o;
  o.scheduler.max_running = 4;
  o.scheduler.batch_tokens = 128;
  o.threads = 2;
  Engine engine(*gpu_, o);
  EngineOptions lone = o;
  lone.scheduler.max_running = 1;
  lone.state_cache_bytes = 0;
  Engine alone(*gpu_, lone);
  // Three chats of 4 turns, their turns submitted together with one random request each time.
  std::vector<std::vector<int32_t>> convo(3);
  for (auto& c : convo) c = random_tokens(100);
  for (int turn = 0; turn < 4; ++turn) {
    std::vector<GenerationRequest> reqs;
    for (auto& c : convo) {
      const std::vector<int32_t> msg = random_tokens(5 + static_cast<int>(rng() % 40));
      c.insert(c.end(), msg.begin(), msg.end());
      GenerationRequest r;
      r.prompt = c;
      r.max_tokens = 8 + static_cast<int>(rng() % 20);
      reqs.push_back(r);
    }
    GenerationRequest other;
    other.prompt = random_tokens(1 + static_cast<int>(rng() % 150));
    other.max_tokens = 16;
    reqs.push_back(other);
    const std::vector<Reply> got = run_all(engine, reqs);
    testing::wait_idle(engine);  // the turns' states are kept before the next turn comes
    for (size_t i = 0; i < reqs.size(); ++i) {
      const Reply ref = run_all(alone, {reqs[i]})[0];
      ASSERT_EQ(got[i].tokens, ref.tokens) << "turn " << turn << " request " << i;
      for (size_t t = 0; t < ref.logits.size(); ++t) {
        ASSERT_TRUE(same_bits(got[i].logits[t], ref.logits[t]))
            << "turn " << turn << " request " << i << " token " << t;
      }
      if (turn > 0 && i < convo.size()) {
        EXPECT_GT(got[i].n_cached, 0) << "turn " << turn;
      }
    }
    for (size_t i = 0; i < convo.size(); ++i)
      convo[i].insert(convo[i].end(), got[i].tokens.begin(), got[i].tokens.end());
  }
  EXPECT_GT(engine.stats().pool.hits, 0u);
}

}  // namespace
}  // namespace tf
