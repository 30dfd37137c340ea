#include "server/server.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>

#include "model/model.h"
#include "runtime/engine.h"
#include "server/openai_api.h"
#include "server/output_parser.h"
#include "server/residency_setup.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tf::server {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// ---------------------------------------------------------------------------------------------
// Metrics, in Prometheus text format.

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}
  void observe(double v) {
    size_t i = 0;
    while (i < bounds_.size() && v > bounds_[i]) ++i;
    ++counts_[i];
    sum_ += v;
    ++n_;
  }
  void write(std::string& out, const std::string& name, const std::string& help) const {
    out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
    uint64_t cum = 0;
    for (size_t i = 0; i < bounds_.size(); ++i) {
      cum += counts_[i];
      out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
    }
    out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, n_, name,
                       sum_, name, n_);
  }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t n_ = 0;
};

struct Metrics {
  std::mutex mu;
  std::map<std::pair<std::string, int>, uint64_t> requests;  // (endpoint, status) -> count
  uint64_t prompt_tokens = 0, completion_tokens = 0;
  Histogram ttft{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
  Histogram itl{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}};
};

// ---------------------------------------------------------------------------------------------
// A request's events, handed from the engine thread to the HTTP thread that waits for them.

struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<TokenEvent> events;
  void push(const TokenEvent& e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(e);
    }
    cv.notify_all();
  }
  // Waits up to `timeout` for events; returns those that arrived (maybe none).
  std::deque<TokenEvent> take(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, timeout, [&] { return !events.empty(); });
    std::deque<TokenEvent> out;
    out.swap(events);
    return out;
  }
};

// One generation in flight: prompt, engine id, text state, counters, timings.
struct Generation {
  ApiRequest api;
  std::vector<int32_t> prompt;
  uint64_t engine_id = 0;
  std::shared_ptr<Channel> channel = std::make_shared<Channel>();
  std::unique_ptr<tok::StreamDecoder> decoder;
  std::unique_ptr<OutputParser> parser;
  std::string id;       // "chatcmpl-..." / "cmpl-..."
  int64_t created = 0;  // unix seconds
  int64_t n_generated = 0, n_cached = 0;
  int64_t keep_prefix = 0;  // the system turn's tokens (a kept-state point), 0: none
  std::string finish_reason;
  bool done = false;
  Clock::time_point start, first_token, last_token;
};

std::string finish_name(FinishReason r) {
  return r == FinishReason::kLength ? "length" : "stop";
}

class Service {
 public:
  explicit Service(const ServerOptions& o) : o_(o) {
    if (o_.model_name.empty()) {
      o_.model_name = std::filesystem::path(o_.model_dir).lexically_normal().filename().string();
      if (o_.model_name.empty())
        o_.model_name = std::filesystem::path(o_.model_dir).parent_path().filename().string();
    }
  }

