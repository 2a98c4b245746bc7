// Leases: heartbeats renew a worker's lease; a worker silent for lease_ms is LOST and its
// live attempts fail (retryable).
#pragma once

#include <string>

#include "coordinator/core.h"

namespace stemma::coordinator {

class Leases {
 public:
  explicit Leases(CoordinatorCore* core) : core_(core) {}
  // The core mutex is held. Every part shares the core's one mutex; the thread-safety
  // analysis cannot see that through two parts' pointers, so callers in other parts say so.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK(core_->mu) { core_->mu.AssertHeld(); }

  // Never takes the core mutex (only live_mu). FAILED_PRECONDITION when the session was
  // replaced or the lease had expired.
  absl::StatusOr<v1::HeartbeatAck> Heartbeat(const std::string& worker_id, uint64_t session,
                                             const v1::Heartbeat& heartbeat);
  // Marks workers whose lease ran out LOST, closes their streams and ends their attempts.
  void Expire(Changes* changes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);

 private:
  CoordinatorCore* const core_;
};

}  // namespace stemma::coordinator
