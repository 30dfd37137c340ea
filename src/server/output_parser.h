// Turns the model's decoded text, piece by piece as it streams, into what a client sees:
//  1. stop strings: generation ends at the first occurrence of any, even across token boundaries,
//     and the stop text is not returned. Text that may be the start of a stop string is held back
//     until it is resolved, so streamed and non-streamed outputs are the same text.
//  2. thinking: `<think>...</think>` goes to reasoning and the rest to content (reasoning_format
//     "parsed"); leading newlines of each part and the newlines before `</think>` are dropped. With
//     reasoning_format "inline" everything is content, tags included.
// Invariant (tested): the concatenation of every push() and finish() equals one push() of the whole
// text followed by finish().
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tf::server {

struct TextDelta {
  std::string reasoning;
  std::string content;
  bool empty() const { return reasoning.empty() && content.empty(); }
  void append(const TextDelta& d) {
    reasoning += d.reasoning;
    content += d.content;
  }
};

class OutputParser {
 public:
  // starts_in_reasoning: the prompt ended inside an open <think> (e.g. a generation prompt of
  // "<|im_start|>assistant\n<think>\n"), so the output begins as reasoning without the tag.
  OutputParser(std::vector<std::string> stops, bool parse_thinking, bool starts_in_reasoning);

  TextDelta push(std::string_view text);
  // End of generation: releases everything held back (a partial stop string is real text then).
  TextDelta finish();
  bool stopped() const { return stopped_; }

 private:
  void release(std::string_view text, TextDelta* out);  // stop-free text into the think splitter
  void split(bool final, TextDelta* out);

  std::vector<std::string> stops_;
  bool parse_thinking_;
  bool stopped_ = false;
  std::string pending_;  // raw text that may begin a stop string
  enum class Mode { kStart, kReasoning, kContentStart, kContent } mode_;
  bool reasoning_started_ = false;
  std::string buf_;  // released text not yet given to a side (partial tags, held newlines)
};

}  // namespace tf::server
