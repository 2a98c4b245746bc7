#include "engine/data/corpus_text.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>

#include <vector>

namespace stemma::engine::data {
namespace {

// The code point at text[i] (advancing i), or -1 when the bytes are not UTF-8.
UChar32 Next(std::string_view text, size_t* i) {
  UChar32 c;
  int32_t at = static_cast<int32_t>(*i);
  U8_NEXT(reinterpret_cast<const uint8_t*>(text.data()), at, static_cast<int32_t>(text.size()), c);
  *i = static_cast<size_t>(at);
  return c;
}

UChar32 At(std::string_view text, size_t i) {
  if (i >= text.size()) return -1;
  return Next(text, &i);
}

bool IsAsciiAlnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// "&name;" or "&#123;" starting at text[i] ('&').
bool IsEntity(std::string_view text, size_t i) {
  size_t j = i + 1;
  if (j < text.size() && text[j] == '#') ++j;
  const size_t start = j;
  while (j < text.size() && IsAsciiAlnum(text[j]) && j - start < 10) ++j;
  return j > start && j < text.size() && text[j] == ';';
}

// Length of a printf conversion starting at text[i] ('%'), 0 when there is none.
size_t PrintfLength(std::string_view text, size_t i) {
  size_t j = i + 1;
  auto digits = [&] {
    const size_t s = j;
    while (j < text.size() && IsDigit(text[j])) ++j;
    return j > s;
  };
  // %<PRIu64> (a system-dependent directive as written in sources).
  if (j < text.size() && text[j] == '<') {
    const size_t close = text.find('>', j);
    if (close != std::string_view::npos && close - j <= 16) return close + 1 - i;
    return 0;
  }
  // Python's %(name)s.
  if (j < text.size() && text[j] == '(') {
    const size_t close = text.find(')', j);
    if (close == std::string_view::npos || close - j > 40) return 0;
    j = close + 1;
  } else {
    const size_t save = j;
    if (digits() && j < text.size() && text[j] == '$') {
      ++j;
    } else {
      j = save;
    }
  }
  while (j < text.size() && std::string_view("-+#0'I").find(text[j]) != std::string_view::npos) ++j;
  if (j < text.size() && text[j] == '*') {
    ++j;
    const size_t save = j;
    if (!(digits() && j < text.size() && text[j] == '$' && ++j)) j = save;
  } else {
    digits();
  }
  if (j < text.size() && text[j] == '.') {
    ++j;
    if (j < text.size() && text[j] == '*') {
      ++j;
    } else {
      digits();
    }
  }
  while (j < text.size() && std::string_view("hlLqjzZt").find(text[j]) != std::string_view::npos)
    ++j;
  if (j < text.size() &&
      std::string_view("diouxXeEfFgGaAcspnCSm").find(text[j]) != std::string_view::npos) {
    return j + 1 - i;
  }
  return 0;
}

// Length of a brace field "{name}", "{0}", "{}", "{x:>8}", "{0!r}" at text[i] ('{'), or 0.
size_t BraceLength(std::string_view text, size_t i) {
  size_t j = i + 1;
  while (j < text.size() && (IsAsciiAlnum(text[j]) || text[j] == '_' || text[j] == '.')) ++j;
  if (j < text.size() && (text[j] == ':' || text[j] == '!')) {
    while (j < text.size() && text[j] != '{' && text[j] != '}' && j - i <= 40) ++j;
  }
  if (j < text.size() && text[j] == '}' && j - i <= 40) return j + 1 - i;
  return 0;
}

}  // namespace

bool IsValidUtf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    if (Next(text, &i) < 0) return false;
  }
  return true;
}

