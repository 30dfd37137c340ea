// Helpers for tests that drive the Engine: a collector of one request's events.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/engine.h"
#include "unit/test_util.h"

namespace tf::testing {

// Collects one request's events (tokens, and the logits each was sampled from); wait() blocks
// until the final one.
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // one row per collected token
  FinishReason reason = FinishReason::kNone;
  int64_t n_cached = -1;
  bool done = false;
  void on_event(const TokenEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (e.token >= 0) {
      tokens.push_back(e.token);
      logits.emplace_back(e.logits.begin(), e.logits.end());
    }
    n_cached = e.n_cached;
    if (e.done) done = true, reason = e.reason;
    cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return done; }));
  }
  std::function<void(const TokenEvent&)> callback() {
    return [this](const TokenEvent& e) { on_event(e); };
  }
};

// Bitwise equality of two logits rows (memcmp semantics: NaN patterns and -0 count).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// n token ids drawn uniformly from [0, vocab).
inline std::vector<int32_t> random_tokens(std::mt19937& rng, int64_t vocab, int n) {
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab) - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

// Greedy requests of these prompts, each of up to max_tokens reply tokens, wanting no logits (so
// the engine's steps take argmax rows, the ones that chain).
inline std::vector<GenerationRequest> argmax_requests(
    const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
  std::vector<GenerationRequest> reqs;
  for (const auto& p : prompts) {
    GenerationRequest r;
    r.prompt = p;
    r.max_tokens = max_tokens;
    r.want_logits = false;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

// One request's reply as a Collector saw it.
struct Reply {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  int64_t n_cached = -1;
};

// Submits the requests at once on `engine` and waits for each; their replies in order.
inline std::vector<Reply> run_all(Engine& engine, const std::vector<GenerationRequest>& reqs) {
  std::vector<Collector> cs(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    GenerationRequest r = reqs[i];
    r.on_event = cs[i].callback();
    EXPECT_TRUE(engine.submit(std::move(r)).is_ok());
  }
  std::vector<Reply> out;
  for (Collector& c : cs) {
    c.wait();
    out.push_back(Reply{c.tokens, c.logits, c.n_cached});
  }
  return out;
}

// Waits until the engine has nothing queued or running (internal keep jobs included).
inline void wait_idle(const Engine& e) {
  for (int i = 0; i < 60000; ++i) {
    const EngineStats s = e.stats();
    if (s.waiting == 0 && s.running == 0 && s.keeping == 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  FAIL() << "engine not idle after 60 s";
}

// A fixture holding the small random model of test_util.h.
class SmallModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    write_small_checkpoint(dir_.path("m"));
    auto m = Model::load(dir_.path("m"));
    ASSERT_TRUE(m.is_ok());
    model_ = std::move(*m);
  }
  TempDir dir_;
  std::unique_ptr<Model> model_;
};

}  // namespace tf::testing
