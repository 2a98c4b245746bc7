// GNU gettext .mo catalogues (the binary files under /usr/share/locale/<lang>/LC_MESSAGES),
// read without gettext's tools: the header (magic 0x950412de in either byte order, revision
// 0 or 1), the two string tables, every offset checked against the file size.
//
// What a catalogue gives the corpus (docs/corpus.md § gettext): one (msgid, msgstr) pair per
// translated entry. The header entry (empty msgid) is skipped but its charset is read; a
// context (`msgctxt` + '\x04' + msgid) is cut off; of plural entries (forms separated by
// '\0') the first form of each side is kept; entries whose msgstr is empty or equal to the
// msgid are untranslated and skipped. System-dependent strings (revision 1's extra tables,
// e.g. "%<PRIu64>") are not read.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace stemma::engine::data {

struct MoEntry {
  std::string msgid;   // English (the catalogue's source strings), context removed
  std::string msgstr;  // the translation, first plural form
};

struct MoCatalogue {
  std::vector<MoEntry> entries;  // in the file's (sorted by msgid) order
  std::string charset;           // from the header's Content-Type; "" when it names none
  bool big_endian = false;
  int64_t strings = 0;       // entries in the file, header included
  int64_t untranslated = 0;  // skipped: msgstr empty or equal to msgid
};

// Parses a whole .mo file. `where` names it in errors: InvalidArgument "<where>: not a GNU
// .mo file (magic ...)", "...: string 12 lies outside the file", ...
absl::StatusOr<MoCatalogue> ParseMoFile(std::string_view bytes, std::string_view where);

}  // namespace stemma::engine::data
