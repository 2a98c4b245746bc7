// UTF-8 encoding of code points: the one encoder (the tokenizer's byte-level alphabet and
// the evaluation's text slices use it). Header-only, so that engine libraries which link
// nothing of common/ (the tokenizer) can use it. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace stemma {

// Appends the UTF-8 bytes of code point `cp` (1 to 4 bytes) to `out`. `cp` is not checked:
// a surrogate or a value past U+10FFFF is encoded as its bits say.
inline void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace stemma
