// Chat formatting from the checkpoint's own files: the Jinja `chat_template` of
// tokenizer_config.json (or chat_template.jinja beside it, which transformers prefers), rendered
// with the variables transformers' apply_chat_template passes: messages, tools (None when absent),
// documents=None, add_generation_prompt, the special tokens (bos/eos/pad/unk_token,
// additional_special_tokens) and any extra keyword (e.g. enable_thinking, only when given).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "tokenizer/jinja.h"

namespace tf::tok {

struct ChatOptions {
  bool add_generation_prompt = false;
  std::optional<bool> enable_thinking;  // unset: the template sees it undefined
};

class ChatTemplate {
 public:
  // Reads DIR/chat_template.jinja if present, else DIR/tokenizer_config.json's chat_template;
  // special tokens come from tokenizer_config.json.
  [[nodiscard]] static Result<ChatTemplate> load(const std::string& dir);
  // `config` is the parsed tokenizer_config.json (may be null) for the special-token variables.
  [[nodiscard]] static Result<ChatTemplate> from_source(std::string_view jinja,
                                                        const nlohmann::ordered_json& config);

  // messages: a JSON list of message objects; tools: a JSON list or null; extra: an object of
  // more template variables (or null), applied before the options.
  [[nodiscard]] Result<std::string> render(const nlohmann::ordered_json& messages,
                                           const nlohmann::ordered_json& tools,
                                           const ChatOptions& options,
                                           const nlohmann::ordered_json& extra = nullptr) const;
  // Renders a "messages file": either a list of messages or an object {"messages": [...],
  // "tools": [...], other template variables...}. Options override same-named keys.
  [[nodiscard]] Result<std::string> render_request(const nlohmann::ordered_json& request,
                                                   const ChatOptions& options) const;

  const std::string& source() const { return source_; }
  const std::optional<std::string>& eos_token() const { return eos_token_; }
  const std::optional<std::string>& pad_token() const { return pad_token_; }

 private:
  ChatTemplate(jinja::Template t, std::string source)
      : template_(std::move(t)), source_(std::move(source)) {}
  jinja::Template template_;
  std::string source_;
  jinja::Dict specials_;
  std::optional<std::string> eos_token_, pad_token_;
};

}  // namespace tf::tok
