#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace tf {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "?";
}

namespace {
int64_t align_down(int64_t n) {
  return n / kDeltaChunk * kDeltaChunk;
}
}  // namespace

Engine::Engine(const Model& model, const EngineOptions& o)
    : model_(model),
      o_(o),
      pool_(o.threads),
      sched_(o.scheduler),
      states_(o.state_cache_bytes, kDeltaChunk),
      prior_(o.draft_max),
      lookup_prior_(1) {
  mtp_ = o.draft_max > 0 && model.has_mtp();
  TF_CHECK(o.scheduler.prefill_align % kDeltaChunk == 0, "prefill_align {} vs chunk {}",
           o.scheduler.prefill_align, kDeltaChunk);
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  shutdown();
}

void Engine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::unique_ptr<Engine::Active> Engine::make_active(GenerationRequest r) {
  auto a = std::make_unique<Active>();
  a->req = std::move(r);
  a->sampler = Sampler(a->req.sampling);
  return a;
}

Result<uint64_t> Engine::submit(GenerationRequest r) {
  const int64_t V = model_.config().vocab_size;
  if (r.prompt.empty()) return Status::invalid("the prompt is empty");
  for (int32_t t : r.prompt) {
    if (t < 0 || t >= V)
      return Status::invalid("token id {} is outside the vocabulary [0, {})", t, V);
  }
  const int64_t P = static_cast<int64_t>(r.prompt.size());
  if (P >= o_.ctx_size) {
    return Status::out_of_range("the prompt has {} tokens; the context holds {} (prompt + reply)",
                                P, o_.ctx_size);
  }
  // Keep points: the prompt's last aligned position and the aligned ends the caller names.
  std::vector<int64_t> cuts{align_down(P)};
  for (int64_t k : r.keep_prefixes) {
    if (k > 0 && k <= P) cuts.push_back(align_down(k));
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  cuts.erase(std::remove(cuts.begin(), cuts.end(), 0), cuts.end());
  if (o_.state_cache_bytes == 0) cuts.clear();

  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return Status(StatusCode::kUnavailable, "the server is shutting down");
  const uint64_t id = next_id_++;
  if (!sched_.enqueue(id, 0, P, cuts)) {
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("the queue is full ({} waiting)", sched_.waiting()));
  }
  auto a = make_active(std::move(r));
  a->cuts = std::move(cuts);
  incoming_.emplace(id, std::move(a));
  cv_.notify_all();
  return id;
}

void Engine::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.push_back(id);
  cv_.notify_all();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats s = stats_;
  // Keep jobs take slots, but /metrics and callers count requests.
  s.waiting = sched_.waiting() - sched_.waiting_internal();
  s.running = sched_.running() - sched_.running_internal();
  s.keeping = sched_.waiting_internal() + sched_.running_internal();
  return s;
}

void Engine::wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = true;
  }
  cv_.notify_all();
}

void Engine::loop() {
  for (;;) {
    bool wake = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || wake_ || !cancels_.empty() || sched_.waiting() > 0 ||
               sched_.running() > 0 || in_flight_.has_value();
      });
      if (stop_) break;
      wake = std::exchange(wake_, false);
    }
    if (wake) pool_.wake();
    step();
  }
  // Shutdown: a chained step still on the device is taken (its tokens dropped), and everything
  // still known ends as cancelled.
  if (in_flight_) {
    std::vector<int32_t> dropped;
    model_.take_argmax(&dropped);
    in_flight_.reset();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, a] : incoming_) active_.emplace(id, std::move(a));
    incoming_.clear();
  }
  std::vector<uint64_t> ids;
  for (auto& [id, a] : active_) ids.push_back(id);
  for (uint64_t id : ids) finish(id, FinishReason::kCancelled, -1);
}

TokenEvent Engine::event(const Active& a, int32_t token, std::span<const float> logits) {
  TokenEvent e;
  e.token = token;
  e.n_prompt = static_cast<int64_t>(a.req.prompt.size());
  e.n_cached = a.n_cached;
  e.n_generated = a.n_generated;
  e.logits = logits;
  return e;
}

