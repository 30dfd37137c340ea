// A pre-tokenizer regex run by PCRE2 (UTF + UCP, JIT-compiled). Patterns in tokenizer.json are
// written for Oniguruma, the engine of HF tokenizers; compile() translates the escapes whose
// meaning differs between the two engines (\s \S \h \H \w \W: e.g. PCRE2's \s also matches U+180E,
// Oniguruma's does not) into explicit Unicode classes, and leaves the rest of the pattern as is.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"

namespace tf::tok {

class RegexSplitter {
 public:
  [[nodiscard]] static Result<RegexSplitter> compile(std::string_view oniguruma_pattern);
  // A pattern matching `literal` exactly.
  static std::string quote(std::string_view literal);
  // The PCRE2 pattern actually compiled (after translation).
  const std::string& pcre2_pattern() const { return pattern_; }

  // Calls f(begin, end) for each successive non-overlapping match in `text` (valid UTF-8).
  template <typename F>
  [[nodiscard]] Status for_each_match(std::string_view text, F&& f) const {
    size_t offset = 0, b = 0, e = 0;
    while (offset <= text.size()) {
      TF_ASSIGN_OR_RETURN(bool found, next_match(text, offset, b, e));
      if (!found) break;
      if (e == b) {  // an empty match: step one character, as the engines do
        offset = e + 1;
        while (offset < text.size() && (static_cast<unsigned char>(text[offset]) & 0xC0) == 0x80)
          ++offset;
        continue;
      }
      f(b, e);
      offset = e;
    }
    return Status::ok();
  }

 private:
  Result<bool> next_match(std::string_view text, size_t offset, size_t& b, size_t& e) const;
  std::shared_ptr<void> code_;  // pcre2_code_8*
  std::string pattern_;
};

}  // namespace tf::tok
