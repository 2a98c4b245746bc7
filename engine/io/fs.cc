#include "engine/io/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <vector>

#include "common/status.h"

namespace stemma::engine::io {
namespace {

absl::Status WriteAll(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("write " + path, errno);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status SyncAndClose(int fd, const std::string& path) {
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus("fsync " + path, err);
  }
  if (::close(fd) != 0) return ErrnoStatus("close " + path, errno);
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFileSynced(const std::string& path, absl::string_view contents) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("create " + path, errno);
  absl::Status s = WriteAll(fd, contents.data(), contents.size(), path);
  if (!s.ok()) {
    ::close(fd);
    return s;
  }
  return SyncAndClose(fd, path);
}

absl::Status CopyFileSynced(const std::string& from, const std::string& to) {
  int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return ErrnoStatus("open " + from, errno);
  int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    int err = errno;
    ::close(in);
    return ErrnoStatus("create " + to, err);
  }
  std::vector<char> buf(1 << 20);
  absl::Status s;
  for (;;) {
    ssize_t n = ::read(in, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      s = ErrnoStatus("read " + from, errno);
      break;
    }
    if (n == 0) break;
    s = WriteAll(out, buf.data(), static_cast<size_t>(n), to);
    if (!s.ok()) break;
  }
  ::close(in);
  if (!s.ok()) {
    ::close(out);
    return s;
  }
  return SyncAndClose(out, to);
}

absl::Status SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("open directory " + dir, errno);
  return SyncAndClose(fd, dir);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("open " + path, errno);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return ErrnoStatus("read " + path, err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
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

}  // namespace stemma::engine::io
