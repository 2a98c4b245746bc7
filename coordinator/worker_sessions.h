// Worker sessions: registration and reconcile (what a worker runs against what the
// coordinator believes it runs), the events of a session (logs, starts, progress, metric
// points, finishes), and disconnects.
#pragma once

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "coordinator/artifact_registry.h"
#include "coordinator/core.h"
#include "coordinator/early_stopper.h"
#include "coordinator/metric_series.h"
#include "coordinator/placement.h"
#include "coordinator/preemptor.h"

namespace stemma::coordinator {

// Thread-safe: everything runs under the core's lock, log file work outside it.
//
// A worker id has one session at a time. Each Registered carries a fresh session secret;
// a Register for a worker whose session is alive (connected, heartbeating within the lease)
// is refused with FAILED_PRECONDITION unless it presents that secret (the same daemon
// reconnecting). Otherwise it is a restart, and is reconciled.
class WorkerSessions {
 public:
  WorkerSessions(CoordinatorCore* core, Placer* placer, MetricSeries* series,
                 ArtifactRegistry* registry, EarlyStopper* stopper, Preemptor* preemptor)
      : core_(core),
        placer_(placer),
        series_(series),
        registry_(registry),
        stopper_(stopper),
        preemptor_(preemptor) {}

  // See WorkerHandler.
  absl::StatusOr<v1::Registered> Register(const v1::Register& request,
                                          std::shared_ptr<WorkerChannel> channel,
                                          uint64_t* session);
  void Events(const std::string& worker_id, uint64_t session,
              absl::Span<const v1::AttemptEvent* const> events);
  void Disconnected(const std::string& worker_id, uint64_t session);

 private:
  // One started, progress, metric or finished event (logs are handled outside the lock).
  // `checks`: the manifest checks of a finished event's artifacts (empty: unchecked);
  // `refused`: why its outputs are refused (ArtifactRegistry::ConfineOutputs; "" = they are
  // not). True when it freed resources, so a placement pass is due.
  bool ApplyEvent(const std::string& worker_id, WorkerEntry& w, const v1::AttemptEvent& event,
                  std::vector<ManifestCheck> checks, const std::string& refused, Changes* changes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  // Per event, why the outputs of a finished event that exited 0 are refused ("" = not, or
  // not such an event); the files of each of its artifacts go into (*checks)[event][i].files
  // (resized as needed). Takes the core mutex briefly; reads the files without it.
  std::vector<std::string> ConfineFinished(const std::string& worker_id,
                                           absl::Span<const v1::AttemptEvent* const> events,
                                           std::vector<std::vector<ManifestCheck>>* checks);

  // Which log events of a batch `worker_id` may write: those of an attempt part placed on
  // it (a worker never writes another worker's attempt log). Per event, the engine processes
  // per part of its job (common/job_ranks.h), which place its log; 0: not its to write.
  std::vector<int> OwnedLogs(const std::string& worker_id,
                             absl::Span<const v1::AttemptEvent* const> events);

  CoordinatorCore* const core_;
  Placer* const placer_;
  MetricSeries* const series_;
  ArtifactRegistry* const registry_;
  EarlyStopper* const stopper_;
  Preemptor* const preemptor_;
  // worker id -> the secret issued with its last Registered (in memory: after a
  // coordinator restart every worker registers afresh).
  absl::flat_hash_map<std::string, std::string> session_secrets_ ABSL_GUARDED_BY(core_->mu);
};

}  // namespace stemma::coordinator
