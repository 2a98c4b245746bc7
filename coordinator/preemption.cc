#include "coordinator/preemption.h"

#include <algorithm>
#include <climits>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace stemma::coordinator {
namespace {

struct Amount {
  int gpus = 0;
  double cpus = 0;
  int64_t memory_mb = 0;

  bool Covers(const Amount& need) const {
    return gpus >= need.gpus && cpus + 1e-9 >= need.cpus && memory_mb >= need.memory_mb;
  }
  void Add(const Amount& a, int sign) {
    gpus += sign * a.gpus;
    cpus += sign * a.cpus;
    memory_mb += sign * a.memory_mb;
  }
};

struct Victim {
  const v1::Job* job;
  int64_t work_ms;
  int priority;
  int64_t started_ms;
  Amount holds;  // its part on the worker
};

bool Cheaper(const Victim& a, const Victim& b) {
  if (a.work_ms != b.work_ms) return a.work_ms < b.work_ms;
  if (a.priority != b.priority) return a.priority < b.priority;
  if (a.started_ms != b.started_ms) return a.started_ms > b.started_ms;
  return a.job->id() < b.job->id();
}

// The cheapest set of victims on one worker that makes a part fit there.
struct WorkerChoice {
  const std::string* worker_id = nullptr;
  std::vector<Victim> victims;
  int64_t work_ms = 0;
  int max_priority = INT_MIN;
};

bool Better(const WorkerChoice& a, const WorkerChoice& b) {
  if (a.work_ms != b.work_ms) return a.work_ms < b.work_ms;
  if (a.max_priority != b.max_priority) return a.max_priority < b.max_priority;
  if (a.victims.size() != b.victims.size()) return a.victims.size() < b.victims.size();
  return *a.worker_id < *b.worker_id;
}

// "j-12.3/0" (an allocation key: attempt id and rank) -> "j-12".
std::string JobIdOfAllocation(const std::string& key) {
  const size_t slash = key.rfind('/');
  const size_t dot = key.rfind('.', slash == std::string::npos ? key.size() : slash);
  return dot == std::string::npos ? key : key.substr(0, dot);
}

// A job whose owner or one of its projects would pass max_running_gpus by starting.
bool BeyondQuota(const Quotas* quotas, const v1::Job& job) {
  if (quotas == nullptr || !quotas->HasGpuLimits()) return false;
  const int64_t gpus =
      static_cast<int64_t>(std::max(1, job.spec().nodes())) * job.spec().resources().gpus();
  if (gpus == 0) return false;
  const std::string owner = JobOwner(job);
  if (quotas->OwnerGpuHeadroom(owner) < gpus) return true;
  if (const auto* projects = quotas->ProjectsOf(owner)) {
    for (const auto& p : *projects) {
      if (quotas->ProjectGpuHeadroom(p) < gpus) return true;
    }
  }
  return false;
}

class Chooser {
 public:
  Chooser(const JobTable& jobs, const WorkerTable& workers, const WorkLostMs& work_lost_ms,
          const std::vector<Reservation>* reservations)
      : jobs_(jobs), workers_(workers), work_lost_ms_(work_lost_ms) {
    if (reservations == nullptr) return;
    for (const Reservation& r : *reservations) {
      reserved_[r.worker_id].Add({r.gpus, r.cpus, r.memory_mb}, +1);
      waiting_.insert(r.job_id);
    }
  }

  // Whether the job already waits for victims of its own.
  bool Waiting(const std::string& id) const { return waiting_.contains(id); }

  std::optional<Preemption> For(const std::string& id, const v1::Job& job) {
    const Amount need{job.spec().resources().gpus(), job.spec().resources().cpus(),
                      job.spec().resources().memory_mb()};
    const int nodes = std::max(1, job.spec().nodes());
    const bool exec = job.spec().kind_case() == v1::JobSpec::kExec;
    std::vector<WorkerChoice> choices;
    for (const auto& [wid, w] : workers_.all()) {
      std::optional<WorkerChoice> c = OnWorker(wid, w, need, job.spec().priority(), exec);
      if (c.has_value()) choices.push_back(std::move(*c));
    }
    if (static_cast<int>(choices.size()) < nodes) return std::nullopt;
    std::sort(choices.begin(), choices.end(), Better);
    choices.resize(nodes);
    Preemption p;
    p.job_id = id;
    absl::flat_hash_set<std::string> seen;
    std::vector<Victim> victims;
    for (const WorkerChoice& c : choices) {
      p.reservations.push_back({id, *c.worker_id, need.gpus, need.cpus, need.memory_mb});
      for (const Victim& v : c.victims) {
        if (seen.insert(v.job->id()).second) victims.push_back(v);
      }
    }
    if (victims.empty()) return std::nullopt;  // it fits without: the next pass places it
    std::sort(victims.begin(), victims.end(), Cheaper);
    for (const Victim& v : victims) {
      p.victims.push_back(v.job->id());
      taken_victims_.insert(v.job->id());
    }
    for (const WorkerChoice& c : choices) taken_workers_.insert(*c.worker_id);
    return p;
  }