void Engine::finish(uint64_t id, FinishReason reason, int32_t token,
                    std::span<const float> logits) {
  auto it = active_.find(id);
  if (it == active_.end()) return;
  Active& a = *it->second;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sched_.finish(id);  // before the event, so a caller woken by it sees the sequence gone
  }
  if (!a.internal) {
    if (reason == FinishReason::kStop || reason == FinishReason::kLength) keep_turn(a);
    TokenEvent e = event(a, token, logits);
    e.done = true;
    e.reason = reason;
    if (a.req.on_event) a.req.on_event(e);
  }
  active_.erase(it);
}

// Queues an internal job that prefills this turn's reply from the longest kept prefix of
// prompt + reply up to its last aligned position, and keeps the state there.
void Engine::keep_turn(const Active& a) {
  if (o_.state_cache_bytes == 0) return;
  std::vector<int32_t> turn = a.req.prompt;
  turn.insert(turn.end(), a.reply.begin(), a.reply.end());
  const int64_t end = align_down(static_cast<int64_t>(turn.size()));
  if (end == 0 || end >= o_.ctx_size || states_.contains(std::span(turn).first(end))) return;
  auto job = make_active(GenerationRequest{});
  job->internal = true;
  MissReason reason;
  const int64_t from = states_.find(turn, end - 1, &job->state, &reason, /*count=*/false);
  if (from == 0) job->state = model_.new_state(o_.buffers, mtp_);
  job->req.prompt.assign(turn.begin(), turn.begin() + end);
  job->cuts = {end};
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  sched_.enqueue(id, from, end - from, job->cuts, /*internal=*/true);
  job->n_cached = from;
  incoming_.emplace(id, std::move(job));
  ++stats_.keep_jobs;
}

