#include "coordinator/log_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/status.h"

namespace stemma::coordinator {
namespace {

// A record's header, little-endian as the hosts we build for; the job id and then the
// bytes follow it.
struct RecordHeader {
  char magic[4];    // kMagic
  uint32_t length;  // bytes of log
  int64_t offset;   // where they start in the attempt's log
  int32_t attempt;
  uint16_t job_bytes;  // length of the job id after the header
  // The engine process (global RANK) whose log this is; 0 for a part of one process and in
  // every record of coordinators before per-rank logs (the field was reserved, always 0).
  uint16_t rank;
};
static_assert(sizeof(RecordHeader) == 24, "the record header is 24 bytes on disk");
// SLG1 records (before receive times) have the job id right after the header; SLG2 records
// (written now) have the receive time first: int64 epoch ms.
constexpr char kMagic[4] = {'S', 'L', 'G', '1'};
constexpr char kMagicTimed[4] = {'S', 'L', 'G', '2'};
constexpr int64_t kTimeBytes = sizeof(int64_t);
constexpr size_t kMaxJobIdBytes = 1024;
constexpr uint32_t kMissing = UINT32_MAX;  // Extent::file of bytes in a removed segment

std::string SegmentName(uint32_t n) { return absl::StrFormat("%08u.seg", n); }

bool ParseSegmentName(absl::string_view name, uint32_t* n) {
  if (!absl::ConsumeSuffix(&name, ".seg") || name.empty()) return false;
  for (char ch : name) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(ch))) return false;
  }
  return absl::SimpleAtoi(name, n);
}

bool WriteAll(int fd, iovec* iov, int count) {
  while (count > 0) {
    const ssize_t w = ::writev(fd, iov, count);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    size_t done = static_cast<size_t>(w);
    while (count > 0 && done >= iov->iov_len) {
      done -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + done;
      iov->iov_len -= done;
    }
  }
  return true;
}

}  // namespace

LogStore::~LogStore() = default;

std::string LogStore::Key(const std::string& job_id, int attempt, int rank) {
  // Rank 0's key is the one logs had before there were ranks.
  return rank == 0 ? absl::StrCat(job_id, ".", attempt)
                   : absl::StrCat(job_id, ".", attempt, "#", rank);
}

