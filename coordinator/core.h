// The coordinator's one core state, which every domain part works on: the mutex, the job
// and worker tables, the open worker channels, the commit path and the outbox.
//
// Thread-safety: `mu` guards the tables and channels (and the domain parts' own tables,
// which are annotated with it). Every change made under `mu` is handed to the committer by
// Finish(), in order; callers answer only after their change is durable (Wait), and
// messages to workers and watch events go out only after the records behind them are
// durable (the committer's durable hook flushes the outbox). Heartbeats read `live`
// under `live_mu` only.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "coordinator/changes.h"
#include "coordinator/committer.h"
#include "coordinator/event_hub.h"
#include "coordinator/job_table.h"
#include "coordinator/log_store.h"
#include "coordinator/metrics.h"
#include "coordinator/quotas.h"
#include "coordinator/scheduler.h"
#include "coordinator/service_interfaces.h"
#include "coordinator/tenancy.h"
#include "coordinator/worker_table.h"

namespace stemma::coordinator {

struct CoordinatorOptions {
  std::string data_dir;         // holds logs/ (the store is opened by the caller)
  int64_t lease_ms = 10000;     // a worker silent this long is lost
  int64_t heartbeat_ms = 2000;  // interval workers are told to use
  int64_t tick_ms = 50;         // lease checks and backoff wake-ups
  // Read the files a worker reports as outputs and check their manifest sha256. Only
  // when the coordinator sees the workers' file systems (`stemma up`).
  bool verify_artifacts = false;
  SchedulerOptions scheduler;
  // Quotas and fair share (coordinator/quotas.h): a YAML file, re-read when it changes; ""
  // for no limits (fair share on, default half-life).
  std::string quotas_file;
  // Projects and the ownership rules (coordinator/tenancy.h, `--projects FILE`).
  Tenancy tenancy;
};

class CoordinatorCore {
 public:
  // Does not take ownership of store, clock or metrics.
  CoordinatorCore(CoordinatorOptions options, Store* store, const Clock* clock,
                  CoordinatorMetrics* metrics);

  // Starts the committer; Finish and Wait need it.
  void StartCommitter();
  // Commits what is pending and stops the committer.
  void StopCommitter();

  // Empty changes; watch events are built only while someone watches.
  Changes NewChanges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Changes c;
    c.want_events = hub.HasSubscribers();
    if (c.want_events) {
      c.want_event = [hub = &hub](const std::string& id) { return hub->Wants(id); };
    }
    return c;
  }
  // Hands `changes` to the committer (under mu) and queues its events and messages in the
  // outbox, to go out once durable. Returns the commit ticket.
  uint64_t Finish(Changes&& changes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Blocks until `ticket` is durable.
  void Wait(uint64_t ticket) { committer_->Wait(ticket); }
  // The ticket of everything handed over so far.
  uint64_t LastTicket() { return committer_->LastTicket(); }

  // Asks the scheduler thread for a pass now.
  void Kick();
  // Waits up to `ms` for a kick. False when stopping.
  bool AwaitKick(int64_t ms);
  // Makes AwaitKick return false from now on. False when a stop was requested before.
  bool RequestStop();

  // Called (under mu) after the metrics on every job state change; set before Start.
  std::function<void(const v1::Job&, v1::JobState from, v1::JobState to)> on_transition;

  const CoordinatorOptions options;
  Store* const store;
  const Clock* const clock;
  CoordinatorMetrics* const metrics;
  LogStore logs;
  EventHub hub;

  absl::Mutex mu;
  JobTable jobs ABSL_GUARDED_BY(mu);
  WorkerTable workers ABSL_GUARDED_BY(mu);
  Quotas quotas ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, std::shared_ptr<WorkerChannel>> channels ABSL_GUARDED_BY(mu);
  uint64_t next_session ABSL_GUARDED_BY(mu) = 0;
  // Heartbeats look workers up here (never under mu). Entries are added under both locks.
  absl::Mutex live_mu ABSL_ACQUIRED_AFTER(mu);
  absl::flat_hash_map<std::string, std::shared_ptr<Liveness>> live ABSL_GUARDED_BY(live_mu);

 private:
  // The committer's durable hook: sends what the outbox holds for tickets up to `durable`,
  // one SendAll per worker, and publishes its watch events. Committer thread only.
  void FlushOutbox(uint64_t durable);

  std::unique_ptr<Committer> committer_;

  // What waits for its ticket to be durable before it goes out, in ticket order. Finish
  // appends (holding outbox_mu_ across the committer's Add, so that a hook never misses an
  // entry whose records it made durable); FlushOutbox takes.
  struct Outgoing {
    uint64_t ticket;
    std::vector<std::pair<std::shared_ptr<WorkerChannel>, v1::CoordinatorMessage>> sends;
    std::vector<v1::JobEvent> events;
  };
  absl::Mutex outbox_mu_ ABSL_ACQUIRED_AFTER(mu);
  std::vector<Outgoing> outbox_ ABSL_GUARDED_BY(outbox_mu_);

  absl::Mutex kick_mu_;
  bool kicked_ ABSL_GUARDED_BY(kick_mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(kick_mu_) = false;
};

// "j-12.3" -> ("j-12", 3); false when it is not an attempt id.
bool ParseAttemptId(const std::string& attempt_id, std::string* job_id, int* number);

}  // namespace stemma::coordinator
