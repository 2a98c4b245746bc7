#include "coordinator/log_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/status.h"

namespace stemma::coordinator {

std::string LogStore::Path(const std::string& job_id, int attempt) const {
  return absl::StrCat(dir_, "/", job_id, "/", attempt, ".log");
}

absl::Status LogStore::Append(const std::string& job_id, int attempt, int64_t offset,
                              const std::string& data) {
  if (job_id.find('/') != std::string::npos || job_id.find("..") != std::string::npos) {
    return absl::InvalidArgumentError("log: bad job id");
  }
  absl::MutexLock lock(&mu_);
  std::string dir = absl::StrCat(dir_, "/", job_id);
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoStatus(absl::StrCat("mkdir ", dir), errno);
  }
  std::string path = Path(job_id, attempt);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(absl::StrCat("open ", path), errno);
  struct stat st;
  ::fstat(fd, &st);
  int64_t size = st.st_size;
  absl::Status result;
  if (truncated_.contains(path)) {
    // Cut by a full disk: it ends with the marker; what comes after is dropped.
  } else if (offset > size) {
    if (EndsWithMarker(fd, size)) {
      truncated_.insert(path);  // cut before a restart
    } else {
      result = absl::OutOfRangeError(absl::StrCat(path, ": chunk at ", offset, " after end ", size));
    }
  } else if (offset + static_cast<int64_t>(data.size()) > size) {
    const char* p = data.data() + (size - offset);
    size_t n = data.size() - (size - offset);
    int64_t end = size;
    while (n > 0) {
      ssize_t w = ::write(fd, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        result = ErrnoStatus(absl::StrCat("write ", path), err);
        if (err == ENOSPC || err == EDQUOT) {
          MarkTruncated(path, end);
          truncated_.insert(path);
          result = absl::ResourceExhaustedError(
              absl::StrCat(path, ": log truncated at ", end, " bytes: the coordinator's disk is full"));
        }
        break;
      }
      p += w;
      n -= w;
      end += w;
    }
    ++generation_;
  }
  ::close(fd);
  return result;
}

bool LogStore::EndsWithMarker(int fd, int64_t size) {
  const int64_t n = static_cast<int64_t>(kTruncatedMarker.size());
  if (size < n) return false;
  std::string tail(kTruncatedMarker.size(), '\0');
  return ::pread(fd, tail.data(), tail.size(), size - n) == n && tail == kTruncatedMarker;
}

void LogStore::MarkTruncated(const std::string& path, int64_t end) {
  // The disk has no room for more: the marker overwrites the log's last bytes, which takes
  // no new space (an O_APPEND descriptor would append, so a second one).
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return;
  const int64_t n = static_cast<int64_t>(kTruncatedMarker.size());
  const int64_t at = end >= n ? end - n : 0;
  if (::pwrite(fd, kTruncatedMarker.data(), kTruncatedMarker.size(), at) != n) {
    spdlog::warn("{}: log truncated, and the marker could not be written either", path);
  }
  ::close(fd);
}

int64_t LogStore::Size(const std::string& job_id, int attempt) const {
  struct stat st;
  if (::stat(Path(job_id, attempt).c_str(), &st) != 0) return 0;
  return st.st_size;
}

absl::StatusOr<std::string> LogStore::Read(const std::string& job_id, int attempt,
                                           int64_t offset, int64_t max) const {
  std::string path = Path(job_id, attempt);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::string();
    return ErrnoStatus(absl::StrCat("open ", path), errno);
  }
  std::string out(max, '\0');
  ssize_t n = ::pread(fd, out.data(), max, offset);
  int err = errno;
  ::close(fd);
  if (n < 0) return ErrnoStatus(absl::StrCat("read ", path), err);
  out.resize(n);
  return out;
}

uint64_t LogStore::WaitForAppend(uint64_t generation, int64_t timeout_ms) const {
  absl::MutexLock lock(&mu_);
  struct Arg {
    const uint64_t* gen;
    uint64_t seen;
  } arg{&generation_, generation};
  mu_.AwaitWithTimeout(absl::Condition(+[](Arg* a) { return *a->gen != a->seen; }, &arg),
                       absl::Milliseconds(timeout_ms));
  return generation_;
}

uint64_t LogStore::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

}  // namespace stemma::coordinator
