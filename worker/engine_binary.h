// Which stemma-engine this worker runs, and its build id. One rule for both, so the binary
// the executor starts is the binary whose bytes go into cache keys (engine_build_id).
// Thread-safe (no state; reads the file system and the environment).
#pragma once

#include <string>

#include "absl/status/status.h"

namespace stemma::worker {

// stemma-engine: `engine_path` (--engine) if it is an executable file; without --engine,
// stemma-engine beside the worker binary, else the first on $PATH (default
// /usr/local/bin:/usr/bin:/bin). Empty if none: a given --engine that is not executable is
// not replaced by another binary.
std::string FindEngine(const std::string& engine_path);

// The build id of the engine binary at `engine` (FindEngine's answer): "sha256:" and the
// first 16 hex digits of sha256 over the hex sha256 of each MiB of its bytes. "" when
// `engine` is empty or cannot be read.
std::string EngineBuildId(const std::string& engine);

// Whether `engine` (FindEngine's answer) can run engine jobs. OK for "" (no engine: engine
// jobs are refused, as ever), for an engine that is not Stemma's front (a single binary, a
// wrapper), and for a front (its bytes carry engine_front::kFrontMarker) with an executable
// stemma-engine-torch beside its resolved path, where the front execs it from.
// FailedPrecondition naming that path otherwise: such a worker would take engine jobs and
// fail every one that is not a fully cached eval (exit 1 at the exec, retried). NotFound
// when `engine` cannot be read.
absl::Status CheckEngine(const std::string& engine);

}  // namespace stemma::worker
