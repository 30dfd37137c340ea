// The engine: a thread that runs the model for many requests at once.
//
//   step() = schedule -> run -> commit
//   schedule: the Scheduler picks decode rows and prefill chunks within the token budget;
//   run:      ONE Model::forward over all rows of the step (the only code that computes);
//   commit:   sample each row that ends a prompt or decodes, emit events, finish sequences.
//
// MTP drafting (qwen3-next.md §6, EngineOptions::draft_max > 0 on a model with an MTP head): before
// the forward, Model::draft runs batched over the decode rows of the requests that draft this step
// (k_i drafts each, within the step's token budget); each such row is fed as a verify row
// [x, d_1 .. d_j] in the same forward as every other row. Commit samples the verify rows in order
// with the request's own sampler, exactly as plain decoding would sample them one step at a time,
// and accepts draft d_{i+1} while the token sampled from row i equals it; the first token that
// differs (or the token after the last draft) is the target's own. So the tokens are those plain
// decoding gives, greedy or seeded sampling alike (with temperature > 0 this is the lossless
// speculative-sampling rule for a drafter whose proposal is its argmax, q = one-hot(d): accept with
// probability p(d), else draw from p without d; and the RNG is used exactly as without drafts).
// Then SequenceState::rollback keeps x, d_1 .. d_m: the state is, bit for bit, plain decoding's.
//
// Kept states (runtime/state_pool.h): a request is admitted from the longest kept prefix of its
// prompt and prefills only the rest. Its prefill is cut at the prompt's last 64-aligned position
// (and at the aligned ends the caller names, e.g. the system prompt's), where the state is kept.
// When a request ends, an internal job prefills its reply from the prompt's kept state up to the
// last aligned position of prompt + reply and keeps that state too, so the next turn of the chat
// resumes after this turn's reply. Every kept state is a prefill state at an aligned position, so
// resumed == fresh, bit for bit.
//
// Requests arrive from any thread through submit(); events are delivered on the engine thread via
// the request's callback, which must return quickly (hand the event to the waiting thread).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "model/model.h"
#include "model/mtp.h"
#include "runtime/lookup.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"
#include "runtime/state_pool.h"

