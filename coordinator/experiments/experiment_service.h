// The experiment operations of the user API, over the job operations (UserHandler): an
// experiment is expanded (experiment_plan.h), compared with its previous revision, and its
// jobs submitted in one Submit — one transaction, so after a crash it is wholly there or
// absent. Experiments are not a table of their own: a job's `experiment` field and its
// labels (stage, matrix coordinates, stemma.revision, stemma.spec) say which experiment,
// revision and cell it is, so a revision is exactly as durable as its jobs.
//
// Thread-safety: as the UserHandler it calls (the coordinator's is thread-safe).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "coordinator/service_interfaces.h"
#include "stemma/v1/experiment.pb.h"

namespace stemma::experiments {

class ExperimentService {
 public:
  // Does not take ownership; `users` outlives this.
  explicit ExperimentService(coordinator::UserHandler* users) : users_(users) {}

  // InvalidArgument "<file>: line L: <field>: ..." for a bad file (nothing submitted).
  // `owner` (the caller's subject, or "") is recorded on every job.
  absl::StatusOr<v1::SubmitExperimentResponse> Submit(const v1::SubmitExperimentRequest& request,
                                                      const std::string& owner);
  absl::StatusOr<v1::ListExperimentsResponse> List();
  // NotFound when no job belongs to `name`.
  absl::StatusOr<v1::GetExperimentResponse> Get(const v1::GetExperimentRequest& request);

 private:
  coordinator::UserHandler* users_;
};

// Labels every experiment job carries.
inline constexpr const char* kRevisionLabel = "stemma.revision";
inline constexpr const char* kSpecHashLabel = "stemma.spec";
inline constexpr const char* kFieldsLabel = "stemma.fields";  // field:hash of each spec field

}  // namespace stemma::experiments
