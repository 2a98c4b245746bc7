// Attempt logs shipped by workers, kept under DATA/logs/ so they outlive coordinator restarts.
// They are appended to segment files (<n>.seg, a new one past kSegmentBytes, after a restart
// and after a failed write), so that the log of a short job costs one write into an open
// file rather than a new file: creating a file takes 0.1-0.2 ms on ext4 here, as much as all
// the rest of the control plane's work for such a job. A record is a header (the job, the
// attempt, the record's offset in the attempt's log, its length) and then the bytes; Load
// rebuilds the index of every attempt's records from the headers. A chunk carries its offset
// in the attempt's log, so a chunk sent twice (after a reconnect) is written once. Logs that
// older coordinators kept as DATA/logs/<job>/<attempt>.log are still read (and continued in
// the segments). A job whose parts run several engine processes has one log per process,
// by its global RANK (`rank` below; 0 by default: the job's log, the only one of a job of one
// process); records of coordinators before ranks carry 0 there and read as rank 0's.
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/files.h"

namespace stemma::coordinator {

class LogStore {
 public:
  explicit LogStore(std::string dir) : dir_(std::move(dir)) {}
  ~LogStore();
  LogStore(const LogStore&) = delete;
  LogStore& operator=(const LogStore&) = delete;

  // The last line of a log that the coordinator's disk could not hold.
  static constexpr std::string_view kTruncatedMarker = "\n[stemma: log truncated: disk full]\n";
  static constexpr int64_t kSegmentBytes = 64 << 20;
  static constexpr int kMaxRank = 65535;  // the record header's 16 bits

  // Creates the directory if needed and indexes the segments there. A record cut short by a
  // crash at the end of a segment is dropped (its worker sends it again: offsets). Call once,
  // before anything else.
  absl::Status Load();

  // Writes the part of [offset, offset + data.size()) not yet stored. A gap (offset past
  // the end) is refused with OUT_OF_RANGE, unless the log was cut: when a write meets a
  // full disk, the log's last bytes become kTruncatedMarker (RESOURCE_EXHAUSTED, naming the
  // segment), and later chunks of that attempt are dropped. The segment being written is
  // closed then, so that removing segments gives the space back.
  // INVALID_ARGUMENT for a bad job id or a rank outside 0..kMaxRank.
  // `time_ms`: when the coordinator received the bytes (epoch ms; 0: now), kept with the
  // record for `stemma logs --since/--timestamps`.
  absl::Status Append(const std::string& job_id, int attempt, int64_t offset,
                      const std::string& data, int rank = 0, int64_t time_ms = 0);
  // The record holding byte `offset` of the log: where it ends and when it was received
  // (0 for records written before receive times were kept). {offset, 0} past the end.
  struct RecordSpan {
    int64_t end = 0;
    int64_t time_ms = 0;
  };
  RecordSpan RecordAt(const std::string& job_id, int attempt, int64_t offset, int rank = 0) const;
  // Where the first record received at or after `since_ms` starts (the size when none was).
  int64_t OffsetSince(const std::string& job_id, int attempt, int64_t since_ms, int rank = 0) const;
  // Where the last `lines` lines start (0 when the log has fewer; the size for lines <= 0).
  absl::StatusOr<int64_t> OffsetOfLastLines(const std::string& job_id, int attempt, int64_t lines,
                                            int rank = 0) const;
  // Bytes stored so far for the attempt (and rank).
  int64_t Size(const std::string& job_id, int attempt, int rank = 0) const;
  // Up to `max` bytes from `offset`; empty at the end. NOT_FOUND when a segment holding
  // them was removed.
  absl::StatusOr<std::string> Read(const std::string& job_id, int attempt, int64_t offset,
                                   int64_t max, int rank = 0) const;
  // Blocks until an append happens after `generation` or `timeout_ms` passes; returns
  // the current generation.
  uint64_t WaitForAppend(uint64_t generation, int64_t timeout_ms) const;
  uint64_t generation() const;

  // Forgets the logs of the jobs `gone` names (`stemma gc jobs --delete`, and at start-up the
  // jobs forgotten before a restart) and gives their disk back: every segment that then holds
  // no byte of a remaining log is removed (the segment being written stays), and so are those
  // jobs' per-attempt files of older coordinators. A segment shared with a remaining log
  // stays whole (records are not copied), so bytes come back as whole segments: those of jobs
  // forgotten together with their neighbours in time. `gone` runs under the store's lock.
  struct Reclaimed {
    int64_t logs = 0;      // attempt logs (per rank) forgotten
    int64_t segments = 0;  // files removed
    int64_t bytes = 0;     // their size
  };
  Reclaimed Drop(const std::function<bool(std::string_view job_id)>& gone);

  // The segment files there are now (tests, operators).
  std::vector<std::string> Segments() const;

 private:
  struct Extent {        // one record's bytes
    uint32_t file = 0;   // index in files_
    int64_t at = 0;      // where they start in that file
    int64_t offset = 0;  // where they start in the attempt's log
    int64_t length = 0;
    int64_t time_ms = 0;  // when it was received (0: unknown, an older record)
  };
  struct AttemptLog {
    std::vector<Extent> extents;  // in log order, contiguous
    int64_t size = 0;
    bool truncated = false;  // cut by a full disk: later chunks are dropped
  };
  struct Piece {  // part of a read
    std::string path;
    int64_t at;
    int64_t length;
  };

  static std::string Key(const std::string& job_id, int attempt, int rank);
  // The attempt's entry, a legacy per-attempt file indexed on first sight; null when there
  // is none and `create` is false.
  AttemptLog* Find(const std::string& job_id, int attempt, int rank, bool create) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<Piece> PiecesOf(const AttemptLog& log, int64_t offset, int64_t max) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static absl::StatusOr<std::string> ReadPieces(const std::vector<Piece>& pieces);
  absl::Status IndexSegment(uint32_t number, bool last) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status OpenSegment() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseSegment() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool EndsWithMarker(const AttemptLog& log) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkTruncated(AttemptLog& log) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t DropLegacy(const std::function<bool(std::string_view)>& gone)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string dir_;
  mutable absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  mutable std::vector<std::string> files_ ABSL_GUARDED_BY(mu_);  // segments and legacy logs
  mutable absl::flat_hash_map<std::string, AttemptLog> index_ ABSL_GUARDED_BY(mu_);
  uint32_t next_segment_ ABSL_GUARDED_BY(mu_) = 1;
  bool legacy_ ABSL_GUARDED_BY(mu_) = false;  // the directory holds per-attempt log files
  files::UniqueFd fd_ ABSL_GUARDED_BY(mu_);   // the segment being written, or none
  uint32_t fd_file_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t fd_size_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace stemma::coordinator
