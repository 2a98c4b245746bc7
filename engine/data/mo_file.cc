#include "engine/data/mo_file.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace stemma::engine::data {
namespace {

constexpr uint32_t kMagic = 0x950412de;

uint32_t Read32(std::string_view bytes, size_t at, bool big_endian) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + at;
  return big_endian
             ? (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3]
             : (uint32_t{p[3]} << 24) | (uint32_t{p[2]} << 16) | (uint32_t{p[1]} << 8) | p[0];
}

// "text/plain; charset=UTF-8" in the header's Content-Type line.
std::string HeaderCharset(std::string_view header_text) {
  const absl::string_view header(header_text.data(), header_text.size());
  for (absl::string_view line : absl::StrSplit(header, '\n')) {
    if (!absl::StartsWithIgnoreCase(line, "Content-Type:")) continue;
    const size_t at = absl::AsciiStrToLower(std::string(line)).find("charset=");
    if (at == std::string::npos) return "";
    absl::string_view value = line.substr(at + 8);
    const size_t end = value.find_first_of("; \t\r");
    return std::string(absl::StripAsciiWhitespace(value.substr(0, end)));
  }
  return "";
}

}  // namespace

absl::StatusOr<MoCatalogue> ParseMoFile(std::string_view bytes, std::string_view where) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(where), ": ", what));
  };
  if (bytes.size() < 28)
    return bad(
        absl::StrCat("not a GNU .mo file (", bytes.size(), " bytes, shorter than its header)"));
  MoCatalogue cat;
  if (Read32(bytes, 0, false) == kMagic) {
    cat.big_endian = false;
  } else if (Read32(bytes, 0, true) == kMagic) {
    cat.big_endian = true;
  } else {
    return bad("not a GNU .mo file (no magic 0x950412de)");
  }
  const bool be = cat.big_endian;
  const uint32_t revision = Read32(bytes, 4, be);
  if ((revision >> 16) > 1)
    return bad(absl::StrCat("unsupported .mo major revision ", revision >> 16));
  const uint64_t n = Read32(bytes, 8, be);
  const uint64_t originals = Read32(bytes, 12, be);
  const uint64_t translations = Read32(bytes, 16, be);
  if (originals + n * 8 > bytes.size() || translations + n * 8 > bytes.size()) {
    return bad(absl::StrCat("its string tables (", n, " entries) lie outside the file"));
  }
  // One string of a table: [length][offset], then `length` bytes and a NUL.
  auto string_at = [&](uint64_t table, uint64_t i, std::string_view* out) -> bool {
    const uint64_t length = Read32(bytes, table + i * 8, be);
    const uint64_t offset = Read32(bytes, table + i * 8 + 4, be);
    if (offset + length > bytes.size()) return false;
    *out = bytes.substr(offset, length);
    return true;
  };
  cat.strings = static_cast<int64_t>(n);
  cat.entries.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    std::string_view id, str;
    if (!string_at(originals, i, &id))
      return bad(absl::StrCat("original string ", i, " lies outside the file"));
    if (!string_at(translations, i, &str))
      return bad(absl::StrCat("translation ", i, " lies outside the file"));
    if (id.empty()) {
      cat.charset = HeaderCharset(str);
      continue;
    }
    if (const size_t eot = id.find('\x04'); eot != std::string_view::npos) id = id.substr(eot + 1);
    id = id.substr(0, id.find('\0'));
    str = str.substr(0, str.find('\0'));
    if (str.empty() || str == id) {
      ++cat.untranslated;
      continue;
    }
    cat.entries.push_back({std::string(id), std::string(str)});
  }
  return cat;
}

}  // namespace stemma::engine::data
