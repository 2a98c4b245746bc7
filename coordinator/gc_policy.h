// The checkpoint retention policy of `stemma ckpt gc`, as a pure function from the
// registry's facts to one decision per checkpoint, so that the rules can be tested alone.
//
// Only checkpoints that are PRESENT, produced by a job (not external) and whose job has
// ended are ever deleted. Never deleted: pinned ones, ones a non-terminal job will read,
// and ones a kept result names (a parent of any present non-checkpoint artifact: GC keeps
// every result). Among the rest, per experiment:
//   drop_intermediate  step checkpoints (IsIntermediateCheckpoint) of succeeded jobs go;
//   keep_best N        the best N by `metric` (lower is better unless maximize) stay;
//   keep_latest N      the latest N stay;
// with keep_best or keep_latest set, what neither keeps goes. Without any rule nothing goes.
// An experiment here is one owner's: two owners' experiments of one name are ranked apart.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "stemma/v1/job.pb.h"
#include "stemma/v1/user_service.pb.h"

namespace stemma::coordinator {

struct GcFacts {
  // Every registered artifact (any state or type).
  std::vector<const v1::Artifact*> artifacts;
  // Ids of artifacts that a job not yet ended refers to.
  absl::flat_hash_set<std::string> read_by_live_jobs;
  // States of the producing jobs; a job missing here counts as not ended.
  absl::flat_hash_map<std::string, v1::JobState> job_states;
  // What the caller may delete (docs/tenancy.md); unset: everything. Artifacts it refuses are
  // neither planned nor ranked, but still protect what they name.
  std::function<bool(const v1::Artifact&)> manageable;
};

struct GcPlanEntry {
  const v1::Artifact* artifact;
  bool remove;
  std::string reason;
};

// INVALID_ARGUMENT naming the field: negative counts, keep_best without metric.
absl::Status ValidateGcPolicy(const v1::GcPolicy& policy);

// Output names of resumable step checkpoints: "checkpoint", "checkpoint-<step>",
// "checkpoint/<step>", "step-<n>".
bool IsIntermediateCheckpoint(const v1::Artifact& artifact);

// The artifacts GC never deletes, whatever the policy, each with why.
absl::flat_hash_map<std::string, std::string> ProtectedArtifacts(const GcFacts& facts);

// One entry per present, produced checkpoint (of policy.experiment when set), in registry
// order.
std::vector<GcPlanEntry> PlanGc(const GcFacts& facts, const v1::GcPolicy& policy);

}  // namespace stemma::coordinator
