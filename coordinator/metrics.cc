#include "coordinator/metrics.h"

#include <algorithm>
#include <iterator>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "coordinator/demand_gauges.h"
#include "stemma/v1/user_service.pb.h"
#include "stemma/v1/worker_service.pb.h"

namespace stemma::coordinator {

absl::StatusOr<std::function<bool(const std::string&, const std::string&)>> MetricsBasicAuth(
    const std::string& text, const std::string& source) {
  std::string line = text.substr(0, text.find('\n'));
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  const size_t colon = line.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == line.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected one line USER:PASSWORD (both non-empty)"));
  }
  const std::string want = line;
  return [want](const std::string& user, const std::string& password) {
    const std::string got = user + ":" + password;
    // Constant time in the content: every byte of the longer string is looked at.
    unsigned diff = got.size() == want.size() ? 0 : 1;
    const size_t n = std::max(got.size(), want.size());
    for (size_t i = 0; i < n; ++i) {
      diff |= static_cast<unsigned char>(i < got.size() ? got[i] : 0) ^
              static_cast<unsigned char>(i < want.size() ? want[i] : 0);
    }
    return diff == 0;
  };
}
namespace {

prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
          0.25,   0.5,     1,      2.5,   5,      10,    30,   60,    300};
}

// gRPC's own code names (codes.Code.String() in Go), as go-grpc-prometheus labels them.
std::string GrpcCodeName(absl::StatusCode code) {
  static constexpr const char* kNames[] = {
      "OK",       "Canceled",       "Unknown",          "InvalidArgument",   "DeadlineExceeded",
      "NotFound", "AlreadyExists",  "PermissionDenied", "ResourceExhausted", "FailedPrecondition",
      "Aborted",  "OutOfRange",     "Unimplemented",    "Internal",          "Unavailable",
      "DataLoss", "Unauthenticated"};
  const auto i = static_cast<size_t>(code);
  return i < std::size(kNames) ? kNames[i] : "Unknown";
}

// Operations of the checkpoints the engine publishes (docs/engine-events.md).
constexpr const char* kCheckpointOperations[] = {"cpt",         "soup",  "merge",   "revert",
                                                 "interpolate", "graft", "upcycle", "init"};

// Registers one family of each kind (the series are added by the caller).
prometheus::Family<prometheus::Gauge>& Gauges(prometheus::Registry& registry, const char* name,
                                              const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}
prometheus::Family<prometheus::Counter>& Counters(prometheus::Registry& registry, const char* name,
                                                  const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
}
prometheus::Family<prometheus::Histogram>& Histograms(prometheus::Registry& registry,
                                                      const char* name, const char* help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry);
}

// The RPC series of every method of both services (and "other"), under Stemma's names and
// grpc-prometheus's. A template so that the class's private series types need not be named.
template <typename CodeCountersByMethod, typename GrpcByMethod>
void RegisterRpcSeries(prometheus::Registry& registry, CodeCountersByMethod& requests_by_method,
                       GrpcByMethod& grpc_by_method) {
  using namespace prometheus;
  auto& requests = Counters(registry, "stemma_rpc_requests_total",
                            "RPCs (and worker sessions) that ended, by method and status code");
  auto& handled = Counters(registry, "grpc_server_handled_total",
                           "RPCs completed on the server, regardless of success or failure");
  auto& handling =
      Histograms(registry, "grpc_server_handling_seconds",
                 "Response latency of RPCs handled by the server (a stream: its life)");
  auto add_method = [&](const std::string& method, const std::string& service,
                        const std::string& type) {
    auto& counters = requests_by_method[method];
    auto& grpc = grpc_by_method[method];
    const std::map<std::string, std::string> labels = {
        {"grpc_service", service}, {"grpc_method", method}, {"grpc_type", type}};
    for (int code = 0; code < static_cast<int>(counters.size()); ++code) {
      const auto c = static_cast<absl::StatusCode>(code);
      counters[code] = &requests.Add({{"method", method}, {"code", absl::StatusCodeToString(c)}});
      auto with_code = labels;
      with_code["grpc_code"] = GrpcCodeName(c);
      grpc.handled[code] = &handled.Add(with_code);
    }
    grpc.handling = &handling.Add(labels, LatencyBuckets());
  };
  for (const auto* service :
       {v1::SubmitRequest::descriptor()->file()->FindServiceByName("UserService"),
        v1::WorkerMessage::descriptor()->file()->FindServiceByName("WorkerService")}) {
    for (int i = 0; service != nullptr && i < service->method_count(); ++i) {
      const auto* m = service->method(i);
      add_method(m->name(), service->full_name(),
                 m->client_streaming() ? (m->server_streaming() ? "bidi_stream" : "client_stream")
                                       : (m->server_streaming() ? "server_stream" : "unary"));
    }
  }
  add_method("other", "other", "unary");
}

}  // namespace

