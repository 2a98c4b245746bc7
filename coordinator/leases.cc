#include "coordinator/leases.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "coordinator/attempts.h"

namespace stemma::coordinator {

absl::StatusOr<v1::HeartbeatAck> Leases::Heartbeat(const std::string& worker_id, uint64_t session,
                                                   const v1::Heartbeat& heartbeat) {
  std::shared_ptr<Liveness> live;
  {
    absl::ReaderMutexLock lock(&core_->live_mu);
    auto it = core_->live.find(worker_id);
    if (it != core_->live.end()) live = it->second;
  }
  if (live == nullptr || live->session.load() != session) {
    return absl::FailedPreconditionError("session replaced; register again");
  }
  if (live->lost.load()) return absl::FailedPreconditionError("lease expired; register again");
  const int64_t now = core_->clock->MonoMs();
  const int64_t previous = live->last_heartbeat_mono.exchange(now);
  core_->metrics->HeartbeatAge((now - previous) / 1000.0);
  v1::HeartbeatAck ack;
  ack.set_seq(heartbeat.seq());
  return ack;
}

void Leases::Expire(Changes* changes) {
  CoordinatorCore& c = *core_;
  c.mu.AssertHeld();
  const int64_t now = c.clock->MonoMs();
  for (auto& [id, w] : c.workers.all()) {
    const int64_t last = w.live->last_heartbeat_mono.load();
    if (w.info.state() == v1::WORKER_LOST || last + c.options.lease_ms > now) continue;
    spdlog::warn("worker={} lost: no heartbeat for {} ms", id, now - last);
    w.info.set_state(v1::WORKER_LOST);
    w.live->lost = true;
    auto ch = c.channels.find(id);
    if (ch != c.channels.end()) {
      ch->second->Close();
      c.channels.erase(ch);
    }
    w.connected = false;
    std::vector<std::string> attempts;
    for (const auto& [key, a] : w.allocations) attempts.push_back(key.substr(0, key.rfind('/')));
    for (const auto& attempt : attempts) {
      v1::Job* job = c.jobs.FindCurrentAttempt(attempt);
      if (job == nullptr || !c.jobs.IsLive(*job)) continue;
      EndAttempt(
          c, job,
          absl::StrCat("worker ", id, " lost (no heartbeat for ", c.options.lease_ms, " ms)"), -1,
          true, "", changes);
    }
    // Anything left (e.g. parts of ended attempts) is freed too.
    std::vector<std::string> keys;
    for (const auto& [key, a] : w.allocations) keys.push_back(key);
    for (const auto& key : keys) c.workers.Free(w, key);
    changes->batch.of<WorkersTable>().push_back(w.info);
  }
}

}  // namespace stemma::coordinator
