// The normalisation of every corpus string (docs/corpus.md § Normalisation), in order:
//   1. invalid UTF-8 drops the string;
//   2. Unicode NFC (ICU);
//   3. gettext accelerators removed: "(_F)" / "(&F)" after a label, "_" before a letter when
//      it is the string's only "_", "&" before a letter when it is the only such "&" and not
//      an entity ("&amp;"); "&&" becomes "&";
//   4. format directives (printf's "%s", "%-5.2f", "%1$s", "%<PRIu64>", Python's "%(name)s",
//      brace fields "{name}", "{0}", "{}", "{x:>8}", Qt's "%1") become `placeholder` ("" removes
//      them); "%%", "{{", "}}" become "%", "{", "}";
//   5. every run of whitespace and control characters becomes one space, and the ends are
//      trimmed;
//   6. the string is dropped when it then has fewer than min_chars code points, or no letter
//      outside its placeholders.
// The only file of engine/data that includes ICU. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace stemma::engine::data {

struct NormalizeOptions {
  std::string placeholder = "…";
  int64_t min_chars = 12;
};

enum class DropReason { kKept, kInvalidUtf8, kTooShort, kNoLetters };

struct NormalizedText {
  std::string text;  // empty unless kept
  DropReason reason = DropReason::kKept;
};

NormalizedText NormalizeCorpusText(std::string_view raw, const NormalizeOptions& options);

// The steps on their own (exposed for tests).
std::string Nfc(std::string_view utf8);
std::string StripAccelerators(std::string_view text);
std::string ReplaceFormatDirectives(std::string_view text, std::string_view placeholder);
std::string CollapseWhitespace(std::string_view text);
bool IsValidUtf8(std::string_view text);
int64_t CodePoints(std::string_view utf8);
bool HasLetter(std::string_view utf8);

}  // namespace stemma::engine::data
