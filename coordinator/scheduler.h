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
};

// `quotas` may be null: one FIFO per priority, no limits.
std::vector<Placement> Schedule(const JobTable& jobs, const WorkerTable& workers,
                                int64_t now_wall_ms, const SchedulerOptions& options = {},
                                const Quotas* quotas = nullptr);

}  // namespace stemma::coordinator
