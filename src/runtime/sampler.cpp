#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backends/cpu/ops.h"

namespace tf {

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(cpu::argmax(logits.data(), static_cast<int64_t>(logits.size())));
}

int32_t Sampler::sample(std::span<const float> logits) {
  int32_t tok;
  if ((p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) && !counts_.empty()) {
    // OpenAI's rule: logit -= count * frequency_penalty + (count > 0) * presence_penalty.
    adjusted_.assign(logits.begin(), logits.end());
    for (const auto& [id, n] : counts_) {
      adjusted_[id] -= static_cast<float>(n) * p_.frequency_penalty + p_.presence_penalty;
    }
    tok = pick(adjusted_);
  } else {
    tok = pick(logits);
  }
  ++counts_[tok];
  return tok;
}

int32_t Sampler::pick(std::span<const float> logits) {
  if (p_.temperature <= 0.0f) return argmax(logits);
  const int32_t V = static_cast<int32_t>(logits.size());
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  // Sort candidates by logit (descending, ties by id) so every filter sees one order.
  int32_t n = V;
  if (p_.top_k > 0 && p_.top_k < V) {
    n = p_.top_k;
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
  } else {
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
  }
  std::vector<double> p(n);
  const double m = logits[ids[0]];
  double sum = 0;
  for (int32_t i = 0; i < n; ++i) sum += (p[i] = std::exp((logits[ids[i]] - m) / p_.temperature));
  for (auto& x : p) x /= sum;
  // min-p: drop tokens below min_p times the top probability.
  if (p_.min_p > 0) {
    int32_t keep = 1;
    while (keep < n && p[keep] >= p_.min_p * p[0]) ++keep;
    n = keep;
  }
  // top-p: the smallest prefix whose mass reaches top_p.
  if (p_.top_p < 1.0f) {
    double cum = 0;
    int32_t keep = 0;
    while (keep < n) {
      cum += p[keep++];
      if (cum >= p_.top_p) break;
    }
    n = keep;
  }
  double total = 0;
  for (int32_t i = 0; i < n; ++i) total += p[i];
  const double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  double cum = 0;
  for (int32_t i = 0; i < n; ++i) {
    cum += p[i];
    if (r < cum) return ids[i];
  }
  return ids[n - 1];
}

}  // namespace tf