 private:
  std::optional<WorkerChoice> OnWorker(const std::string& id, const WorkerEntry& w,
                                       const Amount& need, int priority, bool exec) {
    if (!w.schedulable() || taken_workers_.contains(id) || (exec && !w.info.allow_exec())) {
      return std::nullopt;
    }
    if (!Amount{w.info.gpus_size(), w.info.cpus(), w.info.memory_mb()}.Covers(need)) {
      return std::nullopt;
    }
    Amount have{w.free_gpus(), w.free_cpus(), w.free_memory_mb()};
    if (auto r = reserved_.find(id); r != reserved_.end()) {
      have.Add({std::min(have.gpus, r->second.gpus), std::min(have.cpus, r->second.cpus),
                std::min(have.memory_mb, r->second.memory_mb)},
               -1);
    }
    WorkerChoice choice;
    choice.worker_id = &id;
    if (have.Covers(need)) return choice;
    std::vector<Victim> candidates;
    for (const auto& [key, a] : w.allocations) {
      const v1::Job* job = jobs_.Find(JobIdOfAllocation(key));
      if (job == nullptr || !jobs_.IsLive(*job) || job->spec().priority() >= priority ||
          !job->current().preempted_by().empty() || taken_victims_.contains(job->id()) ||
          key.compare(0, key.rfind('/'), job->current().id()) != 0) {
        continue;
      }
      candidates.push_back({job,
                            work_lost_ms_(*job),
                            job->spec().priority(),
                            job->current().assigned_ms(),
                            {static_cast<int>(a.gpu_ids.size()), a.cpus, a.memory_mb}});
    }
    std::sort(candidates.begin(), candidates.end(), Cheaper);
    for (const Victim& v : candidates) {
      if (have.Covers(need)) break;
      have.Add(v.holds, +1);
      choice.victims.push_back(v);
    }
    if (!have.Covers(need)) return std::nullopt;
    // Minimal: put back what the part fits without, the most costly first.
    for (size_t i = choice.victims.size(); i-- > 0;) {
      Amount without = have;
      without.Add(choice.victims[i].holds, -1);
      if (!without.Covers(need)) continue;
      have = without;
      choice.victims.erase(choice.victims.begin() + static_cast<ptrdiff_t>(i));
    }
    for (const Victim& v : choice.victims) {
      choice.work_ms += v.work_ms;
      choice.max_priority = std::max(choice.max_priority, v.priority);
    }
    return choice;
  }

  const JobTable& jobs_;
  const WorkerTable& workers_;
  const WorkLostMs& work_lost_ms_;
  absl::flat_hash_map<std::string, Amount> reserved_;  // by worker
  absl::flat_hash_set<std::string> waiting_;           // jobs with reservations
  absl::flat_hash_set<std::string> taken_victims_;     // chosen earlier in this pass
  absl::flat_hash_set<std::string> taken_workers_;     // reserved earlier in this pass
};

}  // namespace

std::vector<Preemption> ChoosePreemptions(const JobTable& jobs, const WorkerTable& workers,
                                          int64_t now_wall_ms, int lowest_live_priority,
                                          const WorkLostMs& work_lost_ms, const Quotas* quotas,
                                          const std::vector<Reservation>* reservations,
                                          const PreemptionLimits& limits) {
  std::vector<Preemption> out;
  Chooser chooser(jobs, workers, work_lost_ms, reservations);
  int examined = 0;
  for (const auto& [neg_priority, seq, id] : jobs.queue()) {
    // The queue runs from the highest priority down: past the lowest live one, nothing
    // below can preempt either.
    if (-neg_priority <= lowest_live_priority) break;
    if (examined++ >= limits.max_examined ||
        static_cast<int>(out.size()) >= limits.max_preemptors) {
      break;
    }
    const v1::Job* job = jobs.Find(id);
    if (job == nullptr || job->not_before_ms() > now_wall_ms || chooser.Waiting(id) ||
        BeyondQuota(quotas, *job)) {
      continue;
    }
    if (std::optional<Preemption> p = chooser.For(id, *job)) out.push_back(std::move(*p));
  }
  return out;
}

}  // namespace stemma::coordinator
