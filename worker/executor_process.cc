// The executor's process side: the spawner threads that fork attempts, the event loop that
// reads their output into logs, reaps them and fires their timers (executor.h).
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

#include "worker/attempt_output.h"
#include "worker/exec_outputs.h"
#include "worker/executor.h"
#include "worker/executor_internal.h"
#include "worker/spawn_child.h"
#include "worker/spawn_plan.h"
// Debian 12's <sys/pidfd.h> lacks __BEGIN_DECLS, so C++ would mangle pidfd_open.
extern "C" {
#include <sys/pidfd.h>
}
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/engine_contract.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "common/path_confinement.h"
#include "common/status.h"

extern char** environ;

namespace stemma::worker {

using executor_internal::kLingerGiveUpMs;
using executor_internal::kLingerPollMs;
using executor_internal::kProgressNotifyDelayMs;
using executor_internal::kReadChunk;
using executor_internal::kStartNotifyDelayMs;
using executor_internal::kWakeToken;
using executor_internal::NoteLogged;

namespace {

// The reason of an attempt that exited kExitPreempted: its checkpoint is saved.
std::string PreemptedReason(const std::string& preempted_by) {
  return absl::StrCat("preempted by ",
                      preempted_by.empty() ? std::string("a higher-priority job") : preempted_by,
                      ": checkpoint saved (exit ", engine_contract::kExitPreempted, ")");
}

// The text after the last "stemma-engine: error: " line in a log's tail; empty if none.
std::string LastEngineError(const std::string& tail) {
  const std::string_view prefix = engine_contract::kErrorPrefix;
  size_t at = tail.size();
  while (at > 0) {
    at = tail.rfind(prefix.data(), at - 1, prefix.size());
    if (at == std::string::npos) return "";
    if (at == 0 || tail[at - 1] == '\n') {
      const size_t from = at + prefix.size();
      const size_t end = tail.find('\n', from);
      return tail.substr(from, end == std::string::npos ? std::string::npos : end - from);
    }
  }
  return "";
}

// A child forked from a sealed plan: its pid, pidfd and the read end of its output pipe.
struct Forked {
  pid_t pid = -1;
  int pidfd = -1;
  int out_fd = -1;
};

// Forks `plan`'s child; "" or why not ("worker error: ...").
std::string ForkChild(const SpawnPlan& plan, Forked* forked) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::StrCat("worker error: pipe: ", strerror(errno));
  static const pid_t parent = getpid();  // a process's pid never changes
  // exec jobs start with vfork: the child borrows the worker's memory until execve, so
  // no page tables are copied and torn down for every attempt (fork + exit of the copy
  // cost about half of the worker's CPU per job). noop children outlive that moment, so
  // they need a real fork.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  // The child's plan, completed on this stack before the fork: the child only reads it.
  ChildPlan child = plan.child();
  child.out_fd = fds[1];
  child.parent = parent;
  const pid_t pid = plan.noop ? fork() : vfork();
  if (pid == 0) RunChild(child);
  const int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return absl::StrCat("worker error: fork: ", strerror(fork_errno));
  }
  // Also done in the child; whichever runs first wins the race. After vfork the child
  // has run it already (and exec'd, so the call here would fail with EACCES).
  if (plan.noop) setpgid(pid, pid);
  fcntl(fds[0], F_SETFL, O_RDONLY | O_NONBLOCK);  // already O_CLOEXEC (pipe2)
  const int pidfd = pidfd_open(pid, 0);
  if (pidfd < 0) {
    const int err = errno;
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    close(fds[0]);
    return absl::StrCat("worker error: pidfd_open: ", strerror(err));
  }
  *forked = Forked{pid, pidfd, fds[0]};
  return "";
}

// Undoes a ForkChild whose attempt cannot start after all (a later rank failed to fork).
void KillForked(const Forked& f) {
  kill(-f.pid, SIGKILL);
  kill(f.pid, SIGKILL);
  int status;
  while (waitpid(f.pid, &status, 0) < 0 && errno == EINTR) {
  }
  close(f.pidfd);
  close(f.out_fd);
}

}  // namespace

void Executor::SignalAll(Attempt& a, int sig) {
  a.ForEachProcess([&](RankProcess& p) {
    if (p.pid > 0 && !p.reaped) kill(-p.pid, sig);
  });
}

