// How many engine processes (ranks) one part of a job runs, as torchrun's --nproc-per-node:
// the one rule the coordinator (placement, logs, validation) and the worker (spawning) share.
#pragma once

#include <algorithm>
#include <string>

#include "common/job_spec.h"
#include "stemma/v1/job.pb.h"

namespace stemma {

// Whether engine command `kind` runs as several ranks that share the work: train (data
// parallel) and eval (each rank takes every W-th item of each task; rank 0 writes the
// results, engine/eval/eval_ranks.h). The ranks of any other command would each do all of
// it and write the same outputs, so they run one process per part.
inline bool RunsRanks(const std::string& kind) { return kind == "train" || kind == "eval"; }

// `resources.ranks_per_part` when set; otherwise one rank per GPU for train and eval jobs
// (one on CPU). Other engine commands and noop jobs run one process; an exec job runs several
// when it sets ranks_per_part, or with `launcher: torchrun` one per GPU as train does (its
// processes get the same rank and rendezvous variables). Never below 1.
inline int RanksPerPart(const v1::JobSpec& spec) {
  const v1::Resources& r = spec.resources();
  const std::string kind = JobKind(spec);
  if (kind == "noop") return 1;
  if (kind == "exec") {
    if (r.ranks_per_part() > 0 || spec.exec().launcher() != "torchrun") {
      return std::max(1, r.ranks_per_part());
    }
    return std::max(1, r.gpus());
  }
  if (!RunsRanks(kind)) return 1;
  return r.ranks_per_part() > 0 ? r.ranks_per_part() : std::max(1, r.gpus());
}

// The global rank (RANK) of local rank `local` of part `part`.
inline int GlobalRank(const v1::JobSpec& spec, int part, int local) {
  return part * RanksPerPart(spec) + local;
}

}  // namespace stemma
