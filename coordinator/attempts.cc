#include "coordinator/attempts.h"

#include "common/logging.h"

namespace stemma::coordinator {

void StopParts(CoordinatorCore& core, const v1::Job& job, const std::string& reason,
               const std::string& except_worker, Changes* changes) {
  for (const auto& part : job.current().parts()) {
    WorkerEntry* w = core.workers.Find(part.worker_id());
    if (w != nullptr) core.workers.Free(*w, AllocationKey(job.current().id(), part.rank()));
    if (part.finished() || part.worker_id() == except_worker) continue;
    v1::CoordinatorMessage msg;
    msg.mutable_cancel()->set_attempt_id(job.current().id());
    msg.mutable_cancel()->set_reason(reason);
    changes->messages.push_back({part.worker_id(), std::move(msg)});
  }
}

void EndAttempt(CoordinatorCore& core, v1::Job* job, const std::string& result, int exit_code,
                bool retryable, const std::string& except_worker, Changes* changes) {
  StopParts(core, *job, result, except_worker, changes);
  core.metrics->AttemptEnded(retryable ? "failed" : "failed_permanently");
  spdlog::info("job={} attempt={} failed: {}", job->id(), job->current().id(), result);
  core.jobs.AttemptFailed(job, result, exit_code, retryable, changes);
}

}  // namespace stemma::coordinator
