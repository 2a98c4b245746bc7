#include "coordinator/preemptor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/engine_contract.h"
#include "common/logging.h"
#include "coordinator/attempts.h"
#include "coordinator/preemption.h"

namespace stemma::coordinator {
namespace {

bool Live(v1::JobState s) { return s == v1::ASSIGNED || s == v1::RUNNING; }

}  // namespace

void Preemptor::OnTransition(const v1::Job& job, v1::JobState from, v1::JobState to) {
  const bool was = Live(from), is = Live(to);
  if (was != is) {
    const int priority = job.spec().priority();
    if (is) {
      ++live_priorities_[priority];
    } else if (auto it = live_priorities_.find(priority);
               it != live_priorities_.end() && --it->second <= 0) {
      live_priorities_.erase(it);
    }
  }
  if (was && !is) {
    if (!stopping_.empty()) stopping_.erase(job.id());
    if (!checkpoint_ms_.empty()) checkpoint_ms_.erase(job.current().id());
  }
  // Loaded while its victims were stopping: the grace period starts again.
  if (is && from == v1::JOB_STATE_UNSPECIFIED && !job.current().preempted_by().empty()) {
    stopping_[job.id()] = core_->clock->MonoMs() + core_->options.scheduler.preemption_grace_ms;
  }
  if (from == v1::QUEUED && to != v1::QUEUED && !reserved_until_.empty() &&
      reserved_until_.contains(job.id())) {
    DropReservations(job.id());
  }
}

void Preemptor::OnMetrics(const v1::Job& job, const v1::AttemptEvent::MetricBatch& batch) {
  for (const std::string& name : batch.names()) {
    if (name == engine_contract::kCheckpointStepSeries) {
      // The coordinator's clock, like the attempt's start it is compared with.
      checkpoint_ms_[job.current().id()] = core_->clock->WallMs();
      return;
    }
  }
}

int64_t Preemptor::WorkLostMs(const v1::Job& job, int64_t now_wall_ms) const {
  int64_t since = job.current().assigned_ms();
  if (auto it = checkpoint_ms_.find(job.current().id()); it != checkpoint_ms_.end()) {
    since = std::max(since, it->second);
  }
  return std::max<int64_t>(0, now_wall_ms - since);
}

void Preemptor::Pass(Changes* changes) {
  CoordinatorCore& c = *core_;
  c.mu.AssertHeld();  // as core_->mu
  if (!c.options.scheduler.preemption) return;
  if (!stopping_.empty()) KillOverdue(changes);
  if (!reserved_until_.empty()) {
    const int64_t now = c.clock->MonoMs();
    std::vector<std::string> lapsed;
    for (const auto& [id, until] : reserved_until_) {
      if (now >= until) lapsed.push_back(id);
    }
    for (const std::string& id : lapsed) DropReservations(id);
  }
  // Cheap unless a QUEUED job outranks a live one.
  if (live_priorities_.empty() || c.jobs.queue().empty() ||
      -std::get<0>(*c.jobs.queue().begin()) <= live_priorities_.begin()->first) {
    return;
  }
  const int64_t now = c.clock->WallMs();
  const std::vector<Preemption> chosen = ChoosePreemptions(
      c.jobs, c.workers, now, live_priorities_.begin()->first,
      [&](const v1::Job& job) ABSL_NO_THREAD_SAFETY_ANALYSIS { return WorkLostMs(job, now); },
      &c.quotas, &reservations_);
  const int64_t until = c.clock->MonoMs() + 2 * c.options.scheduler.preemption_grace_ms;
  for (const Preemption& p : chosen) {
    for (const std::string& id : p.victims) {
      const v1::Job* victim = c.jobs.Find(id);
      if (victim == nullptr) continue;
      Stop(c.jobs.FindCurrentAttempt(victim->current().id()), p.job_id, changes);
    }
    reservations_.insert(reservations_.end(), p.reservations.begin(), p.reservations.end());
    reserved_until_[p.job_id] = until;
  }
}

void Preemptor::Stop(v1::Job* victim, const std::string& by, Changes* changes) {
  if (victim == nullptr) return;
  CoordinatorCore& c = *core_;
  c.mu.AssertHeld();  // as core_->mu
  const v1::Job* preemptor = c.jobs.Find(by);
  spdlog::info("job={} preempted by job={} (priority {} over {}): attempt={} asked to stop",
               victim->id(), by, preemptor != nullptr ? preemptor->spec().priority() : 0,
               victim->spec().priority(), victim->current().id());
  c.jobs.MarkPreempting(victim, by, changes);
  for (const auto& part : victim->current().parts()) {
    if (part.finished()) continue;
    v1::CoordinatorMessage msg;
    v1::StopAttempt* stop = msg.mutable_stop();
    stop->set_attempt_id(victim->current().id());
    stop->set_reason(absl::StrCat("preempted by ", by));
    stop->set_preempt(true);
    stop->set_preempted_by(by);
    changes->messages.push_back({part.worker_id(), std::move(msg)});
  }
  stopping_[victim->id()] = c.clock->MonoMs() + c.options.scheduler.preemption_grace_ms;
}

void Preemptor::KillOverdue(Changes* changes) {
  CoordinatorCore& c = *core_;
  c.mu.AssertHeld();  // as core_->mu
  const int64_t now = c.clock->MonoMs();
  std::vector<std::string> overdue;
  for (const auto& [id, until] : stopping_) {
    if (now >= until) overdue.push_back(id);
  }
  for (const std::string& id : overdue) {
    stopping_.erase(id);
    const v1::Job* found = c.jobs.Find(id);
    if (found == nullptr || !c.jobs.IsLive(*found)) continue;
    v1::Job* job = c.jobs.FindCurrentAttempt(found->current().id());
    const std::string why =
        absl::StrCat("preempted by ", job->current().preempted_by(), ": not stopped within ",
                     c.options.scheduler.preemption_grace_ms / 1000, " s");
    spdlog::warn("job={} attempt={} {}; killed and requeued", id, job->current().id(), why);
    StopParts(c, *job, why, "", changes);
    c.metrics->AttemptEnded("preempted");
    c.metrics->Preempted(/*killed=*/true);
    c.jobs.AttemptPreempted(job, -1, /*killed=*/true, changes);
  }
}

void Preemptor::Requeue(v1::Job* job, const std::string& worker_id, int exit_code,
                        Changes* changes) {
  CoordinatorCore& c = *core_;
  c.mu.AssertHeld();  // as core_->mu
  StopParts(c, *job, absl::StrCat("preempted by ", job->current().preempted_by()), worker_id,
            changes);
  c.metrics->AttemptEnded("preempted");
  c.metrics->Preempted(/*killed=*/false);
  spdlog::info("job={} attempt={} stopped for job={}; requeued without spending an attempt",
               job->id(), job->current().id(), job->current().preempted_by());
  c.jobs.AttemptPreempted(job, exit_code, /*killed=*/false, changes);
}

void Preemptor::DropReservations(const std::string& job_id) {
  reservations_.erase(std::remove_if(reservations_.begin(), reservations_.end(),
                                     [&](const Reservation& r) { return r.job_id == job_id; }),
                      reservations_.end());
  reserved_until_.erase(job_id);
}

}  // namespace stemma::coordinator
