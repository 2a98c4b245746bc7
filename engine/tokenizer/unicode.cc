#include "engine/tokenizer/unicode.h"

#include <algorithm>
#include <array>

namespace stemma::engine::tokenizer::internal {
namespace {

// Classes of U+0000..U+00FF, looked up without a search (almost all text in a code base
// and most in European languages stays here).
std::array<CharClass, 256> MakeLatin1Classes() {
  std::array<CharClass, 256> table{};
  for (int i = 0; i < kNumCodePointRanges && kCodePointRanges[i].lo < 256; ++i) {
    const CodePointRange& r = kCodePointRanges[i];
    for (uint32_t cp = r.lo; cp <= r.hi && cp < 256; ++cp) table[cp] = r.cls;
  }
  return table;
}

}  // namespace

CharClass Classify(uint32_t cp) {
  static const std::array<CharClass, 256> kLatin1 = MakeLatin1Classes();
  if (cp < 256) return kLatin1[cp];
  const CodePointRange* end = kCodePointRanges + kNumCodePointRanges;
  // First range whose hi >= cp.
  const CodePointRange* it = std::lower_bound(
      kCodePointRanges, end, cp, [](const CodePointRange& r, uint32_t c) { return r.hi < c; });
  if (it != end && it->lo <= cp) return it->cls;
  return CharClass::kOther;
}

namespace {

// Length of the valid prefix of the sequence at text[pos] (Unicode's "maximal subpart"),
// and whether it is complete. Table 3-7 of the Unicode standard.
int ScanSequence(std::string_view text, size_t pos, bool* complete, uint32_t* cp) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t b0 = byte(pos);
  *complete = false;
  if (b0 < 0x80) {
    *complete = true;
    *cp = b0;
    return 1;
  }
  int need = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 1;  // 80..C1, F5..FF: never valid
  }
  uint32_t value = b0 & (0x3F >> need);
  int len = 1;
  for (int k = 0; k < need; ++k) {
    if (pos + len >= text.size()) return len;
    const uint8_t b = byte(pos + len);
    const uint8_t min = k == 0 ? lo : 0x80, max = k == 0 ? hi : 0xBF;
    if (b < min || b > max) return len;
    value = (value << 6) | (b & 0x3F);
    ++len;
  }
  *complete = true;
  *cp = value;
  return len;
}

}  // namespace

uint32_t DecodeUtf8At(std::string_view text, size_t pos, int* len) {
  bool complete = false;
  uint32_t cp = 0;
  const int n = ScanSequence(text, pos, &complete, &cp);
  if (!complete) {
    *len = 1;
    return 0xFFFD;
  }
  *len = n;
  return cp;
}

std::string ToValidUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    bool complete = false;
    uint32_t cp = 0;
    const int n = ScanSequence(bytes, pos, &complete, &cp);
    if (complete) {
      out.append(bytes.substr(pos, n));
    } else {
      AppendUtf8(0xFFFD, &out);
    }
    pos += n;
  }
  return out;
}

}  // namespace stemma::engine::tokenizer::internal
