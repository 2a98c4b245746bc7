// The child side of an attempt's spawn: what runs between fork (or vfork) and execve. It
// works only on a ChildPlan prepared before the fork (spawn_plan.h), and makes only
// async-signal-safe calls (signal-safety(7)) and raw system calls (prctl, close_range): no
// allocation, no std::string, no locks, no logging, nothing that writes memory the parent
// uses (after vfork the two share it) except errno.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace stemma::worker {

struct ChildPlan {
  // execve's program, argv and envp (null-terminated). Unused for a noop child.
  const char* path = nullptr;
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  const char* workdir = nullptr;  // chdir target
  int stdin_fd = -1;              // becomes fd 0; -1: fd 0 is left as the worker has it
  int out_fd = -1;                // becomes fds 1 and 2 (the write end of the output pipe)
  pid_t parent = 0;               // the worker's pid: the child exits if it is orphaned
  // A noop child sleeps noop_ms and exits with noop_exit & 0xff; it never execs, so every
  // signal handler is reset first (it lives on as a copy of the worker).
  bool noop = false;
  int64_t noop_ms = 0;
  int noop_exit = 0;
  // >= 0: a Landlock rule set (job_confinement.h) the child restricts itself to, with
  // no_new_privs, before execve; when that fails it writes confine_error and exits 126.
  int ruleset_fd = -1;
  // >= 0: a second rule set, the attempt's own (what its owner may write:
  // job_confinement.h MakeWriteRuleset), applied the same way after the first.
  int write_ruleset_fd = -1;
  const char* confine_error = nullptr;
  size_t confine_error_len = 0;
  // Otherwise these signals (those the worker ignores) are reset before execve.
  const int* reset_signals = nullptr;
  size_t reset_signal_count = 0;
  // Written to fd 2 when chdir fails (exit 126), and when execve fails before the errno's
  // text and a newline (exit 127).
  const char* chdir_error = nullptr;
  size_t chdir_error_len = 0;
  const char* exec_error = nullptr;
  size_t exec_error_len = 0;
};

// Runs in the child: process group, parent-death signal, fds, working directory, then
// execve (or the noop sleep). Never returns. Signals must arrive blocked; they are unblocked
// only after the handlers are reset, so no handler of the worker runs in the child.
[[noreturn]] void RunChild(const ChildPlan& plan);

// The text of each errno value, looked up once before any fork (strerror and friends are not
// async-signal-safe). Call it once in the parent before the first RunChild; thread-safe.
void PrepareErrnoTexts();

}  // namespace stemma::worker
