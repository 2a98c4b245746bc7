#include "coordinator/user_operations.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "common/status.h"
#include "coordinator/attempts.h"
#include "coordinator/exec_cache_key.h"
#include "coordinator/memory_check.h"

namespace stemma::coordinator {
namespace {

// A QUEUED job that no registered worker can ever hold says so when read (the placer's
// reason, before whatever reason it had).
void AddUnplaceableReason(v1::Job* job, const WorkerTable& workers) {
  std::string why = Placer::Unplaceable(*job, workers);
  if (why.empty()) return;
  if (!job->reason().empty()) absl::StrAppend(&why, "; ", job->reason());
  job->set_reason(std::move(why));
}

}  // namespace

absl::StatusOr<v1::SubmitResponse> UserOperations::Submit(const v1::SubmitRequest& request) {
  CoordinatorCore& c = *core_;
  // A full disk refuses at once, before anything changes (coordinator/store/store.h).
  RETURN_IF_ERROR(c.store->CheckWritable());
  // An owned job writes only below its owner's prefixes of the storage root (tenancy.h).
  for (int i = 0; i < request.jobs_size(); ++i) {
    const v1::JobSpec& spec = request.jobs(i);
    auto owner = spec.labels().find(kOwnerLabel);
    if (owner == spec.labels().end()) continue;
    absl::Status st = c.options.tenancy.CheckJobOutputs(spec, owner->second);
    if (!st.ok()) {
      return absl::Status(
          st.code(), absl::StrCat(spec.name().empty() ? absl::StrCat("jobs[", i, "]")
                                                      : absl::StrCat("job '", spec.name(), "'"),
                                  ": ", st.message()));
    }
  }
  // A train or eval job no worker's device can hold is refused (coordinator/memory_check.h).
  RETURN_IF_ERROR(CheckJobsFitMemory(request, [this] { return LargestDevices(ListWorkers()); }));
  // Memoization's file reads before the lock; under it they count only for artifacts whose
  // records did not change since (ArtifactRegistry::InstallVerdicts).
  std::vector<ArtifactRegistry::FileVerdict> verdicts = PrecheckCache(request);
  uint64_t ticket;
  v1::SubmitResponse resp;
  {
    absl::MutexLock lock(&c.mu);
    bool exec = false;
    for (const auto& spec : request.jobs()) exec |= spec.kind_case() == v1::JobSpec::kExec;
    if (exec) {
      bool allowed = false;
      int registered = 0;
      for (const auto& [id, w] : c.workers.all()) {
        if (w.info.state() == v1::WORKER_LOST) continue;
        ++registered;
        allowed |= w.info.allow_exec();
      }
      if (!allowed) {
        return absl::FailedPreconditionError(
            absl::StrCat("exec jobs need a worker started with --allow-exec; none of the ",
                         registered, " registered workers allows it"));
      }
    }
    // Quotas: a retried submit (a known key) returns what it made before, never refused.
    if (request.idempotency_key().empty() || !c.jobs.HasIdempotencyKey(request.idempotency_key())) {
      std::vector<const v1::JobSpec*> specs;
      specs.reserve(request.jobs_size());
      for (const auto& spec : request.jobs()) specs.push_back(&spec);
      RETURN_IF_ERROR(c.quotas.CheckSubmit(specs));
    }
    Changes changes = c.NewChanges();
    registry_->AssertHeld();
    registry_->InstallVerdicts(std::move(verdicts));
    absl::StatusOr<JobTable::SubmitResult> submitted = c.jobs.Submit(request, &changes);
    registry_->ClearVerdicts();
    if (!submitted.ok()) return submitted.status();
    JobTable::SubmitResult& result = *submitted;
    resp.mutable_job_ids()->Assign(result.ids.begin(), result.ids.end());
    resp.set_existing(result.existing);
    if (!result.existing) {
      c.metrics->Submitted(static_cast<int>(result.ids.size()));
      placer_->AssertHeld();
      placer_->Place(&changes);  // idle capacity takes new jobs in the same transaction
    }
    // An existing key may still be on its way to disk: wait for everything so far.
    ticket = result.existing ? c.LastTicket() : c.Finish(std::move(changes));
  }
  c.Wait(ticket);
  return resp;
}

std::vector<ArtifactRegistry::FileVerdict> UserOperations::PrecheckCache(
    const v1::SubmitRequest& request) {
  CoordinatorCore& c = *core_;
  std::string build;
  {
    absl::MutexLock lock(&c.mu);
    build = c.jobs.engine_build();
  }
  std::vector<std::string> keys;
  for (const v1::JobSpec& spec : request.jobs()) {
    if (!IsEngineJob(spec) && !IsMemoizedExec(spec)) continue;
    if (auto it = spec.labels().find("stemma.cache");
        it != spec.labels().end() && it->second == "false") {
      continue;
    }
    std::string key = CacheKey(spec, build);  // reads the inputs' manifests
    if (!key.empty()) keys.push_back(std::move(key));
  }
  if (keys.empty()) return {};
  std::vector<v1::Artifact> artifacts;
  {
    absl::MutexLock lock(&c.mu);
    registry_->AssertHeld();
    artifacts = registry_->HitArtifacts(keys);
  }
  return ArtifactRegistry::CheckFiles(std::move(artifacts));
}

absl::StatusOr<v1::Job> UserOperations::GetJob(const std::string& id,
                                               const std::string& prefer_owner) {
  absl::MutexLock lock(&core_->mu);
  const v1::Job* job = core_->jobs.Find(id);
  // A name stands for the most recent job of that name (`stemma get soup`), the caller's own
  // first.
  if (job == nullptr && !prefer_owner.empty()) job = core_->jobs.FindByName(id, prefer_owner);
  if (job == nullptr) job = core_->jobs.FindByName(id);
  if (job == nullptr)
    return absl::NotFoundError(absl::StrCat("no job ", id, " (neither an id nor a job name)"));
  v1::Job out = *job;
  AddUnplaceableReason(&out, core_->workers);
  return out;
}

absl::StatusOr<v1::ListJobsResponse> UserOperations::ListJobs(const v1::ListJobsRequest& request) {
  absl::MutexLock lock(&core_->mu);
  ASSIGN_OR_RETURN(v1::ListJobsResponse response, core_->jobs.List(request));
  for (v1::Job& job : *response.mutable_jobs()) AddUnplaceableReason(&job, core_->workers);
  return response;
}

std::vector<v1::Attempt> UserOperations::AttemptHistory(const std::string& id) {
  absl::MutexLock lock(&core_->mu);
  return core_->jobs.History(id);
}

// A user's gc jobs sees only the jobs it may manage (its own and its projects'), as the
// artifact gc does; an admin's (requester "") sees every job.
absl::StatusOr<v1::GcJobsResponse> UserOperations::CollectJobs(const v1::GcJobsRequest& request) {
  CoordinatorCore& c = *core_;
  if (request.apply()) RETURN_IF_ERROR(c.store->CheckWritable());
  const std::string& who = request.requester();
  auto may_manage = [&](const v1::Job& job) {
    if (who.empty()) return true;
    const std::string owner = !job.owner().empty() ? job.owner() : [&] {
      auto it = job.spec().labels().find(kOwnerLabel);
      return it == job.spec().labels().end() ? std::string() : it->second;
    }();
    return c.options.tenancy.Shares(who, owner);
  };
  uint64_t ticket;
  v1::GcJobsResponse response;
  bool seen = false;
  {
    absl::MutexLock lock(&c.mu);
    const std::string target =
        absl::StrCat(request.finished_before_ms(), request.forget() ? "/forget" : "/archive");
    if (request.apply()) {
      ASSIGN_OR_RETURN(seen, c.jobs.SeenOperation(request.idempotency_key(), "gc-jobs", target));
    }
    Changes changes = c.NewChanges();
    v1::GcJobsRequest run = request;
    if (seen) run.set_apply(false);  // answered again: what it would select now, unchanged
    ASSIGN_OR_RETURN(response, c.jobs.Collect(run, may_manage, &changes));
    if (seen) {
      response.set_applied(true);
      ticket = c.LastTicket();
    } else {
      if (request.apply()) {
        c.jobs.RememberOperation(request.idempotency_key(), "gc-jobs", target, &changes);
      }
      ticket = c.Finish(std::move(changes));
    }
  }
  c.Wait(ticket);
  if (request.apply() && request.forget() && !seen && response.job_ids_size() > 0) {
    // Durable now: the logs go too (a crash before this is finished by the next Start).
    const absl::flat_hash_set<std::string> ids(response.job_ids().begin(),
                                               response.job_ids().end());
    const LogStore::Reclaimed r =
        c.logs.Drop([&](std::string_view id) { return ids.contains(std::string(id)); });
    spdlog::info("gc jobs: forgot {} jobs; {} attempt logs, {} log segments ({} bytes) removed",
                 ids.size(), r.logs, r.segments, r.bytes);
  }
  return response;
}

// Cancel, retry and drain take an idempotency key (JobTable::SeenOperation): a request sent
// again after its answer was lost is answered with the target as it is now, changes nothing,
// and waits until the first one's change is durable.
absl::StatusOr<v1::Job> UserOperations::Cancel(const std::string& id, const std::string& reason,
                                               const std::string& key) {
  CoordinatorCore& c = *core_;
  uint64_t ticket;
  v1::Job result;
  bool seen;
  {
    absl::MutexLock lock(&c.mu);
    const v1::Job* job = c.jobs.Find(id);
    if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job ", id));
    ASSIGN_OR_RETURN(seen, c.jobs.SeenOperation(key, "cancel", id));
    if (seen) {
      result = *job;
      ticket = c.LastTicket();
    } else {
      Changes changes = c.NewChanges();
      bool live = c.jobs.IsLive(*job);
      std::string why = reason.empty() ? "cancelled by user" : absl::StrCat("cancelled: ", reason);
      RETURN_IF_ERROR(c.jobs.Cancel(id, why, &changes));
      if (live) {
        StopParts(c, *job, why, "", &changes);
        c.metrics->AttemptEnded("cancelled");
      }
      c.jobs.RememberOperation(key, "cancel", id, &changes);
      result = *job;
      ticket = c.Finish(std::move(changes));
    }
  }
  if (!seen) c.Kick();
  c.Wait(ticket);
  return result;
}

absl::StatusOr<v1::Job> UserOperations::Retry(const std::string& id, const std::string& key) {
  CoordinatorCore& c = *core_;
  uint64_t ticket;
  v1::Job result;
  bool seen;
  {
    absl::MutexLock lock(&c.mu);
    ASSIGN_OR_RETURN(seen, c.jobs.SeenOperation(key, "retry", id));
    if (seen) {
      // Not a second retry: the attempt budget grew once.
      const v1::Job* job = c.jobs.Find(id);
      if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job ", id));
      result = *job;
      ticket = c.LastTicket();
    } else {
      Changes changes = c.NewChanges();
      RETURN_IF_ERROR(c.jobs.Retry(id, &changes));
      c.jobs.RememberOperation(key, "retry", id, &changes);
      result = *c.jobs.Find(id);
      ticket = c.Finish(std::move(changes));
    }
  }
  if (!seen) c.Kick();
  c.Wait(ticket);
  return result;
}

v1::ListWorkersResponse UserOperations::ListWorkers() {
  CoordinatorCore& c = *core_;
  absl::MutexLock lock(&c.mu);
  v1::ListWorkersResponse resp;
  const int64_t now = c.clock->MonoMs();
  std::vector<const WorkerEntry*> all;
  for (const auto& [id, w] : c.workers.all()) all.push_back(&w);
  std::sort(all.begin(), all.end(),
            [](const WorkerEntry* a, const WorkerEntry* b) { return a->info.id() < b->info.id(); });
  for (const auto* w : all) *resp.add_workers() = c.workers.View(*w, now);
  return resp;
}

absl::StatusOr<v1::WorkerInfo> UserOperations::Drain(const std::string& worker_id, bool undrain,
                                                     const std::string& key) {
  CoordinatorCore& c = *core_;
  uint64_t ticket;
  v1::WorkerInfo view;
  bool seen;
  {
    absl::MutexLock lock(&c.mu);
    WorkerEntry* w = c.workers.Find(worker_id);
    if (w == nullptr) return absl::NotFoundError(absl::StrCat("no worker ", worker_id));
    const char* operation = undrain ? "undrain" : "drain";
    ASSIGN_OR_RETURN(seen, c.jobs.SeenOperation(key, operation, worker_id));
    if (seen) {
      ticket = c.LastTicket();
    } else {
      if (w->info.state() == v1::WORKER_LOST) {
        return absl::FailedPreconditionError(absl::StrCat("worker ", worker_id, " is lost"));
      }
      w->info.set_state(undrain ? v1::WORKER_ALIVE : v1::WORKER_DRAINING);
      Changes changes = c.NewChanges();
      changes.batch.of<WorkersTable>().push_back(w->info);
      c.jobs.RememberOperation(key, operation, worker_id, &changes);
      ticket = c.Finish(std::move(changes));
    }
    view = c.workers.View(*w, c.clock->MonoMs());
  }
  if (!seen) c.Kick();
  c.Wait(ticket);
  return view;
}

std::shared_ptr<EventHub::Subscription> UserOperations::Watch(const v1::WatchRequest& request,
                                                              std::vector<v1::JobEvent>* initial) {
  CoordinatorCore& c = *core_;
  std::vector<std::string> ids(request.job_ids().begin(), request.job_ids().end());
  absl::MutexLock lock(&c.mu);
  auto sub = c.hub.Subscribe(ids);
  if (request.send_initial()) {
    auto add = [&](const v1::Job& job) {
      v1::JobEvent ev;
      *ev.mutable_job() = job;
      ev.set_previous(v1::JOB_STATE_UNSPECIFIED);  // a snapshot, not a transition
      initial->push_back(std::move(ev));
    };
    if (ids.empty()) {
      c.jobs.ForEach(add);
      std::sort(initial->begin(), initial->end(),
                [](const auto& a, const auto& b) { return a.job().seq() < b.job().seq(); });
    } else {
      for (const auto& id : ids) {
        if (const v1::Job* job = c.jobs.Find(id)) add(*job);
      }
    }
  }
  return sub;
}

void UserOperations::Unwatch(const std::shared_ptr<EventHub::Subscription>& sub) {
  core_->hub.Unsubscribe(sub);
}

}  // namespace stemma::coordinator
