// How many engine processes (ranks) one part of a job runs, as torchrun's --nproc-per-node:
// the one rule the coordinator (placement, logs, validation) and the worker (spawning) share.
#pragma once

#include <algorithm>

#include "common/job_spec.h"
#include "stemma/v1/job.pb.h"

namespace stemma {

// `resources.ranks_per_part` when set; otherwise one rank per GPU for engine jobs (one for a
// CPU engine job) and one process for exec and noop jobs (an exec job runs several only when
// it asks for them; a noop job always runs one). Never below 1.
inline int RanksPerPart(const v1::JobSpec& spec) {
  const v1::Resources& r = spec.resources();
  const std::string kind = JobKind(spec);
  if (kind == "noop") return 1;
  if (r.ranks_per_part() > 0) return r.ranks_per_part();
  if (kind == "exec") return 1;
  return std::max(1, r.gpus());
}

// The global rank (RANK) of local rank `local` of part `part`.
inline int GlobalRank(const v1::JobSpec& spec, int part, int local) {
  return part * RanksPerPart(spec) + local;
}

}  // namespace stemma
