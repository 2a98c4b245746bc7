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
    brackets_[r.bracket()][r.rung()].push_back(
        r.values_size() > 0 ? std::vector<double>(r.values().begin(), r.values().end())
                            : std::vector<double>{r.value()});
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

bool EarlyStopper::RecordAndDecide(v1::Job* job, int i, int64_t step,
                                   const std::vector<double>& values, Changes* changes) {
  const v1::EarlyStopRule& config = job->spec().early_stop_rule();
  const bool pareto = experiments::IsPareto(config);
  std::vector<std::vector<double>>& recorded = brackets_[BracketOf(*job)][i];
  recorded.push_back(values);
  std::vector<double> firsts;
  for (const auto& v : recorded) firsts.push_back(v[0]);
  const experiments::RungDecision d =
      pareto ? experiments::DecideAtRungPareto(config, recorded, recorded.size() - 1)
             : experiments::DecideAtRung(config, firsts, values[0]);
  v1::RungRecord& r = changes->batch.of<EarlyStopRungsTable>().emplace_back();
  r.set_bracket(BracketOf(*job));
  r.set_job_id(job->id());
  r.set_job_name(job->spec().name());
  r.set_rung(i);
  r.set_rung_step(config.rungs(i));
  r.set_step(step);
  r.set_value(values[0]);
  if (pareto) {
    for (double v : values) r.add_values(v);
    r.set_front(d.front);
  }
  r.set_stopped(d.stop);
  r.set_trials(d.trials);
  r.set_rank(d.rank);
  r.set_decided_ms(core_->clock->WallMs());
  spdlog::info(
      "job={} {} rung {} (step {}): {} rank {} of {}: {}", job->id(), job->spec().name(), i + 1,
      config.rungs(i),
      pareto ? absl::StrCat(experiments::ObjectiveValues(config, values), " front ", d.front + 1)
             : absl::StrCat(config.metric(), "=", values[0]),
      d.rank, d.trials, d.stop ? "stop" : "continue");
  if (!d.stop) return false;
  core_->jobs.SetEarlyStop(
      job,
      pareto ? experiments::StopReasonPareto(config, i, config.rungs(i), values, d)
             : experiments::StopReason(config, i, config.rungs(i), values[0], d),
      changes);
  SendStop(*job, changes);
  return true;
}

void EarlyStopper::OnMetric(v1::Job* job, const v1::AttemptEvent::Metric& metric,
                            Changes* changes) {
  if (!job->spec().has_early_stop_rule()) return;
  const v1::EarlyStopRule* config = &job->spec().early_stop_rule();
  if (!job->early_stop().empty()) {
    SendStop(*job, changes);  // still running: tell it again (once per attempt)
    return;
  }
  const bool pareto = experiments::IsPareto(*config);
  int objective = -1;
  bool maximize = experiments::Maximize(*config);
  for (int k = 0; pareto && k < config->objectives_size(); ++k) {
    if (config->objectives(k).metric() == metric.name()) {
      objective = k;
      maximize = config->objectives(k).mode() == "max";
    }
  }
  if (pareto ? objective < 0 : metric.name() != config->metric()) return;
  double value = metric.value();
  if (!std::isfinite(value)) {
    value = maximize ? -std::numeric_limits<double>::infinity()
                     : std::numeric_limits<double>::infinity();
  }
  for (int i = 0; i < config->rungs_size() && config->rungs(i) <= metric.step(); ++i) {
    const std::string key = absl::StrCat(job->id(), "/", i);
    if (recorded_.count(key) > 0) continue;
    std::vector<double> values = {value};
    if (pareto) {
      std::map<int, double>& seen = partial_[key];
      seen.emplace(objective, value);  // each objective's first value at or past the rung
      if (static_cast<int>(seen.size()) < config->objectives_size()) continue;
      values.clear();
      for (const auto& [k, v] : seen) values.push_back(v);
      partial_.erase(key);
    }
    recorded_.insert(key);
    if (RecordAndDecide(job, i, metric.step(), values, changes)) return;
  }
}

}  // namespace stemma::coordinator
