// The engine: a thread that runs the model for many requests at once.
//
//   step() = schedule -> run -> commit
//   schedule: the Scheduler picks decode rows and prefill chunks within the token budget;
//   run:      ONE Model::forward over all rows of the step (the only code that computes);
//   commit:   sample each row that ends a prompt or decodes, emit events, finish sequences.
//
// Requests arrive from any thread through submit(); events are delivered on the engine thread via
// the request's callback, which must return quickly (hand the event to the waiting thread).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "model/model.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"

namespace tf {

enum class FinishReason { kNone, kStop, kLength, kCancelled };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled"

struct TokenEvent {
  int32_t token = -1;  // the new token, or -1 on a final event that carries none
  bool done = false;   // last event of the request
  FinishReason reason = FinishReason::kNone;
  int64_t n_prompt = 0;     // prompt tokens
  int64_t n_cached = 0;     // prompt tokens reused from a kept state (0 until the pool lands)
  int64_t n_generated = 0;  // tokens generated so far (this one included)
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_tokens = 256;
  std::vector<int32_t> stop_tokens;  // sampling one ends the request (finish "stop"; not emitted)
  std::function<void(const TokenEvent&)> on_event;
};

struct EngineOptions {
  SchedulerOptions scheduler;
  int64_t ctx_size = 16384;  // positions per sequence (prompt + generated)
  int threads = 0;           // worker threads for the model (0 = all cores)
  // Follows every sequence-state and kept-snapshot buffer (the residency owner); nullptr: none.
  BufferObserver* buffers = nullptr;
};

struct EngineStats {
  uint64_t steps = 0, prompt_tokens = 0, generated_tokens = 0;
  size_t waiting = 0, running = 0;
};

class Engine {
 public:
  Engine(const Model& model, const EngineOptions& o);
  ~Engine();  // shutdown()
  // Ends every queued or running request (final event kCancelled), refuses new ones
  // (kUnavailable) and joins the engine thread. Idempotent.
  void shutdown();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Errors: an empty or too-long prompt (kInvalidArgument, kOutOfRange), a full
  // queue (kResourceExhausted: HTTP 429).
  Result<uint64_t> submit(GenerationRequest r);
  // Cancels a request: its final event (reason kCancelled) comes from the engine thread, and its
  // state is freed. Safe from any thread, at any point; unknown or finished ids are ignored.
  void cancel(uint64_t id);
  EngineStats stats() const;
  // Wakes the engine thread and its worker pool once; returns at once. Safe from any thread (the
  // residency tick keeps them warm between requests).
  void wake();
  const Model& model() const { return model_; }
  const EngineOptions& options() const { return o_; }

 private:
  struct Active {
    GenerationRequest req;
    SequenceState state;
    Sampler sampler;
    int64_t n_generated = 0;
    int32_t last = -1;  // last sampled token, fed by the next decode row
  };
  void loop();
  void step();
  void finish(uint64_t id, FinishReason reason, int32_t token);

  const Model& model_;
  EngineOptions o_;
  ThreadPool pool_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Scheduler sched_;                                 // guarded by mu_
  std::map<uint64_t, GenerationRequest> incoming_;  // submitted, not yet seen by the engine thread
  std::vector<uint64_t> cancels_;                   // guarded by mu_
  std::map<uint64_t, std::unique_ptr<Active>> active_;  // engine thread only
  uint64_t next_id_ = 1;
  bool stop_ = false;
  bool wake_ = false;  // guarded by mu_
  EngineStats stats_;
  std::thread thread_;
};

}  // namespace tf
