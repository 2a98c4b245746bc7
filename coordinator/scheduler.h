// Placement: which QUEUED jobs start now, and where.
//
// Jobs are taken by priority (high first). Among jobs of equal priority, with a Quotas, the
// next job is the oldest of the owner with the least usage now (fair share, quotas.h), and
// an owner whose next job would pass its max_running_gpus waits for the rest of the pass;
// without one (or with fair share off) in submission order. Each part of a job
// goes to a distinct connected, non-draining worker that has the part's GPUs, CPUs and
// memory free (best fit: the worker left with the fewest free GPUs, then CPUs); a gang job
// is placed whole or not at all. A job that does not fit does not block the jobs behind
// it (backfill), but a pass stops after `max_blocked` jobs that did not fit, which bounds
// its cost with very deep queues. Jobs in backoff (not_before in the future) are skipped.
//
// Reservations (preemption, coordinator/preemption.h): what a preempting job's victims free on a
// worker is kept for that job: other jobs see the worker's free resources less the reserved
// amounts (as far as they are free yet), the job itself sees them all.
//
// Pure: reads the tables and returns decisions; the caller applies them.
#pragma once

#include <string>
#include <vector>

#include "coordinator/job_table.h"
#include "coordinator/quotas.h"
#include "coordinator/worker_table.h"

namespace stemma::coordinator {

struct Placement {
  std::string job_id;
  std::vector<std::string> workers;  // one per rank
};

struct SchedulerOptions {
  int max_blocked = 2000;
  // Preemption (coordinator/preemptor.h): a QUEUED job that lower-priority jobs keep out
  // stops them; `stemma-coordinator --no-preemption` turns it off.
  bool preemption = true;
  // How long a victim has to stop (a trainer saves its checkpoint first) before it is
  // killed and requeued anyway (`--preemption-grace-s`).
  int64_t preemption_grace_ms = 300'000;
};

// Resources on one worker kept for a job whose victims are stopping (or have stopped).
struct Reservation {
  std::string job_id;
  std::string worker_id;
  int gpus = 0;
  double cpus = 0;
  int64_t memory_mb = 0;
};

// `quotas` may be null: one FIFO per priority, no limits. `reservations` may be null.
std::vector<Placement> Schedule(const JobTable& jobs, const WorkerTable& workers,
                                int64_t now_wall_ms, const SchedulerOptions& options = {},
                                const Quotas* quotas = nullptr,
                                const std::vector<Reservation>* reservations = nullptr);

}  // namespace stemma::coordinator
