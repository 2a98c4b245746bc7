// Child processes for `stemma up`: start a binary with its output in a log file, poll it,
// signal it, stop it. POSIX (Linux) only. Not thread-safe; one supervisor thread owns all.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace stemma::cli {

class ChildProcess {
 public:
  // Starts `path` with `args` (argv[1..]); stdout and stderr are appended to `log_path`,
  // stdin is /dev/null. The child gets `signal_mask` as its blocked set, its own process
  // group (so a terminal's Ctrl-C reaches only the supervisor) and SIGTERM when this
  // process dies. `name` is what messages call it ("coordinator", "worker w1").
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const std::string& name,
                                                             const std::string& path,
                                                             const std::vector<std::string>& args,
                                                             const std::string& log_path,
                                                             const sigset_t& signal_mask);

  // Reaps the child if it has exited (never blocks). True once it has exited.
  bool Poll();
  bool exited() const { return exited_; }
  // "exited with status 1", "was killed by signal 9"; empty while running.
  std::string ExitDescription() const;

  // SIGTERM, then SIGKILL if still running after `grace`. Blocks until reaped.
  void Stop(absl::Duration grace);
  // Sends `signal` if still running.
  void Signal(int signal);

  const std::string& name() const { return name_; }
  const std::string& log_path() const { return log_path_; }
  pid_t pid() const { return pid_; }

 private:
  ChildProcess(std::string name, std::string log_path, pid_t pid)
      : name_(std::move(name)), log_path_(std::move(log_path)), pid_(pid) {}

  std::string name_;
  std::string log_path_;
  pid_t pid_;
  bool exited_ = false;
  int wait_status_ = 0;
};

// Stops every child still running: SIGTERM to all, then SIGKILL to those left after `grace`.
void StopAll(const std::vector<ChildProcess*>& children, absl::Duration grace);

// `name` in the directory of /proc/self/exe, else on PATH; NOT_FOUND naming both places.
absl::StatusOr<std::string> FindSiblingBinary(const std::string& name);

// The last non-empty line of a file (at most 300 characters), or "" if none.
std::string LastLogLine(const std::string& path);

}  // namespace stemma::cli
