// Preemption's choice: which running jobs a QUEUED job stops to get the resources it needs.
//
// A QUEUED job preempts only jobs of strictly lower priority, and only when it could run on
// the registered workers once they are gone: a single-part job on one worker, a gang on
// `nodes` distinct workers. On each worker that could hold a part (alive, not draining, big
// enough, exec allowed if needed) the candidates are that worker's running parts of lower
// priority, cheapest first:
//   1. least work since the attempt's last checkpoint (what a restart redoes), in
//      milliseconds: a trainer's last `checkpoint` event, else the attempt's start. Time,
//      not steps: steps differ in length between jobs, and a job without steps (eval, merge)
//      loses everything since it started;
//   2. then the lowest priority;
//   3. then the most recently started.
// They are taken in that order until the part fits, then any taken one the part fits without
// is put back (most costly first), so the set is minimal. A single-part job goes to the worker
// whose set costs least (work, then highest priority in it, then fewer victims); a gang to the
// `nodes` cheapest workers (one that fits already costs nothing). A job that fits somewhere
// without stopping anything preempts nothing: the next pass places it.
//
// Not preempted: attempts already told to stop (Attempt.preempted_by set), and anything for a
// job beyond its quota (coordinator/quotas.h): a job whose owner, or one of its projects,
// would pass max_running_gpus by starting preempts nothing, since it could not start anyway;
// so a job within its quota is never stopped for one beyond it. What is reserved for earlier
// preemptions (scheduler.h) is not free for a later one. Within one priority nothing is
// preempted, so fair share (which orders jobs of equal priority) is never overridden.
//
// Pure: reads the tables and returns decisions; the caller applies them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "coordinator/job_table.h"
#include "coordinator/quotas.h"
#include "coordinator/scheduler.h"
#include "coordinator/worker_table.h"

namespace stemma::coordinator {

struct Preemption {
  std::string job_id;                // the QUEUED job that takes the resources
  std::vector<std::string> victims;  // the live jobs to stop, cheapest first
  // What to keep for the job, one entry per part's worker (its resources there).
  std::vector<Reservation> reservations;
};

struct PreemptionLimits {
  int max_preemptors = 8;  // jobs that may preempt in one pass
  int max_examined = 64;   // QUEUED jobs examined in one pass (highest priority first)
};

// The work a live job would lose if stopped now, in milliseconds (see 1. above).
using WorkLostMs = std::function<int64_t(const v1::Job& job)>;

// `lowest_live_priority`: the lowest priority among live jobs (the caller keeps it); nothing
// is examined unless a QUEUED job's priority is above it. `quotas` and `reservations` may be
// null.
std::vector<Preemption> ChoosePreemptions(const JobTable& jobs, const WorkerTable& workers,
                                          int64_t now_wall_ms, int lowest_live_priority,
                                          const WorkLostMs& work_lost_ms, const Quotas* quotas,
                                          const std::vector<Reservation>* reservations,
                                          const PreemptionLimits& limits = {});

}  // namespace stemma::coordinator
