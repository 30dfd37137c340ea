#include "server/openai_api.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace tf::server {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

json ApiError::to_json() const {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

namespace {

ApiError bad(const std::string& param, const std::string& message) {
  return ApiError{400, message, "invalid_request_error", param, ""};
}

// Reads an optional number in [lo, hi] into *out (null or absent: unchanged).
std::optional<ApiError> number(const ojson& j, const char* key, double lo, double hi, float* out) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_number()) return bad(key, fmt::format("'{}' must be a number", key));
  const double v = j[key].get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    return bad(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, v));
  }
  *out = static_cast<float>(v);
  return std::nullopt;
}

std::optional<ApiError> integer(const ojson& j, const char* key, int64_t lo, int64_t hi,
                                int64_t* out) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_number_integer()) return bad(key, fmt::format("'{}' must be an integer", key));
  const int64_t v = j[key].get<int64_t>();
  if (v < lo || v > hi)
    return bad(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, v));
  *out = v;
  return std::nullopt;
}

std::optional<ApiError> boolean(const ojson& j, const char* key, bool* out) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_boolean()) return bad(key, fmt::format("'{}' must be a boolean", key));
  *out = j[key].get<bool>();
  return std::nullopt;
}

// Message content: a string, null, or a list of {"type": "text", "text": ...} parts (joined).
std::optional<ApiError> normalise_content(ojson& m, size_t i) {
  const std::string param = fmt::format("messages[{}].content", i);
  if (!m.contains("content") || m["content"].is_null() || m["content"].is_string())
    return std::nullopt;
  if (!m["content"].is_array())
    return bad(param, "content must be a string or a list of text parts");
  std::string text;
  for (const auto& part : m["content"]) {
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
        !part.contains("text") || !part["text"].is_string()) {
      return bad(param,
                 "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported");
    }
    text += part["text"].get<std::string>();
  }
  m["content"] = text;
  return std::nullopt;
}

// Deepest nesting of arrays/objects in a JSON text (strings skipped). Checked before parsing:
// the parser is iterative, but copying and destroying a json value recurse, so a 100k-deep body
// would overflow the stack of a handler thread.
int max_depth(std::string_view s) {
  int depth = 0, worst = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      worst = std::max(worst, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return worst;
}

constexpr int kMaxDepth = 64;

}  // namespace

