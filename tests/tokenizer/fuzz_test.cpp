// Bounded-time fuzzing (label unit): random and mutated inputs to encode, decode, the streaming
// decoder and the template parser/renderer. Properties: no crash, errors only as Status, and for
// valid text NFC(decode(encode(x))) == NFC(x). TF_FUZZ_SECONDS overrides the time per target
// (default 2).
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace tf::tok {
namespace {

double fuzz_seconds() {
  const char* s = std::getenv("TF_FUZZ_SECONDS");
  return s ? std::atof(s) : 2.0;
}

template <typename F>
size_t for_duration(F&& f) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(fuzz_seconds());
  size_t n = 0;
  while (std::chrono::steady_clock::now() < end) f(n++);
  return n;
}

std::vector<std::string> seeds() {
  std::vector<std::string> out;
  std::ifstream in(std::string(TF_TOK_DATA) + "/corpus.jsonl");
  std::string line;
  for (int i = 0; std::getline(in, line); ++i)
    if (i % 13 == 0) out.push_back(nlohmann::json::parse(line).get<std::string>());
  return out;
}

std::string mutate(std::string s, std::mt19937& rng) {
  static const std::vector<std::string> pieces = {
      "<|im_start|>", "<|im_end|>", "<think>", "</tool_call>", "<|",     "\xC3", "\xE2\x82",
      "\xF0\x9F",     "\x80",       "\xFF",    "\u0301",       "\u200d", "\r\n", "   ",
      "'s",           "😀",          "\u0085",  "\uFEFF",       "１２"};
  const int n = 1 + static_cast<int>(rng() % 4);
  for (int k = 0; k < n; ++k) {
    const size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 4) {
      case 0:
        s.insert(pos, pieces[rng() % pieces.size()]);
        break;
      case 1:
        if (!s.empty()) s.erase(pos == s.size() ? pos - 1 : pos, 1 + rng() % 3);
        break;
      case 2:
        s.insert(pos, 1, static_cast<char>(rng() & 0xFF));
        break;
      default:
        s += s.substr(0, std::min<size_t>(s.size(), 40));
    }
  }
  return s;
}

TEST(Fuzz, EncodeDecodeRoundTrip) {
  auto tk = Tokenizer::load(std::string(TF_TOK_DATA) + "/small");
  ASSERT_TRUE(tk);
  auto nfc = Normalizer::create(NormalForm::kNFC);
  ASSERT_TRUE(nfc);
  const auto base = seeds();
  std::mt19937 rng(1234);
  size_t valid = 0;
  const size_t n = for_duration([&](size_t) {
    const std::string text = mutate(base[rng() % base.size()], rng);
    auto ids = tk->encode(text);
    if (!utf8_valid(text)) {
      ASSERT_FALSE(ids);
      EXPECT_EQ(ids.status().code(), StatusCode::kInvalidArgument);
      return;
    }
    ASSERT_TRUE(ids) << ids.status().to_string();
    // Added tokens are split off before normalization (as HF does), so a combining mark right
    // after one does not compose with it: the round trip equals x up to NFC.
    std::string want, got;
    ASSERT_TRUE(nfc->apply(text, want));
    ASSERT_TRUE(nfc->apply(tk->decode(*ids), got));
    ASSERT_EQ(got, want) << nlohmann::json(text).dump();
    ++valid;
  });
  EXPECT_GT(n, 50u);
  EXPECT_GT(valid, 10u);
}

TEST(Fuzz, DecodeRandomIds) {
  auto tk = Tokenizer::load(std::string(TF_TOK_DATA) + "/small");
  ASSERT_TRUE(tk);
  std::mt19937 rng(99);
  for_duration([&](size_t) {
    std::vector<int32_t> ids(rng() % 20);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % (tk->vocab_size() + 20)) - 10;
    const bool skip = rng() & 1;
    const std::string text = tk->decode(ids, skip);
    ASSERT_TRUE(utf8_valid(text));
    StreamDecoder sd(*tk, skip);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = sd.push(id);
      ASSERT_TRUE(utf8_valid(piece));
      streamed += piece;
    }
    streamed += sd.finish();
    ASSERT_EQ(streamed, text);
  });
}

TEST(Fuzz, TemplateParseAndRender) {
  std::ifstream in(std::string(TF_TOK_DATA) + "/qwen3/tokenizer_config.json");
  const auto config = nlohmann::ordered_json::parse(in);
  const std::string src = config["chat_template"];
  const auto messages = nlohmann::ordered_json::parse(
      R"([{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
          {"role": "assistant", "content": "<think>r</think>a", "tool_calls": [{"function": {"name": "f", "arguments": {"x": [1, 2.5]}}}]},
          {"role": "tool", "content": "t"}])");
  static const std::vector<std::string> pieces = {
      "{{", "}}", "{%", "%}",   "{#",    "#}",    "-",  "'",     "\"",   "(",    ")",   "[",
      "]",  "|",  ".",  " if ", " for ", "endif", "\n", "loop.", "\xff", "not ", " in "};
  std::mt19937 rng(7);
  for_duration([&](size_t) {
    std::string s = src;
    for (int k = 0, n = 1 + static_cast<int>(rng() % 3); k < n; ++k) {
      const size_t pos = rng() % (s.size() + 1);
      if (rng() % 2) {
        s.insert(pos, pieces[rng() % pieces.size()]);
      } else if (pos < s.size()) {
        s.erase(pos, 1 + rng() % 8);
      }
    }
    auto ct = ChatTemplate::from_source(s, config);
    if (!ct) return;  // a clear parse error is fine
    ChatOptions opt;
    opt.add_generation_prompt = rng() & 1;
    auto r = ct->render(messages, nullptr, opt);
    if (r) {
      EXPECT_TRUE(utf8_valid(*r));
    }
  });
}

}  // namespace
}  // namespace tf::tok
