// The executor: runs each job attempt in its own child process and process group, captures
// its output into DATA/attempts/<attempt id>/log, enforces timeouts and cancellations, and
// keeps each attempt's state until the session says the coordinator has it (Forget).
//
// A few spawner threads fork the children, in parallel and without the executor's lock: a
// vfork parent waits until its child has called execve (about half a millisecond here), so
// one thread could start no more than ~2,000 children a second, and under the lock every
// other call would wait too. Spawner threads live as long as the executor, so
// PR_SET_PDEATHSIG (tied to the forking thread) fires only when the worker dies. The
// executor thread waits with epoll on each child's pidfd and output pipe, reaps, and runs
// timers. Other threads call Launch/Cancel/Discard/Forget/Snapshot; they never block on a
// child.
//
// Thread-safe: every public method may be called from any thread. The change callback is
// called from the executor thread, a spawner thread (a failed fork) or the caller of Launch
// (refusals), without the executor's lock held; it must be quick and must not call back
// into Wait*.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "stemma/v1/worker_service.pb.h"
#include "worker/config.h"
#include "worker/metrics.h"

namespace stemma::worker {

// A copy of one attempt's state.
struct AttemptSnapshot {
  std::string attempt_id;
  std::string job_id;
  int32_t rank = 0;
  int64_t pid = 0;        // 0 until forked, and for attempts refused without a process
  std::string log_path;   // empty when there is no log file
  int64_t log_bytes = 0;  // bytes written to the log file so far
  bool finished = false;
  v1::AttemptEvent::Finished result;  // set when finished
  uint64_t progress_version = 0;      // grows with each STEMMA_PROGRESS line
  v1::Progress progress;
  size_t metric_count = 0;  // metric points read so far (MetricsSince)
  // A part of several ranks: the logs of local ranks 1.. (rank 0's is log_path above).
  struct RankLog {
    int32_t local_rank = 0;
    std::string log_path;
    int64_t log_bytes = 0;
  };
  std::vector<RankLog> more_logs;
};

struct SpawnPlan;     // worker/spawn_plan.h
struct SpawnContext;  // worker/spawn_plan.h
struct RankProcess;   // worker/executor_internal.h

class Executor {
 public:
  // Starts the executor thread. `config` (data_dir, allow_exec, kill_grace_ms, engine_path)
  // is copied; `metrics` may be null and must outlive the executor. `clock` (null: the
  // system's) times timeouts, the kill grace period, start signals and orphan reaping, and
  // stamps metric points; it must outlive the executor.
  Executor(const WorkerConfig& config, Metrics* metrics, Clock* clock = nullptr);
  // Shutdown(), then joins the thread.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Called whenever an attempt finishes, 2 ms after it starts and at most 20 ms after it
  // reports progress (or with its finish, if that comes first: one call for all). Log bytes are not
  // signalled: poll Snapshot, which shows a start at once. Replaces the previous callback; after it
  // returns the old one is not running and will not run again.
  void SetChangeCallback(std::function<void()> callback);

  // The metric points an attempt's output has reported (engine `step` and `metric` event
  // lines, common/engine_contract.h), from index `from` on, at most `max` of them, appended
  // to `batch` (empty on entry); returns how many (0 for an unknown attempt). Points are kept
  // until Forget; past kMaxMetricPoints per attempt further ones are dropped.
  size_t MetricsSince(const std::string& attempt_id, size_t from, size_t max,
                      v1::AttemptEvent::MetricBatch* batch) const;
  static constexpr size_t kMaxMetricPoints = 200000;  // = AttemptOutput::kMaxMetricPoints
  // Up to `max` bytes of the attempt's log from `offset`, from memory: false when they are no
  // longer there (or not yet written), and then the log file has them. Reading the file
  // instead costs an open and a close, and on ext4 the close of a log whose file was reused
  // (truncated, rewritten) starts its writeback at once (auto_da_alloc): a disk write per job.
  // `local_rank`: which process of a part of several ranks (0: the first, the attempt's log).
  bool LogSince(const std::string& attempt_id, int64_t offset, size_t max, std::string* out,
                int local_rank = 0) const;

  // Starts an attempt: creates DATA/attempts/<id>/ and its log, and queues the child for a
  // spawner thread to fork. A part of several ranks (common/job_ranks.h) starts one process
  // per rank, each in its own process group with its own log (log, log.1, ...); rank 0's
  // output is the attempt's events. The attempt ends when every rank has exited; the first
  // rank to fail (exit != 0, a signal) ends the others (SIGTERM, SIGKILL after kill_grace_ms)
  // and gives the attempt its exit code and reason ("rank 2: exit 1"). Cancel, Discard,
  // timeouts and Shutdown reach every rank. Refusals (exec without --allow-exec, no engine, bad
  // spec) are not errors: the attempt is recorded as finished with a non-retryable "refused: ..."
  // reason; worker-side failures (disk, fork) finish it as retryable "worker error: ...".
  // ALREADY_EXISTS if the attempt is known; FAILED_PRECONDITION after Shutdown.
  absl::Status Launch(const v1::Assignment& assignment);

