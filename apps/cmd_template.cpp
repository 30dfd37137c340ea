// tensorfold template: render a conversation with the checkpoint's own chat template, exactly as
// transformers' apply_chat_template(tokenize=False) would, and print it with no newline added.
//   tensorfold template --tokenizer DIR --messages-file F [--enable-thinking true|false]
//                       [--add-generation-prompt]
// F holds a JSON list of messages, or an object {"messages": [...], "tools": [...], ...} whose
// other keys become template variables.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "core/file.h"
#include "tokenizer/chat_template.h"

namespace tf::app {
namespace {

struct TemplateOptions {
  std::string tokenizer;
  std::string messages_file;
  std::string enable_thinking;  // "", "true" or "false"
  bool add_generation_prompt = false;
};

int run_template(const TemplateOptions& o) {
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "error: %s\n", st.to_string().c_str());
    return 1;
  };
  auto ct = tok::ChatTemplate::load(o.tokenizer);
  if (!ct) return fail(ct.status());
  auto body = read_file(o.messages_file);
  if (!body)
    return fail(Status(body.status().code(), "--messages-file: " + body.status().message()));
  nlohmann::ordered_json request;
  try {
    request = nlohmann::ordered_json::parse(*body);
  } catch (const nlohmann::json::parse_error& e) {
    return fail(Status::invalid("{}: not valid JSON: {}", o.messages_file, e.what()));
  }
  tok::ChatOptions opt;
  opt.add_generation_prompt = o.add_generation_prompt;
  if (!o.enable_thinking.empty()) opt.enable_thinking = o.enable_thinking == "true";
  auto text = ct->render_request(request, opt);
  if (!text)
    return fail(Status(text.status().code(), o.messages_file + ": " + text.status().message()));
  std::fwrite(text->data(), 1, text->size(), stdout);
  return 0;
}

}  // namespace

void add_template(CLI::App& app) {
  auto o = std::make_shared<TemplateOptions>();
  CLI::App* cmd = app.add_subcommand("template", "Render a conversation with the chat template");
  cmd->add_option("--tokenizer", o->tokenizer,
                  "Directory holding tokenizer_config.json (and/or chat_template.jinja)")
      ->required();
  cmd->add_option("--messages-file", o->messages_file,
                  "JSON list of messages, or {\"messages\": [...], \"tools\": [...]}")
      ->required();
  cmd->add_option("--enable-thinking", o->enable_thinking, "Pass enable_thinking to the template")
      ->check(CLI::IsMember({"true", "false"}));
  cmd->add_flag("--add-generation-prompt", o->add_generation_prompt,
                "End with the assistant turn's opening");
  cmd->callback([o] { exit_code() = run_template(*o); });
}

}  // namespace tf::app
