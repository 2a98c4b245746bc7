// The executor's private parts, shared by executor.cc (attempts, directories, queries)
// and executor_process.cc (spawning, output, reaping, timers). Not a public header: only
// those two files include it.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stemma/v1/worker_service.pb.h"
#include "worker/attempt_output.h"
#include "worker/executor.h"
#include "worker/spawn_plan.h"

namespace stemma::worker {

// One process of an attempt: its pid, output pipe and log. An attempt is its first process
// (local rank 0, whose output is parsed for events); a part of several ranks keeps the others
// in Attempt::more, and their output only goes to their logs.
struct RankProcess {
  RankProcess() = default;
  RankProcess(const RankProcess&) = delete;
  RankProcess& operator=(const RankProcess&) = delete;
  // The log stays open after the attempt finishes: a recycled directory passes it on.
  ~RankProcess() {
    if (log_fd >= 0) close(log_fd);
  }

  int local_rank = 0;
  pid_t pid = 0;
  int pidfd = -1;
  int out_fd = -1;  // read end of the child's stdout+stderr pipe
  int log_fd = -1;
  uint64_t pid_token = 0;
  uint64_t out_token = 0;
  std::string log_path;
  int64_t log_bytes = 0;
  bool log_write_failed = false;
  // The log's last bytes, [log_bytes - log_tail.size(), log_bytes), for the session to ship
  // without opening the file (LogSince).
  std::string log_tail;
  bool reaped = false;  // exited and waited for
};

struct Executor::Attempt : RankProcess {
  std::string id;
  std::string job_id;
  int32_t rank = 0;
  std::vector<int32_t> gpu_ids;
  int64_t timeout_ms = 0;
  std::unique_ptr<SpawnPlan> plan;  // until a spawner takes it
  bool spawning = false;            // a spawner is forking it (pid still 0); it will not be erased
  // Local ranks 1.. of a part of several ranks: their plans until a spawner takes them, then
  // their processes (forked together with the first).
  std::vector<std::unique_ptr<SpawnPlan>> more_plans;
  std::vector<std::unique_ptr<RankProcess>> more;
  // The first rank that failed while the others ran ("rank 2: exit 1"), its exit code and
  // whether a retry may help; the attempt ends with it once every rank is reaped.
  std::string rank_failure;
  int rank_failure_code = 0;
  bool rank_failure_retryable = true;

  // The process with local rank `local` (0: this one); null if there is none.
  RankProcess* Local(int local) {
    if (local == 0) return this;
    return local - 1 < static_cast<int>(more.size()) ? more[local - 1].get() : nullptr;
  }
  const RankProcess* Local(int local) const { return const_cast<Attempt*>(this)->Local(local); }
  // The process an epoll token (out_token, pid_token) belongs to; null if none.
  RankProcess* ProcessOfToken(uint64_t token) {
    if (out_token == token || pid_token == token) return this;
    for (auto& p : more) {
      if (p->out_token == token || p->pid_token == token) return p.get();
    }
    return nullptr;
  }
  // Every process: this one, then the others.
  template <typename F>
  void ForEachProcess(F&& f) {
    f(static_cast<RankProcess&>(*this));
    for (auto& p : more) f(*p);
  }

  int64_t deadline_ms = 0;         // monotonic; 0: no timeout
  int64_t start_notify_ms = 0;     // monotonic; 0: the start needs no (more) signal
  int64_t progress_notify_ms = 0;  // monotonic; 0: no progress waiting to be signalled
  int64_t kill_at_ms = 0;          // monotonic; 0: no SIGKILL scheduled
  bool terminating = false;
  std::string term_reason;
  std::string term_result;
  bool term_retryable = false;
  bool discard = false;

  bool finished = false;
  v1::AttemptEvent::Finished result;

  // An exec job with declared outputs (exec_outputs.h), first part only: its spec, for the
  // collector thread to check and manifest the outputs once every rank exited 0.
  std::unique_ptr<v1::JobSpec> exec_spec;
  bool collecting = false;       // queued for or in the collector; finished by it
  int64_t launched_wall_ms = 0;  // when Launch took it (wall clock)

  // What its output said so far: progress, metric points, outputs, the engine's error line.
  AttemptOutput out;
  bool engine = false;  // an engine job: its exit codes follow common/engine_contract.h
  bool train = false;   // an engine train job: a preemption asks it to checkpoint and exit
  // Preemption (Executor::Preempt): the job that takes the resources ("" when none asked);
  // a rank of the part exited kExitPreempted.
  std::string preempted_by;
  bool rank_preempted = false;
};

namespace executor_internal {

inline constexpr size_t kReadChunk = 64 * 1024;
// How much of each attempt's log is kept in memory for shipping: a session that falls further
// behind reads the file.
inline constexpr size_t kLogTailBytes = 256 * 1024;

inline constexpr uint64_t kWakeToken = 0;
inline constexpr int64_t kLingerPollMs = 50;
inline constexpr int64_t kStartNotifyDelayMs = 2;
// Progress (and the metric points read with it) is signalled at most this often per attempt,
// and with the finish if that comes first: a short job's progress, points and end then leave
// in one session round and reach the coordinator as one pass, a trainer's steps in one round
// per 20 ms at most.
inline constexpr int64_t kProgressNotifyDelayMs = 20;
// Spawner threads. Two keep both cores of a small node busy with children's exec; more
// add little, since a spawn costs CPU, not just waiting.
inline constexpr int kSpawners = 2;
inline constexpr int64_t kLingerGiveUpMs = 30'000;

// Bytes just written to the attempt's log: counts them and keeps the log's tail.
void NoteLogged(std::string& tail, int64_t& log_bytes, const char* data, size_t n);
// write(2) until done or an error other than EINTR.
void WriteAll(int fd, const char* data, size_t n);

}  // namespace executor_internal
}  // namespace stemma::worker
