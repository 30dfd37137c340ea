#include "tokenizer/chat_template.h"

#include <filesystem>

#include "core/file.h"
#include "tokenizer/utf8.h"

namespace tf::tok {
namespace {

using ojson = nlohmann::ordered_json;

// A special token in tokenizer_config.json: a string or an AddedToken object {"content": ...}.
std::optional<std::string> token_string(const ojson& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

Result<ChatTemplate> ChatTemplate::from_source(std::string_view jinja, const ojson& config) {
  TF_ASSIGN_OR_RETURN(jinja::Template t, jinja::Template::parse(jinja));
  ChatTemplate ct(std::move(t), std::string(jinja));
  if (config.is_object()) {
    for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
      auto it = config.find(key);
      if (it == config.end()) continue;
      if (auto s = token_string(*it)) {
        ct.specials_.set(jinja::Value::string(key), jinja::Value::string(*s));
        if (std::string_view(key) == "eos_token") ct.eos_token_ = *s;
        if (std::string_view(key) == "pad_token") ct.pad_token_ = *s;
      }
    }
    auto it = config.find("additional_special_tokens");
    if (it != config.end() && it->is_array()) {
      jinja::List list;
      for (const ojson& v : *it)
        if (auto s = token_string(v)) list.push_back(jinja::Value::string(*s));
      ct.specials_.set(jinja::Value::string("additional_special_tokens"),
                       jinja::Value::list(std::move(list)));
    }
  }
  return ct;
}

Result<ChatTemplate> ChatTemplate::load(const std::string& dir) {
  const std::string config_path = dir + "/tokenizer_config.json";
  ojson config;
  std::optional<std::string> source;
  if (std::filesystem::exists(config_path)) {
    TF_ASSIGN_OR_RETURN(std::string text, read_file(config_path));
    config = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object())
      return Status::corrupt("{}: not a JSON object", config_path);
    auto it = config.find("chat_template");
    if (it != config.end() && it->is_string()) {
      source = it->get<std::string>();
    } else if (it != config.end() && it->is_array()) {  // named templates: use "default"
      for (const ojson& e : *it)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
            e["template"].is_string())
          source = e["template"].get<std::string>();
      if (!source) return Status::corrupt("{}: chat_template list has no \"default\"", config_path);
    } else if (it != config.end() && !it->is_null()) {
      return Status::corrupt("{}: chat_template must be a string", config_path);
    }
  }
  const std::string jinja_path = dir + "/chat_template.jinja";
  if (std::filesystem::exists(jinja_path)) {
    TF_ASSIGN_OR_RETURN(std::string text, read_file(jinja_path));
    source = std::move(text);
  }
  if (!source)
    return Status::not_found(
        "{}: no chat template (neither chat_template.jinja nor a "
        "\"chat_template\" in tokenizer_config.json)",
        dir);
  auto ct = from_source(*source, config);
  if (!ct) return Status(ct.status().code(), dir + ": " + ct.status().message());
  return ct;
}

Result<std::string> ChatTemplate::render(const ojson& messages, const ojson& tools,
                                         const ChatOptions& options, const ojson& extra) const {
  if (!messages.is_array()) return Status::invalid("messages must be a JSON list");
  if (!tools.is_null() && !tools.is_array()) return Status::invalid("tools must be a JSON list");
  if (!extra.is_null() && !extra.is_object())
    return Status::invalid("extra template variables must be a JSON object");
  jinja::Dict vars = specials_;
  if (extra.is_object())
    for (auto it = extra.begin(); it != extra.end(); ++it)
      vars.set(jinja::Value::string(it.key()), jinja::Value::from_json(it.value()));
  vars.set(jinja::Value::string("messages"), jinja::Value::from_json(messages));
  vars.set(jinja::Value::string("tools"),
           tools.is_null() ? jinja::Value::none() : jinja::Value::from_json(tools));
  if (!vars.find("documents")) vars.set(jinja::Value::string("documents"), jinja::Value::none());
  vars.set(jinja::Value::string("add_generation_prompt"),
           jinja::Value::boolean(options.add_generation_prompt));
  if (options.enable_thinking)
    vars.set(jinja::Value::string("enable_thinking"),
             jinja::Value::boolean(*options.enable_thinking));
  return template_.render(vars);
}

Result<std::string> ChatTemplate::render_request(const ojson& request,
                                                 const ChatOptions& options) const {
  if (request.is_array()) return render(request, nullptr, options);
  if (!request.is_object())
    return Status::invalid("expected a list of messages or an object with \"messages\"");
  auto m = request.find("messages");
  if (m == request.end()) return Status::invalid("the object has no \"messages\" list");
  ojson tools = request.contains("tools") ? request["tools"] : ojson(nullptr);
  ojson extra = ojson::object();
  ChatOptions opt = options;
  for (auto it = request.begin(); it != request.end(); ++it) {
    if (it.key() == "messages" || it.key() == "tools") continue;
    // Flags given in the file apply unless the caller set them.
    if (it.key() == "add_generation_prompt" && it->is_boolean()) {
      opt.add_generation_prompt = opt.add_generation_prompt || it->get<bool>();
      continue;
    }
    if (it.key() == "enable_thinking" && it->is_boolean()) {
      if (!opt.enable_thinking) opt.enable_thinking = it->get<bool>();
      continue;
    }
    extra[it.key()] = *it;
  }
  return render(*m, tools, opt, extra);
}

}  // namespace tf::tok
