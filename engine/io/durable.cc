#include "engine/io/durable.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/io/fs.h"
#include "engine/io/manifest.h"
#include "nlohmann/json.hpp"

namespace stemma::engine::io {
namespace {

std::string Trimmed(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

using files::BaseName;
using files::ParentDir;

// Staging directories `<out>.tmp-<pid>` whose process is gone are leftovers of a killed
// writer: removed so they do not pile up.
void RemoveStaleStaging(const std::string& out) {
  const std::string dir = ParentDir(out);
  const std::string prefix = BaseName(out) + ".tmp-";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  std::vector<std::string> stale;
  while (dirent* e = ::readdir(d)) {
    absl::string_view name = e->d_name;
    if (!absl::StartsWith(name, prefix)) continue;
    int pid = 0;
    if (!absl::SimpleAtoi(name.substr(prefix.size()), &pid) || pid <= 0) continue;
    if (pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH) stale.emplace_back(name);
  }
  ::closedir(d);
  for (const auto& name : stale) RemoveTree(absl::StrCat(dir, "/", name)).IgnoreError();
}

bool IsTokenDatasetDir(const std::string& dir) {
  auto text = ReadFile(dir + "/index.json");
  if (!text.ok()) return false;
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  return j.is_object() && j.contains("format") && j["format"].is_string() &&
         absl::StartsWith(j["format"].get<std::string>(), "stemma-tokens");
}

// A prepared corpus (`stemma-engine prepare`): manifest.json with format stemma.corpus/*.
bool IsCorpusDir(const std::string& dir) {
  auto text = ReadFile(absl::StrCat(dir, "/", manifest::kCorpusManifestName));
  return text.ok() && manifest::IsCorpusManifest(nlohmann::json::parse(*text, nullptr, false));
}

}  // namespace

std::string StagingDirFor(const std::string& out) {
  return absl::StrCat(Trimmed(out), ".tmp-", ::getpid());
}

absl::Status CheckReplaceable(const std::string& out_in) {
  const std::string out = Trimmed(out_in);
  struct stat st;
  if (::lstat(out.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoStatus("stat " + out, errno);
  }
  if (S_ISLNK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(out,
                     ": is a symbolic link; overwrite replaces only a checkpoint or dataset "
                     "directory that Stemma wrote"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(out,
                     ": is a file, not a directory; overwrite replaces only a checkpoint or "
                     "dataset directory that Stemma wrote"));
  }
  const std::string manifest = absl::StrCat(out, "/", kManifestName);
  if (PathExists(manifest)) {
    ASSIGN_OR_RETURN(std::string text, ReadFile(manifest));
    if (ParseManifest(text, manifest).ok()) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        out, ": its ", kManifestName, " is not a Stemma manifest; refusing to overwrite"));
  }
  if (IsTokenDatasetDir(out)) return absl::OkStatus();
  if (IsCorpusDir(out)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(out, ": has no ", kManifestName,
                   ", so Stemma did not write it; overwrite "
                   "replaces only a checkpoint or dataset directory that Stemma wrote (remove it "
                   "yourself or choose another out)"));
}

absl::StatusOr<std::string> CreateStagingDir(const std::string& out_in, bool overwrite) {
  const std::string out = Trimmed(out_in);
  if (out.empty()) return absl::InvalidArgumentError("output path is empty");
  if (PathExists(out)) {
    if (!overwrite) {
      return absl::AlreadyExistsError(out + ": already exists (set overwrite: true to replace it)");
    }
    RETURN_IF_ERROR(CheckReplaceable(out));
  }
  // Parents are created as train and init create them, so that an output placed under a
  // fresh directory (an experiment's experiments/<name>/<stage>/<job>) can be published.
  const std::string parent = ParentDir(out);
  if (!PathExists(parent)) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec)
      return absl::FailedPreconditionError(
          absl::StrCat(out, ": cannot create ", parent, ": ", ec.message()));
  }
  RemoveStaleStaging(out);
  const std::string staging = StagingDirFor(out);
  RETURN_IF_ERROR(RemoveTree(staging));
  if (::mkdir(staging.c_str(), 0755) != 0) return ErrnoStatus("mkdir " + staging, errno);
  return staging;
}

absl::Status PublishDir(const std::string& staging, const std::string& out, bool overwrite) {
  return files::PublishDir(staging, out, [overwrite](const std::string& existing) {
    if (!overwrite) {
      return absl::AlreadyExistsError(existing +
                                      ": already exists (set overwrite: true to replace it)");
    }
    return CheckReplaceable(existing);
  });
}

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path,
                                                             bool writable) {
  ASSIGN_OR_RETURN(UniqueFd fd, files::Open(path, O_RDONLY));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("stat " + path, errno);
  std::unique_ptr<MappedFile> m(new MappedFile());
  m->path_ = path;
  m->size_ = static_cast<uint64_t>(st.st_size);
  if (m->size_ > 0) {
    // The mapping outlives the descriptor (closed when `fd` goes out of scope).
    void* p = ::mmap(nullptr, m->size_, PROT_READ | (writable ? PROT_WRITE : 0), MAP_PRIVATE,
                     fd.get(), 0);
    if (p == MAP_FAILED) return ErrnoStatus("mmap " + path, errno);
    m->data_ = static_cast<uint8_t*>(p);
  }
  return m;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

}  // namespace stemma::engine::io
