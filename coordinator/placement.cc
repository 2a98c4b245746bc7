#include "coordinator/placement.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job_ranks.h"
#include "coordinator/preemptor.h"

namespace stemma::coordinator {

int Placer::Place(Changes* changes) {
  CoordinatorCore& c = *core_;
  c.mu.AssertHeld();
  const int64_t now = c.clock->WallMs();
  const std::vector<Reservation>* reservations = nullptr;
  if (preemptor_ != nullptr) {
    preemptor_->AssertHeld();
    reservations = preemptor_->reservations();
  }
  std::vector<Placement> placements =
      Schedule(c.jobs, c.workers, now, c.options.scheduler, &c.quotas, reservations);
  for (const auto& p : placements) {
    const v1::Job* queued = c.jobs.Find(p.job_id);
    const auto& r = queued->spec().resources();
    double wait_s = (now - queued->queued_ms()) / 1000.0;
    double latency_s = (now - std::max(queued->queued_ms(), queued->not_before_ms())) / 1000.0;
    std::string attempt_id = absl::StrCat(p.job_id, ".", queued->attempts() + 1);
    std::vector<v1::AttemptPart> parts;
    for (size_t rank = 0; rank < p.workers.size(); ++rank) {
      WorkerEntry* w = c.workers.Find(p.workers[rank]);
      Allocation a = c.workers.Allocate(*w, AllocationKey(attempt_id, rank), r.gpus(), r.cpus(),
                                        r.memory_mb());
      v1::AttemptPart part;
      part.set_rank(rank);
      part.set_worker_id(p.workers[rank]);
      part.mutable_gpu_ids()->Assign(a.gpu_ids.begin(), a.gpu_ids.end());
      parts.push_back(std::move(part));
    }
    std::string rendezvous;
    // A gang, or one part of several processes (common/job_ranks.h): rank 0 listens on the
    // first part's worker. Resources stay per part: the part's ranks share its GPUs (one
    // each), cores and memory.
    if (p.workers.size() > 1 || RanksPerPart(queued->spec()) > 1) {
      const WorkerEntry* w0 = c.workers.Find(p.workers[0]);
      // A port derived from the job keeps concurrent gangs on one host apart.
      uint64_t seq = queued->seq();
      rendezvous = absl::StrCat(w0->info.host().empty() ? "127.0.0.1" : w0->info.host(), ":",
                                29500 + (seq % 20000));
    }
    v1::Job* job = c.jobs.Assign(p.job_id, std::move(parts), rendezvous, changes);
    for (int rank = 0; rank < job->current().parts_size(); ++rank) {
      v1::CoordinatorMessage msg;
      *msg.mutable_assign() = MakeAssignment(*job, rank);
      changes->messages.push_back({job->current().parts(rank).worker_id(), std::move(msg)});
    }
    c.metrics->QueueWait(std::max(0.0, wait_s));
    c.metrics->SchedulingLatency(std::max(0.0, latency_s));
  }
  return static_cast<int>(placements.size());
}

v1::Assignment Placer::MakeAssignment(const v1::Job& job, int rank) {
  v1::Assignment a;
  a.set_job_id(job.id());
  a.set_attempt_id(job.current().id());
  *a.mutable_spec() = job.spec();
  a.set_rank(rank);
  a.set_world_size(job.current().parts_size());
  a.set_rendezvous(job.current().rendezvous());
  *a.mutable_gpu_ids() = job.current().parts(rank).gpu_ids();
  return a;
}

namespace {

std::string Plural(int64_t n, const char* one, const char* many) {
  return absl::StrCat(n, " ", n == 1 ? one : many);
}

std::string Cpus(double cpus) {
  return absl::StrCat(cpus == static_cast<int64_t>(cpus) ? absl::StrCat(static_cast<int64_t>(cpus))
                                                         : absl::StrFormat("%.2f", cpus),
                      cpus == 1 ? " CPU" : " CPUs");
}

}  // namespace

std::string Placer::Unplaceable(const v1::Job& job, const WorkerTable& workers) {
  if (job.state() != v1::QUEUED) return "";
  const auto& r = job.spec().resources();
  const bool needs_exec = job.spec().kind_case() == v1::JobSpec::kExec;
  const int nodes = std::max(1, job.spec().nodes());
  int registered = 0, exec = 0, fit = 0;
  int max_gpus = 0;
  double max_cpus = 0;
  int64_t max_memory = 0;
  for (const auto& [id, w] : workers.all()) {
    if (w.info.state() != v1::WORKER_ALIVE) continue;
    ++registered;
    const int gpus = w.info.gpus_size();
    max_gpus = std::max(max_gpus, gpus);
    max_cpus = std::max(max_cpus, w.info.cpus());
    max_memory = std::max(max_memory, w.info.memory_mb());
    if (w.info.allow_exec()) ++exec;
    if (gpus >= r.gpus() && w.info.cpus() + 1e-9 >= r.cpus() &&
        w.info.memory_mb() >= r.memory_mb() && (!needs_exec || w.info.allow_exec())) {
      ++fit;
    }
  }
  if (registered == 0 || fit >= nodes) return "";
  const std::string workers_text = Plural(registered, "worker", "workers");
  std::string why;
  if (r.gpus() > max_gpus) {
    why = absl::StrCat("needs ", Plural(r.gpus(), "GPU", "GPUs"), ", the largest worker has ",
                       max_gpus);
  } else if (r.cpus() > max_cpus + 1e-9) {
    why = absl::StrCat("needs ", Cpus(r.cpus()), ", the largest worker has ", Cpus(max_cpus));
  } else if (r.memory_mb() > max_memory) {
    why = absl::StrCat("needs ", r.memory_mb(), " MiB of memory, the largest worker has ",
                       max_memory, " MiB");
  } else if (needs_exec && exec == 0) {
    why = absl::StrCat("exec jobs need a worker started with --allow-exec; none of the ",
                       workers_text, " allows it");
  } else {
    const std::string part =
        absl::StrCat(Plural(r.gpus(), "GPU", "GPUs"), ", ", Cpus(r.cpus()),
                     r.memory_mb() > 0 ? absl::StrCat(", ", r.memory_mb(), " MiB") : "",
                     needs_exec ? " and --allow-exec" : "");
    why = nodes > 1 ? absl::StrCat("needs ", nodes, " workers with ", part, " each; ",
                                   fit == 1 ? "1 registered worker has"
                                            : absl::StrCat(fit, " registered workers have"),
                                   " that")
                    : absl::StrCat("needs ", part, " on one worker; none of the ", workers_text,
                                   " has all of it");
  }
  return absl::StrCat("unplaceable: ", why);
}

void Placer::UpdateGauges() {
  int alive = 0, draining = 0, lost = 0, free = 0, used = 0;
  for (const auto& [id, w] : core_->workers.all()) {
    switch (w.info.state()) {
      case v1::WORKER_ALIVE:
        ++alive;
        break;
      case v1::WORKER_DRAINING:
        ++draining;
        break;
      case v1::WORKER_LOST:
        ++lost;
        continue;
      default:
        continue;
    }
    int f = w.free_gpus();
    free += f;
    used += static_cast<int>(w.gpu_used.size()) - f;
  }
  core_->metrics->WorkerCounts(alive, draining, lost);
  core_->metrics->Gpus(free, used);
}

}  // namespace stemma::coordinator
