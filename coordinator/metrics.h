// Every Prometheus metric of the coordinator, defined in one place and injected.
// Names follow stemma_<subsystem>_<name>_<unit>; labels are bounded (states, kinds,
// methods), never job or worker ids. Thread-safe (prometheus-cpp metrics are).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "stemma/v1/job.pb.h"

namespace stemma::coordinator {

struct Demand;  // coordinator/demand_gauges.h

// HTTP basic authentication for /metrics (`stemma-coordinator --metrics-auth FILE`): the per-
// experiment series name experiments, stages, cells and metrics of every user, which nobody
// without the credentials should read. `text` is the file's content, "USER:PASSWORD";
// INVALID_ARGUMENT naming `source` otherwise. The returned check compares in constant time.
absl::StatusOr<std::function<bool(const std::string&, const std::string&)>> MetricsBasicAuth(
    const std::string& text, const std::string& source);

class CoordinatorMetrics {
 public:
  CoordinatorMetrics();

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // A job moved between states (from UNSPECIFIED when it is loaded or created).
  void Transition(const std::string& kind, v1::JobState from, v1::JobState to);
  void Submitted(int n) { submitted_->Increment(n); }
  void QueueWait(double seconds) { queue_wait_->Observe(seconds); }
  void SchedulingLatency(double seconds) { scheduling_latency_->Observe(seconds); }
  void SchedulerPass(double seconds) { scheduler_pass_->Observe(seconds); }
  prometheus::Histogram& Rpc(const std::string& method);
  // A call ended (stemma_rpc_requests_total{method,code}). Every method of the user and
  // worker services is created with every code at 0 (a series created at its first error
  // would not show that error in rate()); a method of no Stemma service counts as "other".
  // The same call under go-grpc-prometheus's names, so that stock gRPC dashboards work:
  // grpc_server_handled_total{grpc_service,grpc_method,grpc_type,grpc_code} and, when
  // `seconds` (the whole call, a stream's life included) is known,
  // grpc_server_handling_seconds{grpc_service,grpc_method,grpc_type}.
  void RpcEnded(absl::string_view method, absl::StatusCode code, double seconds = -1);
  void StoreCommit(double seconds, size_t records) {
    store_txn_->Observe(seconds);
    store_batch_->Observe(static_cast<double>(records));
  }
  // A store transaction failed (the committer retries it).
  void StoreCommitFailed() { store_commit_errors_->Increment(); }
  void HeartbeatAge(double seconds) { heartbeat_age_->Observe(seconds); }
  void StaleReport() { stale_reports_->Increment(); }
  void WorkerCounts(int alive, int draining, int lost) {
    workers_alive_->Set(alive);
    workers_draining_->Set(draining);
    workers_lost_->Set(lost);
  }
  void Gpus(int free, int allocated) {
    gpus_free_->Set(free);
    gpus_allocated_->Set(allocated);
  }
  void AttemptEnded(const std::string& result);
  // An attempt preempted for a higher-priority job was requeued
  // (stemma_scheduler_preemptions_total{outcome="stopped"|"killed"}): it stopped within the
  // grace period, or was killed after it.
  void Preempted(bool killed) { (killed ? preempted_killed_ : preempted_stopped_)->Increment(); }
  // What the queue asks for and how close running attempts are to their timeout
  // (coordinator/demand_gauges.h), and how many training jobs stopped advancing:
  // stemma_scheduler_queued_gpus{per_node}, stemma_coordinator_attempts_near_timeout,
  // stemma_coordinator_attempt_timeout_ratio_max, stemma_train_stalled_jobs.
  void SetDemand(const Demand& demand, int stalled_training_jobs);

  // Live training series of running jobs, labelled by experiment and stage (bounded: one
  // series per stage of an experiment, whichever of its jobs reported last). The gauges
  // stay valid until RemoveTraining of the same labels; callers keep the pointers so that
  // each point costs one atomic store.
  struct TrainingSeries {
    prometheus::Gauge* loss = nullptr;
    prometheus::Gauge* tokens = nullptr;  // tokens per second
    prometheus::Gauge* step = nullptr;
    prometheus::Gauge* progress = nullptr;      // fraction of the run's steps done (0..1)
    prometheus::Gauge* step_seconds = nullptr;  // mean wall time per step
    prometheus::Gauge* last_step = nullptr;     // Unix time the latest step arrived
  };
  TrainingSeries Training(const std::string& experiment, const std::string& stage);
  // Removes the series of (experiment, stage): no job of it runs any more.
  void RemoveTraining(const std::string& experiment, const std::string& stage);

