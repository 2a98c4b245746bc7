#include "coordinator/metric_series.h"

#include <fnmatch.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace stemma::coordinator {
namespace {

bool IsLiveState(v1::JobState s) { return s == v1::ASSIGNED || s == v1::RUNNING; }

std::string StageOf(const v1::Job& job) {
  auto it = job.spec().labels().find("stage");
  return it == job.spec().labels().end() ? "" : it->second;
}

}  // namespace

size_t MetricSeries::RunFor(const v1::Job& job, const std::string& name,
                            const std::vector<std::pair<std::string, std::string>>& sorted_labels,
                            Changes* changes) {
  // Points of one series in one change extend one run (a step event's loss, lr, ... come
  // interleaved, so the last few runs are searched).
  auto& runs = changes->batch.of<MetricPointsTable>();
  const int attempt = job.current().number();
  for (size_t k = runs.size(); k > 0 && runs.size() - k < kRunsSearched; --k) {
    const MetricRun& r = runs[k - 1];
    if (r.attempt == attempt && r.name == name && r.job_id == job.id() &&
        r.labels == sorted_labels) {
      return k - 1;
    }
  }
  MetricRun& run = runs.emplace_back();
  run.job_id = job.id();
  run.attempt = attempt;
  run.name = name;
  run.labels = sorted_labels;
  return runs.size() - 1;
}

void MetricSeries::NoteLast(const v1::Job& job, const std::string& name, double value,
                            int64_t step) {
  Live& live = live_[job.id()];
  if (live.last.size() < kMaxNamesPerJob || live.last.contains(name)) live.last[name] = value;
  if (job.spec().kind_case() == v1::JobSpec::kEval) {  // a result, as it lands
    const std::string& experiment = job.spec().experiment();
    core_->metrics->EvalScore(experiment, StageOf(job), experiment.empty() ? "" : job.spec().name(),
                              name, value);
  }
  const bool loss = name == "loss";
  const bool tokens = name == "tokens_per_s";
  if (!loss && !tokens) return;
  if (!live.in_group) {
    live.group = {job.spec().experiment(), StageOf(job)};
    live.in_group = true;
    ++groups_[live.group];
    live.gauges = core_->metrics->Training(live.group.first, live.group.second);
  }
  (loss ? live.gauges.loss : live.gauges.tokens)->Set(value);
  live.gauges.step->Set(static_cast<double>(step));
  if (step <= live.step) return;
  // Points arrive in batches: the time per step is the time between arrivals over the
  // steps between them, smoothed.
  const int64_t now = core_->clock->WallMs();
  if (live.step >= 0 && now > live.step_at_ms) {
    const double per =
        static_cast<double>(now - live.step_at_ms) / static_cast<double>(step - live.step);
    live.step_ms = live.step_ms > 0 ? 0.8 * live.step_ms + 0.2 * per : per;
    live.gauges.step_seconds->Set(live.step_ms / 1000.0);
  }
  live.step = step;
  live.step_at_ms = now;
  live.gauges.last_step->Set(static_cast<double>(now) / 1000.0);
}

int MetricSeries::Stalled(int64_t now_wall_ms) const {
  int stalled = 0;
  for (const auto& [id, live] : live_) {
    if (!live.in_group || live.step_ms <= 0) continue;
    const double limit = std::max(kStallFactor * live.step_ms, static_cast<double>(kStallFloorMs));
    if (static_cast<double>(now_wall_ms - live.step_at_ms) > limit) ++stalled;
  }
  return stalled;
}

void MetricSeries::Record(const v1::Job& job, const v1::AttemptEvent::Metric& metric,
                          Changes* changes) {
  std::vector<std::pair<std::string, std::string>> labels(metric.labels().begin(),
                                                          metric.labels().end());
  std::sort(labels.begin(), labels.end());
  MetricRun& run =
      changes->batch.of<MetricPointsTable>()[RunFor(job, metric.name(), labels, changes)];
  run.steps.push_back(metric.step());
  run.values.push_back(metric.value());
  run.times_ms.push_back(metric.time_ms() != 0 ? metric.time_ms() : core_->clock->WallMs());
  NoteLast(job, metric.name(), metric.value(), metric.step());
}

