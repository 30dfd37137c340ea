// The scheduler: which sequences run in the next engine step, and which of their tokens. It owns
// ids and counters only (no tensors), so it is tested as a simulation without a model.
//
// Each step is ONE batched forward over a mix of decode rows (one token per decoding sequence) and
// prefill chunks (prompt pieces within the per-step token budget). Admission is FIFO from a bounded
// queue into at most max_running sequences. Prefill chunks end at absolute multiples of
// kPrefillAlign (the delta rule's chunk size) or at the prompt's end, so a prompt split over steps
// computes exactly what one prefill computes (determinism contract).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

namespace tf {

struct SchedulerOptions {
  int max_running = 4;     // sequences admitted at once (--parallel)
  int batch_tokens = 512;  // tokens per step, decode rows included (--batch-tokens)
  int max_queue = 64;      // waiting requests beyond which submit is refused (HTTP 429)
  int prefill_align = 64;  // prefill chunks end at multiples of this
};

struct StepRow {
  uint64_t seq = 0;
  int64_t begin = 0;     // first position fed (n_past of the sequence)
  int64_t count = 0;     // tokens fed
  bool decode = false;   // a decode row (one generated token) rather than a prompt chunk
  bool samples = false;  // this row's last token yields a token to sample (prompt end or decode)
  // Decode rows only: MTP drafts this row may carry (0: a plain decode row). The budget counts
  // the whole verify pass, count = 1 + draft; the engine feeds 1 + j tokens (j <= draft drafts
  // pass its gate) and reports the accepted length to commit() through count.
  int draft = 0;
};

struct StepPlan {
  std::vector<StepRow> rows;
  int64_t tokens() const {
    int64_t n = 0;
    for (const auto& r : rows) n += r.count;
    return n;
  }
  bool empty() const { return rows.empty(); }
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerOptions& o) : o_(o) {}

  // Queues a request whose prompt still needs `n_prefill` tokens fed, starting at position
  // `n_past`. `cuts` are positions (multiples of prefill_align) where a prefill chunk must end, so
  // that the engine can keep a snapshot of the state there. False (nothing queued) when every slot
  // is taken and max_queue requests already wait. An `internal` sequence (the engine's own work,
  // e.g. extending a kept state) counts against no capacity.
  bool enqueue(uint64_t seq, int64_t n_past, int64_t n_prefill, std::vector<int64_t> cuts = {},
               bool internal = false);
  // Forgets a sequence wherever it is (waiting or running). Unknown ids are ignored.
  void cancel(uint64_t seq);

  // Plans the next step: admit() then plan().
  StepPlan schedule() {
    admit();
    return plan();
  }
  // Admits waiting sequences FIFO into free slots; returns their ids, in order.
  std::vector<uint64_t> admit();
  // Moves an admitted sequence that has not run yet to position n_past (it resumes from a kept
  // state there); n_past must be a cut-free point before the prompt's end.
  void resume(uint64_t seq, int64_t n_past);
  // Drafts a decoding sequence wants in its next decode rows (0: none); plan() grants fewer when
  // the step's budget is short. Unknown ids are ignored.
  void set_draft(uint64_t seq, int draft);
  // One decode row per decoding sequence (in admission order, each with the drafts it wants, as
  // far as the budget goes), then prefill chunks FIFO within the remaining budget, each ending at
  // an aligned position, a cut or the prompt's end.
  StepPlan plan() const;
  // Records that the plan ran: advances each sequence by its row's count (for a decode row with
  // drafts: 1 + the drafts accepted, which the engine writes into the row), moves sequences whose
  // prompt is done to decoding. Call finish() for sequences that ended in this step (stop, length,
  // cancel).
  void commit(const StepPlan& plan);
  void finish(uint64_t seq) { cancel(seq); }

  size_t waiting() const { return waiting_.size(); }
  size_t running() const { return running_.size(); }
  // Internal sequences among waiting() / running().
  size_t waiting_internal() const;
  size_t running_internal() const;
  bool is_running(uint64_t seq) const;
  const SchedulerOptions& options() const { return o_; }

 private:
  struct Seq {
    uint64_t id;
    int64_t n_past;             // positions already in the sequence's state
    int64_t prompt_end;         // position after the last prompt token
    std::vector<int64_t> cuts;  // ascending
    bool internal = false;
    int draft = 0;  // drafts wanted per decode row (set_draft)
    bool decoding() const { return n_past >= prompt_end; }
    int64_t next_cut() const;  // first cut after n_past, or prompt_end
  };
  size_t counted() const;  // sequences that count against the capacity
  SchedulerOptions o_;
  std::deque<Seq> waiting_;
  std::vector<Seq> running_;  // admission order
};

}  // namespace tf
