// Attempt logs shipped by workers, kept as files under DATA/logs/<job id>/<attempt>.log so
// they outlive coordinator restarts. A chunk carries its offset in the attempt's log, so a
// chunk sent twice (after a reconnect) is written once. Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace stemma::coordinator {

class LogStore {
 public:
  explicit LogStore(std::string dir) : dir_(std::move(dir)) {}

  // The last line of a log that the coordinator's disk could not hold.
  static constexpr std::string_view kTruncatedMarker = "\n[stemma: log truncated: disk full]\n";

  // Writes the part of [offset, offset + data.size()) not yet stored. A gap (offset past
  // the end) is refused with OUT_OF_RANGE, unless the log was cut: when a write meets a
  // full disk, the log's last bytes become kTruncatedMarker (RESOURCE_EXHAUSTED, naming the
  // file), and later chunks of that attempt are dropped.
  absl::Status Append(const std::string& job_id, int attempt, int64_t offset,
                      const std::string& data);
  // Bytes stored so far for the attempt.
  int64_t Size(const std::string& job_id, int attempt) const;
  // Up to `max` bytes from `offset`; empty at the end.
  absl::StatusOr<std::string> Read(const std::string& job_id, int attempt, int64_t offset,
                                   int64_t max) const;
  // Blocks until an append happens after `generation` or `timeout_ms` passes; returns
  // the current generation.
  uint64_t WaitForAppend(uint64_t generation, int64_t timeout_ms) const;
  uint64_t generation() const;

 private:
  std::string Path(const std::string& job_id, int attempt) const;
  static bool EndsWithMarker(int fd, int64_t size);
  static void MarkTruncated(const std::string& path, int64_t end);

  const std::string dir_;
  mutable absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<std::string> truncated_ ABSL_GUARDED_BY(mu_);  // paths cut by a full disk
};

}  // namespace stemma::coordinator
