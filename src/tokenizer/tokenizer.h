// The byte-level BPE tokenizer of the Qwen family, loaded from a Hugging Face tokenizer.json and
// equal to HF `tokenizers` on valid UTF-8 text:
//   text -> split on added tokens (longest match on the raw text; lstrip/rstrip/single_word
//   honoured)
//        -> normalizer (NFC/NFD/NFKC/NFKD or a Sequence of them; ICU)
//        -> pre-tokenizer (Split regexes, run by PCRE2 with UTF+UCP, and ByteLevel)
//        -> BPE merges by rank (lowest rank first, ties leftmost) -> ids.
// Decode maps ids to bytes (the ByteLevel decoder's rule, added tokens included) and converts the
// byte string as Rust's from_utf8_lossy does. StreamDecoder does the same incrementally.
//
// A Tokenizer is immutable after load() and cheap to copy (shared state); encode/decode may run
// on many threads at once (the BPE word cache is per thread).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace tf::tok {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;      // skipped by decode(skip_special=true)
  bool normalized = false;   // matched on the normalized text (true) or the raw text (false)
  bool lstrip = false;       // the match swallows whitespace on its left
  bool rstrip = false;       // ... and on its right
  bool single_word = false;  // matched only when not inside a word
};

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json. Errors name the file and the field.
  [[nodiscard]] static Result<Tokenizer> load(const std::string& dir);
  // Parses the text of a tokenizer.json; `source` names it in error messages.
  [[nodiscard]] static Result<Tokenizer> from_json(std::string_view json, std::string_view source);

  // Encodes without adding special tokens. Text that is not valid UTF-8 is an error (HF's API
  // takes str, which cannot hold such text).
  [[nodiscard]] Result<std::vector<int32_t>> encode(std::string_view text) const;
  // Appends to `ids`; `text` must be valid UTF-8 (checked by encode()).
  [[nodiscard]] Status encode_valid(std::string_view text, std::vector<int32_t>& ids) const;

  // HF decode: ids outside the vocabulary are skipped, as HF does; with skip_special the added
  // tokens marked special are dropped. Invalid UTF-8 from partial byte tokens becomes U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // One past the largest id (BPE vocabulary and added tokens).
  int32_t vocab_size() const;
  bool contains(int32_t id) const;
  bool is_special(int32_t id) const;
  // The bytes one token stands for in the decoded byte stream (what decode() concatenates).
  std::string_view token_bytes(int32_t id) const;
  // The token's string as stored in tokenizer.json (byte-level alphabet for BPE tokens).
  std::optional<std::string> id_to_token(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::vector<AddedToken>& added_tokens() const;

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Incremental decode for streaming (SSE): push ids as they are generated and get the text that is
// final so far. Bytes of an incomplete UTF-8 character are held until it completes; the
// concatenation of every push() and finish() equals Tokenizer::decode() of all the ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special) {}
  // Text that became final with this id (possibly empty).
  std::string push(int32_t id);
  // Flushes held bytes (an incomplete character becomes U+FFFD) and resets the decoder.
  std::string finish();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace tf::tok