// Makes the state of each newly admitted request: a copy of the longest kept prefix of its prompt
// (leaving at least one token to feed, whose logits it samples from) or a fresh one.
void Engine::admit(const std::vector<uint64_t>& ids) {
  for (uint64_t id : ids) {
    Active& a = *active_.at(id);
    if (a.internal) continue;  // made with its state
    const std::vector<int32_t>& p = a.req.prompt;
    MissReason reason;
    a.n_cached = states_.find(p, static_cast<int64_t>(p.size()) - 1, &a.state, &reason);
    // A request's depth policy starts from what the engine has measured so far (every k tried
    // once by the first requests), so short replies do not each pay for trying every k.
    if (mtp_ && a.req.draft) {
      a.policy.emplace(prior_);
      a.policy->defer_probe();
      if (o_.draft_lookup > 0) {
        a.lookup.emplace(lookup_prior_);
        a.lookup->defer_probe();
        a.lookup_hits = LookupHits(o_.draft_lookup);
        a.lookup_index.append(p);
      }
    }
    if (a.n_cached == 0) {
      a.state = model_.new_state(o_.buffers, mtp_);
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    sched_.resume(id, a.n_cached);
  }
}

void Engine::step() {
  if (in_flight_) {
    step_in_flight();
    return;
  }
  const auto t_step = std::chrono::steady_clock::now();
  double model_s = 0;  // inside Model::forward and Model::draft
  auto timed = [&model_s](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    model_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Schedule (under the lock: submit/cancel touch the scheduler too).
  std::vector<uint64_t> cancels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels.swap(cancels_);
    for (auto& [id, a] : incoming_) active_.emplace(id, std::move(a));
    incoming_.clear();
  }
  for (uint64_t id : cancels) finish(id, FinishReason::kCancelled, -1);
  std::vector<uint64_t> admitted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, a] : incoming_) active_.emplace(id, std::move(a));  // keep jobs just queued
    incoming_.clear();
    admitted = sched_.admit();
  }
  admit(admitted);
  StepPlan plan;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (mtp_) ask_drafts(/*for_scheduler=*/true);
    plan = sched_.plan();
  }
  if (plan.empty()) return;
  const double c0 = mtp_ ? policy_clock(model_) : 0.0;
  const int64_t captures0 = mtp_ ? model_.graph_captures() : 0;

  // Draft: one batched Model::draft over the decode rows granted drafts.
  std::vector<DraftInput> din;
  std::vector<Active*> drafting;
  for (const StepRow& r : plan.rows) {
    if (!r.decode) continue;
    Active& a = *active_.at(r.seq);
    a.k = r.draft;
    a.feed.assign(1, a.last);
    if (r.draft == 0) {
      a.lookup_drafts.clear();
      continue;
    }
    if (!a.lookup_drafts.empty()) {  // prompt lookup: no drafter to run
      a.lookup_drafts.resize(std::min<size_t>(a.lookup_drafts.size(), r.draft));
      a.feed.insert(a.feed.end(), a.lookup_drafts.begin(), a.lookup_drafts.end());
      continue;
    }
    din.push_back(DraftInput{&a.state, a.last, r.draft, o_.draft_p_min});
    drafting.push_back(&a);
  }
  if (!din.empty()) {
    std::vector<Draft> drafts(din.size());
    timed([&] { model_.draft(din, drafts, &pool_); });
    for (size_t i = 0; i < drafts.size(); ++i) {
      drafting[i]->feed.insert(drafting[i]->feed.end(), drafts[i].tokens.begin(),
                               drafts[i].tokens.end());
    }
  }

  // Run: one forward over every row of the step (verify rows [x, d_1 .. d_j] among them).
  std::vector<StepInput> inputs;
  for (const StepRow& r : plan.rows) {
    Active& a = *active_.at(r.seq);
    const std::span<const int32_t> toks =
        r.decode ? std::span<const int32_t>(a.feed)
                 : std::span<const int32_t>(a.req.prompt).subspan(r.begin, r.count);
    inputs.push_back(StepInput{.state = &a.state,
                               .tokens = toks,
                               .verify = r.decode && a.feed.size() > 1,
                               .form = r.decode ? DeltaForm::kRecurrent : DeltaForm::kChunked});
  }
  std::vector<float> logits;
  std::vector<int32_t> tokens;  // an argmax step's rows
  const bool argmax = std::all_of(plan.rows.begin(), plan.rows.end(),
                                  [this](const StepRow& r) { return argmax_row(r); });
  std::optional<StepPlan> next;  // the step after this one, launched before this one's commit
  if (argmax && chainable(plan)) {
    timed([&] {
      model_.launch_argmax(inputs, /*chained=*/false, &pool_);
      next = launch_next(plan);
      model_.take_argmax(&tokens);
    });
    set_chained_tokens(plan, tokens);
  } else if (argmax) {
    timed([&] { model_.forward_argmax(inputs, &tokens, &pool_); });
  } else {
    timed([&] { model_.forward(inputs, &logits, &pool_); });
  }

  // Commit: keep states at cut points; sample where a row ends a prompt or decodes (every verify
  // row, up to the first rejected draft); emit; finish; then advance the scheduler by what was
  // accepted. Logits rows: a verify input has one per token, any other input one.
  const int64_t V = model_.config().vocab_size;
  size_t row = 0;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const size_t n = inputs[i].verify ? inputs[i].tokens.size() : 1;
    if (argmax)
      commit_row(plan.rows[i], {}, std::span<const int32_t>(tokens).subspan(row, n));
    else
      commit_row(plan.rows[i], std::span<const float>(logits).subspan(row * V, n * V), {});
    row += n;
  }
  // The policies learn the step's whole cost: drafting, the forward and the commit (sampling the
  // verify rows, the rollback), which a verify step makes dearer than a plain one. Not from a
  // step that captured a CUDA graph: its one-time work (the kernels run twice, the graph
  // instantiated: several plain steps' time) would make its k look dear for as long as the
  // measurement is kept, and a probe's step replaces all that was known of its k. (On an H100,
  // 2026-12-06, warm prose at one stream: k = 1 on every step at 0.94x of plain before, plain
  // steps at 0.99x with it: docs/PERFORMANCE.md, "The prior's probes on the device".)
  if (!observed_.empty() && model_.graph_captures() != captures0) observed_.clear();
  if (!observed_.empty()) learn(policy_clock(model_) - c0);
  in_flight_ = std::move(next);
  end_step(plan, t_step, model_s);
}

