#include "engine/io/durable.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
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

std::string ParentDir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

absl::Status SyncPath(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  if (fd < 0) return ErrnoStatus(absl::StrCat("open ", path), errno);
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(absl::StrCat("fsync ", path), err);
  }
  if (::close(fd) != 0) return ErrnoStatus(absl::StrCat("close ", path), errno);
  return absl::OkStatus();
}

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
  auto text = ReadFile(dir + "/manifest.json");
  if (!text.ok()) return false;
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  return j.is_object() && j.contains("format") && j["format"].is_string() &&
         absl::StartsWith(j["format"].get<std::string>(), "stemma.corpus/");
}

}  // namespace

void CrashPointForTest(absl::string_view point) {
  const char* at = std::getenv("STEMMA_IO_CRASH_AT");
  if (at == nullptr || point != at) return;
  std::fprintf(stderr, "stemma-engine: test crash at %.*s\n", static_cast<int>(point.size()),
               point.data());
  ::kill(::getpid(), SIGKILL);
}

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

absl::Status PublishDir(const std::string& staging_in, const std::string& out_in, bool overwrite) {
  const std::string staging = Trimmed(staging_in), out = Trimmed(out_in);
  // Every file durable before the name is: writers usually synced already (then this is
  // cheap), but the door does not rely on it.
  DIR* d = ::opendir(staging.c_str());
  if (d == nullptr) return ErrnoStatus("open directory " + staging, errno);
  std::vector<std::string> files;
  while (dirent* e = ::readdir(d)) {
    if (e->d_type == DT_REG || e->d_type == DT_UNKNOWN) files.emplace_back(e->d_name);
  }
  ::closedir(d);
  for (const std::string& name : files) {
    if (name == "." || name == "..") continue;
    const std::string path = absl::StrCat(staging, "/", name);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    RETURN_IF_ERROR(SyncPath(path, /*directory=*/false));
  }
  RETURN_IF_ERROR(SyncPath(staging, /*directory=*/true));

  CrashPointForTest("publish:before-rename");
  const std::string parent = ParentDir(out);
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, out.c_str(), RENAME_NOREPLACE) == 0) {
    return SyncPath(parent, /*directory=*/true);
  }
  const int err = errno;
  if (err != EEXIST && err != ENOTEMPTY)
    return ErrnoStatus("rename " + staging + " -> " + out, err);
  if (!overwrite)
    return absl::AlreadyExistsError(out + ": already exists (set overwrite: true to replace it)");
  RETURN_IF_ERROR(CheckReplaceable(out));
  // Swap so `out` is never missing, then drop the old directory (now at `staging`).
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, out.c_str(), RENAME_EXCHANGE) != 0) {
    return ErrnoStatus("swap " + staging + " <-> " + out, errno);
  }
  RETURN_IF_ERROR(SyncPath(parent, /*directory=*/true));
  CrashPointForTest("publish:after-swap");
  return RemoveTree(staging);
}

absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents) {
  const std::string tmp = absl::StrCat(path, ".tmp-", ::getpid());
  absl::Status s = WriteFileSynced(tmp, contents);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  CrashPointForTest("write-file:before-rename");
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus("rename " + tmp + " -> " + path, err);
  }
  return SyncPath(ParentDir(path), /*directory=*/true);
}

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path,
                                                             bool writable) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("open " + path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus("stat " + path, err);
  }
  std::unique_ptr<MappedFile> m(new MappedFile());
  m->path_ = path;
  m->size_ = static_cast<uint64_t>(st.st_size);
  if (m->size_ > 0) {
    void* p =
        ::mmap(nullptr, m->size_, PROT_READ | (writable ? PROT_WRITE : 0), MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    if (p == MAP_FAILED) return ErrnoStatus("mmap " + path, err);
    m->data_ = static_cast<uint8_t*>(p);
  } else {
    ::close(fd);
  }
  return m;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

}  // namespace stemma::engine::io