void Executor::SpawnLoop() {
  mu_.Lock();
  for (;;) {
    while (!stop_spawners_ && to_spawn_.empty()) spawn_cv_.Wait(&mu_);
    if (stop_spawners_) break;
    const std::string id = std::move(to_spawn_.front());
    to_spawn_.pop_front();
    auto it = attempts_.find(id);
    if (it == attempts_.end() || it->second->finished || !it->second->plan) continue;
    Attempt& a = *it->second;
    a.spawning = true;
    std::vector<std::unique_ptr<SpawnPlan>> plans;
    plans.push_back(std::move(a.plan));
    for (auto& more : a.more_plans) plans.push_back(std::move(more));
    a.more_plans.clear();
    mu_.Unlock();  // forking takes a while (a vfork parent waits for the child's execve)
    Spawn(a, std::move(plans));
    mu_.Lock();
  }
  mu_.Unlock();
}

void Executor::Loop() {
  epoll_event events[32];
  for (;;) {
    int timeout;
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_ && lingering_.empty() &&
          std::none_of(attempts_.begin(), attempts_.end(),
                       [](const auto& kv) { return !kv.second->finished; })) {
        return;
      }
      const int64_t now = clock_->MonoMs();
      int64_t next = NextTimerMsLocked(now);
      if (!lingering_.empty() && (next < 0 || next > kLingerPollMs)) next = kLingerPollMs;
      timeout = next < 0 ? -1 : static_cast<int>(std::min<int64_t>(next, 60'000));
      loop_wake_ms_ = timeout < 0 ? -1 : now + timeout;
    }
    int n = epoll_wait(epoll_fd_, events, 32, timeout);
    if (n < 0) {
      if (errno != EINTR) spdlog::error("executor: epoll_wait: {}", strerror(errno));
      n = 0;
    }
    bool notify = false;
    // Output is read and logged outside the lock (the session's Snapshot and the spawners
    // would wait on it): only this thread reads an attempt's pipe, writes its log, and ends an
    // attempt that has a pipe, so the attempt stays put until the lock is taken again.
    std::vector<OutputRead> reads;
    std::vector<uint64_t> exits;
    {
      absl::MutexLock lock(&mu_);
      for (int i = 0; i < n; ++i) {
        const uint64_t token = events[i].data.u64;
        if (token == kWakeToken) {
          uint64_t count;
          ssize_t ignored = read(wake_fd_, &count, sizeof count);
          (void)ignored;
          continue;
        }
        auto owner = tokens_.find(token);
        if (owner == tokens_.end()) continue;
        auto it = attempts_.find(owner->second);
        if (it == attempts_.end()) continue;
        Attempt& a = *it->second;
        RankProcess* p = a.ProcessOfToken(token);
        if (p == nullptr) continue;
        if (token == p->out_token && p->out_fd >= 0) {
          reads.push_back(OutputRead{&a, p, p->out_fd, p->log_fd});
        } else if (token == p->pid_token) {
          exits.push_back(token);
        }
      }
    }
    for (OutputRead& r : reads) ReadOutput(r);
    {
      absl::MutexLock lock(&mu_);
      for (const OutputRead& r : reads) ApplyOutputLocked(r);
      for (const uint64_t token : exits) {
        auto owner = tokens_.find(token);
        if (owner == tokens_.end()) continue;
        auto it = attempts_.find(owner->second);
        if (it == attempts_.end()) continue;
        RankProcess* p = it->second->ProcessOfToken(token);
        if (p == nullptr || p->pid_token != token) continue;
        ReapLocked(*it->second, *p);
        notify |= it->second->finished;
      }
      notify |= FireTimersLocked(clock_->MonoMs());
      ReapLingeringLocked(clock_->MonoMs());
      for (auto it = attempts_.begin(); it != attempts_.end();) {
        if (it->second->finished && it->second->discard) {
          it = attempts_.erase(it);
        } else {
          ++it;
        }
      }
      UpdateGaugesLocked();
    }
    if (notify) Notify();
  }
}

