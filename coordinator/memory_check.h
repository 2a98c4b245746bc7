// The memory plan at submit (coordinator/experiments/memory.h has the estimate): a train or
// eval job whose estimated peak per device no registered worker can hold is refused, with the
// estimate and what would make it fit. GPU jobs are checked against the largest GPU any live
// worker reports; CPU jobs (device cpu) against the largest worker's memory, the estimate
// times the processes of a part (ranks_per_part). A job's own `resources.memory_mb` is not
// checked: it is what the scheduler reserves, sized by the user, not a limit anything
// enforces, and small values are common in tests and tiny studies. Without a worker of the
// kind (no GPU registered yet) nothing is refused: the job waits, and `stemma get` says why.
//
// Thread-safety: pure functions, except ModelShapeOnDisk, which reads a file.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "coordinator/experiments/experiment_plan.h"
#include "coordinator/experiments/memory.h"
#include "stemma/v1/user_service.pb.h"

namespace stemma::coordinator {

// What the plan checks against, in bytes; 0: unknown (nothing refused).
struct DeviceMemory {
  double gpu_bytes = 0;  // the largest GPU of any live worker, or --gpu-memory
  double cpu_bytes = 0;  // the largest live worker's memory
  std::string gpu_source = "the registered workers";
};

DeviceMemory LargestDevices(const v1::ListWorkersResponse& workers);

// The shape of the model in `dir` from its config.json; nullopt when unreadable.
std::optional<experiments::ModelShape> ModelShapeOnDisk(const std::string& dir);

// FailedPrecondition "<job>: needs ~146 GiB per GPU (<items>); the largest GPU of <source> has
// 80 GiB; with parallel.shard: full and activation_checkpointing: 1: ~24 GiB" for the first
// job of `request` whose model is readable here and that does not fit.
// `devices` is asked only when the request has a train or eval job.
absl::Status CheckJobsFitMemory(const v1::SubmitRequest& request,
                                const std::function<DeviceMemory()>& devices);

// The same for an expanded experiment's cells (their memory plans are already made).
absl::Status CheckPlanFitsMemory(const experiments::ExperimentPlan& plan,
                                 const DeviceMemory& memory);

}  // namespace stemma::coordinator
