#include <random>

#include <gtest/gtest.h>

#include "server/openai_api.h"
#include "server/output_parser.h"

namespace tf::server {
namespace {

TextDelta whole(const std::string& text, std::vector<std::string> stops, bool think,
                bool in_reasoning) {
  OutputParser p(std::move(stops), think, in_reasoning);
  TextDelta d = p.push(text);
  d.append(p.finish());
  return d;
}

// Any split of the text into pieces gives the same result as one piece: streamed == non-streamed.
// (Checked to fail by dropping the stop-string hold-back: a stop split across pieces leaks.)
TEST(OutputParser, StreamingEqualsWhole) {
  const std::vector<std::string> texts = {
      "<think>\nAdd the ones.\n</think>\n\nThe answer is 47.\nUser: more",
      "\n<think>\n\n</think>\n\nDirect answer. STOP here",
      "Plain text with a < sign and </thin and <think not a tag",
      "no stop at all",
  };
  std::mt19937 rng(7);
  for (const auto& t : texts) {
    for (bool think : {true, false}) {
      const std::vector<std::string> stops = {"User:", "STOP", "</thin"};
      const TextDelta want = whole(t, stops, think, false);
      for (int trial = 0; trial < 200; ++trial) {
        OutputParser p(stops, think, false);
        TextDelta got;
        size_t i = 0;
        while (i < t.size()) {
          const size_t n = 1 + rng() % 5;
          got.append(p.push(t.substr(i, n)));
          i += n;
        }
        got.append(p.finish());
        ASSERT_EQ(got.content, want.content) << t;
        ASSERT_EQ(got.reasoning, want.reasoning) << t;
      }
    }
  }
}

TEST(OutputParser, SplitsThinkingAndStops) {
  TextDelta d = whole("<think>\nstep 1\nstep 2\n</think>\n\n47", {}, true, false);
  EXPECT_EQ(d.reasoning, "step 1\nstep 2");
  EXPECT_EQ(d.content, "47");
  d = whole("<think>\nx\n</think>\n\n47", {}, false, false);  // inline
  EXPECT_EQ(d.content, "<think>\nx\n</think>\n\n47");
  d = whole("reasoning first</think>\n\nanswer", {}, true, /*starts_in_reasoning=*/true);
  EXPECT_EQ(d.reasoning, "reasoning first");
  EXPECT_EQ(d.content, "answer");
  OutputParser p({"lo w"}, false, false);
  d = p.push("hel");
  d.append(p.push("lo"));
  EXPECT_EQ(d.content, "hel");  // "lo" might start "lo w": held back
  d.append(p.push(" wor"));
  EXPECT_TRUE(p.stopped());
  EXPECT_EQ(d.content, "hel");
  EXPECT_TRUE(p.push("ld").empty());
}

TEST(OpenAiApi, ParsesAndValidates) {
  auto r =
      parse_request(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
      {"type": "text", "text": "b"}]}], "temperature": 0, "stop": "x", "max_completion_tokens": 5,
      "chat_template_kwargs": {"enable_thinking": false}, "seed": 3})",
                    true);
  ASSERT_TRUE(std::holds_alternative<ApiRequest>(r));
  const ApiRequest& a = std::get<ApiRequest>(r);
  EXPECT_EQ(a.messages[0]["content"], "ab");
  EXPECT_EQ(a.max_tokens, 5);
  EXPECT_EQ(a.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(a.enable_thinking, false);
  EXPECT_TRUE(a.seeded);
  for (const char* bad : {R"({"messages": [{"role": "user"}], "top_p": 0})", R"([])",
                          R"({"messages": [{"role": "user", "content": 3}]})",
                          R"({"messages": [{"role": "user", "content": "x"}], "stream": "yes"})"}) {
    auto e = parse_request(bad, true);
    ASSERT_TRUE(std::holds_alternative<ApiError>(e)) << bad;
    EXPECT_EQ(std::get<ApiError>(e).status, 400);
  }
  EXPECT_TRUE(std::holds_alternative<ApiError>(parse_request(R"({"prompt": ""})", false)));
  EXPECT_TRUE(std::holds_alternative<ApiRequest>(parse_request(R"({"prompt": [1, 2]})", false)));
  // Deep nesting is refused before parsing (copying such a value would recurse off the stack); a
  // bracket inside a string does not count.
  const std::string deep = "{\"prompt\": " + std::string(5000, '[') + std::string(5000, ']') + "}";
  EXPECT_TRUE(std::holds_alternative<ApiError>(parse_request(deep, false)));
  const std::string in_string = "{\"prompt\": \"" + std::string(5000, '[') + "\"}";
  EXPECT_TRUE(std::holds_alternative<ApiRequest>(parse_request(in_string, false)));
}

}  // namespace
}  // namespace tf::server
