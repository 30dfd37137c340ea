// Unicode normalization forms (tokenizer.json "normalizer": NFC, NFD, NFKC, NFKD), done by ICU
// directly on UTF-8. ASCII text is returned as is without calling ICU.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"

namespace tf::tok {

enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };
std::optional<NormalForm> normalizer_form(std::string_view hf_type);

class Normalizer {
 public:
  [[nodiscard]] static Result<Normalizer> create(NormalForm form);
  // out = normalize(in); `in` must be valid UTF-8.
  [[nodiscard]] Status apply(std::string_view in, std::string& out) const;

 private:
  explicit Normalizer(const void* impl) : impl_(impl) {}
  const void* impl_;  // const icu::Normalizer2*, a process-wide singleton owned by ICU
};

}  // namespace tf::tok
