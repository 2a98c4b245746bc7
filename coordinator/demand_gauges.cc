#include "coordinator/demand_gauges.h"

#include <algorithm>
#include <string>

namespace stemma::coordinator {

size_t GpuSizeIndex(int64_t gpus) {
  size_t i = 0;
  for (int64_t size = 1; size < gpus && i + 1 < kGpuSizeLabels.size(); size *= 2) ++i;
  return i;
}

Demand ComputeDemand(JobTable& jobs, const WorkerTable& workers, int64_t now_wall_ms) {
  Demand d;
  for (const auto& [neg_priority, seq, id] : jobs.queue()) {
    const v1::Job* job = jobs.Find(id);
    if (job == nullptr) continue;
    const int64_t per_node = job->spec().resources().gpus();
    if (per_node <= 0) continue;
    const int64_t nodes = std::max(1, job->spec().nodes());
    d.queued_gpus[GpuSizeIndex(per_node)] += nodes * per_node;
  }
  // Each live attempt once: through its rank-0 part's allocation.
  for (const auto& [worker_id, w] : workers.all()) {
    for (const auto& [key, allocation] : w.allocations) {
      const size_t slash = key.rfind('/');
      if (slash == std::string::npos || key.compare(slash + 1, std::string::npos, "0") != 0) {
        continue;
      }
      const v1::Job* job = jobs.FindCurrentAttempt(key.substr(0, slash));
      if (job == nullptr || job->spec().timeout_ms() <= 0) continue;
      const v1::Attempt& a = job->current();
      const int64_t since = a.started_ms() != 0 ? a.started_ms() : a.assigned_ms();
      if (since <= 0) continue;
      const double ratio =
          static_cast<double>(now_wall_ms - since) / static_cast<double>(job->spec().timeout_ms());
      d.max_timeout_ratio = std::max(d.max_timeout_ratio, ratio);
      if (ratio > kNearTimeout) ++d.near_timeout;
    }
  }
  return d;
}

}  // namespace stemma::coordinator
