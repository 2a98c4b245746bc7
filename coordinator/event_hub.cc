#include "coordinator/event_hub.h"

#include <algorithm>

#include "absl/time/time.h"

namespace stemma::coordinator {

bool EventHub::Subscription::Next(std::vector<v1::JobEvent>* out, int64_t timeout_ms) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || overflowed_; };
  mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(timeout_ms));
  if (overflowed_) return false;
  out->insert(out->end(), std::make_move_iterator(queue_.begin()),
              std::make_move_iterator(queue_.end()));
  queue_.clear();
  return true;
}

std::shared_ptr<EventHub::Subscription> EventHub::Subscribe(const std::vector<std::string>& ids) {
  auto sub = std::make_shared<Subscription>();
  sub->filter_.insert(ids.begin(), ids.end());
  absl::MutexLock lock(&mu_);
  subs_.push_back(sub);
  subscribers_ = static_cast<int>(subs_.size());
  return sub;
}

void EventHub::Unsubscribe(const std::shared_ptr<Subscription>& sub) {
  absl::MutexLock lock(&mu_);
  subs_.erase(std::remove(subs_.begin(), subs_.end(), sub), subs_.end());
  subscribers_ = static_cast<int>(subs_.size());
}

bool EventHub::Wants(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  for (const auto& sub : subs_) {
    if (sub->filter_.empty() || sub->filter_.contains(job_id)) return true;
  }
  return false;
}

void EventHub::Publish(const std::vector<v1::JobEvent>& events) {
  if (events.empty()) return;
  absl::MutexLock lock(&mu_);
  for (auto& sub : subs_) {
    absl::MutexLock sl(&sub->mu_);
    for (const auto& ev : events) {
      if (!sub->filter_.empty() && !sub->filter_.contains(ev.job().id())) continue;
      if (sub->queue_.size() >= kMaxQueued) {
        sub->overflowed_ = true;
        break;
      }
      sub->queue_.push_back(ev);
    }
  }
}

}  // namespace stemma::coordinator
