// tensorfold bench: prefill and decode tokens/s of a checkpoint, and decode bytes per token against
// this machine's measured memory read bandwidth (the roofline). With --draft K, greedy decoding
// with MTP drafts too: its tokens/s against plain decoding of the same prompt, acceptance, and a
// check that both produced the same tokens.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "model/model.h"
#include "model/mtp.h"
#include "runtime/sampler.h"

namespace tf::app {
namespace {

struct BenchOptions {
  std::string model = kDefaultModel;
  WeightOptions weights;  // --load-mode, --matmul-precision
  int prompt_len = 128;
  int gen = 32;
  int reps = 3;
  int threads = 0;
  int tp = 1;  // tensor-parallel ranks (--tp)
  double bandwidth_gib = 2.0;
  bool json = false;
  std::string prompt_ids;  // else a random prompt of prompt_len
  int draft = 0;
  float draft_p_min = 0.0f;
  bool draft_fixed = false;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU seconds used by the process (all threads): on a shared machine, a measure of the work done
// that the other processes' load does not inflate as much as wall time.
double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
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
  auto model_or = Model::load(o.model, {}, load_options(o.weights, "cpu"));
  if (!model_or) {
    std::fprintf(stderr, "error: %s\n", model_or.status().to_string().c_str());
    return 1;
  }
  Model& model = **model_or;
  ThreadPool pool(o.threads);
  const int64_t V = model.config().vocab_size;
  std::vector<int32_t> prompt(o.prompt_len);
  if (o.prompt_ids.empty()) {
    std::mt19937 rng(1234);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % V);
  } else {
    auto ids = parse_prompt_ids(o.prompt_ids, V);
    if (!ids) {
      std::fprintf(stderr, "error: %s\n", ids.status().to_string().c_str());
      return 2;
    }
    prompt = *ids;
  }
  if (o.draft > 0 && !model.has_mtp()) {
    std::fprintf(stderr, "error: --draft: %s has no MTP head (mtp.* tensors)\n", o.model.c_str());
    return 2;
  }
  const int prompt_len = static_cast<int>(prompt.size());

