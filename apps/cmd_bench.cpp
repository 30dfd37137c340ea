// tensorfold bench: prefill and decode tokens/s of a checkpoint, and decode bytes per token against
// this machine's measured memory read bandwidth (the roofline).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "model/model.h"
#include "runtime/sampler.h"

namespace tf::app {
namespace {

struct BenchOptions {
  std::string model = kDefaultModel;
  int prompt_len = 128;
  int gen = 32;
  int reps = 3;
  int threads = 0;
  double bandwidth_gib = 2.0;
  bool json = false;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Best-of-5 read bandwidth (bytes/s) over a buffer of `gib` GiB summed by every pool thread.
double measure_bandwidth(ThreadPool& pool, double gib) {
  const size_t n = static_cast<size_t>(gib * (1 << 30)) / sizeof(uint64_t);
  std::unique_ptr<uint64_t[]> buf(new uint64_t[n]);
  pool.parallel_for(static_cast<int64_t>(n), 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) buf[i] = static_cast<uint64_t>(i);
  });
  std::vector<uint64_t> sums(pool.size() * 8);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(static_cast<int64_t>(n), 1 << 16, [&](int64_t b, int64_t e) {
      uint64_t s = 0;
      for (int64_t i = b; i < e; ++i) s += buf[i];
      sums[(b * 8 / std::max<int64_t>(1, n)) % sums.size()] += s;  // keep the loop alive
    });
    best = std::max(best, static_cast<double>(n * sizeof(uint64_t)) / seconds_since(t0));
  }
  return best;
}

int run_bench(const BenchOptions& o) {
  auto model_or = Model::load(o.model);
  if (!model_or) {
    std::fprintf(stderr, "error: %s\n", model_or.status().to_string().c_str());
    return 1;
  }
  Model& model = **model_or;
  ThreadPool pool(o.threads);
  const int64_t V = model.config().vocab_size;
  std::mt19937 rng(1234);
  std::vector<int32_t> prompt(o.prompt_len);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % V);

  double best_prefill = 1e30, best_decode = 1e30;
  std::vector<float> logits;
  for (int rep = 0; rep < o.reps; ++rep) {
    SequenceState st = model.new_state();
    logits.clear();
    auto t0 = std::chrono::steady_clock::now();
    StepInput in{&st, prompt, false};
    model.forward({&in, 1}, &logits, &pool);
    best_prefill = std::min(best_prefill, seconds_since(t0));
    int32_t tok = argmax(logits);
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.gen; ++i) {
      logits.clear();
      StepInput step{&st, std::span<const int32_t>(&tok, 1), false};
      model.forward({&step, 1}, &logits, &pool);
      tok = argmax(logits);
    }
    best_decode = std::min(best_decode, seconds_since(t0));
  }
  const double bw = measure_bandwidth(pool, o.bandwidth_gib);
  const double prefill_tps = o.prompt_len / best_prefill;
  const double decode_tps = o.gen / best_decode;
  const double bytes = model.decode_bytes_per_token();
  const double ceiling = bw / bytes;
  nlohmann::json j = {{"model", o.model},
                      {"threads", pool.size()},
                      {"prompt_len", o.prompt_len},
                      {"gen", o.gen},
                      {"prefill_tok_s", prefill_tps},
                      {"decode_tok_s", decode_tps},
                      {"decode_bytes_per_token", bytes},
                      {"bandwidth_gb_s", bw / 1e9},
                      {"decode_ceiling_tok_s", ceiling},
                      {"decode_roofline_pct", 100.0 * decode_tps / ceiling}};
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("model            %s (%d threads)\n", o.model.c_str(), pool.size());
    std::printf("prefill          %.1f tok/s (%d tokens, best of %d)\n", prefill_tps, o.prompt_len,
                o.reps);
    std::printf("decode           %.2f tok/s (%d tokens, best of %d)\n", decode_tps, o.gen, o.reps);
    std::printf("bytes/token      %.3f MB (weights read per decoded token)\n", bytes / 1e6);
    std::printf("read bandwidth   %.1f GB/s (measured, %.1f GiB buffer)\n", bw / 1e9,
                o.bandwidth_gib);
    std::printf("decode roofline  %.1f%% of %.2f tok/s\n", 100.0 * decode_tps / ceiling, ceiling);
  }
  return 0;
}

}  // namespace

void add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd =
      app.add_subcommand("bench", "Measure prefill/decode speed and the decode roofline");
  cmd->add_option("--model", o->model, "Checkpoint directory")->capture_default_str();
  cmd->add_option("--prompt-len", o->prompt_len)
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--gen", o->gen, "Decode steps")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--reps", o->reps)->capture_default_str()->check(CLI::Range(1, 1000));
  cmd->add_option("--threads", o->threads, "0 = all cores")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--bandwidth-gib", o->bandwidth_gib, "Buffer size of the bandwidth probe")
      ->capture_default_str()
      ->check(CLI::Range(0.0625, 64.0));
  cmd->add_flag("--json", o->json);
  cmd->callback([o] { exit_code() = run_bench(*o); });
}

}  // namespace tf::app
