// Placement: turns the scheduler's decisions into attempts, allocations and assignments.
#pragma once

#include "coordinator/core.h"

namespace stemma::coordinator {

class Preemptor;

class Placer {
 public:
  explicit Placer(CoordinatorCore* core) : core_(core) {}
  // The reservations of preempting jobs (coordinator/preemptor.h) that placement respects.
  void SetPreemptor(Preemptor* preemptor) { preemptor_ = preemptor; }
  // The core mutex is held. Every part shares the core's one mutex; the thread-safety
  // analysis cannot see that through two parts' pointers, so callers in other parts say so.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK(core_->mu) { core_->mu.AssertHeld(); }

  // Places what fits now. Returns the number of jobs placed.
  int Place(Changes* changes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  // The assignment message for one part (rank) of the job's current attempt.
  static v1::Assignment MakeAssignment(const v1::Job& job, int rank);
  // Why a QUEUED job can never run on the workers registered now (ALIVE): "unplaceable:
  // needs 16 GPUs, the largest worker has 8"; "" when some worker (or, for a gang, enough
  // workers) could hold it once free, or when no worker is registered at all. Computed
  // when read, so it follows workers coming and going; the job stays QUEUED.
  static std::string Unplaceable(const v1::Job& job, const WorkerTable& workers);
  // Worker and GPU gauges.
  void UpdateGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);

 private:
  CoordinatorCore* const core_;
  Preemptor* preemptor_ = nullptr;
};

}  // namespace stemma::coordinator
