#include "runtime/draft_compare.h"

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>

#include <fmt/format.h>

namespace tf {
namespace {

using Clock = std::chrono::steady_clock;

// One request's tokens and the time its last one arrived.
struct Reply {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> ids;
  Clock::time_point first, last;  // when the first and the last token arrived
  bool done = false;
};

struct Run {
  double tokens_per_s = 0;
  double decode_tokens_per_s = 0;  // per stream, after the first token (see DraftComparison)
  std::vector<std::vector<int32_t>> replies;
  EngineStats stats;
};

EngineOptions engine_options(const DraftCompareOptions& o, int draft_max, size_t n_prompts) {
  EngineOptions eo;
  eo.scheduler.max_running = o.streams;
  eo.scheduler.max_queue = static_cast<int>(n_prompts);
  eo.threads = o.threads;
  eo.state_cache_bytes = 0;
  eo.draft_max = draft_max;
  eo.draft_adaptive = o.adaptive;
  eo.draft_p_min = o.p_min;
  eo.draft_max_streams = o.max_streams;
  eo.draft_lookup = draft_max > 0 ? o.lookup : 0;
  eo.chain = o.chain;
  return eo;
}

// The drafting counters of `b` minus those of `a` (one run on an engine that ran before).
EngineStats drafting_delta(const EngineStats& a, const EngineStats& b) {
  EngineStats d = b;
  d.draft_steps -= a.draft_steps;
  d.drafted_tokens -= a.drafted_tokens;
  d.accepted_tokens -= a.accepted_tokens;
  d.lookup_tokens -= a.lookup_tokens;
  d.lookup_accepted -= a.lookup_accepted;
  d.lookup_shadows -= a.lookup_shadows;
  d.lookup_shadow_held -= a.lookup_shadow_held;
  d.steps -= a.steps;
  d.step_seconds -= a.step_seconds;
  d.model_seconds -= a.model_seconds;
  return d;
}

// Every prompt through `engine` (o.streams at a time); tokens/s from the first submit to the last
// reply's last token.
Run run_once(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
             const std::vector<int32_t>& stops, const DraftCompareOptions& o) {
  Run res;
  std::vector<std::unique_ptr<Reply>> replies;
  const EngineStats before = engine.stats();
  const auto t0 = Clock::now();
  for (const auto& p : prompts) {
    replies.push_back(std::make_unique<Reply>());
    GenerationRequest r;
    r.prompt = p;
    r.max_tokens = o.max_tokens;
    r.stop_tokens = stops;
    r.want_logits = false;  // as the server asks
    Reply* rp = replies.back().get();
    r.on_event = [rp](const TokenEvent& e) {
      std::lock_guard<std::mutex> lock(rp->mu);
      if (e.token >= 0) {
        rp->last = Clock::now();
        if (rp->ids.empty()) rp->first = rp->last;
        rp->ids.push_back(e.token);
      }
      rp->done = rp->done || e.done;
      rp->cv.notify_all();
    };
    if (!engine.submit(std::move(r)).is_ok()) return res;
  }
  for (auto& rp : replies) {
    std::unique_lock<std::mutex> lock(rp->mu);
    rp->cv.wait(lock, [&] { return rp->done; });
  }
  res.stats = drafting_delta(before, engine.stats());
  int64_t count = 0, decoded = 0;
  double decode_s = 0;
  Clock::time_point end = t0;
  for (auto& rp : replies) {
    count += static_cast<int64_t>(rp->ids.size());
    if (!rp->ids.empty()) {
      end = std::max(end, rp->last);
      decoded += static_cast<int64_t>(rp->ids.size()) - 1;
      decode_s += std::chrono::duration<double>(rp->last - rp->first).count();
    }
    res.replies.push_back(rp->ids);
  }
  const double s = std::chrono::duration<double>(end - t0).count();
  res.tokens_per_s = s > 0 ? static_cast<double>(count) / s : 0;
  res.decode_tokens_per_s = decode_s > 0 ? static_cast<double>(decoded) / decode_s : 0;
  return res;
}

}  // namespace

DraftComparison compare_drafting(const Model& model,
                                 const std::vector<std::vector<int32_t>>& prompts,
                                 const std::vector<int32_t>& stops, const DraftCompareOptions& o) {
  DraftComparison c;
  Run plain, drafted;
  double plain_decode = 0, drafted_decode = 0;  // the best of the reps
  const EngineOptions po = engine_options(o, 0, prompts.size());
  const EngineOptions dro = engine_options(o, o.control ? 0 : o.draft_max, prompts.size());
  c.control = o.control;
  std::unique_ptr<Engine> warm_plain, warm_drafted;  // o.warm: one engine of each for every rep
  if (o.warm) {
    warm_plain = std::make_unique<Engine>(model, po);
    warm_drafted = std::make_unique<Engine>(model, dro);
  }
  for (int rep = 0; rep < o.reps; ++rep) {
    // Plain first in even reps, drafted first in odd ones, so that neither kind always runs
    // second (after the other has warmed or loaded the machine).
    auto run = [&](Engine* warm, const EngineOptions& eo) {
      if (warm != nullptr) return run_once(*warm, prompts, stops, o);
      Engine e(model, eo);
      return run_once(e, prompts, stops, o);
    };
    Run p, d;
    if (rep % 2 == 0) {
      p = run(warm_plain.get(), po);
      d = run(warm_drafted.get(), dro);
    } else {
      d = run(warm_drafted.get(), dro);
      p = run(warm_plain.get(), po);
    }
    c.same_tokens = c.same_tokens && p.replies == d.replies;
    plain_decode = std::max(plain_decode, p.decode_tokens_per_s);
    drafted_decode = std::max(drafted_decode, d.decode_tokens_per_s);
    if (p.tokens_per_s > plain.tokens_per_s) plain = std::move(p);
    if (d.tokens_per_s > drafted.tokens_per_s) drafted = std::move(d);
  }
  c.plain_tokens_per_s = plain.tokens_per_s;
  c.drafted_tokens_per_s = drafted.tokens_per_s;
  c.plain_decode_tokens_per_s = plain_decode;
  c.drafted_decode_tokens_per_s = drafted_decode;
  c.stats = drafted.stats;
  c.plain_stats = plain.stats;
  for (const auto& r : drafted.replies) c.reply_tokens += static_cast<int64_t>(r.size());
  return c;
}

namespace {
// "host 31.2 + model 190.4 us": a run's mean step, outside and inside the model.
std::string step_split(const EngineStats& s) {
  if (s.steps == 0) return "no step";
  const double n = static_cast<double>(s.steps);
  return fmt::format("host {:.1f} + model {:.1f} us", 1e6 * (s.step_seconds - s.model_seconds) / n,
                     1e6 * s.model_seconds / n);
}
}  // namespace

std::string describe(const std::string& kind, int streams, const DraftComparison& c) {
  if (c.control)
    return fmt::format(
        "{:<5} N={}: control, both plain: {:7.1f} and {:7.1f} tok/s ({:.2f}x); decoding {:.2f}x; "
        "a step: {} and {}{}",
        kind, streams, c.plain_tokens_per_s, c.drafted_tokens_per_s, c.speedup(),
        c.decode_speedup(), step_split(c.plain_stats), step_split(c.stats),
        c.same_tokens ? "" : " (TOKENS DIFFER)");
  return fmt::format(
      "{:<5} N={}: plain {:7.1f} tok/s, drafted {:7.1f} tok/s ({:.2f}x); "
      "decoding {:.1f} and {:.1f} tok/s per stream ({:.2f}x); "
      "{} drafts in {} verify rows, {:.1f}% accepted, mean accepted length {:.2f}; "
      "{} reply tokens; a step: plain {}, drafted {}{}{}{}",
      kind, streams, c.plain_tokens_per_s, c.drafted_tokens_per_s, c.speedup(),
      c.plain_decode_tokens_per_s, c.drafted_decode_tokens_per_s, c.decode_speedup(),
      c.stats.drafted_tokens, c.stats.draft_steps, 100 * c.acceptance(), c.mean_accepted_length(),
      c.reply_tokens, step_split(c.plain_stats), step_split(c.stats),
      c.stats.lookup_tokens > 0 ? fmt::format("; {} of the drafts by prompt lookup, {} accepted",
                                              c.stats.lookup_tokens, c.stats.lookup_accepted)
                                : std::string(),
      c.stats.lookup_shadows > 0 ? fmt::format("; {} lookups checked unverified, {} drafts held",
                                               c.stats.lookup_shadows, c.stats.lookup_shadow_held)
                                 : std::string(),
      c.same_tokens ? "" : " (TOKENS DIFFER)");
}

std::string describe_costs(const DraftComparison& c) {
  std::string s;
  for (size_t k = 0; k < c.stats.draft_costs.size(); ++k)
    s += fmt::format("{}k={} {:.1f} us", k ? ", " : "", k, 1e6 * c.stats.draft_costs[k]);
  return s;
}

}  // namespace tf
