// Preemption as it happens: after each scheduling pass, a QUEUED job that lower-priority jobs
// keep out of the GPUs (or CPUs, memory) it needs stops the cheapest of them
// (coordinator/preemption.h chooses), and what they free is reserved for it (scheduler.h).
//
// A victim's current attempt records the job that preempts it (Attempt.preempted_by,
// committed with the decision, so it is never stopped twice, not even across a restart), and
// each worker of the attempt gets a StopAttempt with `preempt`: a trainer saves its checkpoint
// at once and exits with the engine's "preempted" code, anything else is terminated; the
// worker reports Finished.preempted. The job then goes back to QUEUED at once, without
// backoff and without spending an attempt (JobTable::AttemptPreempted), and its next attempt
// resumes from the checkpoint. A victim that has not stopped within the grace period
// (SchedulerOptions::preemption_grace_ms) is cancelled on its workers and requeued the same
// way. stemma_scheduler_preemptions_total counts both.
//
// The work a victim would lose: the time since its attempt's last checkpoint (the
// `checkpoint_step` points the worker makes of a trainer's checkpoint events,
// common/engine_contract.h), else since the attempt started.
//
// Thread-safety: every method runs under the core mutex.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "coordinator/core.h"

namespace stemma::coordinator {

class Preemptor {
 public:
  explicit Preemptor(CoordinatorCore* core) : core_(core) {}
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK(core_->mu) { core_->mu.AssertHeld(); }

  // Every job state change (also at load): live priorities, victims and reservations.
  void OnTransition(const v1::Job& job, v1::JobState from, v1::JobState to)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  // A metric batch of a live train job: notes its checkpoints.
  void OnMetrics(const v1::Job& job, const v1::AttemptEvent::MetricBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);

  // After a placement pass: kills and requeues victims past the grace period, and lets
  // blocked higher-priority jobs preempt. Nothing when preemption is off.
  void Pass(Changes* changes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);

  // A part of the live job's current attempt reported Finished.preempted: the attempt ends
  // (the other parts are cancelled) and the job is requeued without spending an attempt.
  void Requeue(v1::Job* job, const std::string& worker_id, int exit_code, Changes* changes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);

  // What is kept for preempting jobs, for the scheduler.
  const std::vector<Reservation>* reservations() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu) {
    return &reservations_;
  }

 private:
  // Work the live job would lose if stopped now, in milliseconds.
  int64_t WorkLostMs(const v1::Job& job, int64_t now_wall_ms) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  void Stop(v1::Job* victim, const std::string& by, Changes* changes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  void KillOverdue(Changes* changes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  void DropReservations(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);

  CoordinatorCore* const core_;
  std::map<int, int64_t> live_priorities_ ABSL_GUARDED_BY(core_->mu);  // priority -> live jobs
  // Live attempt id -> wall time of its last checkpoint.
  absl::flat_hash_map<std::string, int64_t> checkpoint_ms_ ABSL_GUARDED_BY(core_->mu);
  // Victim job id -> monotonic time by which it must have stopped.
  absl::flat_hash_map<std::string, int64_t> stopping_ ABSL_GUARDED_BY(core_->mu);
  std::vector<Reservation> reservations_ ABSL_GUARDED_BY(core_->mu);
  // Preempting job id -> monotonic time its reservations lapse if it has not started.
  absl::flat_hash_map<std::string, int64_t> reserved_until_ ABSL_GUARDED_BY(core_->mu);
};

}  // namespace stemma::coordinator
