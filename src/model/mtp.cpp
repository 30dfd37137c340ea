#include "model/mtp.h"

#include <algorithm>
#include <chrono>
#include <ctime>

#include "backends/cpu/ops.h"
#include "core/check.h"

namespace tf {

int32_t argmax_row(std::span<const float> row) {
  return static_cast<int32_t>(cpu::argmax(row.data(), static_cast<int64_t>(row.size())));
}

int64_t accept_greedy(std::span<const float> logits, int64_t vocab,
                      std::span<const int32_t> drafts) {
  const int64_t j = static_cast<int64_t>(drafts.size());
  TF_CHECK(static_cast<int64_t>(logits.size()) == (j + 1) * vocab, "{} logits for {} drafts",
           logits.size(), j);
  int64_t m = 0;
  while (m < j && argmax_row(logits.subspan(m * vocab, vocab)) == drafts[m]) ++m;
  return m;
}

DraftPolicy::DraftPolicy(int k_max, int probe_every)
    : probe_base_(probe_every),
      probe_every_(probe_every),
      next_probe_(probe_every),
      time_(std::max(k_max, 0) + 1, 0.0),
      tokens_(time_.size(), 0.0),
      n_(time_.size(), 0.0),
      last_(time_.size(), -1) {}

int DraftPolicy::best() const {
  int b = 0;
  for (int k = 1; k < static_cast<int>(n_.size()); ++k) {
    if (n_[k] >= kMinSamples * kDecay * kDecay && cost(k) < (1 - kMargin) * cost(b)) b = k;
  }
  return b;
}

int DraftPolicy::next() {
  const int n = static_cast<int>(n_.size());
  for (int k = 0; k < n; ++k) {
    if (n_[k] > 0) continue;
    // Not measured yet: the first sweep goes up only while drafting looked cheaper than plain
    // (a k that did not is rarely beaten by a deeper one, which costs more per step); the
    // deeper k are left to the probes.
    if (k >= 2 && !(cost(k - 1) < cost(0))) break;
    return k;
  }
  const int b = best();
  for (int k = 0; k < n; ++k) {  // looks cheaper, too few steps to tell: try it again
    if (k != b && n_[k] > 0 && n_[k] < kMinSamples * kDecay * kDecay && cost(k) < cost(b)) return k;
  }
  return probe_due() ? probe() : b;
}

int DraftPolicy::probe() {
  TF_CHECK(n_.size() > 1, "probe(): no k to probe");
  const int b = best();
  // The least recently used other k up to b + 1: a k deeper than one that does not pay is not
  // probed. Each draft costs another head pass and is accepted less often than the one before it,
  // so the acceptance a k needs to break even grows with k (tiny-next on an H100: a = 0.49 for
  // k = 1, 0.53, 0.58; the 80B shape 0.65, 0.75, 0.81; tiny-next on the CPU: k = 1 does not pay at
  // 97%, k = 3 less so). On prose the probes of k = 2 and 3 were the dearest rows a fresh engine
  // paid for; the probes climb one k at a time once k = 1 pays.
  const int deepest = std::min(b + 1, static_cast<int>(n_.size()) - 1);
  int stale = b == 0 ? 1 : 0;
  for (int k = 0; k <= deepest; ++k) {
    if (k != b && last_[k] < last_[stale]) stale = k;
  }
  probing_ = stale;
  next_probe_ = steps_ + probe_every_;  // not due again before it is observed
  return stale;
}

void DraftPolicy::observe(int k, int emitted, double seconds) {
  const int before = best();
  const bool probed = k == probing_, swept = n_[k] == 0;  // swept: the first sweep's step of k
  last_[k] = steps_++;
  const double keep = probed ? 0.0 : kDecay;  // a probe replaces the old measurement
  time_[k] = keep * time_[k] + seconds;
  tokens_[k] = keep * tokens_[k] + std::max(emitted, 1);
  n_[k] = keep * n_[k] + 1;
  if (!probed && !swept) return;
  if (probed) probing_ = -1;
  const int b = best();
  // Only a deeper k: a plain step measured dear while drafting pays is re-checked at the usual
  // intervals, so that a noisy or stale measurement of plain does not keep a request drafting.
  if (k > b && n_[b] > 0 && cost(k) >= kFar * cost(b)) {
    probe_every_ = 8 * probe_base_;
  } else if (probed) {
    probe_every_ = b == before ? std::min(2 * probe_every_, 8 * probe_base_) : probe_base_;
  } else {
    return;  // a sweep's step that is not far dearer leaves the probes' schedule as it was
  }
  next_probe_ = steps_ + probe_every_;
}

int next_depth(DraftPolicy* prior, DraftPolicy* own) {
  return prior->probe_due() ? prior->probe() : own->next();
}

double policy_clock(const Model& model) {
  if (model.on_device())
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

std::vector<int32_t> greedy_decode(const Model& model, SequenceState* state, int32_t first,
                                   const GreedyOptions& o, ThreadPool* pool, DraftStats* stats) {
  using Clock = std::chrono::steady_clock;
  auto secs = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  DraftStats local;
  DraftStats& st = stats ? *stats : local;
  const int64_t V = model.config().vocab_size;
  std::vector<int32_t> out;
  std::vector<int32_t> feed;
  std::vector<float> logits;
  Draft d;
  // Appends t; true when generation is over.
  auto emit = [&](int32_t t) {
    out.push_back(t);
    ++st.emitted;
    return static_cast<int>(out.size()) >= o.max_tokens ||
           std::find(o.stop_tokens.begin(), o.stop_tokens.end(), t) != o.stop_tokens.end();
  };
  DraftPolicy policy(o.draft_max);
  int steps = 0;  // decode steps so far: the first kWarmSteps are not learned from
  auto learn = [&](int k, int emitted, double seconds) {
    if (++steps > DraftPolicy::kWarmSteps) policy.observe(k, emitted, seconds);
  };
  int32_t tok = first;
  while (!emit(tok)) {
    const double c0 = policy_clock(model);
    d.tokens.clear();
    const int room = o.max_tokens - static_cast<int>(out.size());  // tokens still wanted, >= 1
    // More drafts than tokens still wanted would be wasted: at most room - 1 (+ the bonus).
    const int k = std::min(o.adaptive ? policy.next() : o.draft_max, room - 1);
    double draft_s = 0;
    if (k > 0) {
      const auto t0 = Clock::now();
      const DraftInput in{state, tok, k, o.draft_p_min};
      model.draft({&in, 1}, {&d, 1}, pool);
      draft_s = secs(t0);
      st.draft_seconds += draft_s;
      ++st.draft_calls;
    }
    feed.assign(1, tok);
    feed.insert(feed.end(), d.tokens.begin(), d.tokens.end());
    const int64_t base = state->n_past;
    const bool verify = !d.tokens.empty();
    const auto t0 = Clock::now();
    logits.clear();
    const StepInput step{state, feed, false, verify};
    model.forward({&step, 1}, &logits, pool);
    ++st.target_passes;
    if (!verify) {
      const double s = secs(t0);
      st.verify_seconds += s;
      learn(k, 1, policy_clock(model) - c0);
      tok = argmax_row(logits);
      continue;
    }
    const int64_t m = accept_greedy(logits, V, d.tokens);
    state->rollback(base + 1 + m);
    const double s = secs(t0);
    st.verify_seconds += s;
    const int j = static_cast<int>(d.tokens.size());
    learn(k, static_cast<int>(m) + 1, policy_clock(model) - c0);
    ++st.verify_steps;
    st.drafted += j;
    st.accepted += m;
    bool done = false;
    for (int64_t i = 0; i < m && !done; ++i) done = emit(d.tokens[i]);
    if (done) break;
    tok = argmax_row(std::span<const float>(logits).subspan(m * V, V));
  }
  return out;
}

}  // namespace tf
