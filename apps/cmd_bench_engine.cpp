// tensorfold bench-engine: the runtime under load, through the Engine (no HTTP):
//   1. aggregate decode tokens/s with N streams decoding at once (continuous batching);
//   2. time to first token of turn T of a chat, resumed from the kept state of turn T-1 versus the
//      same prompt computed fresh (pool off);
//   3. with --draft K: MTP drafting against plain decoding, on chat prompts of two kinds (copy a
//      passage, continue a passage) at each of --draft-streams: decode tokens/s of both, acceptance
//      and mean accepted length, and a check that both gave the same tokens.
// In 1 and 2 token ids are random (timing only) and stop tokens are off so every stream decodes
// --gen tokens; in 3 the prompts are real text and replies end at the end-of-turn token.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "runtime/draft_compare.h"
#include "runtime/engine.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

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
  // Drafting (3): K (0: skip), fixed depth or adaptive, gate, stream counts, reply cap.
  std::string device = "cpu";  // --device
  WeightOptions weights;       // --load-mode, --matmul-precision
  int draft = 0;
  bool draft_fixed = false;
  float draft_p_min = 0.0f;
  int draft_max_streams = 1;
  int draft_lookup = 0;
  bool draft_warm = false;
  bool draft_control = false;
  std::vector<int> draft_streams = {1, 4};
  int draft_gen = 160;
  bool draft_only = false;        // skip 1 and 2
  std::string draft_prompts_out;  // also write the drafting prompts as ids (cuda_bench --draft)
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
// divided by that window. With `gaps`: gaps->at(i) gets, for each request, the seconds between
// its tokens i and i + 1, the time of its decode step i + 1 (token 0 came with the prompt).
double aggregate_decode(const Model& model, const Options& o, int n, std::mt19937& rng,
                        std::vector<std::vector<double>>* gaps = nullptr) {
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
    r.want_logits = false;  // as the server asks
    Timeline* t = tl.back().get();
    r.on_event = [t](const TokenEvent& e) { t->on_event(e); };
    if (!engine.submit(std::move(r))) return 0;
  }
  for (auto& t : tl) t->wait();
  if (gaps != nullptr) {
    for (auto& t : tl) {
      for (size_t i = 0; i + 1 < t->tokens.size(); ++i) {
        if (gaps->size() <= i) gaps->resize(i + 1);
        (*gaps)[i].push_back(
            std::chrono::duration<double>(t->tokens[i + 1] - t->tokens[i]).count());
      }
    }
  }
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
    r.want_logits = false;  // as the server asks
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

// Passages for the drafting bench (written for it). Copy prompts ask for one verbatim; prose
// prompts ask the model to continue one (free text: where MTP drafts are accepted least).
const char* kPassages[] = {
    "The harbour was quiet before dawn. Two fishing boats rocked against the pier, their ropes "
    "creaking, and a gull walked along the rail as if it owned the town.",
    "She folded the map twice, put it in her coat and started up the hill. The path was steep and "
    "wet, and by the time she reached the old mill the rain had stopped.",
    "Every morning the baker opened the shutters at six, set out the bread in long rows and "
    "waited for the first customer, who was always the same old man with a grey dog.",
    "The library kept its rarest books in a cold room behind the reading hall. Nobody went in "
    "without gloves, and the clock on the wall had not been wound for years.",
};