CoordinatorMetrics::CoordinatorMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  using namespace prometheus;
  jobs_ = &Gauges(*registry_, "stemma_coordinator_jobs", "Jobs by state and kind");
  transitions_ =
      &Counters(*registry_, "stemma_coordinator_job_transitions_total", "Job state transitions");
  rpc_ = &Histograms(*registry_, "stemma_rpc_server_handling_seconds",
                     "Time to handle a unary RPC or one session message, by method");
  attempts_ = &Counters(*registry_, "stemma_coordinator_attempts_ended_total",
                        "Attempts that ended, by result");
  train_loss_ = &Gauges(*registry_, "stemma_train_loss",
                        "Latest training loss of a running job, by experiment and stage");
  train_tokens_ = &Gauges(*registry_, "stemma_train_tokens_per_second",
                          "Latest training throughput of a running job, by experiment and stage");
  train_step_ = &Gauges(*registry_, "stemma_train_step",
                        "Latest optimizer step of a running job, by experiment and stage");
  train_progress_ =
      &Gauges(*registry_, "stemma_train_progress_ratio",
              "Fraction of its steps a running job has done, by experiment and stage");
  submitted_ =
      &Counters(*registry_, "stemma_coordinator_jobs_submitted_total", "Jobs accepted by Submit")
           .Add({});
  queue_wait_ =
      &Histograms(*registry_, "stemma_scheduler_queue_wait_seconds", "Time from QUEUED to ASSIGNED")
           .Add({}, LatencyBuckets());
  scheduling_latency_ = &Histograms(*registry_, "stemma_scheduler_latency_seconds",
                                    "Time from a job being placeable to its assignment being sent")
                             .Add({}, LatencyBuckets());
  scheduler_pass_ =
      &Histograms(*registry_, "stemma_scheduler_pass_seconds", "Duration of one scheduling pass")
           .Add({}, LatencyBuckets());
  store_txn_ = &Histograms(*registry_, "stemma_store_transaction_seconds",
                           "SQLite transaction time (including fsync)")
                    .Add({}, LatencyBuckets());
  store_batch_ = &Histograms(*registry_, "stemma_store_transaction_records",
                             "Records per transaction (group commit)")
                      .Add({}, Histogram::BucketBoundaries{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000,
                                                           5000, 20000});
  heartbeat_age_ = &Histograms(*registry_, "stemma_coordinator_heartbeat_age_seconds",
                               "Time since a worker's previous heartbeat, at each heartbeat")
                        .Add({}, LatencyBuckets());
  stale_reports_ = &Counters(*registry_, "stemma_coordinator_stale_reports_total",
                             "Reports refused because they came from a stale attempt")
                        .Add({});
  auto& preemptions = Counters(
      *registry_, "stemma_scheduler_preemptions_total",
      "Attempts preempted for a higher-priority job and requeued, by how they ended: stopped "
      "(checkpointed or terminated within the grace period) or killed (after it)");
  preempted_stopped_ = &preemptions.Add({{"outcome", "stopped"}});
  preempted_killed_ = &preemptions.Add({{"outcome", "killed"}});
  store_commit_errors_ =
      &Counters(*registry_, "stemma_store_commit_errors_total",
                "SQLite transactions that failed (each is retried until it succeeds)")
           .Add({});
  eval_score_ = &Gauges(*registry_, "stemma_eval_score",
                        "Latest value of each metric an eval job reported, by experiment, stage, "
                        "cell and metric");
  auto& checkpoints =
      Counters(*registry_, "stemma_registry_checkpoints_registered_total",
               "Checkpoints entered into the registry, by the operation that made them");
  for (const char* op : kCheckpointOperations) {
    checkpoints_registered_[op] = &checkpoints.Add({{"operation", op}});
  }
  checkpoints_other_ = &checkpoints.Add({{"operation", "other"}});
  RegisterRpcSeries(*registry_, rpc_requests_, grpc_);
  rpc_other_ = &rpc_requests_.at("other");
  grpc_other_ = &grpc_.at("other");
  auto& workers = Gauges(*registry_, "stemma_coordinator_workers", "Workers by state");
  workers_alive_ = &workers.Add({{"state", "alive"}});
  workers_draining_ = &workers.Add({{"state", "draining"}});
  workers_lost_ = &workers.Add({{"state", "lost"}});
  auto& gpus = Gauges(*registry_, "stemma_coordinator_gpus", "GPUs on live workers");
  gpus_free_ = &gpus.Add({{"state", "free"}});
  gpus_allocated_ = &gpus.Add({{"state", "allocated"}});
  auto& queued_gpus =
      Gauges(*registry_, "stemma_scheduler_queued_gpus",
             "GPUs that QUEUED jobs ask for (nodes x GPUs per node), by GPUs per node rounded "
             "up to a power of two: what an autoscaler adds workers for");
  for (const char* size : kGpuSizeLabels)
    queued_gpus_.push_back(&queued_gpus.Add({{"per_node", size}}));
  near_timeout_ = &Gauges(*registry_, "stemma_coordinator_attempts_near_timeout",
                          "Running attempts that have used more than 90% of their timeout")
                       .Add({});
  timeout_ratio_max_ =
      &Gauges(*registry_, "stemma_coordinator_attempt_timeout_ratio_max",
              "The largest share of its timeout a running attempt has used (0: none has one)")
           .Add({});
  stalled_training_ =
      &Gauges(*registry_, "stemma_train_stalled_jobs",
              "Running training jobs with no step for 10x their mean step time (and 5 minutes)")
           .Add({});
  train_step_seconds_ =
      &Gauges(*registry_, "stemma_train_step_seconds",
              "Mean wall time per optimizer step of a running job, by experiment and stage");
  train_last_step_ = &Gauges(*registry_, "stemma_train_last_step_timestamp_seconds",
                             "When a running job of the stage last advanced a step (Unix time), by "
                             "experiment and stage");
}