void Executor::Spawn(Attempt& a, std::vector<std::unique_ptr<SpawnPlan>> plans) {
  // `a` stays put while a.spawning: attempts are erased only once finished, and only this
  // thread finishes a spawning attempt.
  auto fail = [&](const std::string& why) {
    {
      absl::MutexLock lock(&mu_);
      a.spawning = false;
      if (a.terminating) {  // cancelled meanwhile: it ends the way it was asked to
        FinishLocked(a, -1, a.term_reason, a.term_result, a.term_retryable);
      } else {
        FinishLocked(a, -1, why, "failed", true);
      }
    }
    // The executor thread may be waiting for this attempt to end (Shutdown), or may have
    // to drop it (Discard): let it look again.
    WakeLoop();
    Notify();
  };
  // Every rank of the part, or none.
  std::vector<Forked> forked;
  for (const auto& plan : plans) {
    Forked f;
    const std::string error = ForkChild(*plan, &f);
    if (!error.empty()) {
      for (const Forked& done : forked) KillForked(done);
      fail(error);
      return;
    }
    forked.push_back(f);
  }
  spdlog::info("attempt started: job={} attempt={} rank={} pid={} kind={} processes={}", a.job_id,
               a.id, a.rank, forked[0].pid, plans[0]->noop ? "noop" : plans[0]->path,
               forked.size());

  bool wake;
  {
    absl::MutexLock lock(&mu_);
    a.spawning = false;
    for (size_t i = 0; i < forked.size(); ++i) {
      RankProcess& p = *a.Local(static_cast<int>(i));
      p.pid = forked[i].pid;
      p.out_fd = forked[i].out_fd;
      p.pidfd = forked[i].pidfd;
      p.out_token = next_token_++;
      p.pid_token = next_token_++;
      tokens_[p.out_token] = a.id;
      tokens_[p.pid_token] = a.id;
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = p.out_token;
      epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, p.out_fd, &ev);
      ev.data.u64 = p.pid_token;
      epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, p.pidfd, &ev);
    }
    const int64_t now = clock_->MonoMs();
    if (a.timeout_ms > 0) a.deadline_ms = now + a.timeout_ms;
    // A start is signalled kStartNotifyDelayMs later, or with the finish if that comes
    // first: a short job then costs the session one round (one wake-up, one write, one
    // event batch at the coordinator) instead of two.
    a.start_notify_ms = now + kStartNotifyDelayMs;
    int64_t due = a.start_notify_ms;
    if (a.deadline_ms > 0) due = std::min(due, a.deadline_ms);
    if (a.terminating) {  // cancelled while it was being forked
      SignalAll(a, SIGTERM);
      a.kill_at_ms = now + std::max<int64_t>(0, config_.kill_grace_ms);
      due = std::min(due, a.kill_at_ms);
    }
    // The executor thread computes its next timeout from every attempt's timers whenever
    // it goes back to epoll_wait: wake it only if it would sleep past this one.
    wake = loop_wake_ms_ < 0 || loop_wake_ms_ > due;
  }
  if (wake) WakeLoop();
}

void Executor::ReadOutput(OutputRead& r) {
  char buf[kReadChunk];
  // Bounded reads per wakeup keep one chatty child from starving the others.
  for (int i = 0; i < 4; ++i) {
    const ssize_t n = read(r.out_fd, buf, sizeof buf);
    if (n > 0) {
      if (r.log_fd >= 0 && r.write_errno == 0) {
        size_t done = 0;
        while (done < static_cast<size_t>(n)) {
          const ssize_t w = write(r.log_fd, buf + done, static_cast<size_t>(n) - done);
          if (w < 0 && errno == EINTR) continue;
          if (w <= 0) {
            r.write_errno = w < 0 ? errno : EIO;
            break;
          }
          done += static_cast<size_t>(w);
        }
        r.logged += static_cast<int64_t>(done);
      }
      r.data.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      r.would_block = true;
      return;
    }
    r.eof = true;  // EOF: every writer is gone
    return;
  }
}

void Executor::ApplyOutputLocked(const OutputRead& r) {
  Attempt& a = *r.attempt;
  RankProcess& p = *r.process;
  const uint64_t before = a.out.progress_version;
  NoteLogged(p.log_tail, p.log_bytes, r.data.data(), static_cast<size_t>(r.logged));
  if (r.write_errno != 0 && !p.log_write_failed) {
    spdlog::error("attempt={} log write to {} failed: {}", a.id, p.log_path,
                  strerror(r.write_errno));
    p.log_write_failed = true;
  }
  // The job's events come from its first rank; the others' output is only logged.
  if (!r.data.empty() && &p == &a) a.out.Feed(r.data.data(), r.data.size(), clock_->WallMs());
  if (a.out.progress_version != before && a.progress_notify_ms == 0) {
    a.progress_notify_ms = clock_->MonoMs() + kProgressNotifyDelayMs;
  }
  if (r.eof) CloseOutputLocked(p);
}