namespace tf {

enum class FinishReason { kNone, kStop, kLength, kCancelled };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled"

struct TokenEvent {
  int32_t token = -1;  // the new token, or -1 on a final event that carries none
  bool done = false;   // last event of the request
  FinishReason reason = FinishReason::kNone;
  int64_t n_prompt = 0;     // prompt tokens
  int64_t n_cached = 0;     // prompt tokens reused from a kept state
  int64_t n_generated = 0;  // tokens generated so far (this one included)
  // The logits [vocab] the token was sampled from; valid during the callback only.
  std::span<const float> logits;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_tokens = 256;
  std::vector<int32_t> stop_tokens;  // sampling one ends the request (finish "stop"; not emitted)
  // Prompt lengths at whose (64-aligned-down) ends a state should be kept besides the prompt's
  // own, e.g. the end of the system prompt, which other chats share.
  std::vector<int64_t> keep_prefixes;
  // MTP drafting for this request; false: never (it then decodes one token per step). Drafting
  // also needs EngineOptions::draft_max > 0 and an MTP head; it never changes the tokens.
  bool draft = true;
  // false: events carry no logits (an empty span). A step whose sampled rows are all greedy
  // (temperature 0, no penalties) without logits then asks the model for the rows' argmax only
  // (Model::forward_argmax: on the device, a token per row read back instead of the row), the
  // same tokens the sampler picks from the rows. The server sets it false.
  bool want_logits = true;
  std::function<void(const TokenEvent&)> on_event;
};

struct EngineOptions {
  SchedulerOptions scheduler;
  int64_t ctx_size = 16384;                    // positions per sequence (prompt + generated)
  int threads = 0;                             // worker threads for the model (0 = all cores)
  size_t state_cache_bytes = size_t{2} << 30;  // kept-state pool budget (0: no pool)
  // Follows every sequence-state and kept-snapshot buffer (the residency owner); nullptr: none.
  BufferObserver* buffers = nullptr;
  // MTP drafting: drafts per decode row at most (0: off; needs a model with an MTP head). Off by
  // default: on the CPU it does not pay for tiny-next (docs/PERFORMANCE.md, MTP drafting).
  int draft_max = 0;
  float draft_p_min = 0.0f;    // stop before a draft whose head probability is below this
  bool draft_adaptive = true;  // pick k in 0..draft_max per request and step (DraftPolicy)
  // Draft only in steps where at most this many requests decode (0: any number). A batch already
  // amortises the weight reads that drafting amortises; measured on the H200 and the CPU,
  // drafting pays for one decoding request and costs from 4 (docs/PERFORMANCE.md). As vLLM's
  // speculative_disable_by_batch_size.
  int draft_max_streams = 1;
  // Prompt-lookup drafts (runtime/lookup.h), up to this many per step (0: off), for requests that
  // draft: where the context's last 2-4 tokens occurred before, the tokens that followed are
  // verified instead of asking the MTP head, at no drafting cost. Adaptive per request (a second
  // DraftPolicy: lookup or not, where a lookup matches, by measured cost per token), and tried
  // only once the request's unverified lookups have been seen to hold (LookupHits); the depth
  // drops to what was accepted (+ 1) after a rejection and doubles back on full acceptance.
  int draft_lookup = 0;
  // Greedy decode steps on the device chained (Model::launch_argmax): while a step of plain
  // decode rows runs, the engine launches the next one (each row's token read on the device) and
  // only then reads, emits and commits this one's tokens, so the host's work between steps leaves
  // the device's critical path (vLLM's async scheduling, SGLang's overlap scheduler). Only where
  // the next step is known without the tokens: every row a plain decode row of a greedy request
  // that wants no logits, none at its length or context limit, nothing waiting to be admitted or
  // cancelled, no drafts in the step, no on_decode_state. With drafting on, a request that may
  // draft chains while the stream gate (draft_max_streams) keeps drafting off, or where its last
  // planned step asked for no drafts and no prompt lookup matched: a chained step is launched
  // plain, and the drafts asked for at its commit (a lookup needs the token before) wait for the
  // step after. A row whose request stops at the step's token (a stop token) has its next row
  // computed and dropped. The same kernels: the tokens are the unchained engine's, bit for bit.
  // Off by default: on an H100 its tests pass and it gains nothing (the host's share of a step is
  // 9-14 us there, and the chained ids copy costs about 3 us; docs/PERFORMANCE.md, "Chained
  // decode steps"). `serve --chain on`.
  bool chain = false;
  // For tests: chain on the CPU too (Model::launch_argmax runs each step at once there, so
  // nothing overlaps and a request that stops at a stop token costs a step; the bookkeeping runs,
  // under the sanitizers, on every machine).
  bool chain_on_host = false;
  // For tests: called on the engine thread after each decode row's commit, with the request's id
  // and its state (verify window closed), while the request goes on; empty: none.
  std::function<void(uint64_t, const SequenceState&)> on_decode_state;
};

struct EngineStats {
  uint64_t steps = 0, prompt_tokens = 0, generated_tokens = 0;
  uint64_t chained_steps = 0;  // steps launched before the step before was committed (chain)
  uint64_t keep_jobs = 0, keep_tokens = 0;  // internal prefills that extend kept states
  // MTP drafting: verify rows that carried drafts, drafts proposed, drafts accepted (emitted as
  // the target's own tokens). Mean accepted length = accepted_tokens / draft_steps.
  uint64_t draft_steps = 0, drafted_tokens = 0, accepted_tokens = 0;
  // Of those, the prompt-lookup drafts (EngineOptions::draft_lookup) and how many were accepted.
  uint64_t lookup_tokens = 0, lookup_accepted = 0;
  // Lookups that matched and were checked against the reply instead of verified (LookupHits),
  // and of their drafts those that held.
  uint64_t lookup_shadows = 0, lookup_shadow_held = 0;
  // The engine's drafting prior: seconds per emitted token with k = 0 .. draft_max MTP drafts per
  // step (DraftPolicy::cost; 0: not measured). Empty without drafting.
  std::vector<double> draft_costs;
  // Wall seconds of the engine's steps that ran a forward (from the step's start to its commit),
  // and of them inside Model::forward and Model::draft: step_seconds - model_seconds is the host's
  // own work (scheduling, drafting policy and prompt lookups, sampling, events), which the device
  // waits on at one stream (docs/PERFORMANCE.md, drafting on the device).
  double step_seconds = 0, model_seconds = 0;
  size_t waiting = 0, running = 0;  // requests (keep jobs not included)
  size_t keeping = 0;               // keep jobs queued or running
  StatePoolStats pool;
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
  // Whether the engine drafts at all (draft_max > 0 and the model has an MTP head).
  bool drafting() const { return mtp_; }