  // Loads the model, tokenizer and chat template; false (with a message logged) on failure.
  bool load() {
    const auto t0 = Clock::now();
    // A progress bar on a terminal; plain log lines (start, done) otherwise.
    const bool tty = isatty(STDERR_FILENO) != 0;
    int last_pct = -1;
    auto model = Model::load(
        o_.model_dir,
        [&](size_t done, size_t total) {
          const int pct = total ? static_cast<int>(100 * done / total) : 100;
          if (!tty || pct == last_pct) return;
          last_pct = pct;
          std::fprintf(stderr, "\rloading %s [%-40s] %3d%%%s", o_.model_name.c_str(),
                       std::string(static_cast<size_t>(pct * 40 / 100), '#').c_str(), pct,
                       done == total ? "\n" : "");
        },
        o_.load);
    if (tty && last_pct >= 0 && last_pct < 100) std::fprintf(stderr, "\n");
    if (!model) return fail(model.status());
    auto tokenizer = tok::Tokenizer::load(o_.model_dir);
    if (!tokenizer) return fail(tokenizer.status());
    auto tmpl = tok::ChatTemplate::load(o_.model_dir);
    if (!tmpl) return fail(tmpl.status());
    model_ = std::move(*model);
    if (o_.device == "cuda") {
      if (Status st = model_->use_cuda(); !st.is_ok()) return fail(st);
      spdlog::info("device: cuda (weights and sequence states on the GPU)");
    }
    tokenizer_ = std::make_unique<tok::Tokenizer>(std::move(*tokenizer));
    template_ = std::make_unique<tok::ChatTemplate>(std::move(*tmpl));
    // End-of-generation tokens: the config's eos ids, the template's eos token, <|im_end|> and
    // <|endoftext|> when the vocabulary has them.
    std::vector<int32_t> stops;
    for (int64_t id : model_->config().eos_token_ids) stops.push_back(static_cast<int32_t>(id));
    for (const std::string& s : {template_->eos_token().value_or(""), std::string("<|im_end|>"),
                                 std::string("<|endoftext|>")}) {
      if (auto id = tokenizer_->token_to_id(s); id && !s.empty()) stops.push_back(*id);
    }
    std::sort(stops.begin(), stops.end());
    stops.erase(std::unique(stops.begin(), stops.end()), stops.end());
    stop_tokens_ = stops;
    EngineOptions eo;
    eo.scheduler.max_running = o_.parallel;
    eo.scheduler.batch_tokens = o_.batch_tokens;
    eo.scheduler.max_queue = o_.max_queue;
    eo.ctx_size = o_.ctx_size;
    eo.threads = o_.threads;
    eo.state_cache_bytes = o_.state_cache_bytes;
    eo.draft_max = o_.draft_max;
    eo.draft_p_min = o_.draft_p_min;
    eo.draft_adaptive = o_.draft_adaptive;
    eo.draft_max_streams = o_.draft_max_streams;
    eo.draft_lookup = o_.draft_lookup;
    eo.chain = o_.chain;
    if (o_.draft_max > 0 && !model_->has_mtp()) {
      spdlog::warn("drafting: off (the model has no MTP head, --draft-max {} ignored)",
                   o_.draft_max);
    } else if (o_.draft_max > 0) {
      spdlog::info("drafting: up to {} MTP drafts per step ({}, p_min {}), {}{}", o_.draft_max,
                   o_.draft_adaptive ? "adaptive" : "fixed", o_.draft_p_min,
                   o_.draft_max_streams > 0
                       ? fmt::format("while at most {} requests decode", o_.draft_max_streams)
                       : std::string("in any batch"),
                   o_.draft_lookup > 0
                       ? fmt::format(", up to {} prompt-lookup drafts", o_.draft_lookup)
                       : std::string());
    }
    if (o_.residency) {
      residency_ = ServerResidency::hold(*model_, o_.residency_budget, o_.residency_device_budget,
                                         o_.residency_touch);
      if (residency_) eo.buffers = residency_->observer();
    } else {
      spdlog::info("residency: off (--no-residency or TENSORFOLD_NO_RESIDENCY)");
    }
    engine_ = std::make_unique<Engine>(*model_, eo);
    if (residency_) {
      residency_->start(*engine_, {std::chrono::milliseconds(o_.residency_tick_ms),
                                   std::chrono::milliseconds(o_.keep_warm_ms)});
    }
    ready_ = true;
    spdlog::info("model {} loaded from {} in {:.2f} s ({} layers, vocab {}{}); serving",
                 o_.model_name, o_.model_dir, seconds(Clock::now() - t0),
                 model_->config().num_hidden_layers, model_->config().vocab_size,
                 o_.load.bf16_products ? ", bf16 products" : "");
    return true;
  }

  ~Service() {
    if (residency_) residency_->stop();  // its tick wakes the engine: stop it first
  }

  void shutdown() {
    stopping_ = true;
    if (residency_) residency_->stop();
    if (engine_) engine_->shutdown();
  }
  bool failed() const { return failed_; }

  // ---- handlers ------------------------------------------------------------------------------

  void health(const httplib::Request&, httplib::Response& res) {
    if (ready_) {
      res.set_content(R"({"status":"ok"})", "application/json");
    } else {
      res.status = 503;
      res.set_content(R"({"status":"loading"})", "application/json");
    }
  }

  void models(const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    json j = {{"object", "list"},
              {"data",
               {{{"id", o_.model_name},
                 {"object", "model"},
                 {"created", created_},
                 {"owned_by", "tensorfold"}}}}};
    res.set_content(j.dump(), "application/json");
  }

