// Experiments as the coordinator keeps them: each submission of an experiment file is a
// revision. The file is expanded (coordinator/experiments/experiment_plan.h, with this
// coordinator's view of models on disk), compared cell by cell with the latest revision so far
// (what is unchanged is served from the cache, what changed or reads a change runs, unfinished
// jobs of earlier revisions that nothing waits for are cancelled), and its jobs are submitted
// in one Submit — one transaction, so after a crash a revision is wholly there or absent.
// Experiments are not a table of their own: a job's `experiment` field and its labels (stage,
// matrix coordinates, stemma.revision, stemma.spec) say which experiment, revision and cell
// it is, so a revision is exactly as durable as its jobs.
//
// Thread-safety: as the UserHandler it calls (the coordinator's is thread-safe).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "coordinator/experiments/experiment_plan.h"
#include "coordinator/service_interfaces.h"
#include "stemma/v1/experiment.pb.h"

namespace stemma::coordinator {

class ExperimentRevisions {
 public:
  // Does not take ownership; `users` outlives this.
  explicit ExperimentRevisions(UserHandler* users) : users_(users) {}

  // InvalidArgument "<file>: line L: <field>: ..." for a bad file (nothing submitted).
  // `owner` (the caller's subject, or "") is recorded on every job; `space` is the namespace
  // the experiment's name lives in (coordinator/tenancy.h; "" without authentication): only
  // earlier revisions of the same namespace are compared and superseded, and default
  // outputs go below `<owner>/` of the storage root.
  absl::StatusOr<v1::SubmitExperimentResponse> Submit(const v1::SubmitExperimentRequest& request,
                                                      const std::string& owner,
                                                      const std::string& space = "");
  absl::StatusOr<v1::ListExperimentsResponse> List();
  // NotFound when no job belongs to `name` (in request.owner()'s namespace when set).
  absl::StatusOr<v1::GetExperimentResponse> Get(const v1::GetExperimentRequest& request);

 private:
  UserHandler* users_;
};

// How the coordinator expands a file: model sizes from each model's config.json where this
// process can read it, and each cell checked as Submit would check it.
experiments::ExpansionEnv CoordinatorExpansionEnv();

// Labels every experiment job carries.
inline constexpr const char* kRevisionLabel = "stemma.revision";
inline constexpr const char* kSpecHashLabel = "stemma.spec";
inline constexpr const char* kFieldsLabel = "stemma.fields";        // field:hash of each spec field
inline constexpr const char* kNamespaceLabel = "stemma.namespace";  // the experiment's namespace

}  // namespace stemma::coordinator
