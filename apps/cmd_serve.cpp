// tensorfold serve: the OpenAI-compatible HTTP server (see src/server/server.h and the README).
#include <cstdlib>

#include <memory>
#include <string>

#include "apps/commands.h"
#include "residency/options.h"
#include "server/server.h"

namespace tf::app {

void add_serve(CLI::App& app) {
  auto o = std::make_shared<server::ServerOptions>();
  o->model_dir = kDefaultModel;
  CLI::App* cmd =
      app.add_subcommand("serve", "Serve the OpenAI API (chat and completions) over HTTP");
  cmd->add_option("--model", o->model_dir, "Checkpoint directory (with tokenizer files)")
      ->capture_default_str();
  cmd->add_option("--model-name", o->model_name,
                  "Model id for clients (default: the directory name)");
  cmd->add_option("--host", o->host, "Address to bind")->capture_default_str();
  cmd->add_option("--port", o->port)->capture_default_str()->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", o->api_key,
                  "Require 'Authorization: Bearer KEY' on /v1/* (or TENSORFOLD_API_KEY)");
  cmd->add_option("--parallel", o->parallel, "Sequences decoded at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--batch-tokens", o->batch_tokens,
                  "Tokens per engine step (prefill chunks + decode rows)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-queue", o->max_queue,
                  "Waiting requests beyond which the server answers 429")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--ctx-size", o->ctx_size, "Context length per sequence (prompt + reply)")
      ->capture_default_str()
      ->check(CLI::Range(2, 1 << 24));
  cmd->add_option("--state-cache-bytes", o->state_cache_bytes,
                  "Budget of the kept-state pool (e.g. 2GiB; 0 turns it off)")
      ->capture_default_str()
      ->transform(CLI::AsSizeValue(false));
  cmd->add_option("--draft-max", o->draft_max,
                  "MTP drafts per decode step at most (0 = off; the answers are the same either "
                  "way, see docs/PERFORMANCE.md for when it pays)")
      ->capture_default_str()
      ->check(CLI::Range(0, 16));
  cmd->add_option("--draft-p-min", o->draft_p_min,
                  "Stop drafting before a draft whose MTP-head probability is below this")
      ->capture_default_str()
      ->check(CLI::Range(0.0f, 1.0f));
  cmd->add_flag_callback(
      "--draft-fixed", [o] { o->draft_adaptive = false; },
      "Always draft --draft-max tokens (default: adapt the depth per request to measured speed)");
  cmd->add_option("--draft-max-streams", o->draft_max_streams,
                  "Draft only in steps where at most this many requests decode (0 = any number; "
                  "a batch already gains what drafting would)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--draft-lookup", o->draft_lookup,
                  "With --draft-max: up to this many prompt-lookup drafts per step where the "
                  "reply repeats its context (0 = off)")
      ->capture_default_str()
      ->check(CLI::Range(0, 32));
  cmd->add_option_function<std::string>(
         "--chain", [o](const std::string& v) { o->chain = v == "on"; },
         "With --device cuda: launch a greedy decode step before the host has read the step "
         "before's tokens, its token ids copied on the device (the same tokens; no gain measured "
         "on an H100, docs/PERFORMANCE.md): on or off [default: off]")
      ->check(CLI::IsMember({"on", "off"}));
  auto no_draft = std::make_shared<bool>(false);
  cmd->add_flag_callback(
      "--no-draft", [no_draft] { *no_draft = true; },
      "Turn MTP drafting off whatever --draft-max says");
  add_device_option(cmd, &o->device);
  static WeightOptions weights;  // static: written after add_serve returns, like tp
  add_load_options(cmd, &weights);
  cmd->add_option("--threads", o->threads, "Model worker threads (0 = all cores)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  // --tp N (apps/tp_run.cpp). Static: CLI11 writes it after add_serve returns, like o.
  static int tp = 1;
  add_tp_option(cmd, &tp);
  cmd->add_option("--http-threads", o->http_threads, "Connections served at once")
      ->capture_default_str()
      ->check(CLI::Range(4, 4096));
  cmd->add_option("--max-body-bytes", o->max_body_bytes, "Larger request bodies get 413")
      ->capture_default_str();
  cmd->add_option("--enable-thinking", o->enable_thinking,
                  "Default of chat_template_kwargs.enable_thinking")
      ->capture_default_str();
  cmd->add_option("--reasoning-format", o->reasoning_format,
                  "parsed: <think> text goes to reasoning_content; inline: left in content")
      ->capture_default_str()
      ->check(CLI::IsMember({"parsed", "inline"}));
  cmd->add_option("--keepalive-ms", o->keepalive_ms, "SSE keep-alive comment interval")
      ->capture_default_str()
      ->check(CLI::Range(50, 600000));
  cmd->add_option(
         "--log-format",
         [o](const std::vector<std::string>& v) {
           o->log_json = v.at(0) == "json";
           return true;
         },
         "text or json")
      ->check(CLI::IsMember({"text", "json"}));
  // Residency (../shared/design/residency.md).
  cmd->add_flag_callback(
      "--no-residency", [o] { o->residency = false; },
      "Do not hold the engine's buffers resident (or TENSORFOLD_NO_RESIDENCY=1)");
  cmd->add_option_function<std::string>(
         "--residency-limit",
         [o](const std::string& v) {
           o->residency_budget =
               residency::parse_budget(v, residency::physical_memory_bytes()).value();
         },
         "Residency budget: bytes (e.g. 12G) or percent of RAM (e.g. 70%) [default: 70%]")
      ->check([](const std::string& v) -> std::string {
        auto b = residency::parse_budget(v, residency::physical_memory_bytes());
        if (!b) return b.status().message();
        return *b == 0 ? "the residency limit must be more than 0 bytes" : "";
      });
  cmd->add_option(
         "--residency-device-limit", o->residency_device_budget,
         "With --device cuda: the device memory the resident set may count, in bytes (e.g. 100G) "
         "or percent of the device (e.g. 90%) [default: 100%]")
      ->check([](const std::string& v) -> std::string {
        auto b = residency::parse_budget(v, size_t{1} << 40);  // syntax; the device's size later
        if (!b) return b.status().message();
        return *b == 0 ? "the residency device limit must be more than 0 bytes" : "";
      });
  auto duration = [](int64_t* ms) {
    return [ms](const std::string& v) { *ms = residency::parse_duration(v).value().count(); };
  };
  auto positive_duration = [](const std::string& v) -> std::string {
    auto d = residency::parse_duration(v);
    if (!d) return d.status().message();
    return d->count() <= 0 ? "the duration must be at least 1 ms" : "";
  };
  cmd->add_option_function<std::string>(
         "--residency-tick", duration(&o->residency_tick_ms),
         "Keepalive tick period while idle (e.g. 1s, 250ms) [default: 1s]")
      ->check(positive_duration);
  cmd->add_option_function<std::string>(
         "--keep-warm", duration(&o->keep_warm_ms),
         "Ticks go on this long after the last request (e.g. 10m, 0 = never) "
         "[default: 10m]")
      ->check([](const std::string& v) -> std::string {
        auto d = residency::parse_duration(v);
        return d ? "" : d.status().message();
      });
  cmd->add_option_function<std::string>(
         "--residency-touch",
         [o](const std::string& v) { o->residency_touch = residency::parse_bytes(v).value(); },
         "Bytes of the held set each idle tick reads, so pages reclaimed outside this kernel (a "
         "virtual machine's host) come back in the tick, not in a request; e.g. 256M [default: 0, "
         "none]")
      ->check([](const std::string& v) -> std::string {
        auto b = residency::parse_bytes(v);
        return b ? "" : b.status().message();
      });
  cmd->callback([o, no_draft] {
    if (*no_draft) o->draft_max = 0;
    o->load = load_options(weights, o->device);
    if (o->api_key.empty()) {
      if (const char* k = std::getenv("TENSORFOLD_API_KEY")) o->api_key = k;
    }
    if (const char* v = std::getenv("TENSORFOLD_NO_RESIDENCY"); v && *v && std::string(v) != "0")
      o->residency = false;
    // Rank 0 serves; under --tp N the other ranks follow its engine (apps/tp_run.cpp).
    exit_code() = run_with_tp(tp, o->model_dir, &o->threads, follower_options(weights),
                              [o] { return server::run_server(*o); });
  });
}

}  // namespace tf::app
