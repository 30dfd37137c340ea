// Plain against drafted decoding through the Engine, on one set of prompts: the measurement behind
// `tensorfold bench-engine --draft K` (prompts it renders with the chat template) and
// `cuda_bench --draft K` (the same prompts as token ids, bench/draft_prompts.json, on the device,
// where the tokenizer's ICU is not installed). Greedy; every prompt's reply ends at a stop token
// or at max_tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/engine.h"

namespace tf {

struct DraftCompareOptions {
  int streams = 1;       // requests decoding at once (the rest wait in the queue)
  int draft_max = 3;     // K
  bool adaptive = true;  // DraftPolicy picks k per step (else always K)
  float p_min = 0.0f;    // confidence gate
  int max_streams = 1;   // EngineOptions::draft_max_streams
  int lookup = 0;        // EngineOptions::draft_lookup
  int max_tokens = 160;  // reply cap
  int reps = 3;          // best of
  int threads = 0;       // engine worker threads (0: all cores)
  // One engine of each kind for all reps (a server's steady state: the drafting policy's prior
  // carries over from the reps before); false: a fresh engine per run (every run pays for the
  // policy's first tries).
  bool warm = false;
  // A control: the "drafted" engine plain too (draft_max 0), so that the ratio shows the
  // measurement's own spread, with nothing different between the two kinds of run.
  bool control = false;
  // EngineOptions::chain for both engines (on the device the plain engine then chains every
  // decode step, the drafting engine its plain steps where no lookup or probe is due).
  bool chain = false;
};

struct DraftComparison {
  double plain_tokens_per_s = 0, drafted_tokens_per_s = 0;  // generated / wall time, best run
  // Decoding alone, per stream: the tokens after each reply's first over the time from its first
  // token to its last, summed over the replies (llama.cpp's "eval" rate against its "prompt eval";
  // the prompts' prefill, the same work either way, left out). With N > 1 a stream's decode
  // steps share the batch with the others' prefill. The best of the reps.
  double plain_decode_tokens_per_s = 0, drafted_decode_tokens_per_s = 0;
  EngineStats stats;         // the best drafted run's counters
  EngineStats plain_stats;   // the best plain run's (steps and their host / model seconds)
  int64_t reply_tokens = 0;  // tokens of the drafted run's replies
  bool same_tokens = true;   // drafted replies == plain replies, in every rep
  bool control = false;      // DraftCompareOptions::control: both kinds of run were plain

  double speedup() const {
    return plain_tokens_per_s > 0 ? drafted_tokens_per_s / plain_tokens_per_s : 0;
  }
  double decode_speedup() const {
    return plain_decode_tokens_per_s > 0 ? drafted_decode_tokens_per_s / plain_decode_tokens_per_s
                                         : 0;
  }
  double acceptance() const {
    return stats.drafted_tokens ? double(stats.accepted_tokens) / double(stats.drafted_tokens) : 0;
  }
  double mean_accepted_length() const {
    return stats.draft_steps ? double(stats.accepted_tokens) / double(stats.draft_steps) : 0;
  }
};

// Runs `prompts` o.reps times plain and drafted (alternating, and which goes first alternates by
// rep), each run on a fresh engine (or, with o.warm, on one engine of each kind) with the
// kept-state pool off. tokens/s = tokens generated / wall time from the first submit to the last
// reply's last token (prefill included, the same work either way), and decoding alone.
DraftComparison compare_drafting(const Model& model,
                                 const std::vector<std::vector<int32_t>>& prompts,
                                 const std::vector<int32_t>& stops, const DraftCompareOptions& o);

// One line of the report: "copy N=4: plain .. tok/s, drafted .. tok/s (..x); ..".
std::string describe(const std::string& kind, int streams, const DraftComparison& c);
// The drafted engine's prior after the best run: "k=0 190.2 us, k=1 201.7 us, ..." (seconds per
// emitted token by drafts per step; 0: not measured).
std::string describe_costs(const DraftComparison& c);

}  // namespace tf
