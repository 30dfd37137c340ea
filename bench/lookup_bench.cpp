// Micro-benchmarks of the prompt-lookup index (src/runtime/lookup.h): what a drafting request pays
// on the host for its lookups, whether or not it drafts.
//   ./build/release/bench/lookup_bench
// Tokens: a prompt of text-like ids (Zipf-distributed over a 32k vocabulary, so that short n-grams
// repeat as in prose), fixed seed.
#include <cstdint>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

#include "runtime/lookup.h"

namespace tf {
namespace {

std::vector<int32_t> text_like(int64_t n, uint32_t seed) {
  constexpr int kVocab = 32000;
  std::vector<double> w(kVocab);
  for (int i = 0; i < kVocab; ++i) w[i] = 1.0 / (i + 1.0);
  std::discrete_distribution<int32_t> zipf(w.begin(), w.end());
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& v : t) v = zipf(rng);
  return t;
}

// A request's first lookup: its whole prompt indexed, then one lookup of 12 drafts.
void BM_FirstLookup(benchmark::State& state) {
  const std::vector<int32_t> prompt = text_like(state.range(0), 1);
  for (auto _ : state) {
    LookupIndex index;
    index.append(prompt);
    benchmark::DoNotOptimize(index.drafts(12));
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_FirstLookup)->Arg(100)->Arg(2000)->Unit(benchmark::kMicrosecond);

// A decode step's lookup after a prompt of range(0) tokens: one token appended, 12 drafts asked.
void BM_StepLookup(benchmark::State& state) {
  const std::vector<int32_t> prompt = text_like(state.range(0), 2);
  const std::vector<int32_t> reply = text_like(1 << 16, 3);
  LookupIndex index;
  index.append(prompt);
  index.drafts(12);
  size_t i = 0;
  for (auto _ : state) {
    index.append(reply[i++ % reply.size()]);
    benchmark::DoNotOptimize(index.drafts(12));
  }
}
BENCHMARK(BM_StepLookup)->Arg(100)->Arg(2000)->Unit(benchmark::kNanosecond);

}  // namespace
}  // namespace tf

BENCHMARK_MAIN();