absl::Status MetricSeries::RecordBatch(const v1::Job& job,
                                       const v1::AttemptEvent::MetricBatch& batch,
                                       Changes* changes) {
  const int n = batch.name_index_size();
  if (batch.steps_size() != n || batch.values_size() != n ||
      (batch.times_ms_size() != 0 && batch.times_ms_size() != n) ||
      (batch.label_index_size() != 0 && batch.label_index_size() != n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric batch: columns disagree (", n, " names, ", batch.steps_size(),
                     " steps, ", batch.values_size(), " values, ", batch.times_ms_size(),
                     " times, ", batch.label_index_size(), " label indexes)"));
  }
  for (int i = 0; i < n; ++i) {
    if (batch.name_index(i) >= static_cast<uint32_t>(batch.names_size()) ||
        (batch.label_index_size() > 0 &&
         batch.label_index(i) > static_cast<uint32_t>(batch.label_sets_size()))) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric batch: point ", i, " names a name or label set it does not have"));
    }
  }
  std::vector<std::vector<std::pair<std::string, std::string>>> label_sets;
  label_sets.reserve(static_cast<size_t>(batch.label_sets_size()) + 1);
  label_sets.emplace_back();  // index 0: no labels
  for (const auto& set : batch.label_sets()) {
    auto& sorted = label_sets.emplace_back(set.labels().begin(), set.labels().end());
    std::sort(sorted.begin(), sorted.end());
  }
  // The run of each (name, label set) of the batch, found once: the points of a step
  // event's series come interleaved.
  absl::flat_hash_map<uint64_t, size_t> run_of;
  std::vector<int> last_of(static_cast<size_t>(batch.names_size()), -1);  // name -> last point
  auto& runs = changes->batch.of<MetricPointsTable>();
  const int64_t now_ms = core_->clock->WallMs();
  for (int i = 0; i < n; ++i) {
    const uint32_t name = batch.name_index(i);
    const uint32_t labels = batch.label_index_size() > 0 ? batch.label_index(i) : 0;
    const uint64_t key = (static_cast<uint64_t>(name) << 32) | labels;
    auto it = run_of.find(key);
    if (it == run_of.end()) {
      it = run_of
               .emplace(key, RunFor(job, batch.names(static_cast<int>(name)), label_sets[labels],
                                    changes))
               .first;
    }
    MetricRun& run = runs[it->second];
    run.steps.push_back(batch.steps(i));
    run.values.push_back(batch.values(i));
    const int64_t t = batch.times_ms_size() > 0 ? batch.times_ms(i) : 0;
    run.times_ms.push_back(t != 0 ? t : now_ms);
    last_of[name] = i;
  }
  // Last values and gauges once per name, in the order of each name's last point: the state
  // the points one by one would leave.
  std::vector<std::pair<int, uint32_t>> order;  // (last point, name)
  for (uint32_t name = 0; name < last_of.size(); ++name) {
    if (last_of[name] >= 0) order.emplace_back(last_of[name], name);
  }
  std::sort(order.begin(), order.end());
  for (const auto& [i, name] : order) {
    NoteLast(job, batch.names(static_cast<int>(name)), batch.values(i), batch.steps(i));
  }
  return absl::OkStatus();
}

