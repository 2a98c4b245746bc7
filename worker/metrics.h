// All of the worker's Prometheus series, defined in one place and injected into the
// executor and the session. Names follow stemma_worker_<name>_<unit>; labels are bounded
// (no attempt or job ids).
//
// Thread-safe: prometheus-cpp metrics are atomic; the object is immutable after
// construction.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

namespace stemma::worker {

class Metrics {
 public:
  // Registers every series in `registry`, which must outlive this object.
  explicit Metrics(prometheus::Registry* registry);
  // A metrics object with its own private registry (tests, or no /metrics endpoint).
  static std::unique_ptr<Metrics> CreateDetached();

  // result: succeeded | failed | cancelled | timeout | refused.
  void AttemptFinished(const std::string& result);
  void SetAttemptsRunning(int n) { attempts_running_->Set(n); }
  void SetGpusTotal(int n) { gpus_total_->Set(n); }
  void SetGpusInUse(int n) { gpus_in_use_->Set(n); }
  void SetConnected(bool connected) { connected_->Set(connected ? 1 : 0); }
  void ObserveHeartbeatRtt(double seconds) { heartbeat_rtt_->Observe(seconds); }
  void SetHeartbeatAge(double seconds) { heartbeat_age_->Set(seconds); }

  prometheus::Registry* registry() const { return registry_; }

 private:
  std::shared_ptr<prometheus::Registry> owned_;  // only for CreateDetached
  prometheus::Registry* registry_;
  prometheus::Gauge* attempts_running_;
  prometheus::Family<prometheus::Counter>* finished_family_;
  prometheus::Counter* finished_succeeded_;
  prometheus::Counter* finished_failed_;
  prometheus::Counter* finished_cancelled_;
  prometheus::Counter* finished_timeout_;
  prometheus::Counter* finished_refused_;
  prometheus::Counter* finished_preempted_;
  prometheus::Histogram* heartbeat_rtt_;
  prometheus::Gauge* connected_;
  prometheus::Gauge* gpus_total_;
  prometheus::Gauge* gpus_in_use_;
  prometheus::Gauge* heartbeat_age_;
};

}  // namespace stemma::worker
