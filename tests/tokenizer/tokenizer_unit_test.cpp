// Tokenizer building blocks (label unit): UTF-8, the byte-level map, the regex dialect, BPE merge
// order against a naive reference, added tokens, streaming decode, and load errors.
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/regex_split.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace tf::tok {
namespace {

using json = nlohmann::json;
const std::string kSmall = std::string(TF_TOK_DATA) + "/small";

TEST(Utf8, Validation) {
  EXPECT_TRUE(utf8_valid("plain ascii"));
  EXPECT_TRUE(utf8_valid("é中😀\U0010FFFF"));
  EXPECT_EQ(utf8_find_invalid("ab\xC0\x80"), 2u);         // overlong
  EXPECT_EQ(utf8_find_invalid("\xED\xA0\x80"), 0u);       // surrogate
  EXPECT_EQ(utf8_find_invalid("x\xF4\x90\x80\x80"), 1u);  // above U+10FFFF
  EXPECT_EQ(utf8_find_invalid("\xE2\x82"), 0u);           // truncated
  EXPECT_EQ(utf8_find_invalid("abcdefgh\xff"), 8u);
}

TEST(Utf8, LossyIsOneReplacementPerMaximalSubpart) {
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"
                       "A"),
            "\uFFFD"
            "A");
  EXPECT_EQ(utf8_lossy("\xE2\x82"), "\uFFFD");
  EXPECT_EQ(utf8_lossy("\xC0\x80"), "\uFFFD\uFFFD");
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(utf8_lossy("a\x80"
                       "b\xFF"),
            "a\uFFFD"
            "b\uFFFD");
}

TEST(ByteLevel, MapIsGpt2) {
  const auto& m = byte_to_unicode();
  EXPECT_EQ(m['A'], U'A');
  EXPECT_EQ(m[' '], U'\u0120');   // Ġ
  EXPECT_EQ(m['\n'], U'\u010A');  // Ċ
  EXPECT_EQ(m[0xAD], U'\u0143');
  for (int b = 0; b < 256; ++b) EXPECT_EQ(unicode_to_byte(m[b]), b);
  EXPECT_EQ(unicode_to_byte(U'\u4e00'), -1);
}

TEST(Regex, OnigurumaWhitespaceDialect) {
  auto re = RegexSplitter::compile(R"(\s+|\S+)");
  ASSERT_TRUE(re) << re.status().to_string();
  EXPECT_EQ(re->pcre2_pattern().find("\\s"), std::string::npos);
  auto pieces = [&](std::string_view s) {
    std::vector<std::string> out;
    EXPECT_TRUE(
        re->for_each_match(s, [&](size_t b, size_t e) { out.emplace_back(s.substr(b, e - b)); }));
    return out;
  };
  // U+0085 and U+3000 are whitespace for Oniguruma; U+180E and U+FEFF are not.
  EXPECT_EQ(pieces("a\u0085b").size(), 3u);
  EXPECT_EQ(pieces("a\u3000b").size(), 3u);
  EXPECT_EQ(pieces("a\u180Eb").size(), 1u);
  EXPECT_EQ(pieces("a\uFEFFb").size(), 1u);
  EXPECT_FALSE(RegexSplitter::compile("(unclosed"));
  EXPECT_FALSE(RegexSplitter::compile(R"([^\S])"));  // negated class escape inside a class
}

// A tokenizer.json with byte-level BPE over the whole text (no regex split), for merge tests.
std::string tiny_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges,
                           json added = json::array(), json normalizer = nullptr) {
  json vocab = json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8_append(s, byte_to_unicode()[b]);
    vocab[s] = id++;
  }
  json m = json::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = id++;
    m.push_back(a + " " + b);
  }
  json j = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", normalizer},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
  return j.dump();
}

// The textbook BPE: repeatedly merge the adjacent pair of lowest rank, leftmost first.
std::vector<std::string> naive_bpe(const std::string& text,
                                   const std::vector<std::pair<std::string, std::string>>& merges) {
  std::vector<std::string> sym;
  for (unsigned char c : text) {
    std::string s;
    utf8_append(s, byte_to_unicode()[c]);
    sym.push_back(s);
  }
  for (;;) {
    size_t best_rank = SIZE_MAX, best = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i)
      for (size_t r = 0; r < merges.size() && r < best_rank; ++r)
        if (merges[r].first == sym[i] && merges[r].second == sym[i + 1]) best_rank = r, best = i;
    if (best_rank == SIZE_MAX) return sym;
    sym[best] += sym[best + 1];
    sym.erase(sym.begin() + best + 1);
  }
}

TEST(Bpe, MergeOrderMatchesNaiveReferenceShortAndLong) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 30; ++trial) {
    // Random merges over the alphabet {a, b, c}, each built from existing symbols.
    std::vector<std::string> syms = {"a", "b", "c"};
    std::vector<std::pair<std::string, std::string>> merges;
    for (int k = 0; k < 25; ++k) {
      const std::string x = syms[rng() % syms.size()], y = syms[rng() % syms.size()];
      if (std::find(merges.begin(), merges.end(), std::make_pair(x, y)) != merges.end()) continue;
      merges.emplace_back(x, y);
      if (std::find(syms.begin(), syms.end(), x + y) == syms.end()) syms.push_back(x + y);
    }
    auto tk = Tokenizer::from_json(tiny_tokenizer(merges), "tiny");
    ASSERT_TRUE(tk) << tk.status().to_string();
    for (size_t len : {1u, 2u, 7u, 40u, 127u, 128u, 129u, 300u}) {
      std::string text;
      for (size_t i = 0; i < len; ++i) text += "abc"[rng() % 3];
      auto ids = tk->encode(text);
      ASSERT_TRUE(ids);
      std::vector<std::string> got;
      for (int32_t id : *ids) got.push_back(tk->id_to_token(id).value());
      EXPECT_EQ(got, naive_bpe(text, merges)) << text;
      EXPECT_EQ(tk->decode(*ids), text);
    }
  }
}