  void metrics(const httplib::Request&, httplib::Response& res) {
    std::string out;
    {
      std::lock_guard<std::mutex> lock(metrics_.mu);
      out +=
          "# HELP tensorfold_requests_total Requests by endpoint and HTTP status.\n"
          "# TYPE tensorfold_requests_total counter\n";
      for (const auto& [k, n] : metrics_.requests) {
        out += fmt::format("tensorfold_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n",
                           k.first, k.second, n);
      }
      out += fmt::format(
          "# HELP tensorfold_prompt_tokens_total Prompt tokens of finished requests.\n"
          "# TYPE tensorfold_prompt_tokens_total counter\ntensorfold_prompt_tokens_total {}\n"
          "# HELP tensorfold_completion_tokens_total Generated tokens of finished requests.\n"
          "# TYPE tensorfold_completion_tokens_total counter\ntensorfold_completion_tokens_total "
          "{}\n",
          metrics_.prompt_tokens, metrics_.completion_tokens);
      metrics_.ttft.write(out, "tensorfold_time_to_first_token_seconds",
                          "Time from request to first token.");
      metrics_.itl.write(out, "tensorfold_inter_token_latency_seconds",
                         "Time between streamed tokens.");
    }
    const EngineStats s = engine_ ? engine_->stats() : EngineStats{};
    out += fmt::format(
        "# HELP tensorfold_queue_depth Requests waiting for a slot.\n# TYPE tensorfold_queue_depth "
        "gauge\n"
        "tensorfold_queue_depth {}\n"
        "# HELP tensorfold_running_streams Sequences in the engine.\n# TYPE "
        "tensorfold_running_streams gauge\n"
        "tensorfold_running_streams {}\n"
        "# HELP tensorfold_engine_steps_total Engine steps run.\n# TYPE "
        "tensorfold_engine_steps_total counter\n"
        "tensorfold_engine_steps_total {}\n"
        "# HELP tensorfold_engine_chained_steps_total Steps launched on the device before the "
        "step before's tokens were read (--chain on).\n# TYPE "
        "tensorfold_engine_chained_steps_total counter\n"
        "tensorfold_engine_chained_steps_total {}\n"
        "# HELP tensorfold_model_loaded 1 once the model serves.\n# TYPE tensorfold_model_loaded "
        "gauge\n"
        "tensorfold_model_loaded {}\n",
        s.waiting, s.running, s.steps, s.chained_steps, ready_ ? 1 : 0);
    // Mean accepted length = accepted / steps; acceptance rate = accepted / drafted.
    out += fmt::format(
        "# HELP tensorfold_draft_enabled 1 when the engine drafts with the MTP head "
        "(--draft-max > 0 and the model has one).\n"
        "# TYPE tensorfold_draft_enabled gauge\ntensorfold_draft_enabled {}\n"
        "# HELP tensorfold_draft_steps_total Verify rows that carried MTP drafts.\n"
        "# TYPE tensorfold_draft_steps_total counter\ntensorfold_draft_steps_total {}\n"
        "# HELP tensorfold_draft_tokens_total MTP draft tokens proposed.\n"
        "# TYPE tensorfold_draft_tokens_total counter\ntensorfold_draft_tokens_total {}\n"
        "# HELP tensorfold_draft_accepted_tokens_total Draft tokens the target agreed with.\n"
        "# TYPE tensorfold_draft_accepted_tokens_total counter\n"
        "tensorfold_draft_accepted_tokens_total {}\n"
        "# HELP tensorfold_draft_lookup_tokens_total Of the draft tokens, those from prompt "
        "lookup.\n"
        "# TYPE tensorfold_draft_lookup_tokens_total counter\n"
        "tensorfold_draft_lookup_tokens_total {}\n"
        "# HELP tensorfold_draft_lookup_accepted_tokens_total Prompt-lookup drafts accepted.\n"
        "# TYPE tensorfold_draft_lookup_accepted_tokens_total counter\n"
        "tensorfold_draft_lookup_accepted_tokens_total {}\n",
        engine_ && engine_->drafting() ? 1 : 0, s.draft_steps, s.drafted_tokens, s.accepted_tokens,
        s.lookup_tokens, s.lookup_accepted);
    const StatePoolStats& p = s.pool;
    out += fmt::format(
        "# HELP tensorfold_state_cache_hits_total Requests resumed from a kept state.\n"
        "# TYPE tensorfold_state_cache_hits_total counter\n"
        "tensorfold_state_cache_hits_total {}\n"
        "# HELP tensorfold_state_cache_misses_total Requests that found no kept state, by reason.\n"
        "# TYPE tensorfold_state_cache_misses_total counter\n",
        p.hits);
    for (MissReason r : {MissReason::kNoPrefix, MissReason::kEvicted, MissReason::kTooShort,
                         MissReason::kDisabled}) {
      out += fmt::format("tensorfold_state_cache_misses_total{{reason=\"{}\"}} {}\n",
                         miss_reason_name(r), p.misses[static_cast<int>(r)]);
    }
    out += fmt::format(
        "# HELP tensorfold_state_cache_cached_tokens_total Prompt tokens not recomputed.\n"
        "# TYPE tensorfold_state_cache_cached_tokens_total counter\n"
        "tensorfold_state_cache_cached_tokens_total {}\n"
        "# HELP tensorfold_state_cache_entries Kept states.\n"
        "# TYPE tensorfold_state_cache_entries gauge\ntensorfold_state_cache_entries {}\n"
        "# HELP tensorfold_state_cache_bytes Bytes of kept states (budget: "
        "tensorfold_state_cache_budget_bytes).\n"
        "# TYPE tensorfold_state_cache_bytes gauge\ntensorfold_state_cache_bytes {}\n"
        "# HELP tensorfold_state_cache_budget_bytes --state-cache-bytes.\n"
        "# TYPE tensorfold_state_cache_budget_bytes gauge\n"
        "tensorfold_state_cache_budget_bytes {}\n"
        "# HELP tensorfold_state_cache_evictions_total Kept states evicted (least recently "
        "used first).\n"
        "# TYPE tensorfold_state_cache_evictions_total counter\n"
        "tensorfold_state_cache_evictions_total {}\n"
        "# HELP tensorfold_state_cache_keep_tokens_total Reply tokens prefilled to keep the state "
        "at a turn's end.\n"
        "# TYPE tensorfold_state_cache_keep_tokens_total counter\n"
        "tensorfold_state_cache_keep_tokens_total {}\n"
        "# HELP tensorfold_state_cache_keep_jobs Turn-end keep jobs queued or running.\n"
        "# TYPE tensorfold_state_cache_keep_jobs gauge\ntensorfold_state_cache_keep_jobs {}\n",
        p.cached_tokens, p.entries, p.bytes, p.max_bytes, p.evictions, s.keep_tokens, s.keeping);
    if (ready_ && residency_)  // set before ready_, by the loading thread
      residency_->write_metrics(out);
    else
      ServerResidency::write_metrics_off(out);
    res.set_content(out, "text/plain; version=0.0.4");
  }

