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
#include "common/sha256.h"
#include "common/status.h"

namespace stemma::coordinator {

std::string ManifestFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    // A prepared corpus (`stemma-engine prepare`) has manifest.json instead of stemma.json.
    if (::stat((path + "/stemma.json").c_str(), &st) != 0 &&
        ::stat((path + "/manifest.json").c_str(), &st) == 0) {
      return path + "/manifest.json";
    }
    return path + "/stemma.json";
  }
  return path;
}

namespace {

// A corpus manifest (format stemma.corpus/*): `files` is a list of {path, bytes, lines,
// sha256}, and content_hash the sha256 of their sorted "<sha256>  <path>\n" lines.
void VerifyCorpusFiles(const std::string& path, const std::string& manifest,
                       const nlohmann::json& j, DeepCheck* d) {
  if (!j.contains("files") || !j["files"].is_array()) {
    d->problems.push_back(absl::StrCat(manifest, ": not a corpus manifest (no files list)"));
    return;
  }
  std::vector<std::pair<std::string, std::string>> listed;  // path, sha256 as recorded
  for (const auto& entry : j["files"]) {
    if (!entry.is_object() || !entry.contains("path") || !entry["path"].is_string() ||
        !entry.contains("sha256") || !entry["sha256"].is_string()) {
      d->problems.push_back(absl::StrCat(manifest, ": a files entry has no path or sha256"));
      continue;
    }
    const std::string rel = entry["path"].get<std::string>();
    if (rel.empty() || rel[0] == '/' || rel.find("..") != std::string::npos) {
      d->problems.push_back(absl::StrCat(manifest, ": files entry '", rel, "' leaves the corpus"));
      continue;
    }
    listed.emplace_back(rel, entry["sha256"].get<std::string>());
    uint64_t bytes = 0;
    auto sha = Sha256File(path + "/" + rel, &bytes);
    ++d->files_checked;
    if (!sha.ok()) {
      d->problems.push_back(std::string(sha.status().message()));
      continue;
    }
    if (entry.contains("bytes") && entry["bytes"].is_number_integer() &&
        entry["bytes"].get<uint64_t>() != bytes) {
      d->problems.push_back(absl::StrCat(path, "/", rel, ": ", bytes, " bytes, manifest says ",
                                         entry["bytes"].get<int64_t>()));
      continue;
    }
    if (*sha != listed.back().second)
      d->problems.push_back(absl::StrCat(path, "/", rel, ": sha256 differs from the manifest"));
  }
  std::sort(listed.begin(), listed.end());
  std::string listing;
  for (const auto& [rel, sha] : listed) absl::StrAppend(&listing, sha, "  ", rel, "\n");
  if (!j.contains("content_hash") || !j["content_hash"].is_string() ||
      Sha256Hex(listing) != j["content_hash"].get<std::string>()) {
    d->problems.push_back(absl::StrCat(manifest, ": content_hash does not match its files list"));
  }
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
  const std::string manifest = ManifestFile(path);
  if (manifest == path) return d;  // a plain file: its own hash is the manifest hash
  // Unreadable: parsed as "" and reported below as not a manifest.
  const std::string text = files::ReadFile(manifest).value_or("");
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("format") && j["format"].is_string() &&
      j["format"].get<std::string>().rfind("stemma.corpus/", 0) == 0) {
    VerifyCorpusFiles(path, manifest, j, &d);
    return d;
  }
  if (j.is_discarded() || !j.is_object() || !j.contains("files") || !j["files"].is_object()) {
    d.problems.push_back(absl::StrCat(manifest, ": not a manifest (no files object)"));
    return d;
  }
  for (auto it = j["files"].begin(); it != j["files"].end(); ++it) {
    const std::string file = path + "/" + it.key();
    const auto& entry = it.value();
    if (!entry.is_object() || !entry.contains("sha256") || !entry["sha256"].is_string()) {
      d.problems.push_back(absl::StrCat(manifest, ": files.", it.key(), " has no sha256"));
      continue;
    }
    uint64_t bytes = 0;
    auto sha = Sha256File(file, &bytes);
    ++d.files_checked;
    if (!sha.ok()) {
      d.problems.push_back(std::string(sha.status().message()));
      continue;
    }
    if (entry.contains("bytes") && entry["bytes"].is_number_integer() &&
        entry["bytes"].get<uint64_t>() != bytes) {
      d.problems.push_back(
          absl::StrCat(file, ": ", bytes, " bytes, manifest says ", entry["bytes"].get<int64_t>()));
      continue;
    }
    if (*sha != entry["sha256"].get<std::string>()) {
      d.problems.push_back(absl::StrCat(file, ": sha256 differs from the manifest"));
    }
  }
  return d;
}

absl::Status RemoveArtifactFiles(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("remove ", path, ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace stemma::coordinator