  // Drafted (in the same reps, so both see the same machine load): the same greedy tokens
  // (first + gen) from a state that keeps the MTP head's cache.
  double best_drafted = 1e30, best_drafted_cpu = 1e30;
  DraftStats stats;
  bool identical = true;
  double best_prefill = 1e30, best_decode = 1e30, best_decode_cpu = 1e30;
  std::vector<float> logits;
  std::vector<int32_t> plain_tokens;
  for (int rep = 0; rep < o.reps; ++rep) {
    SequenceState st = model.new_state();
    logits.clear();
    auto t0 = std::chrono::steady_clock::now();
    StepInput in{&st, prompt, false};
    model.forward({&in, 1}, &logits, &pool);
    best_prefill = std::min(best_prefill, seconds_since(t0));
    int32_t tok = argmax(logits);
    plain_tokens.assign(1, tok);
    t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds();
    for (int i = 0; i < o.gen; ++i) {
      logits.clear();
      StepInput step{&st, std::span<const int32_t>(&tok, 1), false};
      model.forward({&step, 1}, &logits, &pool);
      tok = argmax(logits);
      plain_tokens.push_back(tok);
    }
    best_decode = std::min(best_decode, seconds_since(t0));
    best_decode_cpu = std::min(best_decode_cpu, cpu_seconds() - c0);
    if (o.draft > 0) {
      SequenceState ds = model.new_state(nullptr, true);
      logits.clear();
      StepInput dp{&ds, prompt, false};
      model.forward({&dp, 1}, &logits, &pool);
      GreedyOptions g;
      g.max_tokens = o.gen + 1;
      g.draft_max = o.draft;
      g.draft_p_min = o.draft_p_min;
      g.adaptive = !o.draft_fixed;
      stats = DraftStats{};
      const auto d0 = std::chrono::steady_clock::now();
      const double dc0 = cpu_seconds();
      const auto toks = greedy_decode(model, &ds, argmax(logits), g, &pool, &stats);
      best_drafted = std::min(best_drafted, seconds_since(d0));
      best_drafted_cpu = std::min(best_drafted_cpu, cpu_seconds() - dc0);
      identical = identical && toks == plain_tokens;
    }
  }
  const double bw = measure_bandwidth(pool, o.bandwidth_gib);
  const double prefill_tps = prompt_len / best_prefill;
  const double decode_tps = o.gen / best_decode;
  const double bytes = model.decode_bytes_per_token();
  const double ceiling = bw / bytes;
  nlohmann::json j = {{"model", o.model},
                      {"threads", pool.size()},
                      {"load_mode", o.weights.mode},
                      {"matmul_precision", o.weights.precision},
                      {"prompt_len", prompt_len},
                      {"gen", o.gen},
                      {"prefill_tok_s", prefill_tps},
                      {"decode_tok_s", decode_tps},
                      {"decode_tok_per_cpu_s", o.gen / best_decode_cpu},
                      {"decode_bytes_per_token", bytes},
                      {"bandwidth_gb_s", bw / 1e9},
                      {"decode_ceiling_tok_s", ceiling},
                      {"decode_roofline_pct", 100.0 * decode_tps / ceiling}};
  const double drafted_tps = o.gen / best_drafted;
  if (o.draft > 0) {
    j["draft"] = {
        {"draft_max", o.draft},
        {"draft_p_min", o.draft_p_min},
        {"adaptive", !o.draft_fixed},
        {"decode_tok_s", drafted_tps},
        {"speedup", drafted_tps / decode_tps},
        {"decode_tok_per_cpu_s", o.gen / best_drafted_cpu},
        {"speedup_cpu", best_decode_cpu / best_drafted_cpu},
        {"identical_to_plain", identical},
        {"target_passes", stats.target_passes},
        {"draft_calls", stats.draft_calls},
        {"drafted", stats.drafted},
        {"accepted", stats.accepted},
        {"acceptance_rate", stats.acceptance_rate()},
        {"mean_accepted", stats.mean_accepted()},
        {"tokens_per_pass", stats.tokens_per_pass()},
        {"draft_share", stats.draft_seconds / (stats.draft_seconds + stats.verify_seconds)}};
  }
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("model            %s (%d threads, load mode %s, %s products)\n", o.model.c_str(),
                pool.size(), o.weights.mode.c_str(), o.weights.precision.c_str());
    std::printf("prefill          %.1f tok/s (%d tokens, best of %d)\n", prefill_tps, prompt_len,
                o.reps);
    std::printf("decode           %.2f tok/s (%d tokens, best of %d); %.2f tok per CPU second\n",
                decode_tps, o.gen, o.reps, o.gen / best_decode_cpu);
    std::printf("bytes/token      %.3f MB (weights read per decoded token)\n", bytes / 1e6);
    std::printf("read bandwidth   %.1f GB/s (measured, %.1f GiB buffer)\n", bw / 1e9,
                o.bandwidth_gib);
    std::printf("decode roofline  %.1f%% of %.2f tok/s\n", 100.0 * decode_tps / ceiling, ceiling);
    if (o.draft > 0) {
      std::printf(
          "drafted decode   %.2f tok/s (k %d, p_min %.2f): %.2fx plain; %.2f tok per CPU "
          "second: %.2fx plain; %s\n",
          drafted_tps, o.draft, o.draft_p_min, drafted_tps / decode_tps, o.gen / best_drafted_cpu,
          best_decode_cpu / best_drafted_cpu, identical ? "same tokens" : "TOKENS DIFFER");
      std::printf(
          "acceptance       %lld of %lld drafts (%.1f%%), %.2f per verify step, %.2f "
          "tokens per target pass\n",
          static_cast<long long>(stats.accepted), static_cast<long long>(stats.drafted),
          100.0 * stats.acceptance_rate(), stats.mean_accepted(), stats.tokens_per_pass());
    }
  }
  if (!identical) {
    std::fprintf(stderr, "error: drafted decoding produced other tokens than plain decoding\n");
    return 1;
  }
  return 0;
}

}  // namespace

void add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd =
      app.add_subcommand("bench", "Measure prefill/decode speed and the decode roofline");
  cmd->add_option("--model", o->model, "Checkpoint directory")->capture_default_str();
  add_load_options(cmd, &o->weights);
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
  cmd->add_option("--prompt-ids", o->prompt_ids,
                  "Comma-separated prompt token ids (default: --prompt-len random ids)");
  add_draft_options(cmd,
                    "Also decode greedily with up to K MTP drafts per step and compare (0 = off)",
                    &o->draft, &o->draft_p_min, &o->draft_fixed);
  cmd->add_flag("--json", o->json);
  add_tp_option(cmd, &o->tp);
  cmd->callback([o] {
    exit_code() = run_with_tp(o->tp, o->model, &o->threads, follower_options(o->weights),
                              [o] { return run_bench(*o); });
  });
}

}  // namespace tf::app