  // SIGTERM to the attempt's process group, SIGKILL after kill_grace_ms. It finishes with
  // reason "cancelled: <reason>". No-op for unknown or finished attempts.
  void Cancel(const std::string& attempt_id, const std::string& reason);

  // Preemption (StopAttempt.preempt): an engine train job is asked to save its checkpoint and
  // exit (the preempt file in its directory, common/engine_contract.h kPreemptFile; it ends
  // with kExitPreempted); any other attempt is terminated like Cancel. Either way it finishes
  // with result "preempted", Finished.preempted set and retryable; one that ends otherwise
  // first (done, failed) keeps that end. No-op for unknown or finished attempts.
  void Preempt(const std::string& attempt_id, const std::string& preempted_by);

  // Like Cancel, but the attempt is forgotten as soon as it ends (the coordinator no longer
  // wants it) and disappears from Snapshot at once. Forgets a finished attempt.
  void Discard(const std::string& attempt_id);

  // Drops a finished attempt's state (its log file stays on disk). No-op while it runs.
  void Forget(const std::string& attempt_id);

  // Records an attempt this executor does not know as finished (exit -1, retryable) so its
  // Finished event reaches the coordinator. No-op if the attempt is known.
  void RecordLost(const std::string& attempt_id, int32_t rank, const std::string& reason);

  // Working directories of forgotten attempts ready for reuse (tests).
  size_t SpareDirs() const ABSL_LOCKS_EXCLUDED(mu_);
  // Every attempt not discarded, running or finished-but-not-forgotten, by attempt id.
  std::vector<AttemptSnapshot> Snapshot() const;
  std::optional<AttemptSnapshot> Get(const std::string& attempt_id) const;

  // Waits until the attempt has finished (or is unknown); false on timeout (real time,
  // whatever the executor's clock).
  bool WaitFinished(const std::string& attempt_id, int64_t timeout_ms) const;

  // Looks at the clock again now and fires what is due: for a clock that jumps (a FakeClock
  // in tests). Otherwise the executor looks when its next timer is due by its clock, on
  // output or exit of a child, and on every call that changes an attempt.
  void CheckTimers();

  // Number of attempts whose process is alive or about to be forked.
  int Running() const;

  // Terminates every process group (SIGTERM, SIGKILL after kill_grace_ms), waits until all
  // are reaped, and stops the executor thread. Idempotent.
  //
  // The executor makes its process a child subreaper (PR_SET_CHILD_SUBREAPER) and reaps
  // orphans by process group: it assumes no one else in the process calls wait(-1).
  void Shutdown();