  void generate(const httplib::Request& req, httplib::Response& res, bool chat) {
    const char* endpoint = chat ? "chat" : "completions";
    if (!authorized(req, res)) return count(endpoint, res.status);
    if (!ready_) {
      error(res, ApiError{503, "the model is loading", "unavailable_error", "", ""});
      return count(endpoint, res.status);
    }
    auto parsed = parse_request(req.body, chat);
    if (auto* e = std::get_if<ApiError>(&parsed)) {
      error(res, *e);
      return count(endpoint, res.status);
    }
    if (residency_) residency_->arm();
    auto g = std::make_shared<Generation>();
    g->api = std::move(std::get<ApiRequest>(parsed));
    g->start = Clock::now();
    if (auto e = prepare(*g)) {
      error(res, *e);
      return count(endpoint, res.status);
    }
    if (auto e = submit(g)) {
      if (e->status == 429) res.set_header("Retry-After", "1");
      error(res, *e);
      return count(endpoint, res.status);
    }
    if (g->api.stream) {
      stream(g, res, endpoint);
      return;
    }
    // Non-streaming: collect everything, then answer once.
    TextDelta text;
    while (!g->done) {
      for (const TokenEvent& e : g->channel->take(std::chrono::milliseconds(1000)))
        text.append(consume(*g, e));
    }
    json body = chat ? chat_response(*g, text) : completion_response(*g, text);
    res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
    finish_log(*g, endpoint, 200);
  }

