#include "coordinator/scheduler.h"

#include <limits>

namespace stemma::coordinator {
namespace {

struct Free {
  const std::string* id;
  int gpus;
  double cpus;
  int64_t memory_mb;
  bool allow_exec;
  bool taken;  // already holds a part of the job being placed
};

}  // namespace

std::vector<Placement> Schedule(const JobTable& jobs, const WorkerTable& workers,
                                int64_t now_wall_ms, const SchedulerOptions& options) {
  std::vector<Placement> out;
  std::vector<Free> free;
  if (jobs.queue().empty()) return out;
  // Every queued job needs at least the smallest demand on each resource, so a worker with
  // less than that free can host none of them; once no worker has it, the pass is over.
  const JobTable::Demand least = jobs.MinQueuedDemand();
  auto can_host_any = [&](int gpus, double cpus, int64_t memory_mb) {
    return gpus >= least.gpus && cpus + 1e-9 >= least.cpus && memory_mb >= least.memory_mb;
  };
  // Workers come in id order, so placement is deterministic.
  for (const auto& [id, w] : workers.all()) {
    if (!w.schedulable() || !can_host_any(w.free_gpus(), w.free_cpus(), w.free_memory_mb())) {
      continue;
    }
    free.push_back(
        {&id, w.free_gpus(), w.free_cpus(), w.free_memory_mb(), w.info.allow_exec(), false});
  }
  if (free.empty()) return out;

  // Upper bounds of what any one worker has free: a job above them is blocked without
  // looking at workers.
  int max_gpus = 0;
  double max_cpus = 0;
  int64_t max_memory = 0;
  auto refresh_bounds = [&] {
    max_gpus = 0;
    max_cpus = 0;
    max_memory = 0;
    for (const Free& f : free) {
      max_gpus = std::max(max_gpus, f.gpus);
      max_cpus = std::max(max_cpus, f.cpus);
      max_memory = std::max(max_memory, f.memory_mb);
    }
  };
  refresh_bounds();

  int blocked = 0;
  std::vector<int> chosen;
  for (const auto& [neg_priority, seq, id] : jobs.queue()) {
    if (!can_host_any(max_gpus, max_cpus, max_memory)) break;  // the cluster is full
    const v1::Job* job = jobs.Find(id);
    if (job == nullptr || job->not_before_ms() > now_wall_ms) continue;
    const auto& r = job->spec().resources();
    const bool needs_exec = job->spec().kind_case() == v1::JobSpec::kExec;
    const int nodes = std::max(1, job->spec().nodes());
    if (r.gpus() > max_gpus || r.cpus() > max_cpus + 1e-9 || r.memory_mb() > max_memory) {
      if (++blocked >= options.max_blocked) break;
      continue;
    }
    chosen.clear();
    for (int part = 0; part < nodes; ++part) {
      int best = -1;
      for (size_t i = 0; i < free.size(); ++i) {
        const Free& f = free[i];
        if (f.taken || f.gpus < r.gpus() || f.cpus + 1e-9 < r.cpus() ||
            f.memory_mb < r.memory_mb() || (needs_exec && !f.allow_exec)) {
          continue;
        }
        if (best < 0 || f.gpus < free[best].gpus ||
            (f.gpus == free[best].gpus && f.cpus < free[best].cpus)) {
          best = static_cast<int>(i);
        }
      }
      if (best < 0) break;
      free[best].taken = true;
      chosen.push_back(best);
    }
    for (int i : chosen) free[i].taken = false;
    if (static_cast<int>(chosen.size()) < nodes) {
      if (++blocked >= options.max_blocked) break;
      continue;
    }
    Placement p;
    p.job_id = id;
    for (int i : chosen) {
      free[i].gpus -= r.gpus();
      free[i].cpus -= r.cpus();
      free[i].memory_mb -= r.memory_mb();
      p.workers.push_back(*free[i].id);
    }
    out.push_back(std::move(p));
    refresh_bounds();
  }
  return out;
}

}  // namespace stemma::coordinator
