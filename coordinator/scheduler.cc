#include "coordinator/scheduler.h"

#include <algorithm>
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
  // Of what is free, the part reserved for a preempting job (not in the fields above).
  int held_gpus = 0;
  double held_cpus = 0;
  int64_t held_memory_mb = 0;
};

// One scheduling pass over the free resources: jobs are offered one by one, in whatever
// order the caller chooses.
class Pass {
 public:
  Pass(const JobTable& jobs, const WorkerTable& workers, int64_t now, const SchedulerOptions& o,
       const std::vector<Reservation>* reservations)
      : now_(now), options_(o), least_(jobs.MinQueuedDemand()) {
    // Workers come in id order, so placement is deterministic.
    for (const auto& [id, w] : workers.all()) {
      if (!w.schedulable() || !CanHostAny(w.free_gpus(), w.free_cpus(), w.free_memory_mb())) {
        continue;
      }
      free_.push_back(
          {&id, w.free_gpus(), w.free_cpus(), w.free_memory_mb(), w.info.allow_exec(), false});
    }
    if (reservations != nullptr && !reservations->empty()) Hold(*reservations);
    RefreshBounds();
  }

  // No worker can take any queued job (every queued job needs at least the smallest demand
  // on each resource), or too many jobs did not fit: the pass is over.
  bool Over() const {
    return blocked_ >= options_.max_blocked || !CanHostAny(max_gpus_, max_cpus_, max_memory_);
  }

  enum class Outcome { kPlaced, kSkipped, kBlocked };
  // Places the job (`id`, found in the table) if it fits now (appending to `out`), on what is
  // reserved for it too.
  Outcome Offer(const std::string& id, const v1::Job* job, std::vector<Placement>* out) {
    if (held_.empty()) return OfferFree(id, job, out);
    const bool reserved = Release(id, +1);
    const Outcome o = OfferFree(id, job, out);
    // Placed: the reservation became the job's allocation. Otherwise it is kept.
    if (reserved && o != Outcome::kPlaced) Release(id, -1);
    return o;
  }

  bool Empty() const { return free_.empty(); }

 private:
  // Takes what is reserved, as far as it is free now, out of each worker's free resources.
  void Hold(const std::vector<Reservation>& reservations) {
    for (const Reservation& r : reservations) {
      for (size_t i = 0; i < free_.size(); ++i) {
        if (*free_[i].id != r.worker_id) continue;
        Free& f = free_[i];
        Held h{&r.job_id, i, std::min(f.gpus, r.gpus), std::min(f.cpus, r.cpus),
               std::min(f.memory_mb, r.memory_mb)};
        f.gpus -= h.gpus;
        f.cpus -= h.cpus;
        f.memory_mb -= h.memory_mb;
        f.held_gpus += h.gpus;
        f.held_cpus += h.cpus;
        f.held_memory_mb += h.memory_mb;
        held_.push_back(h);
        break;
      }
    }
  }
  // Gives the job's held resources back to the free ones (+1) or holds them again (-1);
  // false when the job holds none.
  bool Release(const std::string& id, int sign) {
    bool any = false;
    for (const Held& h : held_) {
      if (*h.job_id != id) continue;
      Free& f = free_[h.index];
      f.gpus += sign * h.gpus;
      f.cpus += sign * h.cpus;
      f.memory_mb += sign * h.memory_mb;
      f.held_gpus -= sign * h.gpus;
      f.held_cpus -= sign * h.cpus;
      f.held_memory_mb -= sign * h.memory_mb;
      any = true;
    }
    if (any) RefreshBounds();
    return any;
  }

  Outcome OfferFree(const std::string& id, const v1::Job* job, std::vector<Placement>* out) {
    if (job == nullptr || job->not_before_ms() > now_) return Outcome::kSkipped;
    const auto& r = job->spec().resources();
    const bool needs_exec = job->spec().kind_case() == v1::JobSpec::kExec;
    const int nodes = std::max(1, job->spec().nodes());
    // Above what any one worker has free: blocked without looking at workers.
    if (r.gpus() > max_gpus_ || r.cpus() > max_cpus_ + 1e-9 || r.memory_mb() > max_memory_) {
      ++blocked_;
      return Outcome::kBlocked;
    }
    chosen_.clear();
    for (int part = 0; part < nodes; ++part) {
      int best = -1;
      for (size_t i = 0; i < free_.size(); ++i) {
        const Free& f = free_[i];
        if (f.taken || f.gpus < r.gpus() || f.cpus + 1e-9 < r.cpus() ||
            f.memory_mb < r.memory_mb() || (needs_exec && !f.allow_exec)) {
          continue;
        }
        if (best < 0 || f.gpus < free_[best].gpus ||
            (f.gpus == free_[best].gpus && f.cpus < free_[best].cpus)) {
          best = static_cast<int>(i);
        }
      }
      if (best < 0) break;
      free_[best].taken = true;
      chosen_.push_back(best);
    }
    for (int i : chosen_) free_[i].taken = false;
    if (static_cast<int>(chosen_.size()) < nodes) {
      ++blocked_;
      return Outcome::kBlocked;
    }
    Placement p;
    p.job_id = id;
    for (int i : chosen_) {
      free_[i].gpus -= r.gpus();
      free_[i].cpus -= r.cpus();
      free_[i].memory_mb -= r.memory_mb();
      p.workers.push_back(*free_[i].id);
    }
    out->push_back(std::move(p));
    RefreshBounds();
    return Outcome::kPlaced;
  }