absl::Status LogStore::Load() {
  absl::MutexLock lock(&mu_);
  if (::mkdir(dir_.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoStatus(absl::StrCat("mkdir ", dir_), errno);
  }
  DIR* d = ::opendir(dir_.c_str());
  if (d == nullptr) return ErrnoStatus(absl::StrCat("opendir ", dir_), errno);
  std::vector<uint32_t> numbers;
  while (dirent* e = ::readdir(d)) {
    uint32_t n = 0;
    if (ParseSegmentName(e->d_name, &n)) {
      numbers.push_back(n);
    } else if (e->d_name[0] != '.' && (e->d_type == DT_DIR || e->d_type == DT_UNKNOWN)) {
      legacy_ = true;  // a job's directory of per-attempt logs, from an older coordinator
    }
  }
  ::closedir(d);
  std::sort(numbers.begin(), numbers.end());
  for (size_t i = 0; i < numbers.size(); ++i) {
    RETURN_IF_ERROR(IndexSegment(numbers[i], i + 1 == numbers.size()));
  }
  next_segment_ = numbers.empty() ? 1 : numbers.back() + 1;
  if (!numbers.empty()) {
    spdlog::info("logs: {} segments, {} attempts' logs in {}", numbers.size(), index_.size(), dir_);
  }
  return absl::OkStatus();
}

absl::Status LogStore::IndexSegment(uint32_t number, bool last) {
  const std::string path = absl::StrCat(dir_, "/", SegmentName(number));
  ASSIGN_OR_RETURN(files::UniqueFd owned, files::Open(path, last ? O_RDWR : O_RDONLY));
  const int fd = owned.get();
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(absl::StrCat("stat ", path), errno);
  files_.push_back(path);
  const auto file = static_cast<uint32_t>(files_.size() - 1);
  const int64_t size = st.st_size;
  int64_t pos = 0;
  std::string job;
  while (pos < size) {
    RecordHeader h;
    if (::pread(fd, &h, sizeof h, pos) != static_cast<ssize_t>(sizeof h)) break;
    const bool timed = std::memcmp(h.magic, kMagicTimed, sizeof kMagicTimed) == 0;
    const int64_t head = static_cast<int64_t>(sizeof h) + (timed ? kTimeBytes : 0);
    if ((!timed && std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) || h.job_bytes == 0 ||
        h.job_bytes > kMaxJobIdBytes || h.offset < 0 ||
        pos + head + h.job_bytes + h.length > size) {
      break;
    }
    int64_t time_ms = 0;
    if (timed && ::pread(fd, &time_ms, sizeof time_ms, pos + static_cast<int64_t>(sizeof h)) !=
                     static_cast<ssize_t>(sizeof time_ms)) {
      break;
    }
    job.resize(h.job_bytes);
    if (::pread(fd, job.data(), job.size(), pos + head) != static_cast<ssize_t>(job.size())) {
      break;
    }
    AttemptLog& log = *Find(job, h.attempt, h.rank, /*create=*/true);
    const int64_t at = pos + head + h.job_bytes;
    int64_t offset = h.offset;
    int64_t length = h.length;
    if (offset > log.size) {  // an earlier segment holding the bytes before was removed
      log.extents.push_back(Extent{kMissing, 0, log.size, offset - log.size, time_ms});
      log.size = offset;
    }
    const int64_t skip = std::min(length, log.size - offset);  // a record is never rewritten,
    if (length > skip) {                                       // but stay safe if one were
      log.extents.push_back(Extent{file, at + skip, offset + skip, length - skip, time_ms});
      log.size = offset + length;
    }
    pos = at + length;
  }
  if (pos < size) {
    if (last && ::ftruncate(fd, pos) == 0) {
      spdlog::warn("logs: {}: dropped a record cut short at byte {} (a crash while writing it)",
                   path, pos);
    } else {
      spdlog::warn("logs: {}: unreadable from byte {} of {}; the rest is not indexed", path, pos,
                   size);
    }
  }
  return absl::OkStatus();
}

LogStore::AttemptLog* LogStore::Find(const std::string& job_id, int attempt, int rank,
                                     bool create) const {
  const std::string key = Key(job_id, attempt, rank);
  if (auto it = index_.find(key); it != index_.end()) return &it->second;
  // A log an older coordinator kept as a file of its own (looked for only where there are
  // such directories: a stat per new attempt otherwise). Those predate ranks: rank 0's.
  const bool look = legacy_ && rank == 0;
  const std::string legacy = look ? absl::StrCat(dir_, "/", job_id, "/", attempt, ".log") : "";
  struct stat st;
  const bool has_legacy = look && ::stat(legacy.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  if (!has_legacy && !create) return nullptr;
  AttemptLog& log = index_[key];
  if (has_legacy && st.st_size > 0) {
    files_.push_back(legacy);
    log.extents.push_back(Extent{static_cast<uint32_t>(files_.size() - 1), 0, 0, st.st_size});
    log.size = st.st_size;
  }
  return &log;
}

absl::Status LogStore::OpenSegment() {
  for (int tries = 0; tries < 1000; ++tries) {
    const std::string path = absl::StrCat(dir_, "/", SegmentName(next_segment_++));
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) continue;
    if (fd < 0) return ErrnoStatus(absl::StrCat("create ", path), errno);
    files_.push_back(path);
    fd_.reset(fd);
    fd_file_ = static_cast<uint32_t>(files_.size() - 1);
    fd_size_ = 0;
    return absl::OkStatus();
  }
  return absl::InternalError(absl::StrCat(dir_, ": no free segment number"));
}

void LogStore::CloseSegment() { fd_.reset(); }

absl::Status LogStore::Append(const std::string& job_id, int attempt, int64_t offset,
                              const std::string& data, int rank, int64_t time_ms) {
  if (time_ms <= 0) time_ms = absl::ToUnixMillis(absl::Now());
  if (job_id.empty() || job_id.size() > kMaxJobIdBytes || job_id.find('/') != std::string::npos ||
      job_id.find("..") != std::string::npos) {
    return absl::InvalidArgumentError("log: bad job id");
  }
  if (rank < 0 || rank > kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("log: rank ", rank, " is outside 0..", kMaxRank));
  }
  absl::MutexLock lock(&mu_);
  AttemptLog& log = *Find(job_id, attempt, rank, /*create=*/true);
  if (log.truncated) return absl::OkStatus();  // cut by a full disk: the rest is dropped
  if (offset > log.size) {
    if (EndsWithMarker(log)) {  // cut before a restart
      log.truncated = true;
      return absl::OkStatus();
    }
    return absl::OutOfRangeError(absl::StrCat("log of ", Key(job_id, attempt, rank), ": chunk at ",
                                              offset, " after end ", log.size));
  }
  const int64_t skip = log.size - offset;
  if (static_cast<int64_t>(data.size()) <= skip) return absl::OkStatus();  // sent before
  const size_t n = data.size() - static_cast<size_t>(skip);
  if (!fd_.valid()) RETURN_IF_ERROR(OpenSegment());

  RecordHeader h{};
  std::memcpy(h.magic, kMagicTimed, sizeof kMagicTimed);
  h.length = static_cast<uint32_t>(n);
  h.offset = log.size;
  h.attempt = attempt;
  h.job_bytes = static_cast<uint16_t>(job_id.size());
  h.rank = static_cast<uint16_t>(rank);
  iovec iov[4] = {{&h, sizeof h},
                  {&time_ms, sizeof time_ms},
                  {const_cast<char*>(job_id.data()), job_id.size()},
                  {const_cast<char*>(data.data() + skip), n}};
  const int64_t record = static_cast<int64_t>(sizeof h + sizeof time_ms + job_id.size() + n);
  if (!WriteAll(fd_.get(), iov, 4)) {
    const int err = errno;
    const std::string path = files_[fd_file_];
    // Nothing half-written stays: the segment goes back to where the record began (which
    // frees what the write took), and is closed, so that an operator removing segments
    // gives the space back; the next append starts a new one.
    if (::ftruncate(fd_.get(), fd_size_) != 0) {
      spdlog::error("logs: {}: cannot cut a failed record off: {}", path, std::strerror(errno));
    }
    if (fd_size_ == 0) ::unlink(path.c_str());
    CloseSegment();
    ++generation_;
    if (err == ENOSPC || err == EDQUOT) {
      MarkTruncated(log);
      return absl::ResourceExhaustedError(absl::StrCat(path, ": ", Key(job_id, attempt, rank),
                                                       ": log truncated at ", log.size,
                                                       " bytes: the coordinator's disk is full"));
    }
    return ErrnoStatus(absl::StrCat("write ", path), err);
  }
  log.extents.push_back(Extent{fd_file_, fd_size_ + record - static_cast<int64_t>(n), log.size,
                               static_cast<int64_t>(n), time_ms});
  log.size += static_cast<int64_t>(n);
  fd_size_ += record;
  ++generation_;
  if (fd_size_ >= kSegmentBytes) CloseSegment();
  return absl::OkStatus();
}

