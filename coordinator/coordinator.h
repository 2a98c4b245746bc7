// The coordinator: composes the core state (core.h) with one part per domain — worker
// sessions and reconcile, leases, placement, user operations, metric series, the checkpoint
// registry, early stopping and experiment revisions — and offers them as the UserHandler and
// WorkerHandler interfaces. It holds no state of its own beyond the scheduler thread.
//
// Thread-safety: see core.h. A scheduler thread places jobs when kicked (submit, freed
// resources) and checks leases on a short tick.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "coordinator/artifact_registry.h"
#include "coordinator/core.h"
#include "coordinator/early_stopper.h"
#include "coordinator/experiment_revisions.h"
#include "coordinator/leases.h"
#include "coordinator/metric_series.h"
#include "coordinator/placement.h"
#include "coordinator/preemptor.h"
#include "coordinator/user_operations.h"
#include "coordinator/worker_sessions.h"

namespace stemma::coordinator {

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
  absl::StatusOr<v1::SubmitResponse> Submit(const v1::SubmitRequest& request) override {
    return users_.Submit(request);
  }
  absl::StatusOr<v1::Job> GetJob(const std::string& id,
                                 const std::string& prefer_owner = "") override {
    return users_.GetJob(id, prefer_owner);
  }
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request) override {
    return users_.ListJobs(request);
  }
  std::vector<v1::Attempt> AttemptHistory(const std::string& id) override {
    return users_.AttemptHistory(id);
  }
  absl::StatusOr<v1::GcJobsResponse> CollectJobs(const v1::GcJobsRequest& request) override {
    return users_.CollectJobs(request);
  }
  absl::StatusOr<v1::Job> Cancel(const std::string& id, const std::string& reason,
                                 const std::string& key = "") override {
    return users_.Cancel(id, reason, key);
  }
  absl::StatusOr<v1::Job> Retry(const std::string& id, const std::string& key = "") override {
    return users_.Retry(id, key);
  }
  v1::ListWorkersResponse ListWorkers() override { return users_.ListWorkers(); }
  absl::StatusOr<v1::WorkerInfo> Drain(const std::string& worker_id, bool undrain,
                                       const std::string& key = "") override {
    return users_.Drain(worker_id, undrain, key);
  }
  std::shared_ptr<EventHub::Subscription> Watch(const v1::WatchRequest& request,
                                                std::vector<v1::JobEvent>* initial) override {
    return users_.Watch(request, initial);
  }
  void Unwatch(const std::shared_ptr<EventHub::Subscription>& sub) override { users_.Unwatch(sub); }
  const LogStore& logs() const override { return core_.logs; }
  absl::StatusOr<v1::QueryMetricsResponse> QueryMetrics(
      const v1::QueryMetricsRequest& request) override {
    return series_.Query(request);
  }
  absl::StatusOr<v1::ListArtifactsResponse> ListArtifacts(
      const v1::ListArtifactsRequest& request) override {
    return registry_.List(request);
  }
  absl::StatusOr<v1::ArtifactDetails> GetArtifact(const std::string& id) override {
    return registry_.Get(id);
  }
  absl::StatusOr<v1::LineageResponse> Lineage(const v1::LineageRequest& request) override {
    return registry_.Lineage(request);
  }
  absl::StatusOr<v1::VerifyArtifactResponse> VerifyArtifact(const std::string& id) override {
    return registry_.Verify(id);
  }
  absl::StatusOr<v1::Artifact> PinArtifact(const std::string& id, bool unpin,
                                           const std::string& key = "") override {
    return registry_.Pin(id, unpin, key);
  }
  absl::StatusOr<v1::GcResponse> CollectGarbage(const v1::GcRequest& request) override {
    return registry_.CollectGarbage(request);
  }
  CacheLookup LookUpCache(const v1::JobSpec& spec) override;
  absl::StatusOr<v1::SubmitExperimentResponse> SubmitExperiment(
      const v1::SubmitExperimentRequest& request, const std::string& owner) override {
    return experiments_.Submit(request, owner, core_.options.tenancy.Namespace(owner));
  }
  absl::StatusOr<v1::ListExperimentsResponse> ListExperiments() override {
    return experiments_.List();
  }
  absl::StatusOr<v1::GetExperimentResponse> GetExperiment(
      const v1::GetExperimentRequest& request) override {
    return experiments_.Get(request);
  }
  const Tenancy& tenancy() const override { return core_.options.tenancy; }

  // WorkerHandler
  absl::StatusOr<v1::Registered> Register(const v1::Register& request,
                                          std::shared_ptr<WorkerChannel> channel,
                                          uint64_t* session) override {
    return sessions_.Register(request, std::move(channel), session);
  }
  absl::StatusOr<v1::HeartbeatAck> Heartbeat(const std::string& worker_id, uint64_t session,
                                             const v1::Heartbeat& heartbeat) override {
    return leases_.Heartbeat(worker_id, session, heartbeat);
  }
  void Events(const std::string& worker_id, uint64_t session,
              absl::Span<const v1::AttemptEvent* const> events) override {
    sessions_.Events(worker_id, session, events);
  }
  void Disconnected(const std::string& worker_id, uint64_t session) override {
    sessions_.Disconnected(worker_id, session);
  }

  // One scheduling step (lease checks + placement), as the scheduler thread runs it.
  // Tests with a FakeClock call it directly. Returns the number of jobs placed.
  int RunSchedulerPass();

 private:
  void SchedulerLoop();
  void DropForgottenLogs(const StoreSnapshot& snap);
  // The queue's demand, attempts near their timeout and stalled training runs, into the
  // metrics: at most once a second (it walks the queue).
  void UpdateDemandGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu);

  CoordinatorCore core_;
  std::unique_ptr<QuotaFile> quota_file_;  // scheduler thread only (after Start)
  Preemptor preemptor_{&core_};
  Placer placer_;
  Leases leases_;
  MetricSeries series_;
  ArtifactRegistry registry_;
  EarlyStopper stopper_;
  WorkerSessions sessions_;
  UserOperations users_;
  ExperimentRevisions experiments_{this};  // over the job operations above
  std::thread scheduler_;
  int64_t demand_at_ms_ ABSL_GUARDED_BY(core_.mu) = 0;  // monotonic
};

}  // namespace stemma::coordinator
