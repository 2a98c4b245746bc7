// Attempt logs shipped by workers, kept as files under DATA/logs/<job id>/<attempt>.log so
// they outlive coordinator restarts. A chunk carries its offset in the attempt's log, so a
// chunk sent twice (after a reconnect) is written once. Thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace stemma::coordinator {

class LogStore {
 public:
  explicit LogStore(std::string dir) : dir_(std::move(dir)) {}

  // Writes the part of [offset, offset + data.size()) not yet stored. A gap (offset past
  // the end) is refused with OUT_OF_RANGE.
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

  const std::string dir_;
  mutable absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace stemma::coordinator
