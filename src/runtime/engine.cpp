#include "runtime/engine.h"

#include <algorithm>
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

Engine::Engine(const Model& model, const EngineOptions& o)
    : model_(model), o_(o), pool_(o.threads), sched_(o.scheduler) {
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

Result<uint64_t> Engine::submit(GenerationRequest r) {
  const int64_t V = model_.config().vocab_size;
  if (r.prompt.empty()) return Status::invalid("the prompt is empty");
  for (int32_t t : r.prompt) {
    if (t < 0 || t >= V)
      return Status::invalid("token id {} is outside the vocabulary [0, {})", t, V);
  }
  if (static_cast<int64_t>(r.prompt.size()) >= o_.ctx_size) {
    return Status::out_of_range("the prompt has {} tokens; the context holds {} (prompt + reply)",
                                r.prompt.size(), o_.ctx_size);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return Status(StatusCode::kUnavailable, "the server is shutting down");
  const uint64_t id = next_id_++;
  if (!sched_.enqueue(id, 0, static_cast<int64_t>(r.prompt.size()))) {
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("the queue is full ({} waiting)", sched_.waiting()));
  }
  incoming_.emplace(id, std::move(r));
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
  s.waiting = sched_.waiting();
  s.running = sched_.running();
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
        return stop_ || wake_ || !cancels_.empty() || sched_.waiting() > 0 || sched_.running() > 0;
      });
      if (stop_) break;
      wake = std::exchange(wake_, false);
    }
    if (wake) pool_.wake();
    step();
  }
  // Shutdown: everything still known ends as cancelled.
  std::vector<uint64_t> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, r] : incoming_)
      active_.emplace(id, std::make_unique<Active>(Active{std::move(r), {}, Sampler({}), 0, -1}));
    incoming_.clear();
  }
  for (auto& [id, a] : active_) ids.push_back(id);
  for (uint64_t id : ids) finish(id, FinishReason::kCancelled, -1);
}

void Engine::finish(uint64_t id, FinishReason reason, int32_t token) {
  auto it = active_.find(id);
  if (it == active_.end()) return;
  Active& a = *it->second;
  TokenEvent e;
  e.token = token;
  e.done = true;
  e.reason = reason;
  e.n_prompt = static_cast<int64_t>(a.req.prompt.size());
  e.n_generated = a.n_generated;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sched_.finish(id);  // before the event, so a caller woken by it sees the sequence gone
  }
  if (a.req.on_event) a.req.on_event(e);
  active_.erase(it);
}

void Engine::step() {
  // Schedule (under the lock: submit/cancel touch the scheduler too).
  StepPlan plan;
  std::vector<uint64_t> cancels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels.swap(cancels_);
    for (auto& [id, r] : incoming_) {
      Sampler sampler(r.sampling);
      active_.emplace(id, std::make_unique<Active>(
                              Active{std::move(r), model_.new_state(o_.buffers), sampler, 0, -1}));
    }
    incoming_.clear();
  }
  for (uint64_t id : cancels) finish(id, FinishReason::kCancelled, -1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    plan = sched_.schedule();
  }
  if (plan.empty()) return;

  // Run: one forward over every row of the step.
  std::vector<StepInput> inputs;
  for (const StepRow& r : plan.rows) {
    Active& a = *active_.at(r.seq);
    std::span<const int32_t> toks =
        r.decode ? std::span<const int32_t>(&a.last, 1)
                 : std::span<const int32_t>(a.req.prompt).subspan(r.begin, r.count);
    inputs.push_back(StepInput{&a.state, toks, false});
  }
  std::vector<float> logits;
  model_.forward(inputs, &logits, &pool_);

  // Commit: sample where a row ends a prompt or decodes; emit; finish.
  {
    std::lock_guard<std::mutex> lock(mu_);
    sched_.commit(plan);
    ++stats_.steps;
  }
  const int64_t V = model_.config().vocab_size;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const StepRow& r = plan.rows[i];
    Active& a = *active_.at(r.seq);
    if (!r.decode) {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.prompt_tokens += r.count;
    }
    if (!r.samples) continue;
    const int32_t tok = a.sampler.sample(std::span<const float>(&logits[i * V], V));
    const auto& stops = a.req.stop_tokens;
    if (std::find(stops.begin(), stops.end(), tok) != stops.end()) {
      finish(r.seq, FinishReason::kStop, -1);
      continue;
    }
    a.last = tok;
    ++a.n_generated;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.generated_tokens;
    }
    const bool at_length = a.n_generated >= a.req.max_tokens || a.state.n_past + 1 >= o_.ctx_size;
    if (at_length) {
      finish(r.seq, FinishReason::kLength, tok);
      continue;
    }
    TokenEvent e;
    e.token = tok;
    e.n_prompt = static_cast<int64_t>(a.req.prompt.size());
    e.n_generated = a.n_generated;
    if (a.req.on_event) a.req.on_event(e);
  }
}

}  // namespace tf
