#include "engine/tokenizer/pretokenizer.h"

#include <cstdint>

#include "engine/tokenizer/unicode.h"

namespace stemma::engine::tokenizer::internal {
namespace {

constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The text decoded once: code points, their classes and byte offsets (offset[n] = size).
struct Chars {
  std::vector<uint32_t> cp;
  std::vector<CharClass> cls;
  std::vector<size_t> offset;
  size_t size() const { return cp.size(); }
};

Chars Decode(std::string_view text) {
  Chars c;
  c.cp.reserve(text.size());
  c.cls.reserve(text.size());
  c.offset.reserve(text.size() + 1);
  size_t pos = 0;
  while (pos < text.size()) {
    int len = 1;
    const uint32_t cp = DecodeUtf8At(text, pos, &len);
    c.cp.push_back(cp);
    c.cls.push_back(Classify(cp));
    c.offset.push_back(pos);
    pos += len;
  }
  c.offset.push_back(text.size());
  return c;
}

bool IsCrLf(uint32_t cp) { return cp == '\r' || cp == '\n'; }

// Simple case folding of the letters the contraction alternatives use: ASCII, and U+017F
// (long s), which Oniguruma's (?i) folds to 's'.
uint32_t Fold(uint32_t cp, bool ignore_case) {
  if (!ignore_case) return cp;
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp == 0x17F) return 's';
  return cp;
}

// 's|'t|'re|'ve|'m|'ll|'d at i: the match length in code points, or 0.
size_t MatchContraction(const Chars& c, size_t i, bool ignore_case) {
  const size_t n = c.size();
  if (c.cp[i] != '\'' || i + 1 >= n) return 0;
  const uint32_t a = Fold(c.cp[i + 1], ignore_case);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= n) return 0;
  const uint32_t b = Fold(c.cp[i + 2], ignore_case);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

size_t RunEnd(const Chars& c, size_t i, CharClass cls) {
  while (i < c.size() && c.cls[i] == cls) ++i;
  return i;
}

// \s*[\r\n]+ | \s+(?!\S) | \s+ at i (c.cls[i] == kSpace). `crlf_alternative` adds the first.
size_t MatchSpaces(const Chars& c, size_t i, bool crlf_alternative) {
  const size_t end = RunEnd(c, i, CharClass::kSpace);
  if (crlf_alternative) {
    // \s* backtracks from the end of the run to the last \r or \n; [\r\n]+ takes it and stops
    // there (what follows it inside the run is other whitespace).
    for (size_t k = end; k > i; --k) {
      if (IsCrLf(c.cp[k - 1])) return k - i;
    }
  }
  // \s+(?!\S): the whole run at the end of the text; otherwise all but its last character,
  // which must then stay for the next piece (" word").
  if (end == c.size() || end - i == 1) return end - i;
  return end - 1 - i;
}

// One match at i for the Llama-3 (max_digits 3) or Qwen2 (max_digits 1) pattern.
size_t MatchLlama3(const Chars& c, size_t i, size_t max_digits) {
  const size_t n = c.size();
  if (size_t len = MatchContraction(c, i, /*ignore_case=*/true)) return len;
  const CharClass cls = c.cls[i];
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (cls == CharClass::kLetter) return RunEnd(c, i, CharClass::kLetter) - i;
  if (cls != CharClass::kNumber && !IsCrLf(c.cp[i]) && i + 1 < n &&
      c.cls[i + 1] == CharClass::kLetter) {
    return RunEnd(c, i + 1, CharClass::kLetter) - i;
  }
  // \p{N}{1,3}
  if (cls == CharClass::kNumber) {
    size_t k = i;
    while (k < n && k - i < max_digits && c.cls[k] == CharClass::kNumber) ++k;
    return k - i;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  size_t start = i;
  if (c.cp[i] == ' ' && i + 1 < n && c.cls[i + 1] == CharClass::kOther) start = i + 1;
  if (c.cls[start] == CharClass::kOther) {
    size_t k = RunEnd(c, start, CharClass::kOther);
    while (k < n && IsCrLf(c.cp[k])) ++k;
    return k - i;
  }
  return MatchSpaces(c, i, /*crlf_alternative=*/true);
}

size_t MatchGpt2(const Chars& c, size_t i) {
  const size_t n = c.size();
  if (size_t len = MatchContraction(c, i, /*ignore_case=*/false)) return len;
  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': the class after an optional space.
  const bool space = c.cp[i] == ' ' && i + 1 < n && c.cls[i + 1] != CharClass::kSpace;
  const size_t start = space ? i + 1 : i;
  if (c.cls[start] != CharClass::kSpace) return RunEnd(c, start, c.cls[start]) - i;
  return MatchSpaces(c, i, /*crlf_alternative=*/false);
}

}  // namespace

std::optional<SplitPattern> SplitPatternFromRegex(std::string_view regex) {
  if (regex == kLlama3Regex) return SplitPattern::kLlama3;
  if (regex == kQwen2Regex) return SplitPattern::kQwen2;
  if (regex == kGpt2Regex) return SplitPattern::kGpt2;
  return std::nullopt;
}

std::vector<std::string_view> SplitText(std::string_view text, SplitPattern pattern) {
  const Chars c = Decode(text);
  std::vector<std::string_view> pieces;
  size_t i = 0;
  while (i < c.size()) {
    size_t len = 0;
    switch (pattern) {
      case SplitPattern::kLlama3:
        len = MatchLlama3(c, i, 3);
        break;
      case SplitPattern::kQwen2:
        len = MatchLlama3(c, i, 1);
        break;
      case SplitPattern::kGpt2:
        len = MatchGpt2(c, i);
        break;
    }
    if (len == 0) len = 1;  // unreachable: every class is matched by some alternative
    pieces.push_back(text.substr(c.offset[i], c.offset[i + len] - c.offset[i]));
    i += len;
  }
  return pieces;
}

}  // namespace stemma::engine::tokenizer::internal
