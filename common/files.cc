#include "common/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace stemma::files {
namespace {

std::string Trimmed(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// fsyncs every regular file directly in `dir`, then `dir` itself.
absl::Status SyncDirAndFiles(const std::string& dir) {
  std::vector<std::string> names;
  {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return ErrnoStatus("open directory " + dir, errno);
    while (dirent* e = ::readdir(d)) {
      if (e->d_type == DT_REG || e->d_type == DT_UNKNOWN) names.emplace_back(e->d_name);
    }
    ::closedir(d);
  }
  for (const std::string& name : names) {
    if (name == "." || name == "..") continue;
    const std::string path = absl::StrCat(dir, "/", name);
    struct stat st;
    // d_type DT_UNKNOWN (some file systems): only regular files are synced.
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    ASSIGN_OR_RETURN(UniqueFd fd, Open(path, O_RDONLY));
    RETURN_IF_ERROR(SyncFd(fd.get(), path));
  }
  return SyncDir(dir);
}

}  // namespace

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

absl::Status UniqueFd::Close(absl::string_view path) {
  if (fd_ < 0) return absl::OkStatus();
  const int rc = ::close(release());
  if (rc != 0) return ErrnoStatus(absl::StrCat("close ", path), errno);
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> Open(const std::string& path, int flags, mode_t mode) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) return ErrnoStatus("open " + path, errno);
  return UniqueFd(fd);
}

absl::StatusOr<std::string> ReadAll(int fd, const std::string& path) {
  std::string out;
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    out.reserve(static_cast<size_t>(st.st_size));
  }
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("cannot read " + path, errno);
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot read " + path, errno);
  UniqueFd owned(fd);
  return ReadAll(fd, path);
}

absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("write " + path, errno);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status SyncFd(int fd, const std::string& path) {
  if (::fsync(fd) != 0) return ErrnoStatus("fsync " + path, errno);
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("open directory " + dir, errno);
  UniqueFd owned(fd);
  RETURN_IF_ERROR(SyncFd(fd, dir));
  return owned.Close(dir);
}

absl::Status WriteFileSynced(const std::string& path, absl::string_view contents, mode_t mode) {
  const int raw = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (raw < 0) return ErrnoStatus("create " + path, errno);
  UniqueFd fd(raw);
  RETURN_IF_ERROR(WriteAll(fd.get(), contents, path));
  RETURN_IF_ERROR(SyncFd(fd.get(), path));
  return fd.Close(path);
}

absl::Status CopyFileSynced(const std::string& from, const std::string& to) {
  ASSIGN_OR_RETURN(UniqueFd in, Open(from, O_RDONLY));
  const int raw = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (raw < 0) return ErrnoStatus("create " + to, errno);
  UniqueFd out(raw);
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(in.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("read " + from, errno);
    if (n == 0) break;
    RETURN_IF_ERROR(WriteAll(out.get(), absl::string_view(buf.data(), n), to));
  }
  RETURN_IF_ERROR(SyncFd(out.get(), to));
  return out.Close(to);
}

absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents, mode_t mode) {
  const std::string tmp = absl::StrCat(path, ".tmp-", ::getpid());
  if (absl::Status s = WriteFileSynced(tmp, contents, mode); !s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  CrashPointForTest("write-file:before-rename");
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus("rename " + tmp + " -> " + path, err);
  }
  return SyncDir(ParentDir(path));
}

absl::Status PublishDir(const std::string& staging_in, const std::string& out_in,
                        const ReplaceCheck& may_replace) {
  const std::string staging = Trimmed(staging_in), out = Trimmed(out_in);
  // Every file durable before its name is: writers usually synced already (then this is
  // cheap), but publication does not rely on it.
  RETURN_IF_ERROR(SyncDirAndFiles(staging));

  CrashPointForTest("publish:before-rename");
  const std::string parent = ParentDir(out);
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, out.c_str(), RENAME_NOREPLACE) == 0) {
    return SyncDir(parent);
  }
  const int err = errno;
  if (err != EEXIST && err != ENOTEMPTY) {
    return ErrnoStatus("rename " + staging + " -> " + out, err);
  }
  if (!may_replace) return absl::AlreadyExistsError(out + ": already exists");
  RETURN_IF_ERROR(may_replace(out));
  // Swap so `out` is never missing, then drop the old directory (now at `staging`).
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, out.c_str(), RENAME_EXCHANGE) != 0) {
    return ErrnoStatus("swap " + staging + " <-> " + out, errno);
  }
  RETURN_IF_ERROR(SyncDir(parent));
  CrashPointForTest("publish:after-swap");
  return RemoveTree(staging);
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

absl::Status RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return absl::InternalError("remove " + path + ": " + ec.message());
  return absl::OkStatus();
}

std::string ParentDir(const std::string& path_in) {
  const std::string path = Trimmed(path_in);
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string BaseName(const std::string& path_in) {
  const std::string path = Trimmed(path_in);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

void CrashPointForTest(absl::string_view point) {
  const char* at = std::getenv("STEMMA_IO_CRASH_AT");
  if (at == nullptr || point != at) return;
  std::fprintf(stderr, "stemma: test crash at %.*s\n", static_cast<int>(point.size()),
               point.data());
  ::kill(::getpid(), SIGKILL);
}

}  // namespace stemma::files
