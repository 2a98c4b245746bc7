// The contract between the worker and `stemma-engine`: the environment the worker sets for
// an attempt, the JSON-line events the engine prints on stdout, and the exit codes. Both
// sides include this header (it has no LibTorch and no gRPC); docs/engine-events.md
// describes the same contract for people.
#pragma once

#include <string_view>

namespace stemma::engine_contract {

// --- Environment set by the worker for every attempt (engine jobs and exec jobs alike). ---
inline constexpr std::string_view kEnvJobId = "STEMMA_JOB_ID";
inline constexpr std::string_view kEnvAttemptId = "STEMMA_ATTEMPT_ID";  // "<job id>.<n>"
inline constexpr std::string_view kEnvRank = "RANK";                    // also STEMMA_RANK
inline constexpr std::string_view kEnvWorldSize = "WORLD_SIZE";         // also STEMMA_WORLD_SIZE
inline constexpr std::string_view kEnvMasterAddr = "MASTER_ADDR";       // gang jobs: rank 0's host
inline constexpr std::string_view kEnvMasterPort = "MASTER_PORT";
inline constexpr std::string_view kEnvWorkdir = "STEMMA_WORKDIR";  // the attempt directory
// Threads the job may use (its resources.cpus, rounded up): a spec's `threads: 0` means this.
inline constexpr std::string_view kEnvCpus = "STEMMA_CPUS";
// The worker's storage root: relative paths in a spec resolve against it.
inline constexpr std::string_view kEnvStorageRoot = "STEMMA_STORAGE_ROOT";

// Early stopping: the worker writes this file (its text: why) into STEMMA_WORKDIR when the
// coordinator asks an attempt to stop; an engine that checks it after each step finishes
// that step, publishes what it has as its output (noting the step it stopped at), emits its
// output event and exits 0.
inline constexpr std::string_view kStopFile = "stop";

// Preemption: the worker writes this file (its text: the job that takes the resources) into
// STEMMA_WORKDIR when the coordinator gives the attempt's resources to a higher-priority job
// (StopAttempt.preempt). A trainer checks it after every step as it checks kStopFile: it saves
// the resumable checkpoint of that step at once (the one it saves every checkpoint.every
// steps, written the same atomic way), prints its `checkpoint` event and exits
// kExitPreempted; the job's next attempt resumes from that checkpoint. Engine commands
// without steps to resume, noop and exec jobs are not asked: the worker terminates them.
inline constexpr std::string_view kPreemptFile = "preempt";

// --- Events: one JSON object per stdout line with "event" as its first key. ---
inline constexpr std::string_view kEventStart = "start";        // {command, spec, ...}
inline constexpr std::string_view kEventProgress = "progress";  // {fraction, message, step}
// {step, total_steps, loss, lr, grad_norm, tokens, tokens_per_s, ...}: every numeric field
// other than step/total_steps is a metric series of its own.
inline constexpr std::string_view kEventStep = "step";
inline constexpr std::string_view kEventMetric = "metric";          // {name, value, step[, labels]}
inline constexpr std::string_view kEventCheckpoint = "checkpoint";  // {step, path}
// The worker turns each `checkpoint` event into a point of this metric series (value and
// step: the checkpoint's step), so the coordinator knows when each running attempt last saved
// one (preemption takes the attempts with the least work since then first).
inline constexpr std::string_view kCheckpointStepSeries = "checkpoint_step";
// {name, path[, type, manifest_sha256, bytes, parents, operation]}: a published result.
inline constexpr std::string_view kEventOutput = "output";
inline constexpr std::string_view kEventDone = "done";

// --- Exit codes. ---
inline constexpr int kExitOk = 0;
// Something failed that another attempt may not hit (a crash, an I/O error, a lost peer).
inline constexpr int kExitFailed = 1;
// The command line itself was wrong (unknown command or flag): a bug in the caller.
inline constexpr int kExitUsage = 2;
// Stopped on request after a step (--stop-after-step): resumable, not a failure of the spec.
inline constexpr int kExitStopped = 3;
// The spec or its inputs are wrong (a bad field, a missing or corrupt input file, a layer
// range outside the model): the same attempt would fail again. The worker does not retry it.
inline constexpr int kExitBadInput = 4;
// Preempted (kPreemptFile): the checkpoint of the last finished step is saved and the run
// can resume from it. Not a failure: the worker reports the attempt as preempted and the
// coordinator requeues the job at once without counting the attempt.
inline constexpr int kExitPreempted = 5;

// The one line an engine prints on stderr before it exits non-zero; the worker copies the
// text after it into the attempt's result and the job's reason.
inline constexpr std::string_view kErrorPrefix = "stemma-engine: error: ";

}  // namespace stemma::engine_contract
