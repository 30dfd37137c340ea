// tensorfold bench-engine: the runtime under load, through the Engine (no HTTP):
//   1. aggregate decode tokens/s with N streams decoding at once (continuous batching);
//   2. time to first token of turn T of a chat, resumed from the kept state of turn T-1 versus the
//      same prompt computed fresh (pool off).
// Token ids are random (timing only); stop tokens are off so every stream decodes --gen tokens.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "runtime/engine.h"

namespace tf::app {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string model = kDefaultModel;
  std::vector<int> streams = {1, 2, 4, 8, 16};
  int prompt_len = 128;
  int gen = 64;
  int turns = 10;
  int system_len = 256;
  int user_len = 48;
  int reply_len = 64;
  int reps = 3;
  int threads = 0;
  bool json = false;
};

// One request's event times.
struct Timeline {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Clock::time_point> tokens;  // arrival of each token
  std::vector<int32_t> ids;
  int64_t n_cached = 0;
  bool done = false;
  void on_event(const TokenEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (e.token >= 0) {
      tokens.push_back(Clock::now());
      ids.push_back(e.token);
    }
    n_cached = e.n_cached;
    done = done || e.done;
    cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  }
};

std::vector<int32_t> random_ids(std::mt19937& rng, int n, int64_t vocab) {
  std::uniform_int_distribution<int32_t> d(
      0, static_cast<int32_t>(std::min<int64_t>(vocab, 5000)) - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Runs `prompts` at once; returns the steady-state aggregate decode rate: tokens that arrived
// while every stream was decoding (after the last first token, before the first last token)
// divided by that window.
double aggregate_decode(const Model& model, const Options& o, int n, std::mt19937& rng) {
  EngineOptions eo;
  eo.scheduler.max_running = n;
  eo.threads = o.threads;
  eo.state_cache_bytes = 0;
  Engine engine(model, eo);
  std::vector<std::unique_ptr<Timeline>> tl;
  for (int i = 0; i < n; ++i) {
    tl.push_back(std::make_unique<Timeline>());
    GenerationRequest r;
    r.prompt = random_ids(rng, o.prompt_len, model.config().vocab_size);
    r.max_tokens = o.gen;
    r.sampling.temperature = 0;
    Timeline* t = tl.back().get();
    r.on_event = [t](const TokenEvent& e) { t->on_event(e); };
    if (!engine.submit(std::move(r))) return 0;
  }
  for (auto& t : tl) t->wait();
  Clock::time_point begin = tl[0]->tokens.front(), end = tl[0]->tokens.back();
  for (auto& t : tl) {
    begin = std::max(begin, t->tokens.front());
    end = std::min(end, t->tokens.back());
  }
  int64_t count = 0;
  for (auto& t : tl) {
    for (auto& when : t->tokens) count += (when > begin && when <= end);
  }
  const double s = std::chrono::duration<double>(end - begin).count();
  return s > 0 ? static_cast<double>(count) / s : 0;
}

struct TurnResult {
  double ttft_resumed = 0, ttft_fresh = 0;
  int64_t prompt = 0, cached = 0;
};

// Plays a chat of o.turns turns on an engine with the pool (pausing between turns, as a user
// would, so each turn's kept state is in place), then runs the last turn's prompt on an engine
// with the pool off. Time to first token: submit -> first token event.
TurnResult chat_ttft(const Model& model, const Options& o, std::mt19937& rng) {
  const int64_t V = model.config().vocab_size;
  EngineOptions eo;
  eo.threads = o.threads;
  auto run = [&](Engine& e, const std::vector<int32_t>& prompt, int max_tokens, Timeline* t) {
    GenerationRequest r;
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.on_event = [t](const TokenEvent& ev) { t->on_event(ev); };
    const auto t0 = Clock::now();
    if (!e.submit(std::move(r))) return 0.0;
    t->wait();
    return std::chrono::duration<double>(t->tokens.front() - t0).count();
  };
  auto idle = [](const Engine& e) {
    for (EngineStats st = e.stats(); st.running + st.waiting + st.keeping > 0; st = e.stats())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  TurnResult res;
  std::vector<int32_t> convo = random_ids(rng, o.system_len, V);
  {
    Engine engine(model, eo);
    for (int turn = 1; turn <= o.turns; ++turn) {
      const std::vector<int32_t> msg = random_ids(rng, o.user_len, V);
      convo.insert(convo.end(), msg.begin(), msg.end());
      Timeline t;
      const double ttft = run(engine, convo, turn == o.turns ? 1 : o.reply_len, &t);
      if (turn == o.turns) {
        res.ttft_resumed = ttft;
        res.cached = t.n_cached;
        res.prompt = static_cast<int64_t>(convo.size());
      }
      convo.insert(convo.end(), t.ids.begin(), t.ids.end());
      idle(engine);
    }
  }
  convo.resize(res.prompt);
  eo.state_cache_bytes = 0;
  Engine fresh(model, eo);
  Timeline t;
  res.ttft_fresh = run(fresh, convo, 1, &t);
  return res;
}

int run(const Options& o) {
  auto model_or = Model::load(o.model);
  if (!model_or) {
    std::fprintf(stderr, "error: %s\n", model_or.status().to_string().c_str());
    return 1;
  }
  const Model& model = **model_or;
  std::mt19937 rng(1234);
  nlohmann::json out = {{"model", o.model}, {"prompt_len", o.prompt_len}, {"gen", o.gen}};
  if (!o.json)
    std::printf("aggregate decode (prompt %d, %d tokens each, best of %d):\n", o.prompt_len, o.gen,
                o.reps);
  for (int n : o.streams) {
    double best = 0;
    for (int rep = 0; rep < o.reps; ++rep)
      best = std::max(best, aggregate_decode(model, o, n, rng));
    out["decode"].push_back({{"streams", n}, {"tokens_per_s", best}});
    if (!o.json) std::printf("  %2d streams: %8.1f tok/s\n", n, best);
  }
  std::vector<TurnResult> turns;
  for (int rep = 0; rep < o.reps; ++rep) turns.push_back(chat_ttft(model, o, rng));
  auto median = [&](auto field) {
    std::vector<double> v;
    for (const auto& t : turns) v.push_back(field(t));
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double resumed = median([](const TurnResult& t) { return t.ttft_resumed; });
  const double fresh = median([](const TurnResult& t) { return t.ttft_fresh; });
  out["chat"] = {{"turn", o.turns},
                 {"prompt_tokens", turns[0].prompt},
                 {"cached_tokens", turns[0].cached},
                 {"ttft_resumed_s", resumed},
                 {"ttft_fresh_s", fresh},
                 {"speedup", resumed > 0 ? fresh / resumed : 0}};
  if (o.json) {
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf(
        "chat turn %d (system %d, user %d, reply %d tokens per turn; median of %d): prompt %lld "
        "tokens, %lld cached\n  time to first token: resumed %.1f ms, fresh %.1f ms (%.1fx)\n",
        o.turns, o.system_len, o.user_len, o.reply_len, o.reps,
        static_cast<long long>(turns[0].prompt), static_cast<long long>(turns[0].cached),
        resumed * 1e3, fresh * 1e3, resumed > 0 ? fresh / resumed : 0);
  }
  return 0;
}

}  // namespace

void add_bench_engine(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "bench-engine",
      "Aggregate decode tokens/s at N streams, and time to first token of a resumed chat turn");
  cmd->add_option("--model", o->model, "Checkpoint directory")->capture_default_str();
  cmd->add_option("--streams", o->streams, "Stream counts to measure")
      ->capture_default_str()
      ->delimiter(',')
      ->check(CLI::Range(1, 256));
  cmd->add_option("--prompt-len", o->prompt_len)
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--gen", o->gen, "Tokens decoded per stream")
      ->capture_default_str()
      ->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--turns", o->turns, "The chat turn whose time to first token is measured")
      ->capture_default_str()
      ->check(CLI::Range(2, 1000));
  cmd->add_option("--system-len", o->system_len)
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--user-len", o->user_len)->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--reply-len", o->reply_len)
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--reps", o->reps)->capture_default_str()->check(CLI::Range(1, 100));
  cmd->add_option("--threads", o->threads, "Worker threads (0 = all cores)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  cmd->add_flag("--json", o->json, "Print JSON");
  cmd->callback([o] { exit_code() = run(*o); });
}

}  // namespace tf::app
