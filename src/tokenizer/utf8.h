// UTF-8 helpers shared by the tokenizer and the chat-template interpreter: validation, decoding,
// lossy conversion (one U+FFFD per maximal invalid subpart, as Rust's String::from_utf8_lossy and
// the WHATWG decoder), and the GPT-2 byte <-> unicode map of byte-level BPE vocabularies.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tf::tok {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Length of the well-formed UTF-8 sequence at s[i..], or 0 when it is invalid or truncated.
// Follows Unicode Table 3-7 (no overlongs, no surrogates, nothing above U+10FFFF).
size_t utf8_sequence_length(std::string_view s, size_t i);

// Byte offset of the first invalid byte, or npos when `s` is valid UTF-8.
size_t utf8_find_invalid(std::string_view s);
inline bool utf8_valid(std::string_view s) {
  return utf8_find_invalid(s) == std::string_view::npos;
}

// Decodes the code point at s[i] (which must start a valid sequence) and advances i.
char32_t utf8_next(std::string_view s, size_t& i);
void utf8_append(std::string& out, char32_t cp);
size_t utf8_length(std::string_view s);  // code points of valid UTF-8

// The longest prefix of s[i..] that is a valid-so-far but incomplete sequence (1..3 bytes), or 0.
// Used by the streaming decoder to hold bytes until a character completes.
size_t utf8_incomplete_tail(std::string_view s, size_t i);

// Lossy decode: invalid or truncated sequences become U+FFFD, one per maximal subpart.
std::string utf8_lossy(std::string_view bytes);
// Appends the lossy decode of `bytes`; when `final` is false, an incomplete sequence at the end is
// not emitted: its start offset is returned (bytes.size() when everything was emitted).
size_t utf8_lossy_append(std::string& out, std::string_view bytes, bool final);

// GPT-2 byte-level alphabet: byte b <-> code point byte_to_unicode()[b] (printable bytes map to
// themselves; the others to U+0100 + k, in byte order).
const std::array<char32_t, 256>& byte_to_unicode();
// Inverse map; -1 for code points outside the alphabet.
int unicode_to_byte(char32_t cp);

}  // namespace tf::tok
