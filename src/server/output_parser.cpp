#include "server/output_parser.h"

#include <algorithm>

namespace tf::server {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

// Length of the longest suffix of `s` that is a proper prefix of `pattern`.
size_t partial_suffix(std::string_view s, std::string_view pattern) {
  for (size_t n = std::min(s.size(), pattern.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == pattern.substr(0, n)) return n;
  }
  return 0;
}

size_t leading_newlines(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && (s[i] == '\n' || s[i] == '\r')) ++i;
  return i;
}

}  // namespace

OutputParser::OutputParser(std::vector<std::string> stops, bool parse_thinking,
                           bool starts_in_reasoning)
    : parse_thinking_(parse_thinking),
      mode_(!parse_thinking ? Mode::kContent
                            : (starts_in_reasoning ? Mode::kReasoning : Mode::kStart)) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

TextDelta OutputParser::push(std::string_view text) {
  TextDelta out;
  if (stopped_) return out;
  pending_ += text;
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    release(std::string_view(pending_).substr(0, first), &out);
    pending_.clear();
    split(true, &out);
    return out;
  }
  size_t hold = 0;
  for (const auto& s : stops_) hold = std::max(hold, partial_suffix(pending_, s));
  release(std::string_view(pending_).substr(0, pending_.size() - hold), &out);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

TextDelta OutputParser::finish() {
  TextDelta out;
  if (!stopped_) release(pending_, &out);
  pending_.clear();
  split(true, &out);
  return out;
}

void OutputParser::release(std::string_view text, TextDelta* out) {
  buf_ += text;
  split(false, out);
}

void OutputParser::split(bool final, TextDelta* out) {
  for (;;) {
    switch (mode_) {
      case Mode::kStart: {
        // Before any content: an opening tag (after optional whitespace) starts reasoning.
        const size_t ws = buf_.find_first_not_of(" \t\r\n");
        if (ws == std::string::npos) {
          if (final) buf_.clear();
          return;
        }
        const std::string_view rest = std::string_view(buf_).substr(ws);
        if (rest.substr(0, kOpen.size()) == kOpen) {
          buf_.erase(0, ws + kOpen.size());
          mode_ = Mode::kReasoning;
          continue;
        }
        if (!final && kOpen.substr(0, rest.size()) == rest) return;  // maybe a partial tag
        mode_ = Mode::kContent;
        continue;
      }
      case Mode::kReasoning: {
        if (!reasoning_started_) {  // drop the newlines right after <think>
          buf_.erase(0, leading_newlines(buf_));
          if (buf_.empty()) return;
          reasoning_started_ = true;
        }
        const size_t close = buf_.find(kClose);
        if (close != std::string::npos) {
          std::string r = buf_.substr(0, close);
          while (!r.empty() && (r.back() == '\n' || r.back() == '\r')) r.pop_back();
          out->reasoning += r;
          buf_.erase(0, close + kClose.size());
          mode_ = Mode::kContentStart;
          continue;
        }
        // Hold a partial closing tag and trailing newlines (they may precede </think>).
        size_t hold = final ? 0 : partial_suffix(buf_, kClose);
        if (!final) {
          while (hold < buf_.size() &&
                 (buf_[buf_.size() - hold - 1] == '\n' || buf_[buf_.size() - hold - 1] == '\r'))
            ++hold;
        }
        out->reasoning += buf_.substr(0, buf_.size() - hold);
        buf_.erase(0, buf_.size() - hold);
        return;
      }
      case Mode::kContentStart: {
        const size_t nl = leading_newlines(buf_);
        buf_.erase(0, nl);
        if (buf_.empty()) return;
        mode_ = Mode::kContent;
        continue;
      }
      case Mode::kContent:
        out->content += buf_;
        buf_.clear();
        return;
    }
  }
}

}  // namespace tf::server