std::variant<ApiRequest, ApiError> parse_request(std::string_view body, bool chat,
                                                 const ParseLimits& limits) {
  if (max_depth(body) > kMaxDepth) {
    return ApiError{400, fmt::format("the body nests arrays/objects deeper than {}", kMaxDepth),
                    "invalid_request_error", "", ""};
  }
  ojson j;
  try {
    j = ojson::parse(body);  // rejects invalid UTF-8 in strings and bad syntax
  } catch (const json::exception& e) {
    return ApiError{400, std::string("the body is not valid JSON: ") + e.what(),
                    "invalid_request_error", "", ""};
  }
  if (!j.is_object()) return bad("", "the body must be a JSON object");
  ApiRequest r;
  r.chat = chat;
  if (j.contains("model") && !j["model"].is_null()) {
    if (!j["model"].is_string()) return bad("model", "'model' must be a string");
    r.model = j["model"].get<std::string>();
  }
  if (chat) {
    if (!j.contains("messages")) return bad("messages", "'messages' is required");
    if (!j["messages"].is_array()) return bad("messages", "'messages' must be a list");
    if (j["messages"].empty()) return bad("messages", "'messages' must not be empty");
    r.messages = j["messages"];
    for (size_t i = 0; i < r.messages.size(); ++i) {
      ojson& m = r.messages[i];
      const std::string param = fmt::format("messages[{}]", i);
      if (!m.is_object()) return bad(param, "each message must be an object");
      if (!m.contains("role") || !m["role"].is_string())
        return bad(param + ".role", "'role' must be a string");
      const std::string role = m["role"];
      if (role != "system" && role != "user" && role != "assistant" && role != "tool" &&
          role != "developer") {
        return bad(param + ".role", fmt::format("unknown role '{}'", role));
      }
      if (role == "developer") m["role"] = "system";
      if (auto e = normalise_content(m, i)) return *e;
      if (m.contains("reasoning_content") && !m["reasoning_content"].is_null() &&
          !m["reasoning_content"].is_string()) {
        return bad(param + ".reasoning_content", "'reasoning_content' must be a string");
      }
    }
    if (j.contains("tools") && !j["tools"].is_null()) {
      if (!j["tools"].is_array()) return bad("tools", "'tools' must be a list");
      if (!j["tools"].empty()) r.tools = j["tools"];
    }
    if (j.contains("chat_template_kwargs") && !j["chat_template_kwargs"].is_null()) {
      if (!j["chat_template_kwargs"].is_object()) {
        return bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
      }
      r.template_kwargs = j["chat_template_kwargs"];
      if (r.template_kwargs.contains("enable_thinking")) {
        if (!r.template_kwargs["enable_thinking"].is_boolean()) {
          return bad("chat_template_kwargs.enable_thinking", "'enable_thinking' must be a boolean");
        }
        r.enable_thinking = r.template_kwargs["enable_thinking"].get<bool>();
        r.template_kwargs.erase("enable_thinking");
      }
    }
    if (j.contains("max_completion_tokens") && !j["max_completion_tokens"].is_null()) {
      if (auto e = integer(j, "max_completion_tokens", 1, int64_t{1} << 40, &r.max_tokens))
        return *e;
    }
  } else {
    if (!j.contains("prompt")) return bad("prompt", "'prompt' is required");
    const ojson& p = j["prompt"];
    if (p.is_string()) {
      r.prompt = p.get<std::string>();
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      r.prompt = p[0].get<std::string>();
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      for (const auto& t : p) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) {
          return bad("prompt", "a token-id prompt must be a list of non-negative integers");
        }
        r.prompt_ids.push_back(t.get<int32_t>());
      }
      r.prompt_is_ids = true;
    } else {
      return bad("prompt",
                 "'prompt' must be a string, a list of one string, or a list of token ids");
    }
    if (r.prompt.empty() && !r.prompt_is_ids) return bad("prompt", "'prompt' must not be empty");
    bool echo = false;
    if (auto e = boolean(j, "echo", &echo)) return *e;
    if (echo) return bad("echo", "'echo' is not supported");
    if (j.contains("suffix") && !j["suffix"].is_null())
      return bad("suffix", "'suffix' is not supported");
  }
  if (r.max_tokens < 0) {
    if (auto e = integer(j, "max_tokens", 1, int64_t{1} << 40, &r.max_tokens)) return *e;
  }
  int64_t n = 1;
  if (auto e = integer(j, "n", 1, 128, &n)) return *e;
  if (n != 1) return bad("n", "'n' > 1 is not supported: send one request per completion");
  if (j.contains("logprobs") && j["logprobs"].is_boolean() && j["logprobs"].get<bool>()) {
    return bad("logprobs", "'logprobs' is not supported");
  }
  if (auto e = number(j, "temperature", 0.0, 2.0, &r.sampling.temperature)) return *e;
  if (!j.contains("temperature") || j["temperature"].is_null()) r.sampling.temperature = 1.0f;
  if (auto e = number(j, "top_p", 0.0, 1.0, &r.sampling.top_p)) return *e;
  if (r.sampling.top_p <= 0.0f) return bad("top_p", "'top_p' must be > 0");
  int64_t top_k = 0;
  if (auto e = integer(j, "top_k", -1, 1 << 30, &top_k)) return *e;
  r.sampling.top_k = top_k < 0 ? 0 : static_cast<int32_t>(top_k);
  if (auto e = number(j, "min_p", 0.0, 1.0, &r.sampling.min_p)) return *e;
  if (auto e = number(j, "presence_penalty", -2.0, 2.0, &r.sampling.presence_penalty)) return *e;
  if (auto e = number(j, "frequency_penalty", -2.0, 2.0, &r.sampling.frequency_penalty)) return *e;
  int64_t seed = 0;
  if (j.contains("seed") && !j["seed"].is_null()) {
    if (!j["seed"].is_number_integer()) return bad("seed", "'seed' must be an integer");
    seed = j["seed"].is_number_unsigned() ? static_cast<int64_t>(j["seed"].get<uint64_t>())
                                          : j["seed"].get<int64_t>();
    r.sampling.seed = static_cast<uint64_t>(seed);
    r.seeded = true;
  }
  if (j.contains("stop") && !j["stop"].is_null()) {
    const ojson& s = j["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      if (static_cast<int>(s.size()) > limits.max_stop) {
        return bad("stop", fmt::format("'stop' takes at most {} strings", limits.max_stop));
      }
      for (const auto& x : s) {
        if (!x.is_string()) return bad("stop", "'stop' must be a string or a list of strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      return bad("stop", "'stop' must be a string or a list of strings");
    }
  }
  if (auto e = boolean(j, "stream", &r.stream)) return *e;
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    if (!j["stream_options"].is_object())
      return bad("stream_options", "'stream_options' must be an object");
    if (auto e = boolean(j["stream_options"], "include_usage", &r.include_usage)) return *e;
  }
  if (j.contains("reasoning_format") && !j["reasoning_format"].is_null()) {
    if (!j["reasoning_format"].is_string() ||
        (j["reasoning_format"] != "parsed" && j["reasoning_format"] != "inline")) {
      return bad("reasoning_format", "'reasoning_format' must be \"parsed\" or \"inline\"");
    }
    r.reasoning_format = j["reasoning_format"].get<std::string>();
  }
  if (auto e = boolean(j, "draft", &r.draft)) return *e;
  if (auto e = boolean(j, "ignore_eos", &r.ignore_eos)) return *e;
  return r;
}

}  // namespace tf::server
