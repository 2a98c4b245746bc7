// Fan-out of job events to Watch streams. Each subscriber has a bounded queue; one that
// falls too far behind is closed (its stream ends with RESOURCE_EXHAUSTED) rather than
// slowing the coordinator. Thread-safe.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "stemma/v1/user_service.pb.h"

namespace stemma::coordinator {

class EventHub {
 public:
  class Subscription {
   public:
    // Waits up to timeout_ms for events; false once the subscription overflowed.
    bool Next(std::vector<v1::JobEvent>* out, int64_t timeout_ms);

   private:
    friend class EventHub;
    absl::Mutex mu_;
    std::deque<v1::JobEvent> queue_ ABSL_GUARDED_BY(mu_);
    bool overflowed_ ABSL_GUARDED_BY(mu_) = false;
    std::set<std::string> filter_;  // empty: every job
  };

  static constexpr size_t kMaxQueued = 100000;

  std::shared_ptr<Subscription> Subscribe(const std::vector<std::string>& job_ids);
  void Unsubscribe(const std::shared_ptr<Subscription>& sub);
  void Publish(const std::vector<v1::JobEvent>& events);
  // Cheap check, so that producers can skip building events nobody reads. A subscriber
  // added concurrently may miss events produced before it was counted, as it may anyway.
  bool HasSubscribers() const { return subscribers_.load(std::memory_order_relaxed) > 0; }
  // Whether some subscriber would receive events of this job.
  bool Wants(const std::string& job_id);

 private:
  absl::Mutex mu_;
  std::vector<std::shared_ptr<Subscription>> subs_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> subscribers_{0};
};

}  // namespace stemma::coordinator
