#include "tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

namespace tf::tok {

std::optional<NormalForm> normalizer_form(std::string_view t) {
  if (t == "NFC") return NormalForm::kNFC;
  if (t == "NFD") return NormalForm::kNFD;
  if (t == "NFKC") return NormalForm::kNFKC;
  if (t == "NFKD") return NormalForm::kNFKD;
  return std::nullopt;
}

Result<Normalizer> Normalizer::create(NormalForm form) {
  UErrorCode ec = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case NormalForm::kNFC:
      n = icu::Normalizer2::getNFCInstance(ec);
      break;
    case NormalForm::kNFD:
      n = icu::Normalizer2::getNFDInstance(ec);
      break;
    case NormalForm::kNFKC:
      n = icu::Normalizer2::getNFKCInstance(ec);
      break;
    case NormalForm::kNFKD:
      n = icu::Normalizer2::getNFKDInstance(ec);
      break;
  }
  if (U_FAILURE(ec) || n == nullptr)
    return Status(StatusCode::kInternal, fmt::format("ICU normalizer: {}", u_errorName(ec)));
  return Normalizer(n);
}

Status Normalizer::apply(std::string_view in, std::string& out) const {
  out.clear();
  size_t i = 0;
  while (i < in.size() && static_cast<unsigned char>(in[i]) < 0x80) ++i;
  if (i == in.size()) {  // ASCII is invariant under every form
    out.assign(in);
    return Status::ok();
  }
  const auto* n = static_cast<const icu::Normalizer2*>(impl_);
  if (in.size() > static_cast<size_t>(INT32_MAX))
    return Status::out_of_range("text of {} bytes is too long to normalize", in.size());
  UErrorCode ec = U_ZERO_ERROR;
  const icu::StringPiece sp(in.data(), static_cast<int32_t>(in.size()));
  if (n->isNormalizedUTF8(sp, ec) && U_SUCCESS(ec)) {
    out.assign(in);
    return Status::ok();
  }
  ec = U_ZERO_ERROR;
  out.reserve(in.size() + in.size() / 4);
  icu::StringByteSink<std::string> sink(&out);
  n->normalizeUTF8(0, sp, sink, nullptr, ec);
  if (U_FAILURE(ec))
    return Status(StatusCode::kInternal, fmt::format("ICU normalize: {}", u_errorName(ec)));
  return Status::ok();
}

}  // namespace tf::tok
