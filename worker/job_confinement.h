// Keeps the worker's credential out of its jobs' reach. An exec job is arbitrary code run as
// the worker's user; without this it could read the worker's token file (its path is in
// /proc/PPID/cmdline), the worker's environment (/proc/PPID/environ), its working directory
// and open files (/proc/PPID/cwd, fd) or its memory (/proc/PPID/mem, which also holds other
// jobs' secrets).
//
// Two mechanisms. When the worker may make a mount namespace (root or CAP_SYS_ADMIN: a
// daemon on a bare-metal node, a privileged GPU pod), it moves itself into a private one at
// start and binds /dev/null over the token file, so its children see an empty file and the
// rest of the file system as it is. Otherwise (a pod with the default capabilities, an
// unprivileged user) Landlock file rules, below, keep the file from them.
//
// Landlock (Linux >= 5.13, unprivileged, no capability needed, so it works
// in a worker pod with the default capabilities): every exec and engine child restricts
// itself, before execve, to a rule set made once here. Its domain
//   - allows reading regular files everywhere except the token file (Landlock rules are
//     allow-lists: "everywhere except" is every entry of each directory on the path from /
//     to the file, except the next step towards it, as those directories are when the rule
//     set is made), and
//   - by being a Landlock domain at all, denies ptrace-class access to processes outside it
//     (the worker's /proc/PID/mem, cwd, root, fd targets) and any mount or umount.
//     /proc/PID/environ stays readable on Linux 6.18 (checked here): the worker scrubs its
//     token from its environment block instead (TakeEnvironmentSecret).
// Files created later directly in a directory on the token file's path are not readable by
// jobs: keep the token in a directory of its own (a Kubernetes Secret volume is one).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "stemma/v1/job.pb.h"

namespace stemma::worker {

// The Landlock ABI version the kernel offers; 0 when it has none or Landlock is disabled.
int LandlockAbi();

// The rule set above, as an O_CLOEXEC descriptor for ChildPlan::ruleset_fd. `secret_file`
// empty: reading is allowed everywhere (the domain still shields the worker's /proc).
// `job_dirs` are (flag, directory) pairs that jobs read whole (--storage-root, --data,
// --read-root): INVALID_ARGUMENT naming the flag when the secret file lies inside one.
// UNIMPLEMENTED without Landlock; NOT_FOUND when the secret file does not exist.
absl::StatusOr<int> MakeJobRuleset(
    const std::string& secret_file,
    const std::vector<std::pair<std::string, std::string>>& job_dirs);

// Ownership of writes (docs/tenancy.md). With authentication every job has an owner (the
// `stemma.owner` label the coordinator sets) who may write only below its prefixes of the
// storage root: `<owner>/` and, for an engine job, the prefix (`<subject>/` or
// `projects/<p>/`) of each output path, which the coordinator checked at submit. Two
// guards, per attempt, before the child starts:
//   - every output path, resolved as the kernel would (symbolic links followed), must stay
//     below its prefix, and the prefix (each of its components) must not be a symbolic
//     link: a link planted in bob/ that points into carol/ is refused before the engine
//     writes a byte;
//   - with Landlock (ABI >= 2), the child restricts itself to a second rule set that allows
//     writing (creating, removing, renaming into, truncating) everywhere outside the storage
//     root and inside it only beneath those prefixes and the attempt directory. Landlock
//     judges the file as it is reached, so a link planted later (by an exec job, while the
//     engine runs) does not help either; an exec job's writes are confined the same way.
// The rule set is an allow-list: below each directory on the path from / to the storage
// root, jobs may write into the entries that exist when the attempt starts, but not create
// new entries directly in those directories (keep the root out of /tmp in production).
// A storage root of "/" cannot be confined this way (jobs would lose /tmp and /dev): the
// path check is all there is then.

// What an owned attempt may write below the storage root.
struct OwnedWrites {
  std::string owner;                  // "" for a job without owner: nothing is confined
  std::vector<std::string> prefixes;  // relative to the root: "bob", "projects/vision"
};

// The owner and writable prefixes of `spec`, after checking every output path of an engine
// spec as above. PERMISSION_DENIED "<kind>.<field>: ..." naming the path and the link.
absl::StatusOr<OwnedWrites> CheckOwnedWrites(const v1::JobSpec& spec,
                                             const std::string& storage_root);

// The per-attempt Landlock rule set for `writes` (its prefixes created below the root when
// missing, without following links), as an O_CLOEXEC descriptor for
// ChildPlan::write_ruleset_fd; -1 when there is nothing to confine (no owner, a root of
// "/", or a kernel with Landlock ABI < 2, where cross-directory renames could not be
// allowed). `workdir`: the attempt directory, always writable.
absl::StatusOr<int> MakeWriteRuleset(const OwnedWrites& writes, const std::string& storage_root,
                                     const std::string& workdir);

// CheckOwnedWrites, then MakeWriteRuleset: what the executor calls for each attempt.
absl::StatusOr<int> ConfineOwnedWrites(const v1::JobSpec& spec, const std::string& storage_root,
                                       const std::string& workdir);

// Moves the calling process into a private mount namespace (mounts of the host still
// propagate in) and binds /dev/null over `path`. Call before any thread starts (a thread
// started earlier stays in the old namespace). FAILED_PRECONDITION without the privilege to
// unshare the mount namespace (then use MakeJobRuleset's file rules); NOT_FOUND when `path`
// does not exist.
absl::Status HideFileFromJobs(const std::string& path);

// Removes `name` from the environment and first overwrites its value in the process's
// original environment block (which /proc/PID/environ keeps showing after unsetenv).
// Returns the value; "" when it was not set. Call before any thread starts.
std::string TakeEnvironmentSecret(const char* name);

}  // namespace stemma::worker
