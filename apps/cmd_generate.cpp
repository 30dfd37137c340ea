// tensorfold generate: run a prompt through the model and print the generated token ids.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "model/model.h"
#include "model/mtp.h"
#include "runtime/sampler.h"

namespace tf::app {

Result<std::vector<int32_t>> parse_prompt_ids(const std::string& s, int64_t vocab) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0 || v >= vocab) {
      return Status::invalid("--prompt-ids: \"{}\" is not a token id in [0, {})", item, vocab);
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return Status::invalid("--prompt-ids: no token ids");
  return ids;
}

namespace {

struct GenerateOptions {
  std::string model = kDefaultModel;
  std::string prompt_ids;
  int max_tokens = 16;
  SamplingParams sampling;
  bool json = false;
  bool ignore_eos = false;
  std::string dump_logits;
  int threads = 0;
  int tp = 1;                  // tensor-parallel ranks (--tp)
  std::string device = "cpu";  // --device
  WeightOptions weights;       // --load-mode, --matmul-precision
  int draft = 0;               // MTP drafts per step (0: plain decoding)
  float draft_p_min = 0.0f;
  bool draft_fixed = false;
};

int run_generate(const GenerateOptions& o) {
  auto model_or = Model::load(o.model, {}, load_options(o.weights, o.device));
  if (!model_or) {
    std::fprintf(stderr, "error: %s\n", model_or.status().to_string().c_str());
    return 1;
  }
  Model& model = **model_or;
  if (!use_device(model, o.device)) return 1;
  auto ids_or = parse_prompt_ids(o.prompt_ids, model.config().vocab_size);
  if (!ids_or) {
    std::fprintf(stderr, "error: %s\n", ids_or.status().to_string().c_str());
    return 2;
  }
  const std::vector<int32_t> prompt = *ids_or;
  if (o.draft > 0) {
    if (!model.has_mtp()) {
      std::fprintf(stderr, "error: --draft: the model has no MTP head (mtp.* tensors)\n");
      return 2;
    }
    if (o.sampling.temperature != 0.0f || !o.dump_logits.empty()) {
      std::fprintf(stderr,
                   "error: --draft needs greedy decoding (--temperature 0) and no "
                   "--dump-logits\n");
      return 2;
    }
  }
  std::ofstream dump;
  if (!o.dump_logits.empty()) {
    dump.open(o.dump_logits, std::ios::binary);
    if (!dump) {
      std::fprintf(stderr, "error: cannot create %s\n", o.dump_logits.c_str());
      return 1;
    }
  }
  ThreadPool pool(o.threads);
  Sampler sampler(o.sampling);
  SequenceState state = model.new_state(nullptr, o.draft > 0);
  std::vector<float> logits;
  const int64_t V = model.config().vocab_size;
  auto write_rows = [&]() {
    if (dump)
      dump.write(reinterpret_cast<const char*>(logits.data()),
                 static_cast<std::streamsize>(logits.size() * sizeof(float)));
  };

  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  StepInput in{&state, prompt, !o.dump_logits.empty()};
  model.forward({&in, 1}, &logits, &pool);
  write_rows();
  const auto t1 = Clock::now();
  std::vector<int32_t> out;
  const auto& eos = model.config().eos_token_ids;
  DraftStats stats;
  if (o.draft > 0) {
    // Greedy with MTP drafts: the same tokens as the loop below, in fewer target passes.
    GreedyOptions g;
    g.max_tokens = o.max_tokens;
    if (!o.ignore_eos) g.stop_tokens.assign(eos.begin(), eos.end());
    g.draft_max = o.draft;
    g.draft_p_min = o.draft_p_min;
    g.adaptive = !o.draft_fixed;
    out = greedy_decode(model, &state, sampler.sample(std::span<const float>(logits).last(V)), g,
                        &pool, &stats);
  }
  while (o.draft == 0 && static_cast<int>(out.size()) < o.max_tokens) {
    const int32_t tok = sampler.sample(std::span<const float>(logits).last(V));
    out.push_back(tok);
    if (!o.ignore_eos && std::find(eos.begin(), eos.end(), tok) != eos.end()) break;
    if (static_cast<int>(out.size()) == o.max_tokens) break;
    logits.clear();
    StepInput step{&state, std::span<const int32_t>(&out.back(), 1), false};
    model.forward({&step, 1}, &logits, &pool);
    write_rows();
  }
  const auto t2 = Clock::now();
  const double prefill_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  const double decode_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
  nlohmann::json draft;
  if (o.draft > 0) {
    draft = {{"draft_max", o.draft},
             {"draft_p_min", o.draft_p_min},
             {"adaptive", !o.draft_fixed},
             {"draft_calls", stats.draft_calls},
             {"target_passes", stats.target_passes},
             {"verify_steps", stats.verify_steps},
             {"drafted", stats.drafted},
             {"accepted", stats.accepted},
             {"acceptance_rate", stats.acceptance_rate()},
             {"mean_accepted", stats.mean_accepted()},
             {"tokens_per_pass", stats.tokens_per_pass()},
             {"draft_ms", stats.draft_seconds * 1e3},
             {"verify_ms", stats.verify_seconds * 1e3}};
  }
  if (o.json) {
    nlohmann::json j = {{"tokens", out},
                        {"prompt_tokens", prompt.size()},
                        {"prefill_ms", prefill_ms},
                        {"decode_ms", decode_ms}};
    if (o.draft > 0) j["draft"] = draft;
    std::printf("%s\n", j.dump().c_str());
  } else {
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i]);
    std::printf("\n");
    std::fprintf(stderr, "prompt %zu tokens in %.1f ms; %zu tokens generated in %.1f ms\n",
                 prompt.size(), prefill_ms, out.size(), decode_ms);
    if (o.draft > 0) {
      std::fprintf(stderr,
                   "draft: %lld drafted, %lld accepted (%.1f%%), %.2f accepted per verify step, "
                   "%.2f tokens per target pass (%lld passes)\n",
                   static_cast<long long>(stats.drafted), static_cast<long long>(stats.accepted),
                   100.0 * stats.acceptance_rate(), stats.mean_accepted(), stats.tokens_per_pass(),
                   static_cast<long long>(stats.target_passes));
    }
  }
  return 0;
}

}  // namespace