std::vector<LogStore::Piece> LogStore::PiecesOf(const AttemptLog& log, int64_t offset,
                                                int64_t max) const {
  std::vector<Piece> pieces;
  const int64_t end = std::min(log.size, offset + max);
  if (offset < 0 || offset >= end) return pieces;
  auto it = std::upper_bound(log.extents.begin(), log.extents.end(), offset,
                             [](int64_t off, const Extent& e) { return off < e.offset; });
  if (it != log.extents.begin()) --it;
  for (; it != log.extents.end() && it->offset < end; ++it) {
    const int64_t from = std::max(offset, it->offset);
    const int64_t to = std::min(end, it->offset + it->length);
    if (to <= from) continue;
    pieces.push_back(Piece{it->file == kMissing ? std::string() : files_[it->file],
                           it->file == kMissing ? 0 : it->at + (from - it->offset), to - from});
  }
  return pieces;
}

absl::StatusOr<std::string> LogStore::ReadPieces(const std::vector<Piece>& pieces) {
  std::string out;
  files::UniqueFd fd;
  const std::string* open_path = nullptr;
  absl::Status status;
  for (const Piece& p : pieces) {
    if (p.path.empty()) {
      status = absl::NotFoundError("part of this log was in a segment that has been removed");
      break;
    }
    if (open_path == nullptr || *open_path != p.path) {
      fd.reset(::open(p.path.c_str(), O_RDONLY | O_CLOEXEC));
      if (!fd.valid()) {
        status = errno == ENOENT
                     ? absl::NotFoundError(absl::StrCat(p.path, ": the log segment was removed"))
                     : ErrnoStatus(absl::StrCat("open ", p.path), errno);
        break;
      }
      open_path = &p.path;
    }
    const size_t base = out.size();
    out.resize(base + static_cast<size_t>(p.length));
    const ssize_t r = ::pread(fd.get(), out.data() + base, static_cast<size_t>(p.length), p.at);
    if (r != p.length) {
      status = r < 0 ? ErrnoStatus(absl::StrCat("read ", p.path), errno)
                     : absl::DataLossError(absl::StrCat(p.path, ": shorter than its index says"));
      break;
    }
  }
  if (!status.ok()) return status;
  return out;
}