void CoordinatorMetrics::SetDemand(const Demand& demand, int stalled_training_jobs) {
  for (size_t i = 0; i < queued_gpus_.size(); ++i) {
    queued_gpus_[i]->Set(static_cast<double>(demand.queued_gpus[i]));
  }
  near_timeout_->Set(demand.near_timeout);
  timeout_ratio_max_->Set(demand.max_timeout_ratio);
  stalled_training_->Set(stalled_training_jobs);
}

prometheus::Gauge& CoordinatorMetrics::JobsGauge(v1::JobState state, const std::string& kind) {
  auto [it, inserted] = jobs_cache_.try_emplace(std::make_pair(static_cast<int>(state), kind));
  if (inserted) it->second = &jobs_->Add({{"state", StateName(state)}, {"kind", kind}});
  return *it->second;
}

void CoordinatorMetrics::Transition(const std::string& kind, v1::JobState from, v1::JobState to) {
  absl::MutexLock lock(&cache_mu_);
  if (from != v1::JOB_STATE_UNSPECIFIED) {
    JobsGauge(from, kind).Decrement();
    auto [it, inserted] = transitions_cache_.try_emplace(
        std::make_pair(static_cast<int>(from), static_cast<int>(to)));
    if (inserted) {
      it->second = &transitions_->Add({{"from", StateName(from)}, {"to", StateName(to)}});
    }
    it->second->Increment();
  }
  JobsGauge(to, kind).Increment();
}