void add_draft_options(CLI::App* cmd, const std::string& draft_help, int* k, float* p_min,
                       bool* fixed) {
  cmd->add_option("--draft", *k, draft_help)->capture_default_str()->check(CLI::Range(0, 64));
  cmd->add_option("--draft-p-min", *p_min,
                  "Stop drafting at a draft whose probability under the head is below this")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_flag("--draft-fixed", *fixed,
                "Always draft K tokens (else K is the most, chosen per step from the recent "
                "acceptance and the measured costs)");
}

void add_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate tokens from a prompt of token ids");
  cmd->add_option("--model", o->model, "Checkpoint directory")->capture_default_str();
  cmd->add_option("--prompt-ids", o->prompt_ids, "Comma-separated prompt token ids")->required();
  cmd->add_option("--max-tokens", o->max_tokens, "Tokens to generate")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temperature", o->sampling.temperature, "0 = greedy")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-p", o->sampling.top_p)->capture_default_str()->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--top-k", o->sampling.top_k)
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--min-p", o->sampling.min_p)->capture_default_str()->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--seed", o->sampling.seed)->capture_default_str();
  add_device_option(cmd, &o->device);
  add_load_options(cmd, &o->weights);
  cmd->add_option("--threads", o->threads, "Worker threads (0 = all cores)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  cmd->add_flag("--json", o->json, "Print one JSON object {\"tokens\": [...], ...}");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at an end-of-sequence token");
  add_draft_options(cmd,
                    "Draft up to K tokens per step with the MTP head (greedy only; 0 = off); the "
                    "output is the same as without",
                    &o->draft, &o->draft_p_min, &o->draft_fixed);
  cmd->add_option("--dump-logits", o->dump_logits,
                  "Write float32 logits, one row per position fed (prompt, then generated)");
  add_tp_option(cmd, &o->tp);
  cmd->callback([o] {
    exit_code() = run_with_tp(o->tp, o->model, &o->threads, follower_options(o->weights),
                              [o] { return run_generate(*o); });
  });
}

}  // namespace tf::app