TEST(Tokenizer, SmallQwenStyle) {
  auto tk = Tokenizer::load(kSmall);
  ASSERT_TRUE(tk) << tk.status().to_string();
  EXPECT_EQ(tk->vocab_size(), 6009);
  const int32_t im_start = tk->token_to_id("<|im_start|>").value();
  const int32_t think = tk->token_to_id("<think>").value();
  EXPECT_TRUE(tk->is_special(im_start));
  EXPECT_FALSE(tk->is_special(think));
  auto ids = tk->encode("<|im_start|>user\nHello<think>x</think><|im_start");
  ASSERT_TRUE(ids);
  EXPECT_EQ(ids->front(), im_start);
  EXPECT_EQ(std::count(ids->begin(), ids->end(), im_start), 1);
  EXPECT_EQ(std::count(ids->begin(), ids->end(), think), 1);
  EXPECT_EQ(tk->decode(*ids), "<|im_start|>user\nHello<think>x</think><|im_start");
  EXPECT_EQ(tk->decode(*ids, /*skip_special=*/true), "user\nHello<think>x</think><|im_start");
  // NFC: a decomposed é encodes like the composed one.
  EXPECT_EQ(tk->encode("caf\u0065\u0301").value(), tk->encode("caf\u00e9").value());
  // Unknown ids are skipped by decode, as HF does.
  const std::vector<int32_t> with_unknown = {-1, 999999, ids->front()};
  EXPECT_EQ(tk->decode(with_unknown), "<|im_start|>");
}

TEST(Tokenizer, InvalidUtf8IsAnError) {
  auto tk = Tokenizer::load(kSmall);
  ASSERT_TRUE(tk);
  auto r = tk->encode("ok\xC3");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("byte 2"), std::string::npos);
}

TEST(Tokenizer, AddedTokenStripFlags) {
  const json added = json::array(
      {{{"id", 300}, {"content", "<x>"}, {"special", true}, {"lstrip", true}, {"rstrip", true}},
       {{"id", 301}, {"content", "<xy>"}, {"special", false}, {"normalized", false}}});
  auto tk = Tokenizer::from_json(tiny_tokenizer({}, added), "tiny");
  ASSERT_TRUE(tk) << tk.status().to_string();
  // Byte b has id b here. lstrip/rstrip make <x> swallow the spaces around it.
  EXPECT_EQ(tk->encode("a  <x>  b<xy>").value(), (std::vector<int32_t>{'a', 300, 'b', 301}));
  EXPECT_EQ(tk->encode("<x><xy").value(), (std::vector<int32_t>{300, '<', 'x', 'y'}));
}

TEST(StreamDecoder, HoldsPartialCharacters) {
  auto tk = Tokenizer::from_json(tiny_tokenizer({}), "tiny");
  ASSERT_TRUE(tk);
  auto byte_id = [&](unsigned char b) {
    std::string s;
    utf8_append(s, byte_to_unicode()[b]);
    return tk->token_to_id(s).value();
  };
  StreamDecoder sd(*tk);
  EXPECT_EQ(sd.push(byte_id(0xF0)), "");
  EXPECT_EQ(sd.push(byte_id(0x9F)), "");
  EXPECT_EQ(sd.push(byte_id(0x98)), "");
  EXPECT_EQ(sd.pending_bytes(), 3u);
  EXPECT_EQ(sd.push(byte_id(0x80)), "😀");
  EXPECT_EQ(sd.push(byte_id(0xC3)), "");
  EXPECT_EQ(sd.push(byte_id('x')), "\uFFFDx");  // the held byte can no longer complete
  EXPECT_EQ(sd.push(byte_id(0xE2)), "");
  EXPECT_EQ(sd.finish(), "\uFFFD");
  EXPECT_EQ(sd.pending_bytes(), 0u);
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(Tokenizer, LoadErrorsAreClear) {
  auto missing = Tokenizer::load("/nonexistent/dir");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/dir/tokenizer.json"), std::string::npos);

  const auto dir =
      std::filesystem::temp_directory_path() / ("tf_tok_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "tokenizer.json").string();
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{not json", "not valid JSON"},
      {"[]", "top level"},
      {R"({"pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"}})", "model"},
      {R"({"pre_tokenizer": {"type": "Whitespace"}})", "Whitespace"},
      {R"({"normalizer": {"type": "Lowercase"}})", "Lowercase"},
      {R"({"pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
           "model": {"type": "Unigram", "vocab": []}})",
       "Unigram"},
      {R"({"pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})",
       "missing from the vocab"},
      {R"({"pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "vocab": {"a": -3}, "merges": []}})",
       "non-negative"},
      {R"({"pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "vocab": {"a": 100000000}, "merges": []}})",
       "dense"},
      {R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(a"}}, "decoder": {"type": "ByteLevel"}})",
       "regex"},
  };
  for (const auto& [text, needle] : bad) {
    write(path, text);
    auto t = Tokenizer::load(dir.string());
    ASSERT_FALSE(t) << text;
    EXPECT_NE(t.status().message().find(needle), std::string::npos) << t.status().to_string();
    EXPECT_NE(t.status().message().find("tokenizer.json"), std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tf::tok
