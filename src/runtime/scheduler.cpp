#include "runtime/scheduler.h"

#include <algorithm>

namespace tf {

bool Scheduler::enqueue(uint64_t seq, int64_t n_past, int64_t n_prefill) {
  // Room for max_running sequences plus max_queue waiting ones (a free slot is not "queued").
  const size_t capacity = static_cast<size_t>(o_.max_running) + static_cast<size_t>(o_.max_queue);
  if (running_.size() + waiting_.size() >= capacity) return false;
  waiting_.push_back(Seq{seq, n_past, n_past + n_prefill});
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

StepPlan Scheduler::schedule() {
  while (!waiting_.empty() && static_cast<int>(running_.size()) < o_.max_running) {
    running_.push_back(waiting_.front());
    waiting_.pop_front();
  }
  StepPlan plan;
  int64_t budget = o_.batch_tokens;
  // Decode rows first: a long prompt never stalls the streams that are decoding.
  for (const Seq& s : running_) {
    if (s.decoding() && budget > 0) {
      plan.rows.push_back(StepRow{s.id, s.n_past, 1, true, true});
      --budget;
    }
  }
  for (const Seq& s : running_) {
    if (s.decoding() || budget <= 0) continue;
    const int64_t left = s.prompt_end - s.n_past;
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
    plan.rows.push_back(StepRow{s.id, s.n_past, n, false, n == left});
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