bool Engine::chainable(const StepPlan& plan) const {
  if (!o_.chain || o_.on_decode_state || plan.empty()) return false;
  if (!model_.on_device() && !o_.chain_on_host) return false;
  // With drafting on, a request that may draft chains while the stream gate keeps drafting off
  // (its depth is then 0 whatever its tokens), or where its last planned step asked for no drafts
  // and no prompt lookup matched (what it asks for at this step's commit, ask_drafts, waits a
  // step: a lookup needs the token before). Every running sequence decodes (checked below).
  const bool gated = mtp_ && o_.draft_max_streams > 0 &&
                     plan.rows.size() > static_cast<size_t>(o_.draft_max_streams);
  for (const StepRow& r : plan.rows) {
    auto it = active_.find(r.seq);
    if (it == active_.end() || !r.decode || r.count != 1 || r.draft != 0 || !argmax_row(r))
      return false;
    // The step's token may end the request only as a stop token, never by a limit (take()).
    const Active& a = *it->second;
    if (a.internal || a.n_generated + 1 >= a.req.max_tokens || r.begin + 2 >= o_.ctx_size)
      return false;
    if (a.policy && !gated && (a.want != 0 || a.lookup_matched)) return false;
  }
  // Every running sequence decodes in this step (none has prompt rows still to run).
  std::lock_guard<std::mutex> lock(mu_);
  return incoming_.empty() && cancels_.empty() && sched_.waiting() == 0 &&
         sched_.running() == plan.rows.size();
}

StepPlan Engine::launch_next(const StepPlan& plan) {
  StepPlan next = plan;
  std::vector<StepInput> inputs;
  for (StepRow& r : next.rows) {
    ++r.begin;
    Active& a = *active_.at(r.seq);
    // a.last is the token before the launched step's: not read (its token is on the device).
    inputs.push_back(StepInput{.state = &a.state,
                               .tokens = std::span<const int32_t>(&a.last, 1),
                               .verify = false,
                               .form = DeltaForm::kRecurrent});
  }
  model_.launch_argmax(inputs, /*chained=*/true, &pool_);
  return next;
}

void Engine::learn(double cost) {
  for (const Observed& ob : observed_) {
    auto it = active_.find(ob.seq);
    Active* a = it != active_.end() ? it->second.get() : nullptr;
    if (ob.lookup) {
      if (a) a->lookup->observe(1, ob.emitted, cost);
      lookup_prior_.observe(1, ob.emitted, cost);
      continue;
    }
    if (a) a->policy->observe(ob.k, ob.emitted, cost);
    prior_.observe(ob.k, ob.emitted, cost);
    if (ob.lookup_matched) {
      if (a) a->lookup->observe(0, ob.emitted, cost);
      lookup_prior_.observe(0, ob.emitted, cost);
    }
  }
  observed_.clear();
  std::lock_guard<std::mutex> lock(mu_);  // the prior changed
  stats_.draft_costs.resize(o_.draft_max + 1);
  for (int k = 0; k <= o_.draft_max; ++k) stats_.draft_costs[k] = prior_.cost(k);
}

void Engine::ask_drafts(bool for_scheduler) {
  int decoding = 0;  // requests past their prompt
  for (auto& [id, a] : active_) decoding += !a->internal && a->last >= 0;
  const bool gated = o_.draft_max_streams > 0 && decoding > o_.draft_max_streams;
  for (auto& [id, a] : active_) {
    a->lookup_drafts.clear();
    a->lookup_matched = false;
    if (!a->policy || a->last < 0) continue;
    a->want = gated ? 0 : want_drafts(*a);
    if (for_scheduler)
      sched_.set_draft(id, a->want);
    else
      a->lookup_drafts.clear();  // the step is launched plain: its drafts, if any, wait a step
  }
}

// The tokens of `plan`, just taken, are those the chained step launched after it was fed: the
// states keeping the MTP head get them (Model::set_chained_token).
void Engine::set_chained_tokens(const StepPlan& plan, std::span<const int32_t> tokens) {
  if (!mtp_) return;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    auto it = active_.find(plan.rows[i].seq);
    if (it != active_.end() && it->second->state.has_mtp)
      model_.set_chained_token(&it->second->state, tokens[i]);
  }
}