  // The latest value an eval job reported for `metric` ("ppl/uk"): stemma_eval_score
  // {experiment, stage, cell, metric}. `cell` is the experiment cell's name
  // ("eval-dense[family=slavic]": a stage with a matrix has one eval per cell, which would
  // otherwise overwrite each other), empty for a job outside an experiment. Bounded by the
  // experiment's design, never a job id. Kept after the job ends (it is the result); not
  // rebuilt when the coordinator restarts. Past kMaxEvalSeries series, new ones are dropped
  // (and logged once).
  static constexpr size_t kMaxEvalSeries = 20000;
  void EvalScore(const std::string& experiment, const std::string& stage, const std::string& cell,
                 const std::string& metric, double value);
  // A checkpoint entered the registry (stemma_registry_checkpoints_registered_total by the
  // operation that made it: cpt, soup, merge, revert, interpolate, graft, upcycle, init,
  // all created at 0; anything else counts as "other").
  void CheckpointRegistered(const std::string& operation);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>* jobs_;
  prometheus::Family<prometheus::Counter>* transitions_;
  prometheus::Family<prometheus::Histogram>* rpc_;
  prometheus::Family<prometheus::Counter>* attempts_;
  prometheus::Counter* submitted_;
  prometheus::Histogram* queue_wait_;
  prometheus::Histogram* scheduling_latency_;
  prometheus::Histogram* scheduler_pass_;
  prometheus::Histogram* store_txn_;
  prometheus::Histogram* store_batch_;
  prometheus::Histogram* heartbeat_age_;
  prometheus::Counter* stale_reports_;
  prometheus::Counter* store_commit_errors_;
  prometheus::Counter* preempted_stopped_;
  prometheus::Counter* preempted_killed_;
  prometheus::Family<prometheus::Gauge>* eval_score_;
  // method -> one counter per status code; built in the constructor, read without a lock.
  using CodeCounters = std::array<prometheus::Counter*, 17>;
  absl::flat_hash_map<std::string, CodeCounters> rpc_requests_;
  CodeCounters* rpc_other_ = nullptr;
  struct GrpcSeries {
    CodeCounters handled{};
    prometheus::Histogram* handling = nullptr;
  };
  absl::flat_hash_map<std::string, GrpcSeries> grpc_;  // by method; built in the constructor
  GrpcSeries* grpc_other_ = nullptr;
  absl::flat_hash_map<std::string, prometheus::Counter*> checkpoints_registered_;
  prometheus::Counter* checkpoints_other_ = nullptr;
  prometheus::Family<prometheus::Gauge>* train_loss_;
  prometheus::Family<prometheus::Gauge>* train_tokens_;
  prometheus::Family<prometheus::Gauge>* train_step_;
  prometheus::Family<prometheus::Gauge>* train_progress_;
  prometheus::Gauge* workers_alive_;
  prometheus::Gauge* workers_draining_;
  prometheus::Gauge* workers_lost_;
  prometheus::Gauge* gpus_free_;
  prometheus::Gauge* gpus_allocated_;
  std::vector<prometheus::Gauge*> queued_gpus_;  // indexed like kGpuSizeLabels
  prometheus::Gauge* near_timeout_;
  prometheus::Gauge* timeout_ratio_max_;
  prometheus::Gauge* stalled_training_;
  prometheus::Family<prometheus::Gauge>* train_step_seconds_;
  prometheus::Family<prometheus::Gauge>* train_last_step_;

  // The labelled series each call would otherwise look up by building a label map (a
  // job's transitions made a dozen such lookups).
  absl::Mutex cache_mu_;
  prometheus::Gauge& JobsGauge(v1::JobState state, const std::string& kind)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(cache_mu_);
  absl::flat_hash_map<std::pair<int, std::string>, prometheus::Gauge*> jobs_cache_
      ABSL_GUARDED_BY(cache_mu_);
  absl::flat_hash_map<std::pair<int, int>, prometheus::Counter*> transitions_cache_
      ABSL_GUARDED_BY(cache_mu_);
  absl::flat_hash_map<std::string, prometheus::Counter*> attempts_cache_ ABSL_GUARDED_BY(cache_mu_);
  absl::flat_hash_map<std::pair<std::string, std::string>, TrainingSeries> training_
      ABSL_GUARDED_BY(cache_mu_);
  // (experiment, stage, cell, metric) -> its gauge.
  absl::flat_hash_map<std::tuple<std::string, std::string, std::string, std::string>,
                      prometheus::Gauge*>
      eval_ ABSL_GUARDED_BY(cache_mu_);
  bool eval_full_logged_ ABSL_GUARDED_BY(cache_mu_) = false;
};

}  // namespace stemma::coordinator
