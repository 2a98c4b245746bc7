// What users do to jobs and workers: submit, read, cancel, retry, drain, watch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "coordinator/artifact_registry.h"
#include "coordinator/core.h"
#include "coordinator/placement.h"

namespace stemma::coordinator {

class UserOperations {
 public:
  UserOperations(CoordinatorCore* core, Placer* placer, ArtifactRegistry* registry)
      : core_(core), placer_(placer), registry_(registry) {}

  // See UserHandler.
  absl::StatusOr<v1::SubmitResponse> Submit(const v1::SubmitRequest& request);
  absl::StatusOr<v1::Job> GetJob(const std::string& id, const std::string& prefer_owner = "");
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request);
  absl::StatusOr<v1::Job> Cancel(const std::string& id, const std::string& reason,
                                 const std::string& key = "");
  absl::StatusOr<v1::Job> Retry(const std::string& id, const std::string& key = "");
  std::vector<v1::Attempt> AttemptHistory(const std::string& id);
  absl::StatusOr<v1::GcJobsResponse> CollectJobs(const v1::GcJobsRequest& request);
  v1::ListWorkersResponse ListWorkers();
  absl::StatusOr<v1::WorkerInfo> Drain(const std::string& worker_id, bool undrain,
                                       const std::string& key = "");
  std::shared_ptr<EventHub::Subscription> Watch(const v1::WatchRequest& request,
                                                std::vector<v1::JobEvent>* initial);
  void Unwatch(const std::shared_ptr<EventHub::Subscription>& sub);

 private:
  // Memoization's expensive file reads for `request`'s jobs, made without the lock
  // (ArtifactRegistry::FileVerdict): the cache keys (which read input manifests) and the files
  // of the artifacts their hits would be served from.
  std::vector<ArtifactRegistry::FileVerdict> PrecheckCache(const v1::SubmitRequest& request);

  CoordinatorCore* const core_;
  Placer* const placer_;
  ArtifactRegistry* const registry_;
};

}  // namespace stemma::coordinator
