// Confined paths: every path an engine job reads or writes must lie inside the roots its
// worker was given. Outputs (ROLE_OUTPUT_PATH) only strictly below the storage root; inputs
// (ROLE_INPUT_MODEL, ROLE_INPUT_PATH) below the storage root or a read-only root
// (`stemma-worker --read-root DIR`).
//
// A path is judged as the engine will open it: a relative path is the storage root joined
// with it and normalised lexically (as ResolveSpecPaths does), an absolute path is taken as
// it is; then the kernel's view of that string is taken: the longest existing prefix is
// resolved with realpath (symlinks and `..` after them, as open() would), the rest
// normalised lexically (it does not exist, so it holds no symlink). The roots are resolved
// the same way. A symlink inside a root that points out of it therefore does not help.
//
// Two levels:
// - CheckSpecPathSyntax: what anyone can see without a file system (the coordinator and the
//   CLI at submit): NUL bytes, empty segments ("a//b"), `..` in an absolute output path,
//   and a relative output path that climbs above its root.
// - CheckSpecConfinement: the worker, just before it starts the engine, against its roots.
//
// What is left open: the worker checks before the engine starts; a symlink planted inside
// the root between the check and the engine's open is not caught (the engine does not
// open with RESOLVE_BENEATH).
//
// Errors are InvalidArgument "<field path>: <value> ... <root>", e.g.
// "train.out: /etc/x is outside the storage root /srv/stemma".
// Thread-safety: pure functions (they read the file system, never write it).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "stemma/v1/job.pb.h"

namespace stemma {

struct PathRoots {
  std::string storage;                 // absolute; read and written
  std::vector<std::string> read_only;  // absolute; read only
  // Absolute directories never written even when inside the storage root (the worker's
  // own --data directory).
  std::vector<std::string> no_write;
};

enum class PathAccess { kRead, kWrite };

// The path the engine will open for `value` (relative: below roots.storage), resolved as the
// kernel would, if it is allowed for `access`; else InvalidArgument naming `field`.
// References (`ckpt:`, `hf:`, `${{`) and "" are not paths: returned unchanged.
absl::StatusOr<std::string> ConfinePath(std::string_view field, const std::string& value,
                                        PathAccess access, const PathRoots& roots);

// ConfinePath for every path field of an engine spec (common/engine_spec.h SpecPaths);
// `prefix` is the spec's field path in the job ("train"). The first refusal.
absl::Status CheckSpecConfinement(const google::protobuf::Message& spec, std::string_view prefix,
                                  const PathRoots& roots);

// CheckSpecConfinement for a job: its engine spec, named by its kind ("train.out"). Jobs
// that are not engine jobs (noop, exec) have no spec paths: OK.
absl::Status CheckJobConfinement(const v1::JobSpec& job, const PathRoots& roots);

// The absolute path `path` names as open() would see it (the rules above: existing components
// resolved, symlinks followed, the rest lexical). Errors name the component.
absl::StatusOr<std::string> ResolveAsOpened(const std::string& path);
// `path` relative to `root` when it resolves (ResolveAsOpened, as `root` does) strictly below
// it; InvalidArgument "<field>: <path> ... is outside the storage root <root>" otherwise.
absl::StatusOr<std::string> RelativeBelowRoot(std::string_view field, const std::string& path,
                                              const std::string& root);

// The file-system-free rules for one path value (see above).
absl::Status CheckPathSyntax(std::string_view field, const std::string& value, PathAccess access);
// CheckPathSyntax for every path field of an engine spec.
absl::Status CheckSpecPathSyntax(const google::protobuf::Message& spec, std::string_view prefix);

}  // namespace stemma
