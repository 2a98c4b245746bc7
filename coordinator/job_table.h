// The job table: every job, its state machine, dependencies, the queue order and the
// idempotency keys. Pure bookkeeping — it knows nothing of workers or RPCs; placements
// are decided by the scheduler and resources are tracked by the worker table.
//
// Every method that changes a job appends the job's new record (and a watch event) to
// `Changes`; the caller commits them. Not thread-safe: the coordinator's mutex guards it.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "coordinator/changes.h"
#include "coordinator/memoization.h"
#include "stemma/v1/job.pb.h"
#include "stemma/v1/user_service.pb.h"

namespace stemma::coordinator {

// A job `stemma gc jobs --delete` forgot: its record is a tombstone (id, seq, archived).
inline bool IsForgotten(const v1::Job& job) {
  return job.archived() && job.state() == v1::JOB_STATE_UNSPECIFIED;
}

class JobTable {
 public:
  // Called on every state change (for metrics).
  using TransitionObserver =
      std::function<void(const v1::Job& job, v1::JobState from, v1::JobState to)>;

  explicit JobTable(const Clock* clock) : clock_(clock) {}
  JobTable(const JobTable&) = delete;  // memo_ looks jobs up in this table
  JobTable& operator=(const JobTable&) = delete;

  void SetObserver(TransitionObserver observer) { observer_ = std::move(observer); }
  // Asked before a job is served from another's outputs (Memoizer::Guard): the checkpoint
  // registry's ownership and content checks.
  void SetCacheGuard(Memoizer::Guard guard) { memo_.SetGuard(std::move(guard)); }

  // Rebuilds the table from stored records (start-up).
  void Load(const StoreSnapshot& snapshot);

  struct SubmitResult {
    std::vector<std::string> ids;
    bool existing = false;
  };
  // Validates and adds jobs. Names in depends_on resolve within the request first, then
  // as job ids. INVALID_ARGUMENT (naming the job and field) for a bad spec, an unknown
  // dependency or a cycle; nothing is added then. A known idempotency key returns the
  // jobs it created before.
  absl::StatusOr<SubmitResult> Submit(const v1::SubmitRequest& request, Changes* changes);

  const v1::Job* Find(const std::string& id) const;
  // Whether a submit used this idempotency key before.
  bool HasIdempotencyKey(const std::string& key) const { return idempotency_.contains(key); }
  // An operation's idempotency key (cancel, retry, drain, pin; the rpc layer scopes it to
  // the caller): false when `key` is new, true when it was used before for the same
  // `operation` on `target` (the caller answers as the first time and changes nothing),
  // FAILED_PRECONDITION naming both when it was used for another. "" is never seen.
  absl::StatusOr<bool> SeenOperation(const std::string& key, const std::string& operation,
                                     const std::string& target) const;
  // Remembers `key` for `operation` on `target`, durably in `changes` (same table as
  // Submit's keys). Nothing for "".
  void RememberOperation(const std::string& key, const std::string& operation,
                         const std::string& target, Changes* changes);
  // The most recently submitted job named `name`, or null. A scan: for user lookups only.
  // The most recent job named `name` (of `owner` only, when not "").
  const v1::Job* FindByName(const std::string& name, const std::string& owner = "") const;
  // The job an attempt id ("j-12.3") belongs to, if that attempt is its current one.
  v1::Job* FindCurrentAttempt(const std::string& attempt_id);

  absl::StatusOr<v1::ListJobsResponse> List(const v1::ListJobsRequest& request) const;

  // QUEUED jobs in scheduling order: priority (high first), then submission order.
  using QueueKey = std::tuple<int, uint64_t, std::string>;  // (-priority, seq, id)
  const std::set<QueueKey>& queue() const { return queue_; }
  // The smallest GPU, CPU and memory demand among QUEUED jobs (each from possibly a
  // different job): when no worker has that much free, no queued job can be placed.
  struct Demand {
    int gpus = 0;
    double cpus = 0;
    int64_t memory_mb = 0;
  };
  Demand MinQueuedDemand() const;

