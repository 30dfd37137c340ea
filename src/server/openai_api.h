// The OpenAI API's request side: JSON bodies of /v1/chat/completions and /v1/completions parsed and
// validated into ApiRequest, or an ApiError in OpenAI's error shape. Pure functions, no transport.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/sampler.h"

namespace tf::server {

// {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, or empty
  std::string code;   // e.g. "model_not_found", or empty
  nlohmann::json to_json() const;
};

struct ApiRequest {
  bool chat = true;
  std::string model;                // as given (may be empty)
  nlohmann::ordered_json messages;  // chat: the messages, content normalised to strings
  nlohmann::ordered_json tools;     // chat: tools list or null
  nlohmann::ordered_json template_kwargs =
      nlohmann::ordered_json::object();  // chat_template_kwargs
  std::optional<bool> enable_thinking;
  std::string prompt;               // completions: text prompt
  std::vector<int32_t> prompt_ids;  // completions: token-id prompt (if given as ids)
  bool prompt_is_ids = false;
  SamplingParams sampling;
  bool seeded = false;      // a seed was given
  int64_t max_tokens = -1;  // -1: until the context is full
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;    // stream_options.include_usage
  std::string reasoning_format;  // "parsed" | "inline" | "" (server default)
  bool ignore_eos = false;       // vLLM's extension: do not stop at end-of-sequence tokens
  bool draft = true;             // false: no MTP drafting for this request (same tokens)
};

struct ParseLimits {
  int max_stop = 4;
};

// Parses a request body. `chat` picks the endpoint's schema.
std::variant<ApiRequest, ApiError> parse_request(std::string_view body, bool chat,
                                                 const ParseLimits& limits = {});

}  // namespace tf::server
