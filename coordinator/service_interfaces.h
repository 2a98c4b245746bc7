// The coordinator's domain interfaces, free of gRPC. The rpc adapters in coordinator/rpc/
// translate the wire to these calls; tests can drive them directly.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "coordinator/event_hub.h"
#include "coordinator/log_store.h"
#include "coordinator/tenancy.h"
#include "stemma/v1/user_service.pb.h"
#include "stemma/v1/worker_service.pb.h"

namespace stemma::coordinator {

// What releasing a job now would do, as memoization decides (coordinator/memoization.h):
// `stemma plan`'s prediction.
struct CacheLookup {
  bool keyed = false;           // false: the job is not memoized, or its key is unknown here
  std::optional<v1::Job> hit;   // the SUCCEEDED job it would be served from
  std::optional<v1::Job> twin;  // else the queued or running job it would wait for
};

// What users can do. Mutations return once they are durable. Thread-safe.
class UserHandler {
 public:
  virtual ~UserHandler() = default;
  // INVALID_ARGUMENT for bad specs, FAILED_PRECONDITION for exec jobs when no worker
  // allows exec.
  virtual absl::StatusOr<v1::SubmitResponse> Submit(const v1::SubmitRequest& request) = 0;
  // An id, or a name: the most recent job of that name, `prefer_owner`'s own when it has one
  // (so another user's newer job of the same name does not stand in for it). NOT_FOUND.
  virtual absl::StatusOr<v1::Job> GetJob(const std::string& id,
                                         const std::string& prefer_owner = "") = 0;
  // Every attempt of a job, oldest first, the current one last (empty for an unknown id).
  virtual std::vector<v1::Attempt> AttemptHistory(const std::string& id) = 0;
  // ListJobs: archived jobs only with include_archived; selector is a label selector
  // (common/label_selector.h; INVALID_ARGUMENT when it does not parse).
  virtual absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request) = 0;
  // `stemma gc jobs` (JobTable::Collect): a dry run unless request.apply(); request.requester
  // (set by the rpc layer for non-admins) limits it to what that subject may manage.
  virtual absl::StatusOr<v1::GcJobsResponse> CollectJobs(const v1::GcJobsRequest& request) = 0;
  // Cancel, Retry, Drain and PinArtifact take an idempotency key ("" for none), already
  // scoped to the caller: the same key again answers with the target as it is now and
  // changes nothing (JobTable::SeenOperation); FAILED_PRECONDITION when the key was used for
  // another operation or target.
  virtual absl::StatusOr<v1::Job> Cancel(const std::string& id, const std::string& reason,
                                         const std::string& key = "") = 0;
  virtual absl::StatusOr<v1::Job> Retry(const std::string& id, const std::string& key = "") = 0;
  virtual v1::ListWorkersResponse ListWorkers() = 0;
  virtual absl::StatusOr<v1::WorkerInfo> Drain(const std::string& worker_id, bool undrain,
                                               const std::string& key = "") = 0;
  // Subscribes to job events; with send_initial, `initial` receives the jobs as they are.
  virtual std::shared_ptr<EventHub::Subscription> Watch(const v1::WatchRequest& request,
                                                        std::vector<v1::JobEvent>* initial) = 0;
  virtual void Unwatch(const std::shared_ptr<EventHub::Subscription>& sub) = 0;
  virtual const LogStore& logs() const = 0;

  // Metric series. INVALID_ARGUMENT without jobs or experiment; NOT_FOUND for unknown ones.
  virtual absl::StatusOr<v1::QueryMetricsResponse> QueryMetrics(
      const v1::QueryMetricsRequest& request) = 0;
  // The checkpoint registry. NOT_FOUND for an unknown artifact (id, ckpt:ID or path).
  virtual absl::StatusOr<v1::ListArtifactsResponse> ListArtifacts(
      const v1::ListArtifactsRequest& request) = 0;
  virtual absl::StatusOr<v1::ArtifactDetails> GetArtifact(const std::string& id) = 0;
  virtual absl::StatusOr<v1::LineageResponse> Lineage(const v1::LineageRequest& request) = 0;
  // Reads the artifact's files on the coordinator's file system.
  virtual absl::StatusOr<v1::VerifyArtifactResponse> VerifyArtifact(const std::string& id) = 0;
  virtual absl::StatusOr<v1::Artifact> PinArtifact(const std::string& id, bool unpin,
                                                   const std::string& key = "") = 0;
  // INVALID_ARGUMENT for a bad policy. A dry run unless request.apply().
  virtual absl::StatusOr<v1::GcResponse> CollectGarbage(const v1::GcRequest& request) = 0;

  // The cache's answer for a job with `spec` (its inputs wired, as the job table would
  // release it), changing nothing.
  virtual CacheLookup LookUpCache(const v1::JobSpec& spec) {
    (void)spec;
    return {};
  }

  // Experiments (coordinator/experiment_revisions.h). `owner`: the caller's
  // subject, recorded on every job, or "" without authentication.
  virtual absl::StatusOr<v1::SubmitExperimentResponse> SubmitExperiment(
      const v1::SubmitExperimentRequest& request, const std::string& owner) = 0;
  virtual absl::StatusOr<v1::ListExperimentsResponse> ListExperiments() = 0;
  virtual absl::StatusOr<v1::GetExperimentResponse> GetExperiment(
      const v1::GetExperimentRequest& request) = 0;

  // The projects and ownership rules the adapters check callers against.
  virtual const Tenancy& tenancy() const = 0;
};

// The coordinator's end of one worker session stream. Thread-safe.
class WorkerChannel {
 public:
  virtual ~WorkerChannel() = default;
  // False when the stream is gone.
  virtual bool Send(const v1::CoordinatorMessage& message) = 0;
  // Sends `messages` in order; the transport may pack them into one stream message.
  virtual bool SendAll(std::vector<v1::CoordinatorMessage> messages) {
    for (const auto& m : messages) {
      if (!Send(m)) return false;
    }
    return true;
  }
  // Ends the session (the worker will reconnect and register again).
  virtual void Close() = 0;
};

// What worker sessions do. Thread-safe.
class WorkerHandler {
 public:
  virtual ~WorkerHandler() = default;
  // Registers (or re-registers) a worker; `session` identifies this stream in later calls.
  // The Registered answer is sent through `channel`, ahead of every other message of the
  // session, once the registration is durable; the returned copy is for the caller's
  // information.
  virtual absl::StatusOr<v1::Registered> Register(const v1::Register& request,
                                                  std::shared_ptr<WorkerChannel> channel,
                                                  uint64_t* session) = 0;
  // FAILED_PRECONDITION when the session was replaced or the lease had expired: the
  // worker must register again.
  virtual absl::StatusOr<v1::HeartbeatAck> Heartbeat(const std::string& worker_id, uint64_t session,
                                                     const v1::Heartbeat& heartbeat) = 0;
  // Applies a worker's events in order (logs, starts, progress, finishes), as one change.
  virtual void Events(const std::string& worker_id, uint64_t session,
                      absl::Span<const v1::AttemptEvent* const> events) = 0;
  void Event(const std::string& worker_id, uint64_t session, const v1::AttemptEvent& event) {
    const v1::AttemptEvent* one = &event;
    Events(worker_id, session, absl::MakeConstSpan(&one, 1));
  }
  virtual void Disconnected(const std::string& worker_id, uint64_t session) = 0;
};

}  // namespace stemma::coordinator
