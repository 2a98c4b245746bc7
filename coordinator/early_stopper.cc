#include "coordinator/early_stopper.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace stemma::coordinator {

std::string EarlyStopper::BracketOf(const v1::Job& job) {
  const auto& labels = job.spec().labels();
  auto label = [&](const char* key) -> std::string {
    auto it = labels.find(key);
    return it == labels.end() ? "" : it->second;
  };
  return absl::StrCat(job.spec().experiment(), "/", label("stage"), "/", label("stemma.revision"));
}

void EarlyStopper::Load(const StoreSnapshot& snapshot) {
  for (const v1::RungRecord& r : snapshot.of<EarlyStopRungsTable>()) {
    if (!recorded_.insert(EarlyStopRungsTable::KeyOf(r)).second) continue;
    brackets_[r.bracket()][r.rung()].push_back(r.value());
  }
}

void EarlyStopper::SendStop(const v1::Job& job, Changes* changes) {
  if (!stop_sent_.insert(job.current().id()).second) return;
  for (const auto& part : job.current().parts()) {
    if (part.finished()) continue;
    v1::CoordinatorMessage msg;
    msg.mutable_stop()->set_attempt_id(job.current().id());
    msg.mutable_stop()->set_reason(job.early_stop());
    changes->messages.push_back({part.worker_id(), std::move(msg)});
  }
}

void EarlyStopper::OnMetric(v1::Job* job, const v1::AttemptEvent::Metric& metric,
                            Changes* changes) {
  if (!job->spec().has_early_stop_rule()) return;
  const v1::EarlyStopRule* config = &job->spec().early_stop_rule();
  if (!job->early_stop().empty()) {
    SendStop(*job, changes);  // still running: tell it again (once per attempt)
    return;
  }
  if (metric.name() != config->metric()) return;
  double value = metric.value();
  if (!std::isfinite(value)) {
    value = experiments::Maximize(*config) ? -std::numeric_limits<double>::infinity()
                                           : std::numeric_limits<double>::infinity();
  }
  const std::string bracket = BracketOf(*job);
  for (size_t i = 0;
       i < static_cast<size_t>(config->rungs_size()) && config->rungs(i) <= metric.step(); ++i) {
    const int rung = static_cast<int>(i);
    if (!recorded_.insert(absl::StrCat(job->id(), "/", rung)).second) continue;
    std::vector<double>& values = brackets_[bracket][rung];
    values.push_back(value);
    const experiments::RungDecision d = experiments::DecideAtRung(*config, values, value);
    v1::RungRecord& r = changes->batch.of<EarlyStopRungsTable>().emplace_back();
    r.set_bracket(bracket);
    r.set_job_id(job->id());
    r.set_job_name(job->spec().name());
    r.set_rung(rung);
    r.set_rung_step(config->rungs(i));
    r.set_step(metric.step());
    r.set_value(value);
    r.set_stopped(d.stop);
    r.set_trials(d.trials);
    r.set_rank(d.rank);
    r.set_decided_ms(core_->clock->WallMs());
    spdlog::info("job={} {} rung {} (step {}): {}={} rank {} of {}: {}", job->id(),
                 job->spec().name(), rung + 1, config->rungs(i), config->metric(), value, d.rank,
                 d.trials, d.stop ? "stop" : "continue");
    if (d.stop) {
      core_->jobs.SetEarlyStop(
          job, experiments::StopReason(*config, rung, config->rungs(i), value, d), changes);
      SendStop(*job, changes);
      return;
    }
  }
}

}  // namespace stemma::coordinator
