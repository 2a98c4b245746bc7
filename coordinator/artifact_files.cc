#include "coordinator/artifact_files.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace stemma::coordinator {

absl::StatusOr<std::string> Sha256File(const std::string& path, int64_t* bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(absl::StrCat("open ", path), errno);
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    ::close(fd);
    return absl::InternalError("sha256: OpenSSL could not start a digest");
  }
  std::vector<char> buf(1 << 20);
  int64_t total = 0;
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return ErrnoStatus(absl::StrCat("read ", path), err);
    }
    if (n == 0) break;
    EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(n));
    total += n;
  }
  ::close(fd);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &len);
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  hex.reserve(len * 2);
  for (unsigned int i = 0; i < len; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 15]);
  }
  if (bytes) *bytes = total;
  return hex;
}

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

std::string Sha256OfText(const std::string& text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(text.data(), text.size(), digest, &len, EVP_sha256(), nullptr);
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 15]);
  }
  return hex;
}

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
    int64_t bytes = 0;
    auto sha = Sha256File(path + "/" + rel, &bytes);
    ++d->files_checked;
    if (!sha.ok()) {
      d->problems.push_back(std::string(sha.status().message()));
      continue;
    }
    if (entry.contains("bytes") && entry["bytes"].is_number_integer() &&
        entry["bytes"].get<int64_t>() != bytes) {
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
      Sha256OfText(listing) != j["content_hash"].get<std::string>()) {
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
  std::ifstream in(manifest);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
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
    int64_t bytes = 0;
    auto sha = Sha256File(file, &bytes);
    ++d.files_checked;
    if (!sha.ok()) {
      d.problems.push_back(std::string(sha.status().message()));
      continue;
    }
    if (entry.contains("bytes") && entry["bytes"].is_number_integer() &&
        entry["bytes"].get<int64_t>() != bytes) {
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
