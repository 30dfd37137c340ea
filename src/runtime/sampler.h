// Token sampling from one row of logits: greedy at temperature 0, else temperature, top-k, top-p
// and min-p filtering and a draw from a seeded generator (same seed, same tokens).
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace tf {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy (argmax, lowest id on ties)
  int32_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  float min_p = 0.0f;        // 0 = off
  uint64_t seed = 0;
};

// argmax with the lowest index on ties.
int32_t argmax(std::span<const float> logits);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}
  int32_t sample(std::span<const float> logits);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

}  // namespace tf