void Executor::DrainOutputLocked(Attempt& a, RankProcess& p) {
  while (p.out_fd >= 0) {
    OutputRead r{&a, &p, p.out_fd, p.log_fd};
    ReadOutput(r);
    ApplyOutputLocked(r);
    if (r.would_block) return;
  }
}

void Executor::CloseOutputLocked(RankProcess& p) {
  if (p.out_fd < 0) return;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, p.out_fd, nullptr);
  close(p.out_fd);
  p.out_fd = -1;
  tokens_.erase(p.out_token);
}

void Executor::ReapLocked(Attempt& a, RankProcess& p) {
  // The leader is a zombie now, so its process group id cannot be reused yet: clear out
  // whatever it left behind in the group before reaping it.
  siginfo_t info{};
  if (waitid(P_PID, p.pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == 0) {
    return;  // still alive (spurious wakeup)
  }
  kill(-p.pid, SIGKILL);
  int status = 0;
  pid_t r;
  do {
    r = waitpid(p.pid, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, p.pidfd, nullptr);
  close(p.pidfd);
  p.pidfd = -1;
  tokens_.erase(p.pid_token);
  DrainOutputLocked(a, p);
  CloseOutputLocked(p);
  lingering_[p.pid] = clock_->MonoMs() + kLingerGiveUpMs;
  p.reaped = true;

  int code = -1;
  std::string reason = "exit status unknown";
  if (r > 0 && WIFEXITED(status)) {
    code = WEXITSTATUS(status);
    reason = absl::StrCat("exit ", code);
  } else if (r > 0 && WIFSIGNALED(status)) {
    code = 128 + WTERMSIG(status);
    reason = absl::StrCat("killed by signal ", WTERMSIG(status));
  }
  if (!a.more.empty()) {
    RankEndedLocked(a, p, code, reason);
    return;
  }
  if (a.terminating) {
    FinishLocked(a, code, a.term_reason, a.term_result, a.term_retryable);
  } else if (a.engine && code == engine_contract::kExitPreempted) {
    FinishLocked(a, code, PreemptedReason(a.preempted_by), "preempted", /*retryable=*/true);
  } else if (a.engine && code == engine_contract::kExitBadInput) {
    // A bad spec or bad input fails the same way every time: no retry, and the engine's own
    // words in the job's reason.
    FinishLocked(
        a, code,
        absl::StrCat("bad input: ", a.out.engine_error.empty() ? reason : a.out.engine_error),
        "failed", /*retryable=*/false);
  } else {
    if (code != 0 && !a.out.engine_error.empty())
      absl::StrAppend(&reason, ": ", a.out.engine_error);
    if (code == 0 && CollectLocked(a)) return;
    FinishLocked(a, code, reason, code == 0 ? "succeeded" : "failed", code != 0);
  }
}

void Executor::RankEndedLocked(Attempt& a, RankProcess& p, int code, const std::string& reason) {
  const int ranks = 1 + static_cast<int>(a.more.size());
  const int global = a.rank * ranks + p.local_rank;
  const bool preempted = a.engine && code == engine_contract::kExitPreempted;
  a.rank_preempted |= preempted;
  if (code != 0 && !preempted && a.rank_failure.empty() && !a.terminating) {
    const std::string error = &p == &a ? a.out.engine_error : LastEngineError(p.log_tail);
    a.rank_failure_code = code;
    if (a.engine && code == engine_contract::kExitBadInput) {
      // As for one process: no retry, and the engine's own words.
      a.rank_failure =
          absl::StrCat("bad input: rank ", global, ": ", error.empty() ? reason : error);
      a.rank_failure_retryable = false;
    } else {
      a.rank_failure = absl::StrCat("rank ", global, ": ", reason);
      if (!error.empty()) absl::StrAppend(&a.rank_failure, ": ", error);
    }
    // One rank's failure ends the part: the others would wait for it in their collectives.
    spdlog::info("attempt rank failed: job={} attempt={} {}; stopping the other ranks", a.job_id,
                 a.id, a.rank_failure);
    SignalAll(a, SIGTERM);
    a.kill_at_ms = clock_->MonoMs() + std::max<int64_t>(0, config_.kill_grace_ms);
  }
  bool all_reaped = true;
  a.ForEachProcess([&](RankProcess& q) { all_reaped &= q.reaped; });
  if (!all_reaped) return;
  a.kill_at_ms = 0;
  if (!a.rank_failure.empty()) {
    FinishLocked(a, a.rank_failure_code, a.rank_failure, "failed", a.rank_failure_retryable);
  } else if (a.terminating) {
    FinishLocked(a, code, a.term_reason, a.term_result, a.term_retryable);
  } else if (a.rank_preempted) {
    FinishLocked(a, engine_contract::kExitPreempted, PreemptedReason(a.preempted_by), "preempted",
                 true);
  } else if (!CollectLocked(a)) {
    FinishLocked(a, 0, "exit 0", "succeeded", false);
  }
}

bool Executor::CollectLocked(Attempt& a) {
  if (a.exec_spec == nullptr || a.collecting) return false;
  a.collecting = true;
  to_collect_.push_back(a.id);
  collect_cv_.Signal();
  return true;
}

void Executor::CollectLoop() {
  mu_.Lock();
  for (;;) {
    while (!stop_collector_ && to_collect_.empty()) collect_cv_.Wait(&mu_);
    if (stop_collector_) break;
    const std::string id = std::move(to_collect_.front());
    to_collect_.pop_front();
    auto it = attempts_.find(id);
    if (it == attempts_.end() || it->second->finished) continue;
    // Stays put: an attempt is erased only once finished, and only this thread finishes it.
    Attempt& a = *it->second;
    const v1::JobSpec spec = *a.exec_spec;
    const std::string job_id = a.job_id;
    const int64_t started_ms = a.launched_wall_ms;
    mu_.Unlock();
    ExecOutputs outs = CollectExecOutputs(spec, job_id, id, config_.storage_root,
                                          absl::StrCat(attempts_dir_, "/", id), started_ms);
    mu_.Lock();
    if (a.terminating) {  // cancelled, timed out or shut down meanwhile
      FinishLocked(a, 0, a.term_reason, a.term_result, a.term_retryable);
    } else if (!outs.error.empty()) {
      const std::string line = absl::StrCat("stemma-worker: ", outs.error, "\n");
      if (a.log_fd >= 0) {
        executor_internal::WriteAll(a.log_fd, line.data(), line.size());
        NoteLogged(a.log_tail, a.log_bytes, line.data(), line.size());
      }
      // The program's fault, and the same every time: no retry.
      FinishLocked(a, 1, absl::StrCat("exit 0, but ", outs.error), "failed", false);
    } else {
      for (v1::OutputArtifact& art : outs.artifacts) {
        a.out.outputs[art.name()] = art.path();
        auto& arts = a.out.artifacts;
        arts.erase(
            std::remove_if(arts.begin(), arts.end(),
                           [&](const v1::OutputArtifact& o) { return o.name() == art.name(); }),
            arts.end());
        arts.push_back(std::move(art));
      }
      const int64_t now = clock_->WallMs();
      for (ResultPoint& p : outs.points) {
        if (a.out.metrics.size() >= AttemptOutput::kMaxMetricPoints) break;
        a.out.metrics.Add(p.name, p.value, 0, now);
        a.out.metrics.SetLastLabels(std::move(p.labels));
      }
      FinishLocked(a, 0, "exit 0", "succeeded", false);
    }
    mu_.Unlock();
    WakeLoop();  // the executor thread may be waiting for it to end (Shutdown, Discard)
    Notify();
    mu_.Lock();
  }
  mu_.Unlock();
}

void Executor::TerminateLocked(Attempt& a, const std::string& reason, const std::string& result,
                               bool retryable) {
  if (a.finished) return;
  if (a.pid == 0 && !a.spawning) {  // not forked yet: never start it
    a.plan.reset();
    FinishLocked(a, -1, reason, result, retryable);
    return;
  }
  // The first reason wins (a timeout, then a cancel; a rank's failure, then anything).
  if (a.terminating || !a.rank_failure.empty()) return;
  a.terminating = true;
  a.term_reason = reason;
  a.term_result = result;
  a.term_retryable = retryable;
  if (a.pid == 0) return;  // being forked: its spawner sends SIGTERM once it has a pid
  SignalAll(a, SIGTERM);
  a.kill_at_ms = clock_->MonoMs() + std::max<int64_t>(0, config_.kill_grace_ms);
  spdlog::info("attempt terminating: job={} attempt={} reason=\"{}\"", a.job_id, a.id, reason);
  WakeLoop();
}

void Executor::FinishLocked(Attempt& a, int exit_code, const std::string& reason,
                            const std::string& result, bool retryable) {
  a.finished = true;
  a.result.set_exit_code(exit_code);
  a.result.set_reason(reason);
  a.result.set_retryable(retryable);
  a.result.set_preempted(result == "preempted");
  for (const auto& [name, path] : a.out.outputs) (*a.result.mutable_outputs())[name] = path;
  if (exit_code == 0) {
    for (const v1::OutputArtifact& art : a.out.artifacts) *a.result.add_artifacts() = art;
  }
  if (a.out.metrics_dropped > 0) {
    spdlog::warn("attempt {}: {} metric points past the first {} were not kept", a.id,
                 a.out.metrics_dropped, AttemptOutput::kMaxMetricPoints);
  }
  if (metrics_ != nullptr && !result.empty()) metrics_->AttemptFinished(result);
  spdlog::info("attempt finished: job={} attempt={} reason=\"{}\" exit_code={} log_bytes={}",
               a.job_id, a.id, reason, exit_code, a.log_bytes);
  UpdateGaugesLocked();
  changed_.SignalAll();
}

int64_t Executor::NextTimerMsLocked(int64_t now) {
  int64_t next = -1;
  auto consider = [&](int64_t at) {
    if (at <= 0) return;
    const int64_t in = std::max<int64_t>(0, at - now);
    if (next < 0 || in < next) next = in;
  };
  for (const auto& [id, a] : attempts_) {
    if (a->finished || a->pid == 0) continue;
    if (!a->terminating) consider(a->deadline_ms);
    consider(a->kill_at_ms);
    consider(a->start_notify_ms);
    consider(a->progress_notify_ms);
  }
  return next;
}

bool Executor::FireTimersLocked(int64_t now) {
  bool started = false;
  for (auto& [id, a] : attempts_) {
    if (a->finished || a->pid == 0) continue;
    if (a->start_notify_ms > 0 && now >= a->start_notify_ms) {
      a->start_notify_ms = 0;
      started = true;
    }
    if (a->progress_notify_ms > 0 && now >= a->progress_notify_ms) {
      a->progress_notify_ms = 0;
      started = true;
    }
    if (!a->terminating && a->deadline_ms > 0 && now >= a->deadline_ms) {
      TerminateLocked(*a, absl::StrCat("timeout after ", a->timeout_ms, " ms"), "timeout", true);
    }
    if (a->kill_at_ms > 0 && now >= a->kill_at_ms) {
      SignalAll(*a, SIGKILL);
      a->kill_at_ms = 0;
    }
  }
  return started;
}

void Executor::ReapLingeringLocked(int64_t now) {
  for (auto it = lingering_.begin(); it != lingering_.end();) {
    const pid_t pgid = it->first;
    int status;
    while (waitpid(-pgid, &status, WNOHANG) > 0) {
    }
    const bool gone = kill(-pgid, 0) != 0 && errno == ESRCH;
    if (gone || now >= it->second) {
      if (!gone) spdlog::warn("executor: process group {} still has members; giving up", pgid);
      it = lingering_.erase(it);
    } else {
      ++it;
    }
  }
}

void Executor::UpdateGaugesLocked() {
  if (metrics_ == nullptr) return;
  int running = 0;
  std::set<int32_t> gpus;
  for (const auto& [id, a] : attempts_) {
    if (a->finished) continue;
    ++running;
    gpus.insert(a->gpu_ids.begin(), a->gpu_ids.end());
  }
  metrics_->SetAttemptsRunning(running);
  metrics_->SetGpusInUse(static_cast<int>(gpus.size()));
}

}  // namespace stemma::worker
