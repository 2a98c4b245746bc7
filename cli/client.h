// A thin wrapper over the coordinator's UserService: every unary call gets a deadline, and
// gRPC errors are converted to absl::Status here and nowhere else in the CLI.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stemma/v1/user_service.pb.h"

namespace stemma::v1 {
class UserService;
}  // namespace stemma::v1

namespace stemma::cli {

// Talks to one coordinator. Not thread-safe: one command uses it from one thread.
//
// Errors: UNAVAILABLE becomes "cannot reach the coordinator at ADDR (start one with
// 'stemma up')", DEADLINE_EXCEEDED names the address and the deadline; every other code
// keeps the coordinator's message.
class CoordinatorClient {
 public:
  // `timeout` bounds each unary call.
  CoordinatorClient(std::string address, absl::Duration timeout);
  ~CoordinatorClient();

  const std::string& address() const { return address_; }

  // Sends an idempotency key (a random one when the request has none) and, when the answer
  // is lost (UNAVAILABLE, DEADLINE_EXCEEDED), sends the same request again until the
  // timeout: never a duplicate, and a submit that may have been committed says so with
  // its key instead of reporting a failure.
  absl::StatusOr<v1::SubmitResponse> Submit(const v1::SubmitRequest& request);
  absl::StatusOr<v1::Job> GetJob(const std::string& id);
  // The job and its attempt history (every attempt, oldest first).
  absl::StatusOr<v1::JobResponse> GetJobWithHistory(const std::string& id);
  // `stemma gc jobs`: a dry run, or (apply) archiving or forgetting, keyed like Cancel.
  absl::StatusOr<v1::GcJobsResponse> CollectJobs(const v1::GcJobsRequest& request);
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request);
  // Cancel, Retry, Drain and PinArtifact send a fresh idempotency key per call and resend
  // it, like Submit, when the answer is lost: a retry never grows the attempt budget twice.
  absl::StatusOr<v1::Job> Cancel(const std::string& id, const std::string& reason);
  absl::StatusOr<v1::Job> Retry(const std::string& id);
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers();
  // Like ListWorkers, with its own (short) deadline: for polling a starting coordinator.
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers(absl::Duration timeout);
  absl::StatusOr<v1::WorkerInfo> Drain(const std::string& worker_id, bool undrain);

  // Metric series and the checkpoint registry (stemma metrics, stemma ckpt).
  absl::StatusOr<v1::QueryMetricsResponse> QueryMetrics(const v1::QueryMetricsRequest& request);
  absl::StatusOr<v1::ListArtifactsResponse> ListArtifacts(const v1::ListArtifactsRequest& request);
  absl::StatusOr<v1::ArtifactDetails> GetArtifact(const std::string& id);
  absl::StatusOr<v1::LineageResponse> Lineage(const v1::LineageRequest& request);
  absl::StatusOr<v1::VerifyArtifactResponse> VerifyArtifact(const std::string& id);
  absl::StatusOr<v1::Artifact> PinArtifact(const std::string& id, bool unpin);
  absl::StatusOr<v1::GcResponse> CollectGarbage(const v1::GcRequest& request);
  absl::StatusOr<v1::SubmitExperimentResponse> SubmitExperiment(
      const v1::SubmitExperimentRequest& request);
  absl::StatusOr<v1::ListExperimentsResponse> ListExperiments();
  absl::StatusOr<v1::GetExperimentResponse> GetExperiment(const v1::GetExperimentRequest& request);

  // Streams events to `on_event` until it returns false (then OK), the stream ends (OK),
  // `deadline` passes (DEADLINE_EXCEEDED) or the stream fails. `*received` counts the
  // events delivered, so callers can tell "never connected" from "connection lost".
  absl::Status Watch(const v1::WatchRequest& request,
                     const std::function<bool(const v1::JobEvent&)>& on_event, absl::Time deadline,
                     int64_t* received);

  // Streams log chunks to `on_chunk` until the stream ends.
  absl::Status Logs(const v1::LogsRequest& request,
                    const std::function<void(const v1::LogChunk&)>& on_chunk);

 public:
  class Impl;

 private:
  std::string address_;
  absl::Duration timeout_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace stemma::cli
