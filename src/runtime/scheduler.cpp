#include "runtime/scheduler.h"

#include <algorithm>

#include "core/check.h"

namespace tf {

int64_t Scheduler::Seq::next_cut() const {
  for (int64_t c : cuts) {
    if (c > n_past && c < prompt_end) return c;
  }
  return prompt_end;
}

size_t Scheduler::waiting_internal() const {
  return static_cast<size_t>(
      std::count_if(waiting_.begin(), waiting_.end(), [](const Seq& s) { return s.internal; }));
}

size_t Scheduler::running_internal() const {
  return static_cast<size_t>(
      std::count_if(running_.begin(), running_.end(), [](const Seq& s) { return s.internal; }));
}

size_t Scheduler::counted() const {
  return running_.size() + waiting_.size() - running_internal() - waiting_internal();
}

bool Scheduler::enqueue(uint64_t seq, int64_t n_past, int64_t n_prefill, std::vector<int64_t> cuts,
                        bool internal) {
  // Room for max_running sequences plus max_queue waiting ones (a free slot is not "queued").
  const size_t capacity = static_cast<size_t>(o_.max_running) + static_cast<size_t>(o_.max_queue);
  if (!internal && counted() >= capacity) return false;
  std::sort(cuts.begin(), cuts.end());
  waiting_.push_back(Seq{seq, n_past, n_past + n_prefill, std::move(cuts), internal});
  return true;
}

void Scheduler::cancel(uint64_t seq) {
  auto pred = [seq](const Seq& s) { return s.id == seq; };
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), pred), waiting_.end());
  running_.erase(std::remove_if(running_.begin(), running_.end(), pred), running_.end());
}

bool Scheduler::is_running(uint64_t seq) const {
  return std::any_of(running_.begin(), running_.end(), [seq](const Seq& s) { return s.id == seq; });
}

std::vector<uint64_t> Scheduler::admit() {
  std::vector<uint64_t> ids;
  while (!waiting_.empty() && static_cast<int>(running_.size()) < o_.max_running) {
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    ids.push_back(running_.back().id);
  }
  return ids;
}

void Scheduler::resume(uint64_t seq, int64_t n_past) {
  for (Seq& s : running_) {
    if (s.id != seq) continue;
    TF_CHECK(n_past >= s.n_past && n_past < s.prompt_end, "resume seq {} at {} (n_past {}, end {})",
             seq, n_past, s.n_past, s.prompt_end);
    s.n_past = n_past;
  }
}

void Scheduler::set_draft(uint64_t seq, int draft) {
  for (Seq& s : running_) {
    if (s.id == seq) s.draft = std::max(draft, 0);
  }
}

StepPlan Scheduler::plan() const {
  StepPlan plan;
  int64_t budget = o_.batch_tokens;
  // Decode rows first: a long prompt never stalls the streams that are decoding. Every decoding
  // sequence gets its one token before any gets drafts, so drafts never starve a stream.
  for (const Seq& s : running_) {
    if (s.decoding() && budget > 0) {
      plan.rows.push_back(StepRow{s.id, s.n_past, 1, true, true});
      --budget;
    }
  }
  for (StepRow& r : plan.rows) {
    for (const Seq& s : running_) {
      if (s.id != r.seq || s.draft == 0) continue;
      r.draft = static_cast<int>(std::min<int64_t>(s.draft, budget));
      r.count += r.draft;
      budget -= r.draft;
    }
  }
  for (const Seq& s : running_) {
    if (s.decoding() || budget <= 0) continue;
    const int64_t left = s.next_cut() - s.n_past;
    int64_t n = std::min(left, budget);
    if (n < left) {
      // Cut at the last alignment boundary inside the budget; if there is none, wait for a step
      // with more room (unless nothing else runs, then take up to the next boundary).
      const int64_t end = ((s.n_past + n) / o_.prefill_align) * o_.prefill_align;
      n = end - s.n_past;
      if (n <= 0) {
        if (!plan.rows.empty()) continue;
        n = std::min(left, o_.prefill_align - s.n_past % o_.prefill_align);
      }
    }
    plan.rows.push_back(StepRow{s.id, s.n_past, n, false, s.n_past + n == s.prompt_end});
    budget -= n;
  }
  return plan;
}

void Scheduler::commit(const StepPlan& plan) {
  for (const StepRow& r : plan.rows) {
    for (Seq& s : running_) {
      if (s.id == r.seq) s.n_past += r.count;
    }
  }
}

}  // namespace tf
