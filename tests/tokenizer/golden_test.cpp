// Reference comparisons (label golden). Inputs, all produced by scripts under tools/:
//   data/corpus.jsonl                      12,881 varied lines (tools/tokenizer_make_corpus.py)
//   data/{qwen3,small}/corpus.hf.ids.jsonl HF tokenizers 0.23.2 ids of each line
//   (tools/tokenizer_ref_hf.py) data/{qwen3,small}/decode.hf.jsonl     HF decode of random id
//   sequences, both skip modes data/chats.jsonl, chats.expected.jsonl Jinja2 renders of 134
//   conversations x 3 templates
//                                          (tools/tokenizer_ref_jinja.py; equal to
//                                          transformers 5.17)
//   data/known_divergences.json            lines where HF and transformers.js disagree
// Live runs (tests/tokenizer/live_reference.sh) point TF_TOK_JS_IDS_{QWEN3,SMALL} at fresh
// transformers.js ids and TF_TOK_JINJA_EXPECTED at a fresh Jinja2 render file.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace tf::tok {
namespace {

using ojson = nlohmann::ordered_json;

const std::string kData = TF_TOK_DATA;
const std::string kBuildData = TF_TOK_BUILD_DATA;

std::vector<ojson> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::vector<ojson> out;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(ojson::parse(line));
  return out;
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> lines = [] {
    std::vector<std::string> out;
    for (const ojson& j : read_jsonl(kData + "/corpus.jsonl")) out.push_back(j.get<std::string>());
    return out;
  }();
  return lines;
}

std::string tokenizer_dir(const std::string& name) {
  return name == "qwen3" ? kBuildData + "/qwen3" : kData + "/small";
}

const Tokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    auto t = Tokenizer::load(tokenizer_dir(name));
    if (!t) {
      ADD_FAILURE() << t.status().to_string();
      std::abort();
    }
    it = cache.emplace(name, std::move(t).value()).first;
  }
  return it->second;
}

std::set<size_t> divergences(const std::string& who, const std::string& name) {
  std::ifstream in(kData + "/known_divergences.json");
  const ojson j = ojson::parse(in);
  return j[who][name].get<std::set<size_t>>();
}

// Compares our ids with a reference file. At the reference's known divergences our ids must
// differ from it (else the list is stale); everywhere else they must be equal.
void compare_ids(const std::string& name, const std::string& ids_path, const std::string& who) {
  const Tokenizer& tk = tokenizer(name);
  const std::vector<ojson> ref = read_jsonl(ids_path);
  const auto& lines = corpus();
  ASSERT_EQ(ref.size(), lines.size()) << ids_path;
  const std::set<size_t> skip = divergences(who, name);
  size_t mismatches = 0, checked = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    auto ids = tk.encode(lines[i]);
    ASSERT_TRUE(ids) << "line " << i << ": " << ids.status().to_string();
    const auto want = ref[i].get<std::vector<int32_t>>();
    if (skip.count(i)) {
      EXPECT_NE(*ids, want) << who << " divergence at line " << i << " no longer diverges";
      continue;
    }
    ++checked;
    if (*ids != want && ++mismatches <= 10)
      ADD_FAILURE() << name << " line " << i << " " << ojson(lines[i]).dump() << "\n ours "
                    << ojson(*ids).dump() << "\n " << who << "  " << ref[i].dump();
  }
  EXPECT_EQ(mismatches, 0u) << "of " << checked << " lines";
  EXPECT_GE(checked, 12000u);
}

TEST(HfTokenizers, Qwen3CorpusIds) {
  compare_ids("qwen3", kBuildData + "/qwen3/corpus.hf.ids.jsonl", "hf");
}
TEST(HfTokenizers, SmallCorpusIds) {
  compare_ids("small", kBuildData + "/small/corpus.hf.ids.jsonl", "hf");
}

TEST(TransformersJs, LiveCorpusIds) {
  const char* q = std::getenv("TF_TOK_JS_IDS_QWEN3");
  const char* s = std::getenv("TF_TOK_JS_IDS_SMALL");
  if (!q || !s) GTEST_SKIP() << "run by live_reference.sh js";
  compare_ids("qwen3", q, "js");
  compare_ids("small", s, "js");
}

void round_trip(const std::string& name) {
  const Tokenizer& tk = tokenizer(name);
  auto nfc = Normalizer::create(NormalForm::kNFC);
  ASSERT_TRUE(nfc);
  size_t n = 0;
  for (const std::string& line : corpus()) {
    auto ids = tk.encode(line);
    ASSERT_TRUE(ids);
    std::string want;
    ASSERT_TRUE(nfc->apply(line, want));
    EXPECT_EQ(tk.decode(*ids), want) << ojson(line).dump();
    // The streaming decoder gives the same text, piece by piece.
    StreamDecoder sd(tk);
    std::string streamed;
    for (int32_t id : *ids) streamed += sd.push(id);
    streamed += sd.finish();
    EXPECT_EQ(streamed, want);
    ++n;
  }
  EXPECT_GE(n, 10000u);
}
TEST(RoundTrip, Qwen3DecodeEncodeIsNfc) {
  round_trip("qwen3");
}
TEST(RoundTrip, SmallDecodeEncodeIsNfc) {
  round_trip("small");
}