// Plain vs drafted decoding on copy and prose chat prompts; false when the model cannot draft
// or the two gave different tokens.
// The model has an MTP head (run() checks).
bool draft_bench(const Model& model, const Options& o, nlohmann::json* out) {
  auto tk = tok::Tokenizer::load(o.model);
  auto tmpl = tok::ChatTemplate::load(o.model);
  if (!tk || !tmpl) {
    std::fprintf(stderr, "error: --draft needs the model's tokenizer and chat template\n");
    return false;
  }
  std::vector<int32_t> stops;
  for (const char* s : {"<|im_end|>", "<|endoftext|>"}) {
    if (auto id = tk->token_to_id(s)) stops.push_back(*id);
  }
  auto chat = [&](const std::string& user) {
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    msgs.push_back({{"role", "user"}, {"content", user}});
    tok::ChatOptions co;
    co.add_generation_prompt = true;
    co.enable_thinking = false;
    return tk->encode(tmpl->render(msgs, nullptr, co).value()).value();
  };
  // Each passage alone and each followed by the next: 8 prompts per kind.
  std::map<std::string, std::vector<std::vector<int32_t>>> sets;
  for (const std::string kind : {"copy", "prose"}) {
    const size_t np = std::size(kPassages);
    for (size_t i = 0; i < 2 * np; ++i) {
      std::string text = kPassages[i % np];
      if (i >= np) text += std::string(" ") + kPassages[(i + 1) % np];
      sets[kind].push_back(chat(kind == "copy" ? "Copy this text exactly:\n\n" + text
                                               : "Continue this text:\n\n" + text));
    }
  }
  if (!o.draft_prompts_out.empty()) {  // the same prompts as ids, for cuda_bench --draft
    std::ofstream f(o.draft_prompts_out);
    f << nlohmann::json{{"model", o.model}, {"stops", stops}, {"prompts", sets}}.dump() << "\n";
    if (!f) {
      std::fprintf(stderr, "error: cannot write %s\n", o.draft_prompts_out.c_str());
      return false;
    }
  }
  bool same = true;
  if (!o.json) {
    std::printf(
        "drafting, up to %d drafts (%s, p_min %.2f, prompt lookup up to %d), greedy, replies up "
        "to %d tokens, best of %d%s; 8 prompts per kind, N at a time, tokens/s = generated / "
        "wall time:\n",
        o.draft, o.draft_fixed ? "fixed" : "adaptive", o.draft_p_min, o.draft_lookup, o.draft_gen,
        o.reps, o.draft_warm ? " on one engine per kind (warm)" : " (a fresh engine per run)");
  }
  for (const auto& [kind, prompts] : sets) {
    for (int n : o.draft_streams) {
      DraftCompareOptions dc;
      dc.streams = n;
      dc.draft_max = o.draft;
      dc.adaptive = !o.draft_fixed;
      dc.p_min = o.draft_p_min;
      dc.max_streams = o.draft_max_streams;
      dc.lookup = o.draft_lookup;
      dc.warm = o.draft_warm;
      dc.max_tokens = o.draft_gen;
      dc.reps = o.reps;
      dc.threads = o.threads;
      const DraftComparison c = compare_drafting(model, prompts, stops, dc);
      same = same && c.same_tokens;
      (*out)["draft"].push_back({{"prompt", kind},
                                 {"streams", n},
                                 {"reply_tokens", c.reply_tokens},
                                 {"plain_tokens_per_s", c.plain_tokens_per_s},
                                 {"drafted_tokens_per_s", c.drafted_tokens_per_s},
                                 {"speedup", c.speedup()},
                                 {"plain_decode_tokens_per_s", c.plain_decode_tokens_per_s},
                                 {"drafted_decode_tokens_per_s", c.drafted_decode_tokens_per_s},
                                 {"decode_speedup", c.decode_speedup()},
                                 {"draft_steps", c.stats.draft_steps},
                                 {"drafted", c.stats.drafted_tokens},
                                 {"accepted", c.stats.accepted_tokens},
                                 {"lookup_drafted", c.stats.lookup_tokens},
                                 {"lookup_accepted", c.stats.lookup_accepted},
                                 {"acceptance", c.acceptance()},
                                 {"mean_accepted_length", c.mean_accepted_length()},
                                 {"same_tokens", c.same_tokens}});
      if (!o.json) std::printf("  %s\n", describe(kind, n, c).c_str());
      if (o.draft_control) {  // the same runs with both engines plain: the ratio's spread
        dc.control = true;
        const DraftComparison a = compare_drafting(model, prompts, stops, dc);
        same = same && a.same_tokens;
        (*out)["draft_control"].push_back({{"prompt", kind},
                                           {"streams", n},
                                           {"first_tokens_per_s", a.plain_tokens_per_s},
                                           {"second_tokens_per_s", a.drafted_tokens_per_s},
                                           {"ratio", a.speedup()},
                                           {"decode_ratio", a.decode_speedup()}});
        if (!o.json) std::printf("  %s\n", describe(kind, n, a).c_str());
      }
    }
  }
  if (!same) std::fprintf(stderr, "error: drafted and plain decoding gave different tokens\n");
  return same;
}

