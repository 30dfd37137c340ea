// Speculative decoding with the MTP head (qwen3-next.md §6), greedy: the pieces the engine uses
// (acceptance, counters) and a single-sequence decode loop for the CLI, the bench and the tests.
//
// One drafted step, for a sequence whose last logits row gave the token x = x[n_past]:
//   Draft d = draft({state, x, k})             // d_1..d_j, state unchanged
//   forward({state, [x, d_1..d_j], verify})    // j + 1 logits rows, opens a verify window
//   m = accept_greedy(rows, d)                 // drafts the target agrees with
//   state->rollback(base + 1 + m)              // keeps x, d_1..d_m; closes the window
//   next x = argmax(row m)                     // the target's own token after d_m
// Every row of the verify pass equals the row of a one-at-a-time decode bit for bit, so this emits
// exactly the tokens plain greedy decoding emits, and leaves exactly its state.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"

namespace tf {

// argmax of one logits row, lowest id on ties (the sampler's greedy rule).
int32_t argmax_row(std::span<const float> row);

// Number m of drafts accepted under greedy verification: the longest prefix with
// argmax(logits row i) == drafts[i]. logits: [drafts.size() + 1, vocab], the verify rows of
// [x, d_1 .. d_j]; the token after the accepted drafts is argmax(row m).
int64_t accept_greedy(std::span<const float> logits, int64_t vocab,
                      std::span<const int32_t> drafts);

struct DraftStats {
  int64_t target_passes = 0;  // forward steps after the prompt
  int64_t verify_steps = 0;   // of which carried at least one draft
  int64_t draft_calls = 0;    // draft() calls (a call may yield no draft under the gate)
  int64_t drafted = 0;        // draft tokens proposed
  int64_t accepted = 0;       // draft tokens accepted
  int64_t emitted = 0;        // tokens returned
  double draft_seconds = 0, verify_seconds = 0;

  double acceptance_rate() const { return drafted ? double(accepted) / double(drafted) : 0.0; }
  // Mean drafts accepted per verify step.
  double mean_accepted() const {
    return verify_steps ? double(accepted) / double(verify_steps) : 0.0;
  }
  double tokens_per_pass() const {
    return target_passes ? double(emitted) / double(target_passes) : 0.0;
  }
};

// Adaptive drafting depth for one sequence: picks k for the next step (0: a plain decode step) by
// the measured cost per emitted token of each k in 0..k_max (decayed sums of seconds and tokens
// over the steps that used it), so that drafting is used only where it pays on this machine, for
// this text (acceptance varies along a reply: a copied passage, then free prose). At the start
// k = 0, 1, ... are tried once each in order while drafting looks cheaper than plain (on prose
// the sweep stops after k = 1: the deeper k cost more per step); one that looks cheaper than the
// current choice is tried until it has kMinSamples steps, and replaces it only if cheaper by
// kMargin. Every `probe_every` steps the least recently used other k up to one deeper than the
// choice is tried again, so a change is noticed (on prose only k = 1); the probe's step replaces
// what was known of that k (measured long ago: a cold start's first steps, other text, other load),
// and a probe that confirms the choice doubles the interval (up to 8x), one that changes it resets
// it. A k deeper than the choice measured (probed, or swept) at kFar times its cost per token or
// more is probed again only at the longest interval. It steers speed only: the tokens are the same
// for any k.
class DraftPolicy {
 public:
  explicit DraftPolicy(int k_max, int probe_every = 32);

