#include "coordinator/coordinator.h"

#include <sys/stat.h>

#include <chrono>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "common/status.h"
#include "coordinator/demand_gauges.h"

namespace stemma::coordinator {

Coordinator::Coordinator(CoordinatorOptions options, Store* store, const Clock* clock,
                         CoordinatorMetrics* metrics)
    : core_(std::move(options), store, clock, metrics),
      placer_(&core_),
      leases_(&core_),
      series_(&core_),
      registry_(&core_, &series_),
      stopper_(&core_),
      sessions_(&core_, &placer_, &series_, &registry_, &stopper_, &preemptor_),
      users_(&core_, &placer_, &registry_) {
  core_.on_transition = [this](const v1::Job& job, v1::JobState from, v1::JobState to)
                            ABSL_NO_THREAD_SAFETY_ANALYSIS {  // JobTable calls it under core_.mu
                              registry_.OnTransition(job, from, to);
                              series_.OnTransition(job, from, to);
                              preemptor_.OnTransition(job, from, to);
                            };
  placer_.SetPreemptor(&preemptor_);
  // Memoization serves content the requester may read, never names (tenancy.md).
  core_.jobs.SetCacheGuard([this](const v1::Job& source, const v1::Job& job)
                               ABSL_NO_THREAD_SAFETY_ANALYSIS {  // under core_.mu
                                 return registry_.CacheRefusal(source, job);
                               });
}

Coordinator::~Coordinator() { Stop(); }

absl::Status Coordinator::Start() {
  RETURN_IF_ERROR(core_.logs.Load());
  QuotaConfig quotas;
  if (!core_.options.quotas_file.empty()) {
    quota_file_ = std::make_unique<QuotaFile>(core_.options.quotas_file, &core_.options.tenancy);
    ASSIGN_OR_RETURN(quotas, quota_file_->Load());
  }
  ASSIGN_OR_RETURN(StoreSnapshot snap, core_.store->Load());
  DropForgottenLogs(snap);
  {
    absl::MutexLock lock(&core_.mu);
    core_.quotas.SetConfig(std::move(quotas));  // before the jobs: their load fills the accounts
    core_.jobs.Load(snap);
    core_.workers.Load(snap, core_.clock->MonoMs(), core_.options.lease_ms);
    registry_.AssertHeld();
    placer_.AssertHeld();
    registry_.Load(snap);
    stopper_.AssertHeld();
    stopper_.Load(snap);
    {
      absl::MutexLock live_lock(&core_.live_mu);
      for (const auto& [id, w] : core_.workers.all()) core_.live[id] = w.live;
    }
    // Resources held by attempts that were live when the coordinator stopped.
    int restored = 0;
    core_.jobs.ForEach([&](const v1::Job& job) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      if (!core_.jobs.IsLive(job)) return;
      for (const auto& part : job.current().parts()) {
        if (part.finished()) continue;
        WorkerEntry* w = core_.workers.Find(part.worker_id());
        if (w == nullptr) continue;
        Allocation a;
        a.gpu_ids.assign(part.gpu_ids().begin(), part.gpu_ids().end());
        a.cpus = job.spec().resources().cpus();
        a.memory_mb = job.spec().resources().memory_mb();
        core_.workers.Restore(*w, AllocationKey(job.current().id(), part.rank()), a);
        ++restored;
      }
    });
    spdlog::info("loaded {} jobs, {} workers, {} artifacts, {} live attempt parts",
                 core_.jobs.size(), snap.of<WorkersTable>().size(), registry_.size(), restored);
    placer_.UpdateGauges();
  }
  core_.StartCommitter();
  scheduler_ = std::thread([this] { SchedulerLoop(); });
  return absl::OkStatus();
}

// The logs of jobs that `gc jobs --delete` forgot when the coordinator stopped before it could
// remove them (their tombstones are in the store).
void Coordinator::DropForgottenLogs(const StoreSnapshot& snap) {
  absl::flat_hash_set<std::string> forgotten;
  for (const auto& job : snap.of<JobsTable>()) {
    if (IsForgotten(job)) forgotten.insert(job.id());
  }
  if (forgotten.empty()) return;
  const LogStore::Reclaimed r =
      core_.logs.Drop([&](std::string_view id) { return forgotten.contains(std::string(id)); });
  if (r.logs > 0) {
    spdlog::info("logs of forgotten jobs: {} attempt logs, {} segments ({} bytes) removed", r.logs,
                 r.segments, r.bytes);
  }
}

void Coordinator::Stop() {
  if (!core_.RequestStop()) return;
  if (scheduler_.joinable()) scheduler_.join();
  core_.StopCommitter();  // commits what is pending
}

void Coordinator::SchedulerLoop() {
  while (core_.AwaitKick(core_.options.tick_ms)) {
    if (quota_file_ != nullptr) {
      // Read outside the lock; installed under it.
      if (std::optional<QuotaConfig> changed = quota_file_->Poll(core_.clock->MonoMs())) {
        absl::MutexLock lock(&core_.mu);
        core_.quotas.SetConfig(*std::move(changed));
      }
    }
    RunSchedulerPass();
  }
}

void Coordinator::UpdateDemandGauges() {
  const int64_t now = core_.clock->MonoMs();
  if (demand_at_ms_ != 0 && now - demand_at_ms_ < 1000) return;
  demand_at_ms_ = now;
  const int64_t wall = core_.clock->WallMs();
  core_.metrics->SetDemand(ComputeDemand(core_.jobs, core_.workers, wall), series_.Stalled(wall));
}

CacheLookup Coordinator::LookUpCache(const v1::JobSpec& spec) {
  v1::Job job;
  job.set_id("plan");
  *job.mutable_spec() = spec;
  // The cache may serve only what the submitter may read (ArtifactRegistry::CacheRefusal).
  if (auto owner = spec.labels().find(kOwnerLabel); owner != spec.labels().end()) {
    job.set_owner(owner->second);
  }
  ApplyDefaults(job.mutable_spec());
  CacheLookup out;
  absl::MutexLock lock(&core_.mu);
  const Memoizer::Prediction p = core_.jobs.PredictCache(job);
  out.keyed = !p.key.empty();
  if (p.hit != nullptr) out.hit = *p.hit;
  if (p.twin != nullptr) out.twin = *p.twin;
  return out;
}

int Coordinator::RunSchedulerPass() {
  auto start = std::chrono::steady_clock::now();
  int placed;
  {
    absl::MutexLock lock(&core_.mu);
    Changes changes = core_.NewChanges();
    leases_.AssertHeld();
    placer_.AssertHeld();
    leases_.Expire(&changes);
    preemptor_.AssertHeld();
    preemptor_.Pass(&changes);  // before placing: what it kills is placed in this pass
    placed = placer_.Place(&changes);
    placer_.UpdateGauges();
    UpdateDemandGauges();
    if (!changes.batch.empty() || !changes.messages.empty()) core_.Finish(std::move(changes));
  }
  core_.metrics->SchedulerPass(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return placed;
}

}  // namespace stemma::coordinator
