// The one door to the file system for every Stemma process (leveldb's util/env_posix.cc idea):
// reading a whole file, owning a descriptor, writing a file durably, publishing a file or a
// directory atomically. The crash rules are written here once:
//
//   - a file is written to `<path>.tmp-<pid>`, fsynced, renamed onto `path`, and its
//     directory fsynced: a reader sees the old file or the new one, never a prefix, and the
//     new name survives a crash once the call returns;
//   - a directory is built complete under a staging name beside its final name, every file
//     in it and the directory itself fsynced, renamed onto the final name and the parent
//     fsynced. Replacing an existing directory swaps the two (RENAME_EXCHANGE), so at every
//     instant the name holds the old directory or the new one, never none or a mix.
//
// Errors are absl::Status naming the path and what failed ("cannot read /x/y: No such file
// or directory"), errno converted once by ErrnoStatus (common/status.h): ENOENT is NotFound,
// EEXIST AlreadyExists, EACCES/EPERM PermissionDenied, ENOSPC ResourceExhausted.
// Torch-free and gRPC-free: the control plane and the engine both use it.
// Thread-safety: every function is safe to call concurrently on different paths.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stemma::files {

// Owns one file descriptor and closes it when destroyed (errors of that close are ignored:
// call Close() where a failed close matters, i.e. after writing). Move-only. Not
// thread-safe (one owner).
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }
  // Gives up ownership without closing; the object is empty afterwards.
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  // Closes the current descriptor (if any) and takes `fd`.
  void reset(int fd = -1);
  // Closes now and reports the error naming `path`; the object is empty afterwards.
  absl::Status Close(absl::string_view path);

 private:
  int fd_ = -1;
};

// open(2) with O_CLOEXEC added. The error names `path` ("open <path>: ...").
absl::StatusOr<UniqueFd> Open(const std::string& path, int flags, mode_t mode = 0644);

// The whole file's bytes. "cannot read <path>: <strerror>" on any error.
absl::StatusOr<std::string> ReadFile(const std::string& path);
// Reads `fd` from its current offset to the end; errors name `path`.
absl::StatusOr<std::string> ReadAll(int fd, const std::string& path);
// Writes all of `data` to `fd` (retrying short writes and EINTR); errors name `path`.
absl::Status WriteAll(int fd, absl::string_view data, const std::string& path);

// fsync(2) of an open descriptor; errors name `path`.
absl::Status SyncFd(int fd, const std::string& path);
// Opens a directory and fsyncs it, so the names created in it survive a crash.
absl::Status SyncDir(const std::string& dir);

// Creates or truncates `path` (with `mode` when created), writes `contents`, fsyncs, closes.
// Not atomic: a crash may leave a prefix (use WriteFileAtomic for a file readers may see).
absl::Status WriteFileSynced(const std::string& path, absl::string_view contents,
                             mode_t mode = 0644);
// Copies `from` to `to` (created or truncated) and fsyncs `to`.
absl::Status CopyFileSynced(const std::string& from, const std::string& to);

// Writes `contents` to `path` atomically and durably: `<path>.tmp-<pid>` (created with
// `mode`), fsync, rename onto `path`, fsync of the directory. On error the temporary file
// is removed and `path` is untouched.
absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents,
                             mode_t mode = 0644);

// Decides whether PublishDir may replace the existing `out`: OK lets it, any error is
// returned by PublishDir as it is (`out` untouched).
using ReplaceCheck = std::function<absl::Status(const std::string& out)>;

// Publishes the complete directory `staging` as `out`: fsyncs every regular file directly in
// it and the directory, renames it onto `out` (RENAME_NOREPLACE) and fsyncs the parent. When
// `out` exists: without `may_replace` AlreadyExists ("<out>: already exists"); with it, the
// check runs and, when OK, the two are swapped (RENAME_EXCHANGE), the parent fsynced and the
// old directory (now at `staging`) removed. On error `staging` is left for the caller.
absl::Status PublishDir(const std::string& staging, const std::string& out,
                        const ReplaceCheck& may_replace = nullptr);

// lstat(2) succeeds (a dangling symlink exists).
bool PathExists(const std::string& path);
// Removes a file or a directory tree; a missing path is OK.
absl::Status RemoveTree(const std::string& path);
// "/a/b/c" -> "/a/b", "c" -> ".", "/c" -> "/" (trailing slashes of `path` ignored).
std::string ParentDir(const std::string& path);
// "/a/b/c" -> "c" (trailing slashes ignored).
std::string BaseName(const std::string& path);

// Crash tests: when $STEMMA_IO_CRASH_AT equals `point`, the process kills itself (SIGKILL,
// no cleanup) right there. The points in this file: "write-file:before-rename",
// "publish:before-rename", "publish:after-swap" (replaced, the old directory not yet removed).
void CrashPointForTest(absl::string_view point);

}  // namespace stemma::files