prometheus::Histogram& CoordinatorMetrics::Rpc(const std::string& method) {
  return rpc_->Add({{"method", method}}, LatencyBuckets());
}

void CoordinatorMetrics::RpcEnded(absl::string_view method, absl::StatusCode code, double seconds) {
  auto it = rpc_requests_.find(method);
  CodeCounters& counters = it != rpc_requests_.end() ? it->second : *rpc_other_;
  auto g = grpc_.find(method);
  GrpcSeries& grpc = g != grpc_.end() ? g->second : *grpc_other_;
  size_t index = static_cast<size_t>(code);
  if (index >= counters.size()) index = static_cast<size_t>(absl::StatusCode::kUnknown);
  counters[index]->Increment();
  grpc.handled[index]->Increment();
  if (seconds >= 0) grpc.handling->Observe(seconds);
}

void CoordinatorMetrics::CheckpointRegistered(const std::string& operation) {
  auto it = checkpoints_registered_.find(operation);
  (it != checkpoints_registered_.end() ? it->second : checkpoints_other_)->Increment();
}

void CoordinatorMetrics::EvalScore(const std::string& experiment, const std::string& stage,
                                   const std::string& cell, const std::string& metric,
                                   double value) {
  absl::MutexLock lock(&cache_mu_);
  auto key = std::make_tuple(experiment, stage, cell, metric);
  auto it = eval_.find(key);
  if (it == eval_.end()) {
    if (eval_.size() >= kMaxEvalSeries) {
      if (!eval_full_logged_) {
        spdlog::warn(
            "stemma_eval_score: {} series; further (experiment, stage, metric) are not exported",
            eval_.size());
      }
      eval_full_logged_ = true;
      return;
    }
    prometheus::Gauge* g = &eval_score_->Add(
        {{"experiment", experiment}, {"stage", stage}, {"cell", cell}, {"metric", metric}});
    it = eval_.emplace(std::move(key), g).first;
  }
  it->second->Set(value);
}

void CoordinatorMetrics::AttemptEnded(const std::string& result) {
  absl::MutexLock lock(&cache_mu_);
  auto [it, inserted] = attempts_cache_.try_emplace(result);
  if (inserted) it->second = &attempts_->Add({{"result", result}});
  it->second->Increment();
}

CoordinatorMetrics::TrainingSeries CoordinatorMetrics::Training(const std::string& experiment,
                                                                const std::string& stage) {
  absl::MutexLock lock(&cache_mu_);
  auto [it, inserted] = training_.try_emplace({experiment, stage});
  if (inserted) {
    const std::map<std::string, std::string> labels = {{"experiment", experiment},
                                                       {"stage", stage}};
    it->second.loss = &train_loss_->Add(labels);
    it->second.tokens = &train_tokens_->Add(labels);
    it->second.step = &train_step_->Add(labels);
    it->second.progress = &train_progress_->Add(labels);
    it->second.step_seconds = &train_step_seconds_->Add(labels);
    it->second.last_step = &train_last_step_->Add(labels);
  }
  return it->second;
}

void CoordinatorMetrics::RemoveTraining(const std::string& experiment, const std::string& stage) {
  absl::MutexLock lock(&cache_mu_);
  auto it = training_.find({experiment, stage});
  if (it == training_.end()) return;
  train_loss_->Remove(it->second.loss);
  train_tokens_->Remove(it->second.tokens);
  train_step_->Remove(it->second.step);
  train_progress_->Remove(it->second.progress);
  train_step_seconds_->Remove(it->second.step_seconds);
  train_last_step_->Remove(it->second.last_step);
  training_.erase(it);
}

}  // namespace stemma::coordinator