// The chained step in in_flight_: the next one launched if it can be, then this one's tokens read
// and committed for the requests still there (a request that stopped at the step before, or was
// cancelled since, has its row dropped).
void Engine::step_in_flight() {
  const auto t_step = std::chrono::steady_clock::now();
  StepPlan plan = std::move(*in_flight_);
  in_flight_.reset();
  std::vector<uint64_t> cancels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels.swap(cancels_);
  }
  for (uint64_t id : cancels) finish(id, FinishReason::kCancelled, -1);
  std::vector<int32_t> tokens;
  const auto t_model = std::chrono::steady_clock::now();
  if (chainable(plan)) in_flight_ = launch_next(plan);
  model_.take_argmax(&tokens);
  const double model_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_model).count();
  if (in_flight_) set_chained_tokens(plan, tokens);
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    auto it = active_.find(plan.rows[i].seq);
    if (it == active_.end()) continue;
    Active& a = *it->second;
    a.k = 0;
    a.feed.assign(1, a.last);  // the token the step was fed (on the device)
    commit_row(plan.rows[i], {}, std::span<const int32_t>(tokens).subspan(i, 1));
  }
  // A chained step costs the time since the step before ended (it overlapped that one's end);
  // not learned from where a graph was captured meanwhile (as in step()).
  if (!observed_.empty() && model_.graph_captures() != step_end_captures_) observed_.clear();
  if (!observed_.empty()) learn(policy_clock(model_) - step_end_clock_);
  end_step(plan, t_step, model_s);
}

void Engine::end_step(const StepPlan& plan, std::chrono::steady_clock::time_point t_step,
                      double model_s) {
  if (in_flight_ && mtp_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ask_drafts(/*for_scheduler=*/false);
    }
    step_end_clock_ = policy_clock(model_), step_end_captures_ = model_.graph_captures();
  }
  std::lock_guard<std::mutex> lock(mu_);
  sched_.commit(plan);
  ++stats_.steps;
  stats_.chained_steps += in_flight_.has_value();
  stats_.step_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_step).count();
  stats_.model_seconds += model_s;
  stats_.pool = states_.stats();
}

int Engine::want_drafts(Active& a) {
  // Tokens still wanted: at most room - 1 drafts (+ the target's own token) can be used. Row i of
  // a verify pass leaves n_past = base + 1 + i, and plain decoding stops once n_past + 1 reaches
  // ctx_size, so rows past ctx_size - 2 - base are never sampled.
  const int64_t room = a.req.max_tokens - a.n_generated;
  const int64_t ctx_room = o_.ctx_size - 2 - a.state.n_past;
  const int64_t limit = std::max<int64_t>(0, std::min(room - 1, ctx_room));
  if (a.lookup && limit > 0) {
    std::vector<int32_t> d =
        a.lookup_index.drafts(static_cast<int>(std::min<int64_t>(a.lookup_hits.depth(), limit)));
    if (!d.empty()) {
      a.lookup_matched = true;
      // Adaptive: verified only where this request's lookups have been seen to hold, and then as
      // the lookup policy chooses; else checked against the reply for free (LookupHits).
      if (!o_.draft_adaptive ||
          (a.lookup_hits.promising() && next_depth(&lookup_prior_, &*a.lookup) == 1)) {
        count_shadow(a.lookup_hits.close());
        a.lookup_drafts = std::move(d);
        return static_cast<int>(a.lookup_drafts.size());
      }
      a.lookup_hits.shadow(std::move(d));
    }
  }
  const int k = o_.draft_adaptive ? next_depth(&prior_, &*a.policy) : o_.draft_max;
  return static_cast<int>(std::min<int64_t>(k, limit));
}

void Engine::count_shadow(std::optional<int> held) {
  if (!held) return;
  ++stats_.lookup_shadows;
  stats_.lookup_shadow_held += *held;
}

bool Engine::cancel_pending(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::find(cancels_.begin(), cancels_.end(), id) != cancels_.end();
}

bool Engine::argmax_row(const StepRow& r) const {
  const Active& a = *active_.at(r.seq);
  if (a.internal || (!r.decode && !r.samples)) return true;
  const SamplingParams& p = a.req.sampling;
  return !a.req.want_logits && p.temperature <= 0.0f && p.presence_penalty == 0.0f &&
         p.frequency_penalty == 0.0f;
}