 private:
  struct Attempt;

  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // Launch's part for local ranks 1.. of a part of several ranks: their plans and logs, or
  // why the attempt cannot start (`refusal`: never here; `failure`: this worker's fault).
  // `write_ruleset_fd`: local rank 0's write confinement (job_confinement.h), shared by all.
  void AddRanks(const v1::Assignment& assignment, const SpawnContext& context, Attempt& attempt,
                int write_ruleset_fd, std::string* refusal, std::string* failure);
  // Launch's part for the attempt directory `workdir` and local rank 0's log (a recycled
  // spare directory if there is one): sets attempt.log_path and log_fd; returns what failed
  // ("worker error: ..."), empty when both are there.
  std::string OpenAttemptDir(const std::string& workdir, const std::string& log_path,
                             Attempt& attempt) ABSL_LOCKS_EXCLUDED(mu_);
  void WakeLoop();
  // A spawner thread: forks what Launch queued in to_spawn_, until Shutdown's end.
  void SpawnLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Forks the attempt's child from `plan` (taken out of the attempt under mu_, which is
  // not held here), then records it under mu_.
  void Spawn(Attempt& attempt, std::vector<std::unique_ptr<SpawnPlan>> plans)
      ABSL_LOCKS_EXCLUDED(mu_);
  // One wake-up's read of an attempt's pipe, done without the lock (ReadOutput: only the
  // loop thread reads a pipe and writes its log) and then applied under it.
  struct OutputRead {
    Attempt* attempt;
    RankProcess* process;  // the attempt itself or one of its further ranks
    int out_fd;
    int log_fd;
    std::string data;     // what was read
    int64_t logged = 0;   // bytes of it written to the log
    int write_errno = 0;  // the log write that failed, if one did
    bool eof = false;
    bool would_block = false;  // the pipe is empty for now
  };
  static void ReadOutput(OutputRead& r);
  // The read's bytes into the attempt's log count, tail and parser; closes the pipe at EOF.
  void ApplyOutputLocked(const OutputRead& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads the pipe to its end for now (the attempt is being reaped).
  void DrainOutputLocked(Attempt& attempt, RankProcess& process) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseOutputLocked(RankProcess& process) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReapLocked(Attempt& attempt, RankProcess& process) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A part of several ranks: one has been reaped with `code` / `reason`; the first failure
  // stops the others, and the attempt finishes once all are reaped.
  void RankEndedLocked(Attempt& attempt, RankProcess& process, int code, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `sig` to the process group of every rank not yet reaped.
  static void SignalAll(Attempt& attempt, int sig);
  void TerminateLocked(Attempt& attempt, const std::string& reason, const std::string& result,
                       bool retryable) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishLocked(Attempt& attempt, int exit_code, const std::string& reason,
                    const std::string& result, bool retryable) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReapLingeringLocked(int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Notify() ABSL_LOCKS_EXCLUDED(mu_, callback_mu_);
  int64_t NextTimerMsLocked(int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Timeouts, SIGKILLs after the grace period, delayed start and progress signals; true if
  // a start or progress is to be signalled.
  bool FireTimersLocked(int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  AttemptSnapshot SnapshotOf(const Attempt& attempt) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const WorkerConfig config_;
  Clock* const clock_;
  const std::string attempts_dir_;  // absolute DATA/attempts
  Metrics* const metrics_;
  // The worker's environment when the executor started, name -> "NAME=value": the base of
  // every child's environment.
  const std::map<std::string, std::string> worker_env_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd
  int devnull_fd_ = -1;

  mutable absl::Mutex mu_;
  mutable absl::CondVar changed_;  // signalled when an attempt finishes or is forgotten
  std::map<std::string, std::unique_ptr<Attempt>> attempts_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> to_spawn_ ABSL_GUARDED_BY(mu_);  // attempts to fork, in order
  absl::CondVar spawn_cv_;  // to_spawn_ grew, or the spawners must stop (with mu_)
  bool stop_spawners_ ABSL_GUARDED_BY(mu_) = false;
  // When the executor thread's epoll_wait returns at the latest (monotonic ms; -1: no
  // timeout): a spawner wakes it only for a timer due before then.
  int64_t loop_wake_ms_ ABSL_GUARDED_BY(mu_) = -1;
  std::map<uint64_t, std::string> tokens_ ABSL_GUARDED_BY(mu_);  // epoll token -> attempt
  // Process groups of finished attempts that may still hold orphans (zombies to reap or
  // processes about to die from SIGKILL), with the monotonic time to give up on them.
  std::map<pid_t, int64_t> lingering_ ABSL_GUARDED_BY(mu_);
  uint64_t next_token_ ABSL_GUARDED_BY(mu_) = 1;
  // Working directories of forgotten attempts that hold nothing but their log (already
  // shipped), kept under their old names for reuse: one rename to the next attempt's name
  // costs far less than allocating two inodes (directory and log), which dominated the
  // worker's CPU per short job on ext4. The log stays open, so the next attempt needs
  // no open, and RecycleLoop has emptied it. Left as they are when the worker stops.
  struct SpareDir {
    std::string dir;
    int log_fd = -1;         // owned: open on dir/log, O_APPEND
    bool log_empty = false;  // false until RecycleLoop has emptied it
  };
  std::vector<SpareDir> spare_dirs_ ABSL_GUARDED_BY(mu_);
  // Offers the directory of a forgotten attempt (and its open log) for reuse: queued for
  // RecycleLoop, which keeps it if it holds nothing but its log, emptied. Takes mu_ itself,
  // briefly.
  void RecycleDir(Attempt& attempt) ABSL_LOCKS_EXCLUDED(mu_);
  void RecycleLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the spare holds nothing but its log; empties the log. No lock: file work only.
  static bool PrepareSpare(SpareDir& spare);
  // Declared outputs of exec jobs (exec_outputs.h): an attempt whose ranks all exited 0 is
  // queued here instead of finishing; CollectLoop checks and manifests its outputs without
  // the lock (hashing a checkpoint takes a while) and then finishes it.
  // True when `attempt` has outputs to collect: it is queued and finishes later.
  bool CollectLocked(Attempt& attempt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CollectLoop() ABSL_LOCKS_EXCLUDED(mu_);
  std::deque<std::string> to_collect_ ABSL_GUARDED_BY(mu_);
  absl::CondVar collect_cv_;  // to_collect_ grew, or the collector must stop (with mu_)
  bool stop_collector_ ABSL_GUARDED_BY(mu_) = false;
  std::thread collector_;
  std::deque<SpareDir> to_recycle_ ABSL_GUARDED_BY(mu_);
  absl::CondVar recycle_cv_;  // to_recycle_ grew, or the recycler must stop (with mu_)
  std::thread recycler_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex callback_mu_;  // never held together with mu_
  std::function<void()> callback_ ABSL_GUARDED_BY(callback_mu_);

  absl::Mutex shutdown_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // serializes Shutdown callers
  std::thread thread_;
  std::vector<std::thread> spawners_;
};

}  // namespace stemma::worker