void MetricSeries::Progress(const v1::Job& job, const v1::Progress& progress) {
  if (progress.fraction() <= 0) return;  // 0: not known
  auto it = live_.find(job.id());
  if (it == live_.end() || !it->second.in_group) return;
  it->second.gauges.progress->Set(std::min(progress.fraction(), 1.0));
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

absl::flat_hash_map<std::string, double> MetricSeries::LastValues(const std::string& job_id) const {
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

namespace {

int RevisionOf(const v1::Job& job) {
  auto it = job.spec().labels().find("stemma.revision");
  int r = 0;
  if (it != job.spec().labels().end() && !absl::SimpleAtoi(it->second, &r)) r = 0;
  return r;
}

// The job a memoized job's points belong to ("memoized from j-7"), else "".
std::string MemoSource(const v1::Job& job) {
  constexpr absl::string_view kPrefix = "memoized from ";
  if (!absl::StartsWith(job.reason(), kPrefix)) return "";
  std::string id = job.reason().substr(kPrefix.size());
  if (const size_t end = id.find_first_of(" ,;"); end != std::string::npos) id.resize(end);
  return id;
}

}  // namespace

absl::Status MetricSeries::ExperimentJobs(const v1::QueryMetricsRequest& request, MetricQuery* q,
                                          absl::flat_hash_map<std::string, Cell>* cells) {
  std::vector<const v1::Job*> jobs;
  int latest = 0;
  core_->jobs.ForEach([&](const v1::Job& job) {
    if (job.spec().experiment() != request.experiment()) return;
    jobs.push_back(&job);
    latest = std::max(latest, RevisionOf(job));
  });
  if (jobs.empty()) {
    return absl::NotFoundError(absl::StrCat("no jobs in experiment ", request.experiment()));
  }
  if (request.revision() < -1) return absl::InvalidArgumentError("revision: -1, 0 or a revision");
  const int revision = request.revision() == 0 ? latest : request.revision();
  std::sort(jobs.begin(), jobs.end(),
            [](const v1::Job* a, const v1::Job* b) { return a->seq() < b->seq(); });
  std::vector<std::string> ids;
  for (const v1::Job* job : jobs) {
    if (revision != -1 && RevisionOf(*job) != revision) continue;
    // A cell by its name (brackets and all), or a glob over names.
    if (!request.cell().empty() && job->spec().name() != request.cell() &&
        ::fnmatch(request.cell().c_str(), job->spec().name().c_str(), 0) != 0)
      continue;
    // A cell served from the cache has the points of the job that ran: they are this cell's
    // too (named by it, with that job's id).
    std::string source = job->id();
    for (int hop = 0; hop < 16; ++hop) {
      const v1::Job* j = core_->jobs.Find(source);
      const std::string from = j == nullptr ? "" : MemoSource(*j);
      if (from.empty() || from == source || core_->jobs.Find(from) == nullptr) break;
      source = from;
    }
    if (cells->count(source)) continue;
    (*cells)[source] = {job->spec().name(), RevisionOf(*job)};
    ids.push_back(source);
  }
  if (ids.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no jobs in experiment ", request.experiment(),
                     revision == -1 ? "" : absl::StrCat(" revision ", revision),
                     request.cell().empty() ? "" : absl::StrCat(" matching ", request.cell())));
  }
  for (std::string& id : ids) q->job_ids.push_back(std::move(id));
  return absl::OkStatus();
}

absl::StatusOr<v1::QueryMetricsResponse> MetricSeries::Query(
    const v1::QueryMetricsRequest& request) {
  MetricQuery q;
  q.name_pattern = request.name_pattern();
  q.last_only = request.last_only();
  if (request.limit() < 0) return absl::InvalidArgumentError("limit: must not be negative");
  if (request.limit() > 0)
    q.limit = static_cast<size_t>(std::min<int64_t>(request.limit(), 10000000));
  uint64_t ticket;
  absl::flat_hash_map<std::string, Cell> cells;  // job id → the cell its points are named by
  {
    absl::MutexLock lock(&core_->mu);
    for (const std::string& id : request.job_ids()) {
      const v1::Job* job = core_->jobs.Find(id);
      if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job ", id));
      q.job_ids.push_back(id);
      cells.try_emplace(id, Cell{job->spec().name(), RevisionOf(*job)});
    }
    if (!request.experiment().empty()) RETURN_IF_ERROR(ExperimentJobs(request, &q, &cells));
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
  for (auto& p : *points) {
    if (auto it = cells.find(p.job_id()); it != cells.end()) {
      p.set_job_name(it->second.name);
      p.set_revision(it->second.revision);
    }
    *resp.add_points() = std::move(p);
  }
  resp.set_truncated(truncated);
  return resp;
}

}  // namespace stemma::coordinator
