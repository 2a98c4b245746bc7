#include "worker/metrics.h"

namespace stemma::worker {

Metrics::Metrics(prometheus::Registry* registry) : registry_(registry) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  attempts_running_ = &BuildGauge()
                           .Name("stemma_worker_attempts_running")
                           .Help("Attempts whose process is alive on this worker.")
                           .Register(*registry)
                           .Add({});
  finished_family_ = &BuildCounter()
                          .Name("stemma_worker_attempts_finished_total")
                          .Help("Attempts finished on this worker, by result.")
                          .Register(*registry);
  finished_succeeded_ = &finished_family_->Add({{"result", "succeeded"}});
  finished_failed_ = &finished_family_->Add({{"result", "failed"}});
  finished_cancelled_ = &finished_family_->Add({{"result", "cancelled"}});
  finished_timeout_ = &finished_family_->Add({{"result", "timeout"}});
  finished_refused_ = &finished_family_->Add({{"result", "refused"}});
  finished_preempted_ = &finished_family_->Add({{"result", "preempted"}});
  heartbeat_rtt_ = &BuildHistogram()
                        .Name("stemma_worker_heartbeat_rtt_seconds")
                        .Help("Round trip of a heartbeat to the coordinator and back.")
                        .Register(*registry)
                        .Add({}, prometheus::Histogram::BucketBoundaries{
                                     0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                     0.5, 1, 2.5, 5});
  connected_ = &BuildGauge()
                    .Name("stemma_worker_connected")
                    .Help("1 while registered with the coordinator, else 0.")
                    .Register(*registry)
                    .Add({});
  gpus_total_ = &BuildGauge()
                     .Name("stemma_worker_gpus")
                     .Help("GPUs this worker offers.")
                     .Register(*registry)
                     .Add({});
  gpus_in_use_ = &BuildGauge()
                      .Name("stemma_worker_gpus_in_use")
                      .Help("GPUs held by running attempts.")
                      .Register(*registry)
                      .Add({});
  heartbeat_age_ = &BuildGauge()
                        .Name("stemma_worker_heartbeat_age_seconds")
                        .Help("Seconds since the coordinator last acknowledged a heartbeat.")
                        .Register(*registry)
                        .Add({});
}

std::unique_ptr<Metrics> Metrics::CreateDetached() {
  auto registry = std::make_shared<prometheus::Registry>();
  auto metrics = std::make_unique<Metrics>(registry.get());
  metrics->owned_ = std::move(registry);
  return metrics;
}

void Metrics::AttemptFinished(const std::string& result) {
  if (result == "succeeded") {
    finished_succeeded_->Increment();
  } else if (result == "cancelled") {
    finished_cancelled_->Increment();
  } else if (result == "timeout") {
    finished_timeout_->Increment();
  } else if (result == "refused") {
    finished_refused_->Increment();
  } else if (result == "preempted") {
    finished_preempted_->Increment();
  } else {
    finished_failed_->Increment();
  }
}

}  // namespace stemma::worker
