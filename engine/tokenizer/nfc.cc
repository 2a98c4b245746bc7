// The only file of the engine that includes ICU (Debian's libicu-dev): NFC for the
// `NFC` normalizer of tokenizer.json (Qwen2). ICU's tables (Unicode 15 in ICU 72) and the
// `unicode-normalization` crate that `tokenizers` uses agree on every assigned code point
// both know.
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include "engine/tokenizer/unicode.h"

namespace stemma::engine::tokenizer::internal {

std::string NfcNormalize(std::string_view text) {
  bool ascii = true;
  for (char c : text) ascii = ascii && static_cast<uint8_t>(c) < 0x80;
  if (ascii) return std::string(text);  // ASCII is always NFC

  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(err);
  if (U_FAILURE(err)) return ToValidUtf8(text);  // ICU data missing: a broken install
  const icu::UnicodeString in = icu::UnicodeString::fromUTF8(
      icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  if (nfc->isNormalized(in, err) && U_SUCCESS(err)) return ToValidUtf8(text);
  err = U_ZERO_ERROR;
  const icu::UnicodeString normalized = nfc->normalize(in, err);
  std::string out;
  if (U_FAILURE(err)) return ToValidUtf8(text);
  normalized.toUTF8String(out);
  return out;
}

}  // namespace stemma::engine::tokenizer::internal
