#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex_split.h"

#include <pcre2.h>

namespace tf::tok {
namespace {

// Oniguruma's Unicode meaning of the class escapes (doc/RE of Oniguruma 6.9):
//   \s  U+0009-U+000D, U+0085, General_Category Zs/Zl/Zp
//   \w  General_Category L, M, N, Pc
//   \h  hexadecimal digit
constexpr std::string_view kSpaceItems = R"(\t-\r\x{85}\p{Z})";
constexpr std::string_view kWordItems = R"(\p{L}\p{M}\p{N}\p{Pc})";
constexpr std::string_view kHexItems = "0-9a-fA-F";

Result<std::string> translate(std::string_view p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      std::string_view items;
      bool negated = false;
      switch (e) {
        case 's':
        case 'S':
          items = kSpaceItems, negated = e == 'S';
          break;
        case 'w':
        case 'W':
          items = kWordItems, negated = e == 'W';
          break;
        case 'h':
        case 'H':
          items = kHexItems, negated = e == 'H';
          break;
        default:
          break;
      }
      if (items.empty()) {
        out += c;
        out += e;
        ++i;
        continue;
      }
      if (in_class) {
        if (negated)
          return Status::unsupported("regex: \\{} inside a character class is not supported", e);
        out += items;
      } else {
        out += negated ? "[^" : "[";
        out += items;
        out += ']';
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      const size_t end = p.find(":]", i + 2);  // POSIX class [:alpha:] stays as is
      if (end != std::string_view::npos) {
        out += p.substr(i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

struct ThreadMatchState {
  pcre2_match_context* mcontext = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  pcre2_match_data* md = nullptr;
  ThreadMatchState() {
    mcontext = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    if (mcontext && jit_stack) pcre2_jit_stack_assign(mcontext, nullptr, jit_stack);
    md = pcre2_match_data_create(1, nullptr);
  }
  ~ThreadMatchState() {
    pcre2_match_data_free(md);
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(mcontext);
  }
};
thread_local ThreadMatchState t_match;

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

std::string RegexSplitter::quote(std::string_view literal) {
  return "\\Q" + std::string(literal) + "\\E";
}

Result<RegexSplitter> RegexSplitter::compile(std::string_view oniguruma_pattern) {
  TF_ASSIGN_OR_RETURN(std::string pat, translate(oniguruma_pattern));
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  if (code == nullptr)
    return Status::invalid("cannot compile /{}/ at offset {}: {}", pat, err_off,
                           pcre2_message(err));
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when unavailable
  RegexSplitter r;
  r.code_ =
      std::shared_ptr<void>(code, [](void* c) { pcre2_code_free(static_cast<pcre2_code*>(c)); });
  r.pattern_ = std::move(pat);
  return r;
}

Result<bool> RegexSplitter::next_match(std::string_view text, size_t offset, size_t& b,
                                       size_t& e) const {
  ThreadMatchState& st = t_match;
  if (st.md == nullptr || st.mcontext == nullptr)
    return Status(StatusCode::kResourceExhausted, "regex: out of memory");
  auto* code = static_cast<const pcre2_code*>(code_.get());
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc =
      pcre2_jit_match(code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, st.md, st.mcontext);
  if (rc == PCRE2_ERROR_JIT_BADOPTION || rc == PCRE2_ERROR_JIT_STACKLIMIT)  // no JIT, or too deep
    rc = pcre2_match(code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, st.md, st.mcontext);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) return Status(StatusCode::kResourceExhausted, "regex: " + pcre2_message(rc));
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
  b = ov[0];
  e = ov[1];
  return true;
}

}  // namespace tf::tok
