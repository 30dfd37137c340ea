#include "tokenizer/utf8.h"

namespace tf::tok {
namespace {

// Valid range of the second byte for a lead byte (Table 3-7); the later bytes are 80..BF.
struct Lead {
  uint8_t len;
  uint8_t lo, hi;
};
constexpr Lead lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Number of bytes of s[i..] that form a valid prefix of a sequence, and the full length it needs.
// prefix == need means a complete sequence; prefix < need means invalid (or truncated at the end).
struct Scan {
  size_t prefix, need;
};
Scan scan(std::string_view s, size_t i) {
  const Lead l = lead_info(static_cast<uint8_t>(s[i]));
  if (l.len <= 1) return {l.len, 1};
  size_t k = 1;
  if (i + k < s.size()) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if (b >= l.lo && b <= l.hi) {
      ++k;
      while (k < l.len && i + k < s.size() && (static_cast<uint8_t>(s[i + k]) & 0xC0) == 0x80) ++k;
    }
  }
  return {k, l.len};
}

}  // namespace

size_t utf8_sequence_length(std::string_view s, size_t i) {
  const Scan r = scan(s, i);
  return r.prefix == r.need ? r.need : 0;
}

size_t utf8_find_invalid(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t len = utf8_sequence_length(s, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

char32_t utf8_next(std::string_view s, size_t& i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return s[i++];
  const size_t len = b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : 4;
  char32_t cp = b0 & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  i += len;
  return cp;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  return n;
}

size_t utf8_incomplete_tail(std::string_view s, size_t i) {
  const Scan r = scan(s, i);
  return (r.prefix < r.need && i + r.prefix == s.size()) ? r.prefix : 0;
}

size_t utf8_lossy_append(std::string& out, std::string_view bytes, bool final) {
  size_t i = 0;
  const size_t n = bytes.size();
  while (i < n) {
    size_t j = i;
    while (j < n && static_cast<uint8_t>(bytes[j]) < 0x80) ++j;
    out.append(bytes.data() + i, j - i);
    i = j;
    if (i >= n) break;
    const Scan r = scan(bytes, i);
    if (r.prefix == r.need) {
      out.append(bytes.data() + i, r.need);
      i += r.need;
      continue;
    }
    if (!final && i + r.prefix == n && r.prefix > 0) return i;  // may still complete
    utf8_append(out, kReplacementChar);
    i += r.prefix == 0 ? 1 : r.prefix;
  }
  return n;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  utf8_lossy_append(out, bytes, /*final=*/true);
  return out;
}

const std::array<char32_t, 256>& byte_to_unicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

int unicode_to_byte(char32_t cp) {
  static const std::array<int16_t, 324> inverse = [] {
    std::array<int16_t, 324> t{};
    t.fill(-1);
    const auto& fwd = byte_to_unicode();
    for (int b = 0; b < 256; ++b) t[fwd[b]] = static_cast<int16_t>(b);
    return t;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

}  // namespace tf::tok
