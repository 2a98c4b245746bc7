// Early stopping as metric points arrive: the trials of a train stage with `early_stop:`
// (JobSpec.early_stop_rule, coordinator/experiments/early_stop.h for the rule) are
// recorded at each rung they reach and stopped there when they are not in the top `keep`
// of the trials recorded at that rung so far (by one metric, or by Pareto rank over the
// objectives of `method: pareto`: a trial is recorded at a rung once every objective has
// reported there; the values of one that reported only some are held in memory, and after a
// restart the next points fill them again).
//
// A stop: the decision and the trial's Job.early_stop are committed together with the point
// that caused them (the early_stop_rungs table holds every recorded value and decision, and
// is loaded at start, so a restart neither loses a decision nor makes one twice); once
// durable, each worker of the attempt gets a StopAttempt, and the engine finishes its step,
// publishes what it has as `out` and exits 0. The job then ends SUCCEEDED with the stop as
// its reason (JobTable::PartSucceeded), and its dependents run on the survivors only
// (JobTable::Release). A stopping trial that reports another point (the message was lost,
// the coordinator restarted, a new attempt started) is told again, once per attempt and
// coordinator process.
//
// Thread-safety: every method runs under the core mutex.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "coordinator/core.h"
#include "coordinator/experiments/early_stop.h"

namespace stemma::coordinator {

class EarlyStopper {
 public:
  explicit EarlyStopper(CoordinatorCore* core) : core_(core) {}
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK(core_->mu) { core_->mu.AssertHeld(); }

  // The recorded rungs (start-up).
  void Load(const StoreSnapshot& snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);

  // A metric point of a live job's current attempt.
  void OnMetric(v1::Job* job, const v1::AttemptEvent::Metric& metric, Changes* changes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);

  // "<experiment>/<stage>/<revision>": the trials compared with each other.
  static std::string BracketOf(const v1::Job& job);

 private:
  void SendStop(const v1::Job& job, Changes* changes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  // Records `values` (one per objective; one for a single-metric rule) for `job` at rung `i`
  // and decides; true when the trial stops there.
  bool RecordAndDecide(v1::Job* job, int i, int64_t step, const std::vector<double>& values,
                       Changes* changes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);

  CoordinatorCore* const core_;
  // bracket → rung index → the values recorded there (one vector per trial: the metric, or
  // each objective's value).
  absl::flat_hash_map<std::string, std::map<int, std::vector<std::vector<double>>>> brackets_
      ABSL_GUARDED_BY(core_->mu);
  // Pareto: "<job id>/<rung>" → objective index → value, until every objective reported.
  absl::flat_hash_map<std::string, std::map<int, double>> partial_ ABSL_GUARDED_BY(core_->mu);
  absl::flat_hash_set<std::string> recorded_ ABSL_GUARDED_BY(core_->mu);   // "<job id>/<rung>"
  absl::flat_hash_set<std::string> stop_sent_ ABSL_GUARDED_BY(core_->mu);  // attempt ids
};

}  // namespace stemma::coordinator
