// Token sampling from one row of logits: greedy at temperature 0, else temperature, top-k, top-p
// and min-p filtering and a draw from a seeded generator (same seed, same tokens).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

namespace tf {

struct SamplingParams {
  float temperature = 0.0f;       // 0 = greedy (argmax, lowest id on ties)
  int32_t top_k = 0;              // 0 = off
  float top_p = 1.0f;             // 1 = off
  float min_p = 0.0f;             // 0 = off
  float presence_penalty = 0.0f;  // subtracted once from the logit of every token already generated
  float frequency_penalty = 0.0f;  // subtracted per occurrence of a token already generated
  uint64_t seed = 0;
};

// argmax with the lowest index on ties.
int32_t argmax(std::span<const float> logits);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}
  // Picks the next token and records it for the penalties.
  int32_t sample(std::span<const float> logits);

 private:
  int32_t pick(std::span<const float> logits);
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int32_t> counts_;  // generated token -> occurrences (penalties)
  std::vector<float> adjusted_;
};

}  // namespace tf
