// The coordinator's domain core: jobs, workers, scheduling, leases and durability,
// behind the UserHandler and WorkerHandler interfaces.
//
// Thread-safety: one mutex guards the job and worker tables. Every change made under it
// is handed to the Committer in order; callers answer only after their change is durable,
// and messages to workers and watch events go out only after the records behind them are
// durable. A scheduler thread places jobs when kicked (submit, freed resources) and
// checks leases on a short tick.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "coordinator/committer.h"
#include "coordinator/event_hub.h"
#include "coordinator/job_table.h"
#include "coordinator/log_store.h"
#include "coordinator/metrics.h"
#include "coordinator/scheduler.h"
#include "coordinator/service_interfaces.h"
#include "coordinator/worker_table.h"

namespace stemma::coordinator {

struct CoordinatorOptions {
  std::string data_dir;            // holds logs/ (the store is opened by the caller)
  int64_t lease_ms = 10000;        // a worker silent this long is lost
  int64_t heartbeat_ms = 2000;     // interval workers are told to use
  int64_t tick_ms = 50;            // lease checks and backoff wake-ups
  SchedulerOptions scheduler;
};

class Coordinator final : public UserHandler, public WorkerHandler {
 public:
  // Does not take ownership of store, clock or metrics. Call Start() to load state and
  // begin scheduling.
  Coordinator(CoordinatorOptions options, Store* store, const Clock* clock,
              CoordinatorMetrics* metrics);
  ~Coordinator() override;

  absl::Status Start();
  void Stop();

  // UserHandler
  absl::StatusOr<v1::SubmitResponse> Submit(const v1::SubmitRequest& request) override;
  absl::StatusOr<v1::Job> GetJob(const std::string& id) override;
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request) override;
  absl::StatusOr<v1::Job> Cancel(const std::string& id, const std::string& reason) override;
  absl::StatusOr<v1::Job> Retry(const std::string& id) override;
  v1::ListWorkersResponse ListWorkers() override;
  absl::StatusOr<v1::WorkerInfo> Drain(const std::string& worker_id, bool undrain) override;
  std::shared_ptr<EventHub::Subscription> Watch(const v1::WatchRequest& request,
                                                std::vector<v1::JobEvent>* initial) override;
  void Unwatch(const std::shared_ptr<EventHub::Subscription>& sub) override;
  const LogStore& logs() const override { return logs_; }

  // WorkerHandler
  absl::StatusOr<v1::Registered> Register(const v1::Register& request,
                                          std::shared_ptr<WorkerChannel> channel,
                                          uint64_t* session) override;
  absl::StatusOr<v1::HeartbeatAck> Heartbeat(const std::string& worker_id, uint64_t session,
                                             const v1::Heartbeat& heartbeat) override;
  void Events(const std::string& worker_id, uint64_t session,
              absl::Span<const v1::AttemptEvent* const> events) override;
  void Disconnected(const std::string& worker_id, uint64_t session) override;

  // One scheduling step (lease checks + placement), as the scheduler thread runs it.
  // Tests with a FakeClock call it directly. Returns the number of jobs placed.
  int RunSchedulerPass();

 private:
  // Hands `changes` to the committer (under mu_) and queues its events and messages in the
  // outbox, to go out once durable. Returns the commit ticket.
  uint64_t Finish(Changes&& changes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The committer's durable hook: sends what the outbox holds for tickets up to `durable`,
  // one SendAll per worker, and publishes its watch events. Committer thread only.
  void FlushOutbox(uint64_t durable);
  // One started, progress or finished event of a worker's session (logs are handled
  // outside mu_). True when it freed resources, so a placement pass is due.
  bool ApplyEvent(const std::string& worker_id, WorkerEntry& w, const v1::AttemptEvent& event,
                  Changes* changes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Empty changes; watch events are built only while someone watches.
  Changes NewChanges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Changes c;
    c.want_events = hub_.HasSubscribers();
    if (c.want_events) {
      c.want_event = [hub = &hub_](const std::string& id) { return hub->Wants(id); };
    }
    return c;
  }
  // Ends the job's current attempt as failed: frees its parts, tells the workers of the
  // other parts to stop them, and requeues or fails the job.
  void EndAttempt(v1::Job* job, const std::string& result, int exit_code, bool retryable,
                  const std::string& except_worker, Changes* changes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees every unfinished part of the job's current attempt, sending cancellations.
  void StopParts(const v1::Job& job, const std::string& reason, const std::string& except_worker,
                 Changes* changes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLeases(Changes* changes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int Place(Changes* changes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::Assignment MakeAssignment(const v1::Job& job, int rank) const;
  void UpdateGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Kick();
  void SchedulerLoop();

  const CoordinatorOptions options_;
  Store* const store_;
  const Clock* const clock_;
  CoordinatorMetrics* const metrics_;
  LogStore logs_;
  EventHub hub_;
  std::unique_ptr<Committer> committer_;

  absl::Mutex mu_;
  JobTable jobs_ ABSL_GUARDED_BY(mu_);
  WorkerTable workers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<WorkerChannel>> channels_ ABSL_GUARDED_BY(mu_);
  uint64_t next_session_ ABSL_GUARDED_BY(mu_) = 0;
  // Heartbeats look workers up here (never under mu_). Entries are added under both locks.
  absl::Mutex live_mu_ ABSL_ACQUIRED_AFTER(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Liveness>> live_ ABSL_GUARDED_BY(live_mu_);

  // What waits for its ticket to be durable before it goes out, in ticket order. Finish
  // appends (holding outbox_mu_ across the committer's Add, so that a hook never misses an
  // entry whose records it made durable); FlushOutbox takes.
  struct Outgoing {
    uint64_t ticket;
    std::vector<std::pair<std::shared_ptr<WorkerChannel>, v1::CoordinatorMessage>> sends;
    std::vector<v1::JobEvent> events;
  };
  absl::Mutex outbox_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::vector<Outgoing> outbox_ ABSL_GUARDED_BY(outbox_mu_);

  absl::Mutex kick_mu_;
  bool kicked_ ABSL_GUARDED_BY(kick_mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(kick_mu_) = false;
  std::thread scheduler_;
};

}  // namespace stemma::coordinator