int64_t CodePoints(std::string_view utf8) {
  int64_t n = 0;
  for (char c : utf8) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

bool HasLetter(std::string_view utf8) {
  for (size_t i = 0; i < utf8.size();) {
    const UChar32 c = Next(utf8, &i);
    if (c >= 0 && u_isalpha(c)) return true;
  }
  return false;
}

std::string Nfc(std::string_view text) {
  bool ascii = true;
  for (char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(text);
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(err);
  if (U_FAILURE(err)) return std::string(text);
  const icu::UnicodeString in = icu::UnicodeString::fromUTF8(
      icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  if (nfc->isNormalized(in, err) && U_SUCCESS(err)) return std::string(text);
  err = U_ZERO_ERROR;
  const icu::UnicodeString normalized = nfc->normalize(in, err);
  if (U_FAILURE(err)) return std::string(text);
  std::string out;
  normalized.toUTF8String(out);
  return out;
}

std::string StripAccelerators(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  // "(_F)" / "(&F)" as CJK and Indic translations mark an accelerator after the label.
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '(' && i + 3 < text.size() && (text[i + 1] == '_' || text[i + 1] == '&') &&
        IsAsciiAlnum(text[i + 2]) && text[i + 3] == ')') {
      while (!out.empty() && out.back() == ' ') out.pop_back();
      i += 3;
      continue;
    }
    out.push_back(text[i]);
  }
  // One '_' before a letter marks an accelerator; several are an identifier's.
  size_t underscores = 0;
  for (char c : out) underscores += c == '_' ? 1 : 0;
  size_t amp_letters = 0;
  for (size_t i = 0; i + 1 < out.size(); ++i) {
    if (out[i] == '&' && out[i + 1] == '&') {
      ++i;
    } else if (out[i] == '&' && !IsEntity(out, i)) {
      const UChar32 c = At(out, i + 1);
      amp_letters += c >= 0 && u_isalpha(c) ? 1 : 0;
    }
  }
  std::string result;
  result.reserve(out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    const char c = out[i];
    if (c == '_' && underscores == 1) {
      const UChar32 next = At(out, i + 1);
      if (next >= 0 && u_isalpha(next)) continue;
    }
    if (c == '&' && i + 1 < out.size() && out[i + 1] == '&') {
      result.push_back('&');
      ++i;
      continue;
    }
    if (c == '&' && amp_letters == 1 && !IsEntity(out, i)) {
      const UChar32 next = At(out, i + 1);
      if (next >= 0 && u_isalpha(next)) continue;
    }
    result.push_back(c);
  }
  return result;
}

std::string ReplaceFormatDirectives(std::string_view text, std::string_view placeholder) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '%') {
      if (i + 1 < text.size() && text[i + 1] == '%') {
        out.push_back('%');
        ++i;
        continue;
      }
      if (const size_t n = PrintfLength(text, i); n > 0) {
        out.append(placeholder);
        i += n - 1;
        continue;
      }
      // Qt / KDE positional "%1".."%99".
      if (i + 1 < text.size() && IsDigit(text[i + 1])) {
        size_t j = i + 1;
        while (j < text.size() && IsDigit(text[j]) && j - i <= 2) ++j;
        out.append(placeholder);
        i = j - 1;
        continue;
      }
    } else if (c == '{') {
      if (i + 1 < text.size() && text[i + 1] == '{') {
        out.push_back('{');
        ++i;
        continue;
      }
      if (const size_t n = BraceLength(text, i); n > 0) {
        out.append(placeholder);
        i += n - 1;
        continue;
      }
    } else if (c == '}' && i + 1 < text.size() && text[i + 1] == '}') {
      out.push_back('}');
      ++i;
      continue;
    }
    out.push_back(c);
  }
  return out;
}

std::string CollapseWhitespace(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool space = false;
  for (size_t i = 0; i < text.size();) {
    const size_t start = i;
    const UChar32 c = Next(text, &i);
    if (c < 0 || u_isUWhiteSpace(c) || u_iscntrl(c) || c == 0xFEFF || c == 0x200B) {
      space = true;
      continue;
    }
    if (space && !out.empty()) out.push_back(' ');
    space = false;
    out.append(text.substr(start, i - start));
  }
  return out;
}

NormalizedText NormalizeCorpusText(std::string_view raw, const NormalizeOptions& options) {
  NormalizedText result;
  if (!IsValidUtf8(raw)) {
    result.reason = DropReason::kInvalidUtf8;
    return result;
  }
  const std::string stripped = StripAccelerators(Nfc(raw));
  std::string text = CollapseWhitespace(ReplaceFormatDirectives(stripped, options.placeholder));
  if (CodePoints(text) < options.min_chars) {
    result.reason = DropReason::kTooShort;
    return result;
  }
  // Letters outside the placeholders (a placeholder may be made of letters).
  if (!HasLetter(options.placeholder.empty() ? text : ReplaceFormatDirectives(stripped, ""))) {
    result.reason = DropReason::kNoLetters;
    return result;
  }
  result.text = std::move(text);
  return result;
}

}  // namespace stemma::engine::data
