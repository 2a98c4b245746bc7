// UTF-8 and the three Unicode classes the pre-tokenizer patterns use (\p{L}, \p{N}, \s).
// Internal to engine/tokenizer/. No state; everything is thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/utf8.h"

namespace stemma::engine::tokenizer::internal {

enum class CharClass : uint8_t { kOther, kLetter, kNumber, kSpace };

// Sorted, non-overlapping ranges of code points that are not kOther (unicode_tables.cc,
// generated from the `tokenizers` package's Oniguruma tables by gen_unicode_tables.py).
struct CodePointRange {
  uint32_t lo;
  uint32_t hi;  // inclusive
  CharClass cls;
};
extern const CodePointRange kCodePointRanges[];
extern const int kNumCodePointRanges;

// \p{L} -> kLetter, \p{N} -> kNumber, \s (Unicode White_Space) -> kSpace, else kOther.
CharClass Classify(uint32_t cp);

// The code point at text[pos] and its length in bytes. A byte that does not start a valid
// UTF-8 sequence gives U+FFFD with length 1 (callers keep the byte itself).
uint32_t DecodeUtf8At(std::string_view text, size_t pos, int* len);

// The one UTF-8 encoder (common/utf8.h).
using ::stemma::AppendUtf8;

// `bytes` with every maximal invalid subsequence replaced by U+FFFD, as Rust's
// String::from_utf8_lossy and Python's bytes.decode("utf-8", "replace") do.
std::string ToValidUtf8(std::string_view bytes);

// NFC through ICU (nfc.cc is the only file that includes ICU). Invalid UTF-8 becomes U+FFFD.
std::string NfcNormalize(std::string_view text);

}  // namespace stemma::engine::tokenizer::internal