 private:
  bool fail(const Status& s) {
    spdlog::error("cannot load {}: {}", o_.model_dir, s.to_string());
    failed_ = true;
    return false;
  }

  bool authorized(const httplib::Request& req, httplib::Response& res) {
    if (o_.api_key.empty()) return true;
    const std::string want = "Bearer " + o_.api_key;
    if (req.get_header_value("Authorization") == want) return true;
    error(res, ApiError{401, "invalid or missing API key (send 'Authorization: Bearer <key>')",
                        "authentication_error", "", "invalid_api_key"});
    return false;
  }

  void error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(e.to_json().dump(-1, ' ', false, json::error_handler_t::replace),
                    "application/json");
  }

  void count(const char* endpoint, int status) {
    std::lock_guard<std::mutex> lock(metrics_.mu);
    ++metrics_.requests[{endpoint, status}];
  }

  // The length of the system turn as the start of `prompt` (0 when there is none or it does not
  // render as a prefix): the engine keeps a state there, which other chats with the same system
  // prompt resume from.
  int64_t system_prompt_tokens(const ApiRequest& a, tok::ChatOptions co,
                               const std::vector<int32_t>& prompt) const {
    if (!a.messages.is_array() || a.messages.size() < 2 ||
        a.messages[0].value("role", "") != "system")
      return 0;
    co.add_generation_prompt = false;
    auto text = template_->render(nlohmann::ordered_json::array({a.messages[0]}), a.tools, co,
                                  a.template_kwargs);
    if (!text) return 0;
    auto ids = tokenizer_->encode(*text);
    if (!ids || ids->size() > prompt.size() ||
        !std::equal(ids->begin(), ids->end(), prompt.begin()))
      return 0;
    return static_cast<int64_t>(ids->size());
  }

  // Renders and tokenizes the prompt; checks the model name and the context.
  std::optional<ApiError> prepare(Generation& g) {
    ApiRequest& a = g.api;
    if (!a.model.empty() && a.model != o_.model_name) {
      return ApiError{
          400,
          fmt::format("model '{}' does not exist; this server serves '{}'", a.model, o_.model_name),
          "invalid_request_error", "model", "model_not_found"};
    }
    bool starts_in_reasoning = false;
    if (a.chat) {
      tok::ChatOptions co;
      co.add_generation_prompt = true;
      co.enable_thinking = a.enable_thinking.value_or(o_.enable_thinking);
      auto text = template_->render(a.messages, a.tools, co, a.template_kwargs);
      if (!text)
        return ApiError{400, "cannot render the chat template: " + text.status().message(),
                        "invalid_request_error", "messages", ""};
      // The generation prompt may open a <think> block (thinking-only templates).
      const size_t open = text->rfind("<think>"), close = text->rfind("</think>");
      starts_in_reasoning =
          open != std::string::npos && (close == std::string::npos || close < open);
      auto ids = tokenizer_->encode(*text);
      if (!ids)
        return ApiError{400, ids.status().message(), "invalid_request_error", "messages", ""};
      g.prompt = std::move(*ids);
      g.keep_prefix = system_prompt_tokens(a, co, g.prompt);
    } else if (a.prompt_is_ids) {
      g.prompt = a.prompt_ids;
      for (int32_t t : g.prompt) {
        if (t >= model_->config().vocab_size) {
          return ApiError{400,
                          fmt::format("token id {} is outside the vocabulary ({})", t,
                                      model_->config().vocab_size),
                          "invalid_request_error", "prompt", ""};
        }
      }
    } else {
      auto ids = tokenizer_->encode(a.prompt);
      if (!ids) return ApiError{400, ids.status().message(), "invalid_request_error", "prompt", ""};
      g.prompt = std::move(*ids);
    }
    if (g.prompt.empty())
      return ApiError{400, "the prompt has no tokens", "invalid_request_error", "prompt", ""};
    const int64_t P = static_cast<int64_t>(g.prompt.size());
    if (P >= o_.ctx_size) {
      return ApiError{
          400,
          fmt::format("the prompt has {} tokens but the context holds {} (prompt plus at least one "
                      "generated token; see --ctx-size)",
                      P, o_.ctx_size),
          "invalid_request_error", a.chat ? "messages" : "prompt", "context_length_exceeded"};
    }
    if (!a.seeded)
      a.sampling.seed = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);
    const bool parse =
        (a.reasoning_format.empty() ? o_.reasoning_format : a.reasoning_format) == "parsed";
    g.decoder = std::make_unique<tok::StreamDecoder>(*tokenizer_, /*skip_special=*/true);
    g.parser = std::make_unique<OutputParser>(a.stop, parse && a.chat, starts_in_reasoning);
    g.created = std::chrono::duration_cast<std::chrono::seconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
    g.id = fmt::format("{}-{:016x}", a.chat ? "chatcmpl" : "cmpl",
                       next_id_.fetch_add(1) * 0x9E3779B97F4A7C15ull);
    return std::nullopt;
  }

  std::optional<ApiError> submit(const std::shared_ptr<Generation>& g) {
    GenerationRequest r;
    r.prompt = g->prompt;
    r.sampling = g->api.sampling;
    const int64_t room = o_.ctx_size - static_cast<int64_t>(g->prompt.size());
    r.max_tokens = g->api.max_tokens > 0 ? std::min(g->api.max_tokens, room) : room;
    if (!g->api.ignore_eos) r.stop_tokens = stop_tokens_;
    r.draft = g->api.draft;
    r.want_logits = false;  // no logprobs: greedy steps keep the logits on the device
    if (g->keep_prefix > 0) r.keep_prefixes = {g->keep_prefix};
    std::weak_ptr<Channel> ch = g->channel;
    r.on_event = [ch](const TokenEvent& e) {
      if (auto c = ch.lock()) c->push(e);
    };
    auto id = engine_->submit(std::move(r));
    if (!id) {
      const Status& s = id.status();
      if (s.code() == StatusCode::kResourceExhausted)
        return ApiError{429, s.message() + "; retry later", "rate_limit_error", "", ""};
      if (s.code() == StatusCode::kUnavailable)
        return ApiError{503, s.message(), "unavailable_error", "", ""};
      return ApiError{400, s.message(), "invalid_request_error", "", ""};
    }
    g->engine_id = *id;
    return std::nullopt;
  }

  // Folds one engine event into the generation; returns the text it releases.
  TextDelta consume(Generation& g, const TokenEvent& e) {
    TextDelta out;
    const auto now = Clock::now();
    if (e.token >= 0 && !g.parser->stopped()) {
      if (g.n_generated == 0) {
        g.first_token = now;
        std::lock_guard<std::mutex> lock(metrics_.mu);
        metrics_.ttft.observe(seconds(now - g.start));
      } else {
        std::lock_guard<std::mutex> lock(metrics_.mu);
        metrics_.itl.observe(seconds(now - g.last_token));
      }
      g.last_token = now;
      ++g.n_generated;
      out.append(g.parser->push(g.decoder->push(e.token)));
      if (g.parser->stopped()) {
        g.finish_reason = "stop";
        engine_->cancel(g.engine_id);  // a stop string ended it: free the sequence now
      }
    }
    g.n_cached = e.n_cached;
    if (e.done) {
      if (!g.parser->stopped()) {
        out.append(g.parser->push(g.decoder->finish()));
        out.append(g.parser->finish());
        g.finish_reason = finish_name(e.reason);
      }
      g.done = true;
    }
    return out;
  }

  json usage(const Generation& g) const {
    const int64_t P = static_cast<int64_t>(g.prompt.size());
    return {{"prompt_tokens", P},
            {"completion_tokens", g.n_generated},
            {"total_tokens", P + g.n_generated},
            {"prompt_tokens_details", {{"cached_tokens", g.n_cached}}}};
  }

  json chat_response(const Generation& g, const TextDelta& t) const {
    json msg = {{"role", "assistant"}, {"content", t.content}};
    if (!t.reasoning.empty()) msg["reasoning_content"] = t.reasoning;
    return {{"id", g.id},
            {"object", "chat.completion"},
            {"created", g.created},
            {"model", o_.model_name},
            {"choices",
             {{{"index", 0},
               {"message", msg},
               {"logprobs", nullptr},
               {"finish_reason", g.finish_reason}}}},
            {"usage", usage(g)}};
  }

  json completion_response(const Generation& g, const TextDelta& t) const {
    return {{"id", g.id},
            {"object", "text_completion"},
            {"created", g.created},
            {"model", o_.model_name},
            {"choices",
             {{{"index", 0},
               {"text", t.content},
               {"logprobs", nullptr},
               {"finish_reason", g.finish_reason}}}},
            {"usage", usage(g)}};
  }

  // One SSE chunk (choices: one delta, or none for the usage chunk).
  std::string chunk(const Generation& g, const TextDelta* d, const json& role, const char* finish,
                    bool with_usage) const {
    json c = {{"id", g.id},
              {"object", g.api.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", g.created},
              {"model", o_.model_name}};
    if (with_usage) {
      c["choices"] = json::array();
      c["usage"] = usage(g);
    } else {
      json choice = {{"index", 0},
                     {"logprobs", nullptr},
                     {"finish_reason", finish ? json(finish) : json(nullptr)}};
      if (g.api.chat) {
        json delta = json::object();
        if (!role.is_null()) delta["role"] = role;
        if (d && !d->reasoning.empty()) delta["reasoning_content"] = d->reasoning;
        if (d && !d->content.empty()) delta["content"] = d->content;
        if (!role.is_null() && (!d || d->content.empty())) delta["content"] = "";
        choice["delta"] = delta;
      } else {
        choice["text"] = d ? d->content : "";
      }
      c["choices"] = json::array({choice});
    }
    return "data: " + c.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
  }

  void stream(std::shared_ptr<Generation> g, httplib::Response& res, const char* endpoint) {
    res.set_header("Cache-Control", "no-cache");
    auto sent_role = std::make_shared<bool>(false);
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, g, sent_role](size_t, httplib::DataSink& sink) {
          auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
          if (!*sent_role && g->api.chat) {
            *sent_role = true;
            if (!write(chunk(*g, nullptr, "assistant", nullptr, false))) return abort(*g);
          }
          auto events = g->channel->take(std::chrono::milliseconds(o_.keepalive_ms));
          if (events.empty()) {
            // Nothing yet (a long prompt): a comment keeps proxies and clients from timing out,
            // and tells us whether the client is still there.
            if (!write(": keep-alive\n\n")) return abort(*g);
            return true;
          }
          TextDelta d;
          for (const TokenEvent& e : events) d.append(consume(*g, e));
          if (!d.empty() && !write(chunk(*g, &d, nullptr, nullptr, false))) return abort(*g);
          if (!g->done) return true;
          bool ok = write(chunk(*g, nullptr, nullptr, g->finish_reason.c_str(), false));
          if (ok && g->api.include_usage) ok = write(chunk(*g, nullptr, nullptr, nullptr, true));
          if (ok) ok = write("data: [DONE]\n\n");
          if (!ok) return abort(*g);
          sink.done();
          return true;
        },
        [this, g, endpoint](bool success) {
          if (!g->done) engine_->cancel(g->engine_id);  // the client went away
          finish_log(*g, endpoint, success ? 200 : 499);
        });
  }

  bool abort(Generation& g) {
    engine_->cancel(g.engine_id);
    return false;
  }

  void finish_log(const Generation& g, const char* endpoint, int status) {
    if (residency_) residency_->arm();  // the keep-warm window runs from the last request's end
    {
      std::lock_guard<std::mutex> lock(metrics_.mu);
      ++metrics_.requests[{endpoint, status}];
      metrics_.prompt_tokens += g.prompt.size();
      metrics_.completion_tokens += g.n_generated;
    }
    const double total_ms = seconds(Clock::now() - g.start) * 1e3;
    const double ttft_ms = g.n_generated ? seconds(g.first_token - g.start) * 1e3 : 0.0;
    if (o_.log_json) {
      spdlog::info(json({{"id", g.id},
                         {"endpoint", endpoint},
                         {"status", status},
                         {"stream", g.api.stream},
                         {"prompt_tokens", g.prompt.size()},
                         {"cached_tokens", g.n_cached},
                         {"completion_tokens", g.n_generated},
                         {"finish_reason", g.finish_reason},
                         {"ttft_ms", ttft_ms},
                         {"total_ms", total_ms}})
                       .dump());
    } else {
      spdlog::info(
          "{} {} status={} stream={} prompt={} cached={} completion={} finish={} ttft={:.1f}ms "
          "total={:.1f}ms",
          g.id, endpoint, status, g.api.stream, g.prompt.size(), g.n_cached, g.n_generated,
          g.finish_reason.empty() ? "-" : g.finish_reason, ttft_ms, total_ms);
    }
  }

  ServerOptions o_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<tok::Tokenizer> tokenizer_;
  std::unique_ptr<tok::ChatTemplate> template_;
  std::unique_ptr<ServerResidency> residency_;  // after the model, before the engine it follows
  std::unique_ptr<Engine> engine_;
  std::vector<int32_t> stop_tokens_;
  std::atomic<bool> ready_{false}, stopping_{false};
  bool failed_ = false;
  std::atomic<uint64_t> next_id_{1};
  int64_t created_ = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  Metrics metrics_;
};

}  // namespace

