// What the queue asks of the cluster and how close running attempts are to their timeout:
// the inputs of an autoscaler (deploy/kubernetes/components/autoscaling) and of the
// StemmaAttemptNearTimeout alert. Not thread-safe: called under the coordinator's mutex.
#pragma once

#include <array>
#include <cstdint>

#include "coordinator/job_table.h"
#include "coordinator/worker_table.h"

namespace stemma::coordinator {

// GPUs per node a queued job asks for, rounded up to a power of two: the label values of
// stemma_scheduler_queued_gpus{per_node}. A pool of N-GPU workers serves the sizes <= N.
inline constexpr std::array<const char*, 7> kGpuSizeLabels = {"1",  "2",  "4",   "8",
                                                              "16", "32", "more"};

struct Demand {
  // Queued GPUs (nodes x GPUs per node of every QUEUED job that asks for GPUs), indexed
  // like kGpuSizeLabels.
  std::array<int64_t, kGpuSizeLabels.size()> queued_gpus{};
  // Running attempts with a timeout that have used more than kNearTimeout of it.
  int near_timeout = 0;
  // The largest elapsed/timeout of the running attempts that have a timeout (0 when none).
  double max_timeout_ratio = 0;
};

inline constexpr double kNearTimeout = 0.9;

// The index in kGpuSizeLabels of a job asking for `gpus` per node (gpus > 0).
size_t GpuSizeIndex(int64_t gpus);

// O(queued jobs + allocations on workers).
Demand ComputeDemand(JobTable& jobs, const WorkerTable& workers, int64_t now_wall_ms);

}  // namespace stemma::coordinator