  bool CanHostAny(int gpus, double cpus, int64_t memory_mb) const {
    return gpus >= least_.gpus && cpus + 1e-9 >= least_.cpus && memory_mb >= least_.memory_mb;
  }
  // Upper bounds of what any one worker has free (reserved or not: the job it is reserved
  // for may still come).
  void RefreshBounds() {
    max_gpus_ = 0;
    max_cpus_ = 0;
    max_memory_ = 0;
    for (const Free& f : free_) {
      max_gpus_ = std::max(max_gpus_, f.gpus + f.held_gpus);
      max_cpus_ = std::max(max_cpus_, f.cpus + f.held_cpus);
      max_memory_ = std::max(max_memory_, f.memory_mb + f.held_memory_mb);
    }
  }

  const int64_t now_;
  const SchedulerOptions& options_;
  const JobTable::Demand least_;
  std::vector<Free> free_;
  struct Held {
    const std::string* job_id;
    size_t index;  // in free_
    int gpus;
    double cpus;
    int64_t memory_mb;
  };
  std::vector<Held> held_;
  std::vector<int> chosen_;
  int max_gpus_ = 0;
  double max_cpus_ = 0;
  int64_t max_memory_ = 0;
  int blocked_ = 0;
};

int64_t JobGpus(const v1::Job& job) {
  return static_cast<int64_t>(std::max(1, job.spec().nodes())) * job.spec().resources().gpus();
}

// GPU limits within one pass: what each owner and project may still take.
class GpuBudget {
 public:
  explicit GpuBudget(const Quotas* q) : q_(q != nullptr && q->HasGpuLimits() ? q : nullptr) {}
  bool Allows(const std::string& owner, int64_t gpus) {
    if (q_ == nullptr || gpus == 0) return true;
    if (Own(owner) < gpus) return false;
    if (const auto* projects = q_->ProjectsOf(owner)) {
      for (const auto& p : *projects) {
        if (Project(p) < gpus) return false;
      }
    }
    return true;
  }
  void Take(const std::string& owner, int64_t gpus) {
    if (q_ == nullptr || gpus == 0) return;
    Own(owner) -= gpus;
    if (const auto* projects = q_->ProjectsOf(owner)) {
      for (const auto& p : *projects) Project(p) -= gpus;
    }
  }

 private:
  int64_t& Own(const std::string& owner) {
    auto [it, inserted] = own_.try_emplace(owner, 0);
    if (inserted) it->second = q_->OwnerGpuHeadroom(owner);
    return it->second;
  }
  int64_t& Project(const std::string& project) {
    auto [it, inserted] = project_.try_emplace(project, 0);
    if (inserted) it->second = q_->ProjectGpuHeadroom(project);
    return it->second;
  }

  const Quotas* q_;
  absl::flat_hash_map<std::string, int64_t> own_;
  absl::flat_hash_map<std::string, int64_t> project_;
};

// One priority level, fair share: a heap of owners by usage (each placement adds its
// minimum charge), each owner's jobs in submission order.
void ScheduleLevel(const Quotas& quotas, const Quotas::Level& level, const JobTable& jobs,
                   int64_t now, Pass& pass, GpuBudget& budget, std::vector<Placement>* out) {
  struct Cursor {
    double usage;
    const std::string* owner;
    Quotas::OwnerQueue::const_iterator next, end;
  };
  std::vector<Cursor> heap;
  heap.reserve(level.size());
  for (const auto& [owner, queue] : level) {
    heap.push_back({quotas.Usage(owner, now), &owner, queue.begin(), queue.end()});
  }
  auto later = [](const Cursor& a, const Cursor& b) {
    return a.usage != b.usage ? a.usage > b.usage : *a.owner > *b.owner;
  };
  std::make_heap(heap.begin(), heap.end(), later);
  while (!heap.empty() && !pass.Over()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    Cursor& c = heap.back();
    const std::string& id = c.next->second;
    ++c.next;
    const v1::Job* job = jobs.Find(id);
    bool keep = c.next != c.end;
    if (job != nullptr) {
      const int64_t gpus = JobGpus(*job);
      if (!budget.Allows(*c.owner, gpus)) {
        keep = false;  // at its GPU limit: the owner waits for the rest of this pass
      } else if (pass.Offer(id, job, out) == Pass::Outcome::kPlaced) {
        budget.Take(*c.owner, gpus);
        c.usage += Quotas::Weight(job->spec()) * Quotas::kMinChargeSeconds;
      }
    }
    if (keep) {
      std::push_heap(heap.begin(), heap.end(), later);
    } else {
      heap.pop_back();
    }
  }
}

}  // namespace

std::vector<Placement> Schedule(const JobTable& jobs, const WorkerTable& workers,
                                int64_t now_wall_ms, const SchedulerOptions& options,
                                const Quotas* quotas,
                                const std::vector<Reservation>* reservations) {
  std::vector<Placement> out;
  if (jobs.queue().empty()) return out;
  Pass pass(jobs, workers, now_wall_ms, options, reservations);
  if (pass.Empty()) return out;
  GpuBudget budget(quotas);
  if (quotas != nullptr && quotas->config().fair_share) {
    for (const auto& [neg_priority, level] : quotas->levels()) {
      if (pass.Over()) break;
      ScheduleLevel(*quotas, level, jobs, now_wall_ms, pass, budget, &out);
    }
    return out;
  }
  const bool gpu_limits = quotas != nullptr && quotas->HasGpuLimits();
  for (const auto& [neg_priority, seq, id] : jobs.queue()) {
    if (pass.Over()) break;
    const v1::Job* job = jobs.Find(id);
    if (gpu_limits && job != nullptr) {
      const std::string owner = JobOwner(*job);
      const int64_t gpus = JobGpus(*job);
      if (!budget.Allows(owner, gpus)) continue;
      if (pass.Offer(id, job, &out) == Pass::Outcome::kPlaced) budget.Take(owner, gpus);
      continue;
    }
    pass.Offer(id, job, &out);
  }
  return out;
}

}  // namespace stemma::coordinator