int run_server(const ServerOptions& o) {
  if (o.log_json) spdlog::set_pattern(R"({"time":"%Y-%m-%dT%H:%M:%S.%e","level":"%l","msg":%v})");
  // SIGINT/SIGTERM go to one thread (sigwait); every other thread, made after this, blocks them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  Service service(o);
  httplib::Server http;
  const int http_threads = std::max(4, o.http_threads);
  http.new_task_queue = [http_threads] {
    return new httplib::ThreadPool(static_cast<size_t>(http_threads));
  };
  http.set_payload_max_length(o.max_body_bytes);
  http.set_read_timeout(10, 0);
  http.set_write_timeout(10, 0);
  http.set_keep_alive_timeout(2);  // idle keep-alive connections must not delay shutdown past 3 s
  http.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    const int s = res.status;
    ApiError e{s,
               s == 413   ? "the request body is too large"
               : s == 404 ? "no such endpoint"
                          : fmt::format("HTTP error {}", s),
               s == 404 ? "not_found_error" : "invalid_request_error", "", ""};
    res.set_content(e.to_json().dump(), "application/json");
  });
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "internal error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& ex) {
          what = ex.what();
        } catch (...) {
        }
        spdlog::error("handler failed: {}", what);
        res.status = 500;
        res.set_content(ApiError{500, what, "server_error", "", ""}.to_json().dump(),
                        "application/json");
      });
  http.Get("/health",
           [&](const httplib::Request& q, httplib::Response& r) { service.health(q, r); });
  http.Get("/metrics",
           [&](const httplib::Request& q, httplib::Response& r) { service.metrics(q, r); });
  http.Get("/v1/models",
           [&](const httplib::Request& q, httplib::Response& r) { service.models(q, r); });
  http.Post("/v1/chat/completions",
            [&](const httplib::Request& q, httplib::Response& r) { service.generate(q, r, true); });
  http.Post("/v1/completions", [&](const httplib::Request& q, httplib::Response& r) {
    service.generate(q, r, false);
  });

  if (!http.bind_to_port(o.host, o.port)) {
    std::fprintf(stderr,
                 "error: cannot listen on %s:%d (in use, or not an address of this machine)\n",
                 o.host.c_str(), o.port);
    return 1;
  }
  spdlog::info("listening on http://{}:{} (model loading from {})", o.host, o.port, o.model_dir);
  std::atomic<bool> load_failed{false};
  std::thread loader([&] {
    if (!service.load()) {
      load_failed = true;
      http.stop();
    }
  });
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (sig == SIGINT || sig == SIGTERM)
      spdlog::info("signal {}: stopping (in-flight streams end now)", sig);
    service.shutdown();  // ends every request first, so no handler waits on the engine
    http.stop();
  });
  http.listen_after_bind();
  loader.join();
  if (load_failed) {
    pthread_kill(waiter.native_handle(), SIGTERM);
    waiter.join();
    return 1;
  }
  // listen returned because of a signal (or stop): make sure the waiter is done.
  service.shutdown();
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  spdlog::info("stopped");
  return 0;
}

}  // namespace tf::server
