// `tensorfold serve`: the OpenAI-compatible HTTP server. The transport (cpp-httplib) stays inside
// server.cpp; handlers map requests onto the runtime Engine and Status codes onto HTTP codes here
// and nowhere else. Handlers never throw out of the transport.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/weights.h"

namespace tf::server {

struct ServerOptions {
  std::string model_dir = "models/tiny-next";
  std::string model_name;  // the id clients send; default: the directory's name
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;       // empty: no authentication
  int parallel = 4;          // sequences decoded at once
  int batch_tokens = 512;    // tokens per engine step
  int max_queue = 64;        // waiting requests before 429
  int64_t ctx_size = 16384;  // positions per sequence
  int threads = 0;           // model worker threads (0 = all cores)
  // "cpu", or "cuda" (Model::use_cuda: the weights and states on CUDA device 0).
  std::string device = "cpu";
  LoadOptions load;  // --load-mode (the CLI copies the weights on the CPU by default)
  size_t state_cache_bytes = size_t{2} << 30;  // kept-state pool budget (0: off)
  // MTP drafting (EngineOptions): drafts per step at most (0: off, the default: it does not pay
  // on the CPU, docs/PERFORMANCE.md), the head-confidence gate, adaptive depth.
  int draft_max = 0;
  float draft_p_min = 0.0f;
  bool draft_adaptive = true;
  int draft_max_streams = 1;  // EngineOptions::draft_max_streams
  int draft_lookup = 12;      // EngineOptions::draft_lookup (with --draft-max)
  bool chain = false;         // EngineOptions::chain: greedy decode steps chained on the device
  int http_threads = 64;      // connections served at once
  size_t max_body_bytes = 8 << 20;          // larger bodies get 413
  bool enable_thinking = true;              // default of chat_template_kwargs.enable_thinking
  std::string reasoning_format = "parsed";  // "parsed" (reasoning_content) or "inline"
  int keepalive_ms = 2000;                  // SSE comment interval while nothing is produced
  bool log_json = false;                    // one JSON object per log line
  // Residency (../shared/design/residency.md): hold the engine's buffers resident; the tick.
  bool residency = true;                // false: no owner at all (--no-residency)
  size_t residency_budget = 0;          // host bytes; 0: 70% of physical RAM
  std::string residency_device_budget;  // --device cuda: bytes or "N%" of the device; "": 100%
  int64_t residency_tick_ms = 1000;     // keepalive tick period while idle
  int64_t keep_warm_ms = 600000;        // ticks go on this long after the last request
  // Bytes each idle tick reads (0: none): for a VM whose host reclaims guest memory, mlocked or
  // not (docs/PERFORMANCE.md, "Residency").
  size_t residency_touch = 0;
};

// Runs until SIGINT/SIGTERM (then stops accepting, ends in-flight streams and returns 0) or a
// fatal startup error (returns non-zero with a message on stderr). The model loads in the
// background: /health answers 503 until it is ready.
int run_server(const ServerOptions& options);

}  // namespace tf::server
