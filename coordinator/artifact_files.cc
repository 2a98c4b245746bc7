#include "coordinator/artifact_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/manifest.h"
#include "common/sha256.h"
#include "common/status.h"

namespace stemma::coordinator {

std::string ManifestFile(const std::string& path) { return manifest::ManifestPathOf(path); }

std::optional<std::string> ReadArtifactManifest(const std::string& path) {
  constexpr off_t kLimit = 64 << 20;
  const std::string file = ManifestFile(path);
  struct stat st;
  if (::stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > kLimit) {
    return std::nullopt;
  }
  absl::StatusOr<std::string> text = files::ReadFile(file);
  if (!text.ok() || static_cast<off_t>(text->size()) > kLimit) return std::nullopt;
  return *std::move(text);
}

bool ArtifactFilesPresent(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return std::filesystem::is_regular_file(path, ec);
  const std::optional<std::string> text = ReadArtifactManifest(path);
  if (!text.has_value()) return false;
  const nlohmann::json m = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  for (const manifest::ListedFile& f : manifest::ListedFiles(m)) {
    if (!f.bytes.has_value() || f.path.empty() || f.path.find("..") != std::string::npos) continue;
    const auto size = std::filesystem::file_size(path + "/" + f.path, ec);
    if (ec || static_cast<int64_t>(size) != *f.bytes) return false;
  }
  return true;
}

namespace {

// One file a manifest lists, against the disk: present, of its recorded size (when the
// manifest records one), with its recorded sha256.
void CheckListedFile(const std::string& file, const manifest::ListedFile& listed, DeepCheck* d) {
  uint64_t bytes = 0;
  auto sha = Sha256File(file, &bytes);
  ++d->files_checked;
  if (!sha.ok()) {
    d->problems.push_back(std::string(sha.status().message()));
    return;
  }
  if (listed.bytes.has_value() && static_cast<uint64_t>(*listed.bytes) != bytes) {
    d->problems.push_back(absl::StrCat(file, ": ", bytes, " bytes, manifest says ", *listed.bytes));
    return;
  }
  if (*sha != listed.sha256) {
    d->problems.push_back(absl::StrCat(file, ": sha256 differs from the manifest"));
  }
}

// The files a corpus manifest or token index lists, each checked against the disk; returns
// the (path, sha256) pairs as recorded.
std::vector<std::pair<std::string, std::string>> CheckListedFiles(const std::string& path,
                                                                  const std::string& manifest_path,
                                                                  const nlohmann::json& j,
                                                                  DeepCheck* d) {
  std::vector<std::pair<std::string, std::string>> listing;  // path, sha256 as recorded
  for (const manifest::ListedFile& f : manifest::ListedFiles(j)) {
    if (f.path.empty() || f.sha256.empty()) {
      d->problems.push_back(absl::StrCat(manifest_path, ": a files entry has no path or sha256"));
      continue;
    }
    if (f.path[0] == '/' || f.path.find("..") != std::string::npos) {
      d->problems.push_back(
          absl::StrCat(manifest_path, ": files entry '", f.path, "' leaves the artifact"));
      continue;
    }
    listing.emplace_back(f.path, f.sha256);
    CheckListedFile(path + "/" + f.path, f, d);
  }
  return listing;
}

// A corpus manifest (format stemma.corpus/*): `files` is a list of {path, bytes, lines,
// sha256}, and content_hash the sha256 of their sorted "<sha256>  <path>\n" lines.
void VerifyCorpusFiles(const std::string& path, const std::string& manifest_path,
                       const nlohmann::json& j, DeepCheck* d) {
  if (!j.contains("files") || !j["files"].is_array()) {
    d->problems.push_back(absl::StrCat(manifest_path, ": not a corpus manifest (no files list)"));
    return;
  }
  std::vector<std::pair<std::string, std::string>> listing =
      CheckListedFiles(path, manifest_path, j, d);
  std::sort(listing.begin(), listing.end());
  std::string text;
  for (const auto& [rel, sha] : listing) absl::StrAppend(&text, sha, "  ", rel, "\n");
  if (!j.contains("content_hash") || !j["content_hash"].is_string() ||
      Sha256Hex(text) != j["content_hash"].get<std::string>()) {
    d->problems.push_back(
        absl::StrCat(manifest_path, ": content_hash does not match its files list"));
  }
}

// A token dataset's index.json (format stemma-tokens-*, docs/data-format.md): every shard
// and index.bin, of the size their counts imply, with their recorded sha256.
void VerifyTokenDatasetFiles(const std::string& path, const std::string& manifest_path,
                             const nlohmann::json& j, DeepCheck* d) {
  if (!j.contains("shards") || !j["shards"].is_array() || !j.contains("documents")) {
    d->problems.push_back(
        absl::StrCat(manifest_path, ": not a token dataset index (no shards or documents)"));
    return;
  }
  CheckListedFiles(path, manifest_path, j, d);
}

}  // namespace

ManifestCheck CheckManifest(const std::string& path, const std::string& expected) {
  ManifestCheck c;
  const std::string file = ManifestFile(path);
  auto sha = Sha256File(file);
  if (!sha.ok()) {
    c.result = v1::UNREADABLE;
    c.detail = std::string(sha.status().message());
    return c;
  }
  if (*sha != expected) {
    c.result = v1::MISMATCH;
    c.detail = absl::StrCat(file, ": sha256 ", *sha, ", reported ",
                            expected.empty() ? "(none)" : expected);
    return c;
  }
  c.result = v1::VERIFIED;
  return c;
}

DeepCheck VerifyArtifactFiles(const std::string& path, const std::string& expected) {
  DeepCheck d;
  d.manifest = CheckManifest(path, expected);
  if (d.manifest.result != v1::VERIFIED) {
    d.problems.push_back(d.manifest.detail);
    return d;
  }
  d.files_checked = 1;
  const std::string manifest_path = ManifestFile(path);
  if (manifest_path == path) return d;  // a plain file: its own hash is the manifest hash
  // Unreadable: parsed as "" and reported below as not a manifest.
  const std::string text = files::ReadFile(manifest_path).value_or("");
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (manifest::IsCorpusManifest(j)) {
    VerifyCorpusFiles(path, manifest_path, j, &d);
    return d;
  }
  if (manifest::IsTokenIndex(j)) {
    VerifyTokenDatasetFiles(path, manifest_path, j, &d);
    return d;
  }
  if (j.is_discarded() || !j.is_object() || !j.contains("files") || !j["files"].is_object()) {
    d.problems.push_back(absl::StrCat(manifest_path, ": not a manifest (no files object)"));
    return d;
  }
  for (const manifest::ListedFile& f : manifest::ListedFiles(j)) {
    if (f.sha256.empty()) {
      d.problems.push_back(absl::StrCat(manifest_path, ": files.", f.path, " has no sha256"));
      continue;
    }
    CheckListedFile(path + "/" + f.path, f, &d);
  }
  return d;
}

namespace {

v1::FileStamp Stamp(const std::string& rel, const struct stat& st) {
  v1::FileStamp s;
  s.set_path(rel);
  s.set_bytes(st.st_size);
  s.set_mtime_ns(static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec);
  s.set_ctime_ns(static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec);
  s.set_inode(st.st_ino);
  return s;
}

}  // namespace

std::vector<v1::FileStamp> StampFiles(const std::string& given) {
  constexpr size_t kMaxFiles = 100000;
  std::string path = given;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  std::vector<v1::FileStamp> out;
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return out;
  if (!S_ISDIR(st.st_mode)) {
    out.push_back(Stamp("", st));
    return out;
  }
  std::error_code ec;
  std::filesystem::recursive_directory_iterator it(path, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string file = it->path().string();
    if (::lstat(file.c_str(), &st) != 0 || S_ISDIR(st.st_mode)) continue;
    if (out.size() >= kMaxFiles) return {};
    out.push_back(Stamp(file.substr(path.size() + 1), st));
  }
  if (ec) return {};
  std::sort(out.begin(), out.end(),
            [](const v1::FileStamp& a, const v1::FileStamp& b) { return a.path() < b.path(); });
  return out;
}

bool SameStamps(const google::protobuf::RepeatedPtrField<v1::FileStamp>& then,
                const std::vector<v1::FileStamp>& now) {
  if (then.size() != static_cast<int>(now.size())) return false;
  for (size_t i = 0; i < now.size(); ++i) {
    const v1::FileStamp& a = then[static_cast<int>(i)];
    const v1::FileStamp& b = now[i];
    if (a.path() != b.path() || a.bytes() != b.bytes() || a.mtime_ns() != b.mtime_ns() ||
        a.ctime_ns() != b.ctime_ns() || a.inode() != b.inode()) {
      return false;
    }
  }
  return true;
}

absl::Status RemoveArtifactFiles(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("remove ", path, ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace stemma::coordinator
