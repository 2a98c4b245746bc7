// How attempts end, shared by the domains that end them (worker sessions, leases, users).
#pragma once

#include <string>

#include "coordinator/core.h"

namespace stemma::coordinator {

// Frees every unfinished part of the job's current attempt and tells the workers of the
// parts (except `except_worker`'s) to stop them.
void StopParts(CoordinatorCore& core, const v1::Job& job, const std::string& reason,
               const std::string& except_worker, Changes* changes)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);

// Ends the job's current attempt as failed: stops its parts and requeues or fails the job.
void EndAttempt(CoordinatorCore& core, v1::Job* job, const std::string& result, int exit_code,
                bool retryable, const std::string& except_worker, Changes* changes)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu);

}  // namespace stemma::coordinator