  // QUEUED → ASSIGNED with a new attempt of these parts.
  v1::Job* Assign(const std::string& id, std::vector<v1::AttemptPart> parts,
                  const std::string& rendezvous, Changes* changes);
  // ASSIGNED → RUNNING (first part started).
  void MarkStarted(v1::Job* job, int rank, Changes* changes);
  // Progress report of a running job.
  void SetProgress(v1::Job* job, const v1::Progress& progress, Changes* changes);
  // A part finished with exit code 0; the job succeeds when all parts have.
  void PartSucceeded(v1::Job* job, int rank,
                     const google::protobuf::Map<std::string, std::string>& outputs,
                     Changes* changes);
  // The current attempt failed: back to QUEUED after its backoff while the attempt
  // budget lasts (and `retryable`), else FAILED; FAILED spreads to dependents.
  void AttemptFailed(v1::Job* job, const std::string& result, int exit_code, bool retryable,
                     Changes* changes);
  // Preemption (coordinator/preemptor.h): this live job's current attempt is being stopped
  // for `by` (Attempt.preempted_by; durable, so a restart does not stop it twice).
  void MarkPreempting(v1::Job* job, const std::string& by, Changes* changes);
  // The current attempt ended preempted (it stopped when asked, or was killed after the grace
  // period): back to QUEUED at once, no backoff, the attempt not counted against the budget
  // (attempt_budget grows by one); Job.preemptions and Job.preempted_by record it.
  void AttemptPreempted(v1::Job* job, int exit_code, bool killed, Changes* changes);
  // Early stopping decided to stop this live job (coordinator/early_stopper.h): `reason`
  // becomes its Job.early_stop now and its reason when it succeeds.
  void SetEarlyStop(v1::Job* job, const std::string& reason, Changes* changes);
  // The engine build a cache hit must have been produced by (the build id the most recently
  // registered worker with an engine reported; "" before any did).
  void SetEngineBuild(const std::string& build) {
    if (!build.empty()) engine_build_ = build;
  }
  const std::string& engine_build() const { return engine_build_; }
  // What releasing `job` (its inputs wired, defaults applied) now would do: served from a
  // hit, waiting for a twin, or run; changes nothing (Memoizer::Predict). The pointers are
  // valid under the lock that guards this table.
  Memoizer::Prediction PredictCache(const v1::Job& job) const {
    return memo_.Predict(job, engine_build_);
  }
  // Ends the job as CANCELLED. FAILED_PRECONDITION when it has already ended.
  absl::Status Cancel(const std::string& id, const std::string& reason, Changes* changes);
  // Gives a FAILED or CANCELLED job a fresh attempt budget; dependents that failed
  // because of it wait again.
  absl::Status Retry(const std::string& id, Changes* changes);

  // Every attempt of the job, oldest first: those a newer attempt replaced (AttemptsTable)
  // and then the current one (when it has started one). Empty for an unknown job.
  std::vector<v1::Attempt> History(const std::string& id) const;

  // `stemma gc jobs` (coordinator/job_archive.cc): the finished jobs that `request` selects
  // (finished before request.finished_before_ms, in request.states, of request.experiment)
  // and `may_manage` accepts, in submission order. Never a job that is not finished or that
  // an unfinished job depends on (or waits for as its cache twin); with `forget`, only jobs
  // whose dependents are forgotten too. With request.apply, archives them (Job.archived:
  // hidden from listings) or, with forget, replaces each record by a tombstone (id and seq
  // only, so that ids are never reused; skipped by Load). INVALID_ARGUMENT for a request
  // without a time or with an unfinished state.
  absl::StatusOr<v1::GcJobsResponse> Collect(const v1::GcJobsRequest& request,
                                             const std::function<bool(const v1::Job&)>& may_manage,
                                             Changes* changes);

  bool IsLive(const v1::Job& job) const {
    return job.state() == v1::ASSIGNED || job.state() == v1::RUNNING;
  }
  size_t size() const { return jobs_.size(); }

  // Visits every job (for rebuilding resource allocations and metrics).
  template <typename F>
  void ForEach(F&& f) const {
    for (const auto& [id, e] : jobs_) f(e.job);
  }

 private:
  struct Entry {
    v1::Job job;
    std::vector<std::string> dependents;
  };

  void SetState(Entry& e, v1::JobState to, const std::string& reason, Changes* changes);
  void Record(Entry& e, v1::JobState previous, Changes* changes);
  // PENDING or QUEUED depending on the dependencies; FAILED if one has failed.
  void Release(Entry& e, Changes* changes);
  // An engine job whose cache key a SUCCEEDED job with outputs still in place ran under ends
  // SUCCEEDED at once with that job's outputs ("memoized from j-…"); true when it did
  // (coordinator/memoization.h decides).
  bool ServeFromCache(Entry& e, Changes* changes);
  // An engine job whose cache key a queued or running job already has waits for that one
  // (PENDING, its id in the kWaitsForLabel label, one of its dependents) instead of running
  // the same thing beside it into the same outputs, and is then served from the cache (or
  // runs, if that one failed or was cancelled); true when it waits. Otherwise the job is the
  // one that runs under its key.
  bool WaitForTwin(Entry& e, Changes* changes);
  // Re-evaluates the PENDING dependents of a job that ended.
  void ReleaseDependents(Entry& e, Changes* changes);

  const Clock* clock_;
  TransitionObserver observer_;
  absl::node_hash_map<std::string, Entry> jobs_;  // stable addresses
  std::vector<std::string> order_;                // ids in submission order
  std::set<QueueKey> queue_;
  std::multiset<int> queued_gpus_;
  std::multiset<double> queued_cpus_;
  std::multiset<int64_t> queued_memory_;
  void Enqueue(const v1::Job& job);
  void Dequeue(const v1::Job& job);
  absl::flat_hash_map<std::string, std::vector<std::string>> idempotency_;
  Memoizer memo_{[this](const std::string& id) -> const v1::Job* {
    auto it = jobs_.find(id);
    return it == jobs_.end() ? nullptr : &it->second.job;
  }};
  std::string engine_build_;
  uint64_t next_seq_ = 1;
  // Replaced attempts by job id, oldest first (the current one is in the job's record).
  absl::flat_hash_map<std::string, std::vector<v1::Attempt>> history_;
  // Removes a forgotten job from every index (Collect with forget).
  void Forget(const std::string& id, Changes* changes);
};

}  // namespace stemma::coordinator
