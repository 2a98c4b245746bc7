// The memoization key of an exec job with declared outputs (issue 23; ExecSpec): the job runs
// the researcher's own program, which the coordinator cannot look inside, so the key is what
// the job declares it depends on:
//
//   sha256("exec", argv, env (by name), launcher, the declared outputs (name, path, type),
//          the identity of argv[0], the identity of every `inputs:` path, the content of every
//          `code:` path)
//
// - argv[0]'s identity: for an absolute path this process can stat, its resolved path, size
//   and modification time (a python3 that was upgraded in place gets a new key); otherwise the
//   name as written. What the interpreter imports is not in it: list the files that matter
//   (a script, a package directory, a requirements lock) under `code:`.
// - An input's identity is a directory's manifest's sha256, read as for engine jobs
//   (ReadArtifactManifest: its stemma.json, else a corpus's manifest.json, else a token
//   dataset's index.json), else the sha256 of a file, else the content of a directory tree
//   (every file's relative path and sha256).
// - A code path's identity is always its content (a file, or a directory tree as above).
// Paths are read where the coordinator runs, as for engine inputs: absolute paths, or relative
// ones from the coordinator's working directory (`stemma up` runs coordinator and worker in
// one directory). A path that cannot be read here stands for itself (its text), so the job is
// still memoized, on its spelling.
//
// "" (not memoized) for a job that is not exec, declares no outputs, says `cache: false`, or
// still holds a wiring token (`${{ ... }}`). Pure apart from reading those files; thread-safe.
#pragma once

#include <string>

#include "stemma/v1/job.pb.h"

namespace stemma::coordinator {

std::string ExecCacheKey(const v1::JobSpec& spec);

// Whether `spec` is an exec job that memoization considers (declared outputs, cache not off).
bool IsMemoizedExec(const v1::JobSpec& spec);

}  // namespace stemma::coordinator