  int next();
  // A step that asked for k drafts, emitted `emitted` tokens and cost `seconds` in all.
  void observe(int k, int emitted, double seconds);
  // Whether a probe is due, and the probe itself (the k next() would probe, marked as under probe
  // until observed). An engine's prior, which observes every request's steps, probes through
  // these for the requests (next_depth), since requests shorter than probe_every steps never
  // reach their own probe.
  bool probe_due() const { return n_.size() > 1 && steps_ >= next_probe_; }
  int probe();
  // The next probe `probe_every` steps from now: for a request's policy copied from the engine's
  // prior (whose probe may be due), so that every new request does not begin with one.
  void defer_probe() { next_probe_ = steps_ + probe_every_; }
  // Estimated seconds per emitted token with k drafts (0: not measured yet).
  double cost(int k) const { return tokens_[k] > 0 ? time_[k] / tokens_[k] : 0.0; }

  // kMargin 0.08 (0.03 before): a step's measured cost leaves out work that drafting adds around
  // it (on the H200, tiny-next prose at one stream: k = 1 measured 2.6% cheaper per token, the
  // replies came 3% slower), so only a clear gain switches drafting on.
  static constexpr double kMinSamples = 3, kMargin = 0.08, kDecay = 0.9;
  // kFar 1.5: for such a k to pay, its tokens per step would have to rise by half (k = 1 on prose:
  // from 1.3 to 2, every draft accepted), which the text rarely does within a probe interval; a
  // reply that turns to a copy is noticed by the prompt lookups at no cost (LookupHits). On prose a
  // fresh engine measures k = 1 at about 2x plain per token (tiny-next on an H100: 407 against
  // 210 us; on the CPU about 2.7x: the head's pass, the prompt's pending head rows and a verify row
  // of 2 tokens, for 1.3 tokens), so its probes came every 32, 64, 128 steps for nothing
  // (docs/PERFORMANCE.md, "Probes only where drafting might pay").
  static constexpr double kFar = 1.5;
  // The engine learns nothing from a request's first kWarmSteps decode steps: a prompt's step
  // leaves the decode weights out of the caches, and the first decode steps after it cost up to
  // 2-3x the later ones whatever their k (`tensorfold bench-engine --streams 1` prints a step's
  // time by its place after the prompt). Plain steps measured only there (the first sweep's)
  // looked dear for good, and a fresh engine drafted k = 1 on prose at 0.73-0.90x of plain
  // (docs/PERFORMANCE.md, "The first decode steps after a prompt are not learned from").
  static constexpr int kWarmSteps = 4;

 private:
  int best() const;
  int probe_base_, probe_every_, steps_ = 0, next_probe_;
  int probing_ = -1;                       // the k under probe, until observed
  std::vector<double> time_, tokens_, n_;  // [k_max + 1] decayed sums per k
  std::vector<int64_t> last_;              // step at which each k was last used
};

// k for a request's next step: the prior's probe when one is due (the prior pools every request's
// observations; both then observe the step), else the request's own choice. Without the prior's
// probes an engine whose first requests happened to measure plain steps dear (first-use costs)
// kept drafting on every later short request, never measuring plain steps again.
int next_depth(DraftPolicy* prior, DraftPolicy* own);

// The drafting policy's clock, in seconds: on the CPU the process's CPU time (the cost of a step
// is the work it does, which other processes' load inflates less than wall time); on a device
// wall time (the host mostly waits for the device there).
double policy_clock(const Model& model);

struct GreedyOptions {
  int max_tokens = 16;               // tokens to return, first included
  std::vector<int32_t> stop_tokens;  // returned, then generation stops
  int draft_max = 0;                 // k: drafts per step at most (0: plain decoding)
  float draft_p_min = 0.0f;          // confidence gate (DraftInput::p_min)
  bool adaptive = true;              // choose k per step with a DraftPolicy (else always k)
};

// Greedy decoding of one sequence. `state` has been fed the prompt and `first` is the argmax of
// its last logits row (returned as the first token). With draft_max > 0 the state must have been
// made with mtp = true. Returns the same tokens for any draft_max / draft_p_min.
std::vector<int32_t> greedy_decode(const Model& model, SequenceState* state, int32_t first,
                                   const GreedyOptions& o, ThreadPool* pool,
                                   DraftStats* stats = nullptr);

}  // namespace tf