void hf_decode(const std::string& name) {
  const Tokenizer& tk = tokenizer(name);
  const std::string dir = name == "qwen3" ? kData + "/qwen3" : kData + "/small";
  const std::vector<ojson> cases = read_jsonl(dir + "/decode.hf.jsonl");
  ASSERT_GE(cases.size(), 400u);
  for (const ojson& c : cases) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tk.decode(ids, false), c["text"].get<std::string>()) << c["ids"].dump();
    EXPECT_EQ(tk.decode(ids, true), c["text_skip_special"].get<std::string>()) << c["ids"].dump();
    for (bool skip : {false, true}) {
      StreamDecoder sd(tk, skip);
      std::string streamed;
      for (int32_t id : ids) {
        const std::string piece = sd.push(id);
        EXPECT_TRUE(utf8_valid(piece));  // never a partial UTF-8 sequence
        streamed += piece;
      }
      streamed += sd.finish();
      EXPECT_EQ(streamed, c[skip ? "text_skip_special" : "text"].get<std::string>());
    }
  }
}
TEST(HfTokenizers, Qwen3Decode) {
  hf_decode("qwen3");
}
TEST(HfTokenizers, SmallDecode) {
  hf_decode("small");
}

// ---------------------------------------------------------------------------------------------
// Chat templates

// tf::read_file's text, or "" (and a failure of the test) when the file cannot be read.
std::string read_text(const std::string& path) {
  Result<std::string> text = read_file(path);
  EXPECT_TRUE(text.is_ok()) << text.status().to_string();
  return text.is_ok() ? *text : std::string();
}

void compare_chats(const std::string& expected_path) {
  const ojson config = ojson::parse(read_text(kData + "/qwen3/tokenizer_config.json"));
  std::map<std::string, std::string> sources = {
      {"qwen3", config["chat_template"].get<std::string>()},
      {"qwen3_next_instruct", read_text(kData + "/templates/qwen3_next_instruct.jinja")},
      {"qwen3_next_thinking", read_text(kData + "/templates/qwen3_next_thinking.jinja")}};
  std::map<std::string, ChatTemplate> templates;
  for (const auto& [name, src] : sources) {
    auto ct = ChatTemplate::from_source(src, config);
    ASSERT_TRUE(ct) << name << ": " << ct.status().to_string();
    templates.emplace(name, std::move(ct).value());
  }
  const std::vector<ojson> cases = read_jsonl(kData + "/chats.jsonl");
  const std::vector<ojson> expected = read_jsonl(expected_path);
  ASSERT_EQ(expected.size(), cases.size() * templates.size());
  size_t renders = 0, errors = 0;
  for (const ojson& e : expected) {
    const ojson& c = cases.at(e["case"].get<size_t>());
    ChatOptions opt;
    opt.add_generation_prompt = c.value("add_generation_prompt", false);
    if (c.contains("enable_thinking")) opt.enable_thinking = c["enable_thinking"].get<bool>();
    auto r = templates.at(e["template"].get<std::string>())
                 .render(c["messages"], c.contains("tools") ? c["tools"] : ojson(nullptr), opt);
    const std::string where = e["template"].get<std::string>() + " case " + e["case"].dump() +
                              " (" + c["name"].get<std::string>() + ")";
    if (e.contains("error")) {
      EXPECT_FALSE(r) << where << ": Jinja2 raised " << e["error"].dump();
      ++errors;
      continue;
    }
    ASSERT_TRUE(r) << where << ": " << r.status().to_string();
    EXPECT_EQ(*r, e["text"].get<std::string>()) << where;
    ++renders;
  }
  EXPECT_GE(renders, 390u);
  EXPECT_GE(errors, 1u);
}

TEST(Jinja2, ChatRendersByteForByte) {
  compare_chats(kData + "/chats.expected.jsonl");
}

TEST(Jinja2, LiveChatRenders) {
  const char* path = std::getenv("TF_TOK_JINJA_EXPECTED");
  if (!path) GTEST_SKIP() << "run by live_reference.sh jinja";
  compare_chats(path);
}

TEST(ChatTemplate, LoadsFromTokenizerDirs) {
  const std::vector<ojson> cases = read_jsonl(kData + "/chats.jsonl");
  const std::vector<ojson> expected = read_jsonl(kData + "/chats.expected.jsonl");
  for (const std::string name : {"qwen3", "small"}) {
    auto ct = ChatTemplate::load(tokenizer_dir(name));
    ASSERT_TRUE(ct) << ct.status().to_string();
    EXPECT_EQ(ct->eos_token().value_or(""), "<|im_end|>");
    EXPECT_EQ(ct->pad_token().value_or(""), "<|endoftext|>");
    const Tokenizer& tk = tokenizer(name);
    for (size_t i = 0; i < cases.size(); ++i) {
      const ojson& e = expected[i];  // the qwen3 template's block comes first
      ASSERT_EQ(e["template"], "qwen3");
      if (e.contains("error")) continue;
      ChatOptions opt;
      opt.add_generation_prompt = cases[i].value("add_generation_prompt", false);
      if (cases[i].contains("enable_thinking"))
        opt.enable_thinking = cases[i]["enable_thinking"].get<bool>();
      ojson req = cases[i];
      req.erase("name");
      auto r = ct->render_request(req, opt);
      ASSERT_TRUE(r) << r.status().to_string();
      EXPECT_EQ(*r, e["text"].get<std::string>()) << name << " case " << i;
      // The prompt encodes with the ChatML tokens as single ids and decodes back exactly.
      auto ids = tk.encode(*r);
      ASSERT_TRUE(ids);
      EXPECT_EQ(tk.decode(*ids), *r);
      const int32_t im_start = tk.token_to_id("<|im_start|>").value();
      size_t n_im_start = 0;
      for (size_t p = r->find("<|im_start|>"); p != std::string::npos;
           p = r->find("<|im_start|>", p + 1))
        ++n_im_start;
      EXPECT_EQ(static_cast<size_t>(std::count(ids->begin(), ids->end(), im_start)), n_im_start);
    }
  }
}

}  // namespace
}  // namespace tf::tok
