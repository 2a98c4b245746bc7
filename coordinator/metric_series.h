// Metric series: the engine's `step` and `metric` events, stored as packed runs (the points
// of one series that one transaction appends are one row) in the store's append-only
// metric_points table (committed with the job records, never loaded at start),
// the last values of live jobs (for the registry and Prometheus) and the QueryMetrics read.
//
// Thread-safety: Record, OnTransition, LastValues and Forget run under the core mutex;
// Query takes it briefly and reads the store outside it.
#pragma once

#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "coordinator/core.h"

namespace stemma::coordinator {

class MetricSeries {
 public:
  explicit MetricSeries(CoordinatorCore* core) : core_(core) {}
  // The core mutex is held. Every part shares the core's one mutex; the thread-safety
  // analysis cannot see that through two parts' pointers, so callers in other parts say so.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK(core_->mu) { core_->mu.AssertHeld(); }

  // At most this many distinct names per job are remembered as last values.
  static constexpr size_t kMaxNamesPerJob = 1024;
  // How many of a change's latest runs a point may extend before it starts a new one.
  static constexpr size_t kRunsSearched = 16;

  // The points of one MetricBatch of the job's current attempt: appended to the series' runs
  // of the next transaction (one row per series per transaction), each name's last value
  // and, for loss / tokens_per_s / the step, the job's gauges. INVALID_ARGUMENT (and nothing
  // recorded) for a batch whose columns do not agree.
  absl::Status RecordBatch(const v1::Job& job, const v1::AttemptEvent::MetricBatch& batch,
                           Changes* changes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  // One Metric event (a point per message, as older workers send them): the same.
  void Record(const v1::Job& job, const v1::AttemptEvent::Metric& metric, Changes* changes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  // A progress event of a live job: its stage's progress gauge, once the job has set its
  // training gauges (a loss or tokens_per_s point). A progress without a fraction is ignored.
  void Progress(const v1::Job& job, const v1::Progress& progress)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  // A job leaving ASSIGNED/RUNNING loses its gauges; its last values are kept only when it
  // succeeded (the registry takes them, then calls Forget).
  void OnTransition(const v1::Job& job, v1::JobState from, v1::JobState to)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  // The last value of every name the job's current attempt reported.
  absl::flat_hash_map<std::string, double> LastValues(const std::string& job_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  void Forget(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  // Live training jobs whose last step is older than kStallFactor times their mean step
  // time (and at least kStallFloorMs): stemma_train_stalled_jobs, StemmaTrainingStalled. A
  // job counts once it has advanced twice (a mean step time is known).
  static constexpr double kStallFactor = 10;
  static constexpr int64_t kStallFloorMs = 300000;
  int Stalled(int64_t now_wall_ms) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);

  // INVALID_ARGUMENT without jobs or experiment, NOT_FOUND for an unknown job or an
  // experiment with no jobs (of the revision / cells asked for). An experiment's points are
  // its latest revision's unless request.revision says otherwise (-1: every revision), only
  // the cells matching request.cell (a glob over job names) when given; a cell served from
  // the cache answers with the points of the job that ran. Every point carries its job's
  // (cell's) name and revision. Sees every point reported before the call.
  absl::StatusOr<v1::QueryMetricsResponse> Query(const v1::QueryMetricsRequest& request);

 private:
  struct Cell {
    std::string name;
    int revision = 0;
  };
  // The experiment's jobs the request selects, into q->job_ids (job order), and the cell
  // each one's points are named by.
  absl::Status ExperimentJobs(const v1::QueryMetricsRequest& request, MetricQuery* q,
                              absl::flat_hash_map<std::string, Cell>* cells)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  using Group = std::pair<std::string, std::string>;  // (experiment, stage)
  struct Live {
    Group group;
    bool in_group = false;                      // counted in groups_ (it reported a gauge value)
    CoordinatorMetrics::TrainingSeries gauges;  // valid while in_group
    absl::flat_hash_map<std::string, double> last;
    int64_t step = -1;       // the latest step a loss or tokens_per_s point carried
    int64_t step_at_ms = 0;  // wall time that step arrived
    double step_ms = 0;      // mean time per step (moving average); 0: not known yet
  };
  void LeaveGroup(Live& live) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  // The index in the change's runs of the run of (job, current attempt, name, labels) that
  // a point extends: one of the last kRunsSearched, or a new one.
  size_t RunFor(const v1::Job& job, const std::string& name,
                const std::vector<std::pair<std::string, std::string>>& sorted_labels,
                Changes* changes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  // The name's latest value (and step) for the job: last values and gauges.
  void NoteLast(const v1::Job& job, const std::string& name, double value, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);

  CoordinatorCore* const core_;
  absl::flat_hash_map<std::string, Live> live_ ABSL_GUARDED_BY(core_->mu);
  // Live jobs per (experiment, stage) that set its gauges; at 0 the series are removed.
  absl::flat_hash_map<Group, int> groups_ ABSL_GUARDED_BY(core_->mu);
};

}  // namespace stemma::coordinator