bool LogStore::EndsWithMarker(const AttemptLog& log) const {
  const auto n = static_cast<int64_t>(kTruncatedMarker.size());
  if (log.size < n) return false;
  absl::StatusOr<std::string> tail = ReadPieces(PiecesOf(log, log.size - n, n));
  return tail.ok() && *tail == kTruncatedMarker;
}

void LogStore::MarkTruncated(AttemptLog& log) {
  log.truncated = true;
  // The disk has no room for more: the marker overwrites the log's last bytes in place,
  // which takes no new space (a log shorter than it gets the marker's end).
  const auto n = static_cast<int64_t>(kTruncatedMarker.size());
  const int64_t at = std::max<int64_t>(0, log.size - n);
  std::string_view text = kTruncatedMarker.substr(static_cast<size_t>(n - (log.size - at)));
  for (const Piece& p : PiecesOf(log, at, log.size - at)) {
    files::UniqueFd fd(p.path.empty() ? -1 : ::open(p.path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd.valid() ||
        ::pwrite(fd.get(), text.data(), static_cast<size_t>(p.length), p.at) != p.length) {
      spdlog::warn("logs: {}: log truncated, and the marker could not be written either", p.path);
    }
    text.remove_prefix(static_cast<size_t>(p.length));
  }
}

int64_t LogStore::Size(const std::string& job_id, int attempt, int rank) const {
  absl::MutexLock lock(&mu_);
  const AttemptLog* log = Find(job_id, attempt, rank, /*create=*/false);
  return log == nullptr ? 0 : log->size;
}

absl::StatusOr<std::string> LogStore::Read(const std::string& job_id, int attempt, int64_t offset,
                                           int64_t max, int rank) const {
  std::vector<Piece> pieces;
  {
    absl::MutexLock lock(&mu_);
    const AttemptLog* log = Find(job_id, attempt, rank, /*create=*/false);
    if (log == nullptr) return std::string();
    pieces = PiecesOf(*log, offset, max);
  }
  // Records are never rewritten once indexed (the marker aside), so the reads need no lock.
  return ReadPieces(pieces);
}

LogStore::RecordSpan LogStore::RecordAt(const std::string& job_id, int attempt, int64_t offset,
                                        int rank) const {
  absl::MutexLock lock(&mu_);
  const AttemptLog* log = Find(job_id, attempt, rank, /*create=*/false);
  if (log == nullptr || offset >= log->size) return RecordSpan{offset, 0};
  auto it = std::upper_bound(log->extents.begin(), log->extents.end(), offset,
                             [](int64_t off, const Extent& e) { return off < e.offset; });
  if (it != log->extents.begin()) --it;
  if (it == log->extents.end()) return RecordSpan{log->size, 0};
  return RecordSpan{it->offset + it->length, it->time_ms};
}

int64_t LogStore::OffsetSince(const std::string& job_id, int attempt, int64_t since_ms,
                              int rank) const {
  absl::MutexLock lock(&mu_);
  const AttemptLog* log = Find(job_id, attempt, rank, /*create=*/false);
  if (log == nullptr) return 0;
  for (const Extent& e : log->extents) {
    if (e.time_ms >= since_ms) return e.offset;
  }
  return log->size;
}

absl::StatusOr<int64_t> LogStore::OffsetOfLastLines(const std::string& job_id, int attempt,
                                                    int64_t lines, int rank) const {
  const int64_t size = Size(job_id, attempt, rank);
  if (lines <= 0) return size;
  // Backwards a block at a time, counting line ends; a last line without its newline counts.
  constexpr int64_t kBlock = 64 * 1024;
  int64_t end = size;
  int64_t seen = 0;
  bool first = true;
  while (end > 0) {
    const int64_t from = std::max<int64_t>(0, end - kBlock);
    ASSIGN_OR_RETURN(std::string block, Read(job_id, attempt, from, end - from, rank));
    for (int64_t i = static_cast<int64_t>(block.size()) - 1; i >= 0; --i) {
      if (block[static_cast<size_t>(i)] != '\n') continue;
      if (first && from + i == size - 1) continue;  // the log's own final newline
      if (++seen == lines) return from + i + 1;
    }
    first = false;
    end = from;
  }
  return 0;
}

LogStore::Reclaimed LogStore::Drop(const std::function<bool(std::string_view)>& gone) {
  absl::MutexLock lock(&mu_);
  Reclaimed out;
  std::vector<bool> live(files_.size(), false);
  for (auto it = index_.begin(); it != index_.end();) {
    // Key(): "<job>.<attempt>" or "<job>.<attempt>#<rank>"; a job id may hold dots.
    std::string_view key = it->first;
    key = key.substr(0, key.find('#'));
    const std::string_view job = key.substr(0, key.rfind('.'));
    if (gone(job)) {
      index_.erase(it++);
      ++out.logs;
      continue;
    }
    for (const Extent& e : it->second.extents) {
      if (e.file != kMissing) live[e.file] = true;
    }
    ++it;
  }
  for (size_t i = 0; i < files_.size(); ++i) {
    const std::string& path = files_[i];
    if (live[i] || !absl::EndsWith(path, ".seg")) continue;
    if (fd_.valid() && i == fd_file_) continue;  // appends go on there
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) continue;  // removed before
    if (::unlink(path.c_str()) != 0) {
      spdlog::warn("logs: cannot remove {}: {}", path, std::strerror(errno));
      continue;
    }
    ++out.segments;
    out.bytes += st.st_size;
  }
  if (legacy_) out.bytes += DropLegacy(gone);
  if (out.segments > 0) ++generation_;
  return out;
}

