#include "coordinator/core.h"

#include <iterator>

#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "common/job_spec.h"

namespace stemma::coordinator {

bool ParseAttemptId(const std::string& attempt_id, std::string* job_id, int* number) {
  auto dot = attempt_id.rfind('.');
  if (dot == std::string::npos || attempt_id.rfind("j-", 0) != 0) return false;
  uint64_t seq;
  if (!absl::SimpleAtoi(attempt_id.substr(2, dot - 2), &seq)) return false;
  if (!absl::SimpleAtoi(attempt_id.substr(dot + 1), number) || *number <= 0) return false;
  *job_id = attempt_id.substr(0, dot);
  return true;
}

CoordinatorCore::CoordinatorCore(CoordinatorOptions opts, Store* s, const Clock* c,
                                 CoordinatorMetrics* m)
    : options(std::move(opts)),
      store(s),
      clock(c),
      metrics(m),
      logs(options.data_dir + "/logs"),
      jobs(c),
      quotas(c) {
  jobs.SetObserver([this](const v1::Job& job, v1::JobState from, v1::JobState to)
                       ABSL_NO_THREAD_SAFETY_ANALYSIS {  // JobTable calls it under mu
                         metrics->Transition(JobKind(job.spec()), from, to);
                         quotas.OnTransition(job, from, to);
                         if (on_transition) on_transition(job, from, to);
                       });
}

void CoordinatorCore::StartCommitter() {
  committer_ = std::make_unique<Committer>(
      store,
      [this](double s, size_t n, bool ok) {
        if (ok) {
          metrics->StoreCommit(s, n);
        } else {
          metrics->StoreCommitFailed();
        }
      },
      [this](uint64_t durable) { FlushOutbox(durable); });
}

void CoordinatorCore::StopCommitter() { committer_.reset(); }

uint64_t CoordinatorCore::Finish(Changes&& changes) {
  // Lazy unless someone waits: the caller (Wait) or the messages and events. A change
  // nobody waits for (a job going RUNNING, metric points) joins the next transaction.
  const bool outgoing = !changes.events.empty() || !changes.messages.empty();
  if (!outgoing) return committer_->Add(std::move(changes.batch), /*urgent=*/false);
  Outgoing out;
  out.events = std::move(changes.events);
  for (auto& m : changes.messages) {
    auto it = channels.find(m.worker_id);
    if (it != channels.end()) out.sends.emplace_back(it->second, std::move(m.message));
  }
  absl::MutexLock lock(&outbox_mu_);
  out.ticket = committer_->Add(std::move(changes.batch), /*urgent=*/true);
  const uint64_t ticket = out.ticket;
  outbox_.push_back(std::move(out));
  return ticket;
}

void CoordinatorCore::FlushOutbox(uint64_t durable) {
  std::vector<Outgoing> ready;
  {
    absl::MutexLock lock(&outbox_mu_);
    size_t n = 0;
    while (n < outbox_.size() && outbox_[n].ticket <= durable) ++n;
    if (n == 0) return;
    ready.assign(std::make_move_iterator(outbox_.begin()),
                 std::make_move_iterator(outbox_.begin() + n));
    outbox_.erase(outbox_.begin(), outbox_.begin() + n);
  }
  // Everything for one worker leaves in one write (an ack and the next assignment, say);
  // messages keep their order within each worker.
  std::vector<std::pair<std::shared_ptr<WorkerChannel>, std::vector<v1::CoordinatorMessage>>>
      per_worker;
  absl::flat_hash_map<const WorkerChannel*, size_t> index;  // channel -> per_worker entry
  std::vector<v1::JobEvent> events;
  for (Outgoing& o : ready) {
    for (auto& [channel, message] : o.sends) {
      auto [it, inserted] = index.try_emplace(channel.get(), per_worker.size());
      if (inserted) per_worker.emplace_back(channel, std::vector<v1::CoordinatorMessage>());
      per_worker[it->second].second.push_back(std::move(message));
    }
    if (events.empty()) {
      events = std::move(o.events);
    } else {
      events.insert(events.end(), std::make_move_iterator(o.events.begin()),
                    std::make_move_iterator(o.events.end()));
    }
  }
  for (auto& [channel, messages] : per_worker) channel->SendAll(std::move(messages));
  if (!events.empty()) hub.Publish(events);
}

void CoordinatorCore::Kick() {
  absl::MutexLock lock(&kick_mu_);
  kicked_ = true;
}

bool CoordinatorCore::AwaitKick(int64_t ms) {
  absl::MutexLock lock(&kick_mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kick_mu_) { return kicked_ || stopping_; };
  kick_mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(ms));
  if (stopping_) return false;
  kicked_ = false;
  return true;
}

bool CoordinatorCore::RequestStop() {
  absl::MutexLock lock(&kick_mu_);
  if (stopping_) return false;
  stopping_ = true;
  return true;
}

}  // namespace stemma::coordinator
