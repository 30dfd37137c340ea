// tensorfold tokenize: encode text with a checkpoint's tokenizer.json (no special tokens added), or
// decode ids back to text.
//   tensorfold tokenize --tokenizer DIR (--text T | --text-file F) [--json]
//   tensorfold tokenize --tokenizer DIR --decode 1,2,3 [--skip-special] [--json]
#include <charconv>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "core/file.h"
#include "tokenizer/tokenizer.h"

namespace tf::app {
namespace {

struct TokenizeOptions {
  std::string tokenizer;
  std::string text;
  std::string text_file;
  std::string decode;
  bool json = false;
  bool skip_special = false;
};

int fail(const Status& st) {
  std::fprintf(stderr, "error: %s\n", st.to_string().c_str());
  return 1;
}

Result<std::vector<int32_t>> parse_ids(const std::string& s, const tok::Tokenizer& t) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    std::string_view item(s.data() + pos, end - pos);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    int64_t v = 0;
    auto r = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || r.ec != std::errc() || r.ptr != item.data() + item.size())
      return Status::invalid("--decode: \"{}\" is not an integer id (expected e.g. 1,2,3)", item);
    if (v < 0 || v >= t.vocab_size() || !t.contains(static_cast<int32_t>(v)))
      return Status::out_of_range("--decode: id {} is not in the vocabulary (0..{})", v,
                                  t.vocab_size() - 1);
    ids.push_back(static_cast<int32_t>(v));
    pos = end + 1;
  }
  return ids;
}

int run_tokenize(const TokenizeOptions& o) {
  auto tk = tok::Tokenizer::load(o.tokenizer);
  if (!tk) return fail(tk.status());
  if (!o.decode.empty()) {
    auto ids = parse_ids(o.decode, *tk);
    if (!ids) return fail(ids.status());
    const std::string text = tk->decode(*ids, o.skip_special);
    if (o.json) {
      std::printf("{\"text\": %s}\n", nlohmann::json(text).dump().c_str());
    } else {
      std::fwrite(text.data(), 1, text.size(), stdout);
    }
    return 0;
  }
  std::string text = o.text;
  if (!o.text_file.empty()) {
    auto file = read_file(o.text_file);
    if (!file) return fail(Status(file.status().code(), "--text-file: " + file.status().message()));
    text = std::move(*file);
  }
  auto ids = tk->encode(text);
  if (!ids) return fail(ids.status());
  std::string list;
  for (size_t i = 0; i < ids->size(); ++i)
    list += (i ? (o.json ? ", " : " ") : "") + std::to_string((*ids)[i]);
  if (o.json) {
    std::printf("{\"ids\": [%s]}\n", list.c_str());
  } else {
    std::printf("%s\n", list.c_str());
  }
  return 0;
}

}  // namespace

void add_tokenize(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "Encode text to token ids (no special tokens added), or decode ids to text");
  cmd->add_option("--tokenizer", o->tokenizer, "Directory holding tokenizer.json")->required();
  auto* text = cmd->add_option("--text", o->text, "Text to encode (UTF-8)");
  auto* file = cmd->add_option("--text-file", o->text_file, "File whose bytes are encoded");
  auto* dec = cmd->add_option("--decode", o->decode, "Comma-separated ids to decode, e.g. 1,2,3");
  text->excludes(file)->excludes(dec);
  file->excludes(dec);
  cmd->add_flag("--json", o->json, "Print {\"ids\": [...]} (or {\"text\": ...} with --decode)");
  cmd->add_flag("--skip-special", o->skip_special, "With --decode: drop special tokens");
  cmd->callback([o, cmd] {
    if (cmd->count("--text") + cmd->count("--text-file") + cmd->count("--decode") != 1) {
      std::fprintf(stderr, "error: give one of --text, --text-file or --decode\n");
      exit_code() = 2;
      return;
    }
    exit_code() = run_tokenize(*o);
  });
}

}  // namespace tf::app