// The per-attempt files of older coordinators (DATA/logs/<job>/<attempt>.log) of jobs gone.
int64_t LogStore::DropLegacy(const std::function<bool(std::string_view)>& gone) {
  int64_t bytes = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    if (!entry.is_directory(ec) || !gone(entry.path().filename().string())) continue;
    for (const auto& file : std::filesystem::directory_iterator(entry.path(), ec)) {
      const auto size = file.file_size(ec);
      if (!ec) bytes += static_cast<int64_t>(size);
    }
    std::filesystem::remove_all(entry.path(), ec);
    if (ec) spdlog::warn("logs: cannot remove {}: {}", entry.path().string(), ec.message());
  }
  return bytes;
}

std::vector<std::string> LogStore::Segments() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const std::string& f : files_) {
    if (absl::EndsWith(f, ".seg") && ::access(f.c_str(), F_OK) == 0) out.push_back(f);
  }
  return out;
}

uint64_t LogStore::WaitForAppend(uint64_t generation, int64_t timeout_ms) const {
  absl::MutexLock lock(&mu_);
  struct Arg {
    const uint64_t* gen;
    uint64_t seen;
  } arg{&generation_, generation};
  mu_.AwaitWithTimeout(absl::Condition(
                           +[](Arg* a) { return *a->gen != a->seen; }, &arg),
                       absl::Milliseconds(timeout_ms));
  return generation_;
}

uint64_t LogStore::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

}  // namespace stemma::coordinator