void Engine::commit_row(StepRow& r, std::span<const float> logits,
                        std::span<const int32_t> tokens) {
  if (r.decode) {
    commit_decode(r, logits, tokens);
    return;
  }
  Active& a = *active_.at(r.seq);
  const int64_t end = r.begin + r.count;
  if (std::find(a.cuts.begin(), a.cuts.end(), end) != a.cuts.end()) {
    // A prompt row never opens a verify window. The kept copy carries no verify scratch, and the
    // MTP head's pending rows are computed once here rather than by every resume.
    a.state.release_verify();
    if (a.state.has_mtp) {
      SequenceState* st = &a.state;
      model_.mtp_sync({&st, 1}, &pool_);
    }
    states_.put(std::span<const int32_t>(a.req.prompt).first(end), a.state);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    (a.internal ? stats_.keep_tokens : stats_.prompt_tokens) += r.count;
  }
  if (!r.samples) return;
  if (a.internal) {
    finish(r.seq, FinishReason::kStop, -1);  // its state is kept; nothing to sample
    return;
  }
  take(r.seq, a, tokens.empty() ? a.sampler.sample(logits) : tokens[0], logits, a.state.n_past);
}

void Engine::commit_decode(StepRow& r, std::span<const float> logits,
                           std::span<const int32_t> tokens) {
  Active& a = *active_.at(r.seq);
  const int64_t V = model_.config().vocab_size;
  const int64_t base = r.begin;  // n_past before the step; feed[i] sat at position base + i
  const std::vector<int32_t> feed = std::move(a.feed);
  const int64_t j = static_cast<int64_t>(feed.size()) - 1;  // drafts fed
  const int k = a.k;
  const bool lookup = !a.lookup_drafts.empty();  // the drafts came from prompt lookup
  if (j > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.draft_steps;
    stats_.drafted_tokens += j;
    if (lookup) stats_.lookup_tokens += j;
  }
  // Row i holds the target's logits after feed[0 .. i]: sample it as plain decoding would, and go
  // on to row i + 1 only while the token is the draft fed next (d_{i+1} = feed[i + 1]).
  int64_t i = 0;
  for (;; ++i) {
    if (i > 0 && cancel_pending(r.seq)) {  // nothing more is emitted once cancelled
      finish(r.seq, FinishReason::kCancelled, -1);
      return;
    }
    // An argmax step's token is the greedy sampler's pick; its events carry no logits.
    const std::span<const float> row = tokens.empty() ? logits.subspan(i * V, V) : logits;
    const int32_t tok = tokens.empty() ? a.sampler.sample(row) : tokens[i];
    const bool accepted = i < j && tok == feed[i + 1];
    if (accepted) {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.accepted_tokens;
      if (lookup) ++stats_.lookup_accepted;
    }
    if (!take(r.seq, a, tok, row, base + 1 + i)) return;  // finished: `a` is gone
    if (!accepted) break;
  }
  // Keep x, d_1 .. d_i: exactly plain decoding's state after the tokens emitted but the last.
  if (j > 0) a.state.rollback(base + 1 + i);
  r.count = 1 + i;
  const int emitted = static_cast<int>(i) + 1;
  if (lookup) a.lookup_hits.verified(static_cast<int>(i), static_cast<int>(j));
  if (a.policy && o_.draft_adaptive && ++a.decode_steps > DraftPolicy::kWarmSteps)
    observed_.push_back(Observed{r.seq, k, emitted, lookup, a.lookup_matched});
  if (o_.on_decode_state) o_.on_decode_state(r.seq, a.state);
}

bool Engine::take(uint64_t id, Active& a, int32_t tok, std::span<const float> logits,
                  int64_t n_past) {
  a.reply.push_back(tok);
  if (a.lookup) {
    a.lookup_index.append(tok);
    if (const std::optional<int> held = a.lookup_hits.token(tok)) {
      std::lock_guard<std::mutex> lock(mu_);
      count_shadow(held);
    }
  }
  const auto& stops = a.req.stop_tokens;
  if (std::find(stops.begin(), stops.end(), tok) != stops.end()) {
    finish(id, FinishReason::kStop, -1);
    return false;
  }
  a.last = tok;
  ++a.n_generated;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.generated_tokens;
  }
  if (a.n_generated >= a.req.max_tokens || n_past + 1 >= o_.ctx_size) {
    finish(id, FinishReason::kLength, tok, logits);  // the last token travels on the final event
    return false;
  }
  if (a.req.on_event) a.req.on_event(event(a, tok, logits));
  return true;
}

}  // namespace tf
