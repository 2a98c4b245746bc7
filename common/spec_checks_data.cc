// Cross-field rules of `prepare` (common/spec_checks.h): unique language codes that can name
// files, exactly one base language, a source for every language, mixtures over known
// languages that have train text. Checked at submit and again in the engine; what only the
// machine that runs it can know (does the gettext root exist?) is checked by the engine.
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/spec_checks.h"

namespace stemma::spec_checks {
namespace {

// A code or mixture name becomes a file name: letters, digits, '_', '-', '@', '.' (not first).
bool FileNameSafe(const std::string& name) {
  if (name.empty() || name.size() > 64 || name[0] == '.') return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '@' || c == '.';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

absl::Status Check(const v1::PrepareSpec& spec, const SpecChecker& checker) {
  std::set<std::string> codes, held_out;
  int bases = 0;
  bool any_gettext = !spec.gettext().empty();
  for (int i = 0; i < spec.languages_size(); ++i) {
    const v1::CorpusLanguage& l = spec.languages(i);
    const std::string at = absl::StrCat("languages[", i, "]");
    if (!FileNameSafe(l.code())) {
      return checker.Error(
          at + ".code",
          absl::StrCat("'", l.code(), "' cannot name a file (letters, digits, _ - @ . only)"));
    }
    if (!codes.insert(l.code()).second) {
      return checker.Error(at + ".code", absl::StrCat("'", l.code(), "' is listed twice"));
    }
    if (l.role() == "base") ++bases;
    if (l.role() == "held_out") held_out.insert(l.code());
    const bool own = !l.gettext().empty() || l.text_size() > 0 || l.jsonl_size() > 0;
    any_gettext |= !l.gettext().empty();
    if (!own && spec.gettext().empty() && l.role() != "base") {
      return checker.Error(
          at + ".code",
          absl::StrCat(
              "language '", l.code(),
              "' has no source: set its gettext, text or jsonl, or the spec's gettext root"));
    }
    if (l.locales_size() > 0 && l.gettext().empty() && (own || spec.gettext().empty())) {
      return checker.Error(at + ".locales", "applies to a gettext source only");
    }
    for (int k = 0; k < l.locales_size(); ++k) {
      if (!FileNameSafe(l.locales(k))) {
        return checker.Error(absl::StrCat(at, ".locales[", k, "]"),
                             absl::StrCat("'", l.locales(k), "' is not a locale directory name"));
      }
    }
    for (int k = 0; k < l.jsonl_size(); ++k) {
      if (l.jsonl(k).has_field() && l.jsonl(k).field().empty()) {
        return checker.Error(absl::StrCat(at, ".jsonl[", k, "].field"), "is empty");
      }
    }
  }
  if (bases != 1) {
    return checker.Error(
        "languages",
        absl::StrCat("needs exactly one language with role base (English), found ", bases));
  }
  for (int i = 0; i < spec.languages_size(); ++i) {
    const v1::CorpusLanguage& l = spec.languages(i);
    if (l.role() == "base" && !any_gettext && l.text_size() == 0 && l.jsonl_size() == 0) {
      return checker.Error(
          absl::StrCat("languages[", i, "].code"),
          absl::StrCat(
              "base language '", l.code(),
              "' has no source: no gettext catalogue is read and it has no text or jsonl"));
    }
  }
  std::set<std::string> mixtures;
  for (int i = 0; i < spec.mixtures_size(); ++i) {
    const v1::CorpusMixture& m = spec.mixtures(i);
    const std::string at = absl::StrCat("mixtures[", i, "]");
    if (!FileNameSafe(m.name()))
      return checker.Error(at + ".name", absl::StrCat("'", m.name(), "' cannot name a file"));
    if (!mixtures.insert(m.name()).second)
      return checker.Error(at + ".name", absl::StrCat("'", m.name(), "' is listed twice"));
    std::set<std::string> seen;
    for (int k = 0; k < m.languages_size(); ++k) {
      const std::string& code = m.languages(k);
      const std::string field = absl::StrCat(at, ".languages[", k, "]");
      if (codes.count(code) == 0)
        return checker.Error(field, absl::StrCat("'", code, "' is not under languages"));
      if (held_out.count(code) > 0)
        return checker.Error(field, absl::StrCat("'", code, "' is held_out: it has no train text"));
      if (!seen.insert(code).second)
        return checker.Error(field, absl::StrCat("'", code, "' is listed twice"));
    }
  }
  return absl::OkStatus();
}

}  // namespace stemma::spec_checks