 private:
  struct Active {
    GenerationRequest req;  // for an internal job: prompt = the tokens to keep a state of
    SequenceState state;    // made at admission (from a kept state or fresh)
    Sampler sampler{SamplingParams{}};
    std::vector<int64_t> cuts;  // aligned positions where the state is kept
    bool internal = false;      // an internal keep job: no events, no sampling
    int64_t n_cached = 0;
    int64_t n_generated = 0;
    int32_t last = -1;           // last sampled token, fed by the next decode row
    std::vector<int32_t> reply;  // every sampled token, the stop token included
    // MTP drafting (requests that may draft only): the depth policy, and this step's k and feed.
    std::optional<DraftPolicy> policy;
    int k = 0;  // drafts asked for this step (0: a plain decode row)
    // What want_drafts asked for the request's latest planned step: a step after it is chained
    // only if it was 0 (so a prompt lookup or a probe found then waits one step at most).
    int want = 0;
    int decode_steps = 0;       // decode steps so far (DraftPolicy::kWarmSteps)
    std::vector<int32_t> feed;  // this step's decode row: [last, d_1 .. d_j]
    // Prompt lookup (EngineOptions::draft_lookup): whether to use it where it matches (arm 1) or
    // not (arm 0), whether this request's lookups hold and the depth of the next one, this step's
    // lookup drafts (empty: the MTP head drafts, if any), and whether a lookup matched this step.
    std::optional<DraftPolicy> lookup;
    LookupIndex lookup_index;  // prompt + reply, with lookup only
    LookupHits lookup_hits;
    std::vector<int32_t> lookup_drafts;
    bool lookup_matched = false;
  };
  static std::unique_ptr<Active> make_active(GenerationRequest r);
  static TokenEvent event(const Active& a, int32_t token, std::span<const float> logits);
  void loop();
  void step();
  // EngineOptions::chain: whether the step after `plan` (launched, not committed) can be launched
  // now; launches it (its plan: the same rows one position on); the step of in_flight_.
  bool chainable(const StepPlan& plan) const;
  StepPlan launch_next(const StepPlan& plan);
  void set_chained_tokens(const StepPlan& plan, std::span<const int32_t> tokens);
  // With drafting on (mu_ held): each request that may draft asks want_drafts for the next step
  // (Active::want; 0 while the stream gate, draft_max_streams, is closed), which goes to the
  // scheduler; or, after the commit of a step whose next step was launched chained (plain), only
  // to `want`, so that its lookups and policy go on as in an unchained engine and what it asks for
  // waits for the step after.
  void ask_drafts(bool for_scheduler);
  // The end of every step: ask_drafts where a chained step was launched, then the scheduler
  // advanced by what `plan` committed and the step counted (started at t_step, model_s of it in
  // the model).
  void end_step(const StepPlan& plan, std::chrono::steady_clock::time_point t_step, double model_s);
  // The drafting policies learn from the steps just committed (observed_) at this cost (seconds
  // of policy_clock per step).
  void learn(double cost);
  void step_in_flight();
  void admit(const std::vector<uint64_t>& ids);
  // A row's results: `logits` [n, vocab], or with an argmax step (forward_argmax) `tokens` [n]
  // and no logits.
  void commit_row(StepRow& r, std::span<const float> logits, std::span<const int32_t> tokens);
  // A decode row, plain or verify: logits [1 + j, V] for feed [last, d_1 .. d_j].
  void commit_decode(StepRow& r, std::span<const float> logits, std::span<const int32_t> tokens);
  // Whether the step's row r may be an argmax row: it samples nothing, or greedily with no
  // penalties for a request that wants no logits.
  bool argmax_row(const StepRow& r) const;
  bool cancel_pending(uint64_t id) const;  // cancel() was called for id since the step began
  int want_drafts(Active& a);  // k for the next decode row of a decoding request (asks its policy)
  // A shadow lookup resolved (LookupHits; nullopt: none did): into the stats. Under mu_.
  void count_shadow(std::optional<int> held);
  // A token sampled from `logits` after which the state holds n_past positions (as plain decoding
  // leaves it): recorded; a stop token or a limit finishes the request (false: `a` is gone), else
  // it is emitted.
  bool take(uint64_t id, Active& a, int32_t tok, std::span<const float> logits, int64_t n_past);
  void finish(uint64_t id, FinishReason reason, int32_t token, std::span<const float> logits = {});
  void keep_turn(const Active& a);

  const Model& model_;
  EngineOptions o_;
  bool mtp_ = false;  // states carry the MTP head and requests may draft
  ThreadPool pool_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Scheduler sched_;  // guarded by mu_
  std::map<uint64_t, std::unique_ptr<Active>>
      incoming_;                   // submitted, not yet seen by the engine thread
  std::vector<uint64_t> cancels_;  // guarded by mu_
  std::map<uint64_t, std::unique_ptr<Active>> active_;  // engine thread only
  StatePool states_;                                    // engine thread only
  // Every request's depth observations, pooled (engine thread only): a new request's policy
  // starts as a copy of it, and its probes are taken by whichever request is next (next_depth).
  DraftPolicy prior_;
  DraftPolicy lookup_prior_;  // the same for the lookup-or-not choice
  // This step's decode rows of adaptive requests, for their policies once the step's cost is known
  // (engine thread only): k asked, tokens emitted, drafted by lookup, a lookup matched.
  struct Observed {
    uint64_t seq;
    int k, emitted;
    bool lookup, lookup_matched;
  };
  std::vector<Observed> observed_;
  // A chained step launched and not yet committed (engine thread only; EngineOptions::chain).
  std::optional<StepPlan> in_flight_;
  // policy_clock and Model::graph_captures at the end of the last step that launched a chained
  // step (drafting on): a chained step's cost is the time from the step before's end to its own.
  double step_end_clock_ = 0;
  int64_t step_end_captures_ = 0;
  uint64_t next_id_ = 1;
  bool stop_ = false;
  bool wake_ = false;  // guarded by mu_
  EngineStats stats_;
  std::thread thread_;
};

}  // namespace tf