int run(const Options& o) {
  auto model_or = Model::load(o.model, {}, load_options(o.weights, o.device));
  if (!model_or) {
    std::fprintf(stderr, "error: %s\n", model_or.status().to_string().c_str());
    return 1;
  }
  if (!use_device(**model_or, o.device)) return 1;
  const Model& model = **model_or;
  if (o.draft > 0 && !model.has_mtp()) {
    std::fprintf(stderr, "error: --draft: the model has no MTP head (mtp.* tensors)\n");
    return 2;
  }
  std::mt19937 rng(1234);
  nlohmann::json out = {
      {"model", o.model}, {"device", o.device}, {"prompt_len", o.prompt_len}, {"gen", o.gen}};
  if (o.draft > 0 && o.draft_only) {
    const bool ok = draft_bench(model, o, &out);
    if (o.json) std::printf("%s\n", out.dump(2).c_str());
    return ok ? 0 : 1;
  }
  if (!o.json)
    std::printf("aggregate decode (prompt %d, %d tokens each, best of %d):\n", o.prompt_len, o.gen,
                o.reps);
  std::vector<std::vector<double>> gaps;  // one stream: [i] seconds of decode step i + 1
  for (int n : o.streams) {
    double best = 0;
    for (int rep = 0; rep < o.reps; ++rep)
      best = std::max(best, aggregate_decode(model, o, n, rng, n == 1 ? &gaps : nullptr));
    out["decode"].push_back({{"streams", n}, {"tokens_per_s", best}});
    if (!o.json) std::printf("  %2d streams: %8.1f tok/s\n", n, best);
  }
  // A decode step's time by its place after the prompt (one stream): the first steps after a
  // prompt's step can be dearer (on a CPU the prompt leaves the decode weights out of the caches;
  // docs/PERFORMANCE.md, "The first decode steps after a prompt are not learned from").
  if (!gaps.empty()) {
    auto mean_ms = [](const std::vector<double>& v) {
      double sum = 0;
      for (double x : v) sum += x;
      return v.empty() ? 0.0 : 1e3 * sum / static_cast<double>(v.size());
    };
    std::vector<double> later;  // steps 9 and after
    for (size_t i = 8; i < gaps.size(); ++i)
      later.insert(later.end(), gaps[i].begin(), gaps[i].end());
    nlohmann::json first = nlohmann::json::array();
    if (!o.json) std::printf("  1 stream, ms a decode step by its place after the prompt:");
    for (size_t i = 0; i < std::min<size_t>(gaps.size(), 8); ++i) {
      first.push_back(mean_ms(gaps[i]));
      if (!o.json) std::printf(" %zu: %.3f", i + 1, mean_ms(gaps[i]));
    }
    if (!o.json)
      std::printf(", 9 on: %.3f (mean of %zu replies)\n", mean_ms(later), gaps[0].size());
    out["step_ms_after_prompt"] = {{"first", first}, {"later", mean_ms(later)}};
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
  if (!o.json) {
    std::printf(
        "chat turn %d (system %d, user %d, reply %d tokens per turn; median of %d): prompt %lld "
        "tokens, %lld cached\n  time to first token: resumed %.1f ms, fresh %.1f ms (%.1fx)\n",
        o.turns, o.system_len, o.user_len, o.reply_len, o.reps,
        static_cast<long long>(turns[0].prompt), static_cast<long long>(turns[0].cached),
        resumed * 1e3, fresh * 1e3, resumed > 0 ? fresh / resumed : 0);
  }
  if (o.draft > 0 && !draft_bench(model, o, &out)) return 1;
  if (o.json) std::printf("%s\n", out.dump(2).c_str());
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
  add_device_option(cmd, &o->device);
  add_load_options(cmd, &o->weights);
  cmd->add_option("--threads", o->threads, "Worker threads (0 = all cores)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  cmd->add_flag("--json", o->json, "Print JSON");
  cmd->add_option("--draft", o->draft,
                  "Also compare MTP drafting (up to K drafts) with plain decoding (0 = skip)")
      ->capture_default_str()
      ->check(CLI::Range(0, 16));
  cmd->add_flag("--draft-fixed", o->draft_fixed, "Always K drafts (default: adaptive depth)");
  cmd->add_option("--draft-p-min", o->draft_p_min, "Drafting confidence gate")
      ->capture_default_str()
      ->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--draft-max-streams", o->draft_max_streams,
                  "Draft only in steps where at most this many requests decode (0 = any)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--draft-lookup", o->draft_lookup,
                  "Prompt-lookup drafts per step at most, besides the MTP head's (0 = off)")
      ->capture_default_str()
      ->check(CLI::Range(0, 32));
  cmd->add_flag("--draft-warm", o->draft_warm,
                "One engine per kind for every rep (a server's steady state; default: a fresh "
                "engine per run)");
  cmd->add_flag("--draft-control", o->draft_control,
                "After each drafting row, the same runs with both engines plain (the ratio's "
                "spread when nothing differs)");
  cmd->add_option("--draft-streams", o->draft_streams, "Stream counts for the drafting comparison")
      ->capture_default_str()
      ->delimiter(',')
      ->check(CLI::Range(1, 256));
  cmd->add_option("--draft-gen", o->draft_gen, "Reply cap for the drafting comparison")
      ->capture_default_str()
      ->check(CLI::Range(2, 1 << 20));
  cmd->add_flag("--draft-only", o->draft_only, "Only the drafting comparison");
  cmd->add_option("--draft-prompts-out", o->draft_prompts_out,
                  "Also write the drafting prompts as token ids (JSON, for cuda_bench --draft)");
  cmd->callback([o] { exit_code() = run(*o); });
}

}  // namespace tf::app
