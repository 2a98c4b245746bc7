#include "coordinator/metric_series.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace stemma::coordinator {
namespace {

bool IsLiveState(v1::JobState s) { return s == v1::ASSIGNED || s == v1::RUNNING; }

std::string StageOf(const v1::Job& job) {
  auto it = job.spec().labels().find("stage");
  return it == job.spec().labels().end() ? "" : it->second;
}

}  // namespace

void MetricSeries::Record(const v1::Job& job, const v1::AttemptEvent::Metric& metric,
                          Changes* changes) {
  // Points of one series in one change extend one run (a step event's loss, lr, ... come
  // interleaved, so the last few runs are searched).
  auto& runs = changes->batch.of<MetricPointsTable>();
  const int attempt = job.current().number();
  auto same_labels = [&](const MetricRun& r) {
    if (r.labels.size() != metric.labels().size()) return false;
    for (const auto& [k, v] : r.labels) {
      auto it = metric.labels().find(k);
      if (it == metric.labels().end() || it->second != v) return false;
    }
    return true;
  };
  MetricRun* run = nullptr;
  for (size_t k = runs.size(); k > 0 && runs.size() - k < kRunsSearched; --k) {
    MetricRun& r = runs[k - 1];
    if (r.attempt == attempt && r.name == metric.name() && r.job_id == job.id() && same_labels(r)) {
      run = &r;
      break;
    }
  }
  if (run == nullptr) {
    run = &runs.emplace_back();
    run->job_id = job.id();
    run->attempt = attempt;
    run->name = metric.name();
    run->labels.assign(metric.labels().begin(), metric.labels().end());
    std::sort(run->labels.begin(), run->labels.end());
  }
  run->steps.push_back(metric.step());
  run->values.push_back(metric.value());
  run->times_ms.push_back(metric.time_ms() != 0 ? metric.time_ms() : core_->clock->WallMs());

  Live& live = live_[job.id()];
  if (live.last.size() < kMaxNamesPerJob || live.last.contains(metric.name())) {
    live.last[metric.name()] = metric.value();
  }
  const bool loss = metric.name() == "loss";
  const bool tokens = metric.name() == "tokens_per_s";
  if (!loss && !tokens) return;
  if (!live.in_group) {
    live.group = {job.spec().experiment(), StageOf(job)};
    live.in_group = true;
    ++groups_[live.group];
    live.gauges = core_->metrics->Training(live.group.first, live.group.second);
  }
  (loss ? live.gauges.loss : live.gauges.tokens)->Set(metric.value());
  live.gauges.step->Set(static_cast<double>(metric.step()));
}

void MetricSeries::LeaveGroup(Live& live) {
  if (!live.in_group) return;
  live.in_group = false;
  auto it = groups_.find(live.group);
  if (it == groups_.end()) return;
  if (--it->second <= 0) {
    core_->metrics->RemoveTraining(live.group.first, live.group.second);
    groups_.erase(it);
  }
}

void MetricSeries::OnTransition(const v1::Job& job, v1::JobState from, v1::JobState to) {
  if (!IsLiveState(from) || IsLiveState(to)) return;
  auto it = live_.find(job.id());
  if (it == live_.end()) return;
  LeaveGroup(it->second);
  if (to != v1::SUCCEEDED) live_.erase(it);
}

absl::flat_hash_map<std::string, double> MetricSeries::LastValues(
    const std::string& job_id) const {
  auto it = live_.find(job_id);
  if (it == live_.end()) return {};
  return it->second.last;
}

void MetricSeries::Forget(const std::string& job_id) {
  auto it = live_.find(job_id);
  if (it == live_.end()) return;
  LeaveGroup(it->second);
  live_.erase(it);
}

absl::StatusOr<v1::QueryMetricsResponse> MetricSeries::Query(
    const v1::QueryMetricsRequest& request) {
  MetricQuery q;
  q.name_pattern = request.name_pattern();
  q.last_only = request.last_only();
  if (request.limit() < 0) return absl::InvalidArgumentError("limit: must not be negative");
  if (request.limit() > 0) q.limit = static_cast<size_t>(std::min<int64_t>(request.limit(), 10000000));
  uint64_t ticket;
  {
    absl::MutexLock lock(&core_->mu);
    for (const std::string& id : request.job_ids()) {
      if (core_->jobs.Find(id) == nullptr) return absl::NotFoundError(absl::StrCat("no job ", id));
      q.job_ids.push_back(id);
    }
    if (!request.experiment().empty()) {
      std::vector<std::pair<uint64_t, std::string>> jobs;
      core_->jobs.ForEach([&](const v1::Job& job) {
        if (job.spec().experiment() == request.experiment()) jobs.emplace_back(job.seq(), job.id());
      });
      if (jobs.empty()) {
        return absl::NotFoundError(absl::StrCat("no jobs in experiment ", request.experiment()));
      }
      std::sort(jobs.begin(), jobs.end());
      for (auto& [seq, id] : jobs) q.job_ids.push_back(std::move(id));
    }
    if (q.job_ids.empty()) {
      return absl::InvalidArgumentError("job_ids or experiment: name at least one");
    }
    ticket = core_->LastTicket();
  }
  // Points reported so far may wait for a lazy commit: make them durable first, so that
  // what was reported before the call is in the answer.
  core_->Wait(ticket);
  bool truncated = false;
  auto points = core_->store->ReadMetrics(q, &truncated);
  if (!points.ok()) return points.status();
  v1::QueryMetricsResponse resp;
  resp.mutable_points()->Reserve(static_cast<int>(points->size()));
  for (auto& p : *points) *resp.add_points() = std::move(p);
  resp.set_truncated(truncated);
  return resp;
}

}  // namespace stemma::coordinator
