#include "worker/executor.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

#include "worker/attempt_output.h"
#include "worker/engine_binary.h"
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

struct Executor::Attempt {
  Attempt() = default;
  Attempt(const Attempt&) = delete;
  Attempt& operator=(const Attempt&) = delete;
  // The log stays open after the attempt finishes: a recycled directory passes it on.
  ~Attempt() {
    if (log_fd >= 0) close(log_fd);
  }

  std::string id;
  std::string job_id;
  int32_t rank = 0;
  std::vector<int32_t> gpu_ids;
  int64_t timeout_ms = 0;
  std::unique_ptr<SpawnPlan> plan;  // until a spawner takes it
  bool spawning = false;            // a spawner is forking it (pid still 0); it will not be erased

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

  // What its output said so far: progress, metric points, outputs, the engine's error line.
  AttemptOutput out;
  bool engine = false;  // an engine job: its exit codes follow common/engine_contract.h
};

namespace {

constexpr size_t kReadChunk = 64 * 1024;
// How much of each attempt's log is kept in memory for shipping: a session that falls further
// behind reads the file.
constexpr size_t kLogTailBytes = 256 * 1024;

// Bytes just written to the attempt's log.
void NoteLogged(std::string& tail, int64_t& log_bytes, const char* data, size_t n) {
  log_bytes += static_cast<int64_t>(n);
  if (n >= kLogTailBytes) {
    tail.assign(data + (n - kLogTailBytes / 2), kLogTailBytes / 2);
    return;
  }
  if (tail.size() + n > kLogTailBytes) tail.erase(0, tail.size() + n - kLogTailBytes / 2);
  tail.append(data, n);
}
constexpr uint64_t kWakeToken = 0;
constexpr int64_t kLingerPollMs = 50;
constexpr int64_t kStartNotifyDelayMs = 2;
// Progress (and the metric points read with it) is signalled at most this often per attempt,
// and with the finish if that comes first: a short job's progress, points and end then leave
// in one session round and reach the coordinator as one pass, a trainer's steps in one round
// per 20 ms at most.
constexpr int64_t kProgressNotifyDelayMs = 20;
// Spawner threads. Two keep both cores of a small node busy with children's exec; more
// add little, since a spawn costs CPU, not just waiting.
constexpr int kSpawners = 2;
constexpr int64_t kLingerGiveUpMs = 30'000;

// Whether `path` is an executable regular file (the PATH lookups).
bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

void WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    data += w;
    n -= static_cast<size_t>(w);
  }
}

absl::Status WriteFile(const std::string& path, const std::string& data) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("open " + path, errno);
  WriteAll(fd, data.data(), data.size());
  if (close(fd) != 0) return ErrnoStatus("close " + path, errno);
  return absl::OkStatus();
}

// Signals this process ignores, read once (after gRPC set SIGPIPE to ignored), plus SIGPIPE
// in any case.
const std::vector<int>& IgnoredSignals() {
  static const std::vector<int> ignored = [] {
    std::vector<int> out = {SIGPIPE};
    for (int sig = 1; sig < NSIG; ++sig) {
      struct sigaction sa;
      if (sig != SIGPIPE && sigaction(sig, nullptr, &sa) == 0 && sa.sa_handler == SIG_IGN) {
        out.push_back(sig);
      }
    }
    return out;
  }();
  return ignored;
}

// The worker's environment: name -> "NAME=value".
std::map<std::string, std::string> WorkerEnv() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    absl::string_view kv(*e);
    size_t eq = kv.find('=');
    if (eq == absl::string_view::npos || eq == 0) continue;
    env[std::string(kv.substr(0, eq))] = std::string(kv);
  }
  return env;
}

}  // namespace

Executor::Executor(const WorkerConfig& config, Metrics* metrics, Clock* clock)
    : config_(config),
      clock_(clock != nullptr ? clock : RealClock::Get()),
      attempts_dir_(std::filesystem::absolute(config.data_dir).lexically_normal().string() +
                    "/attempts"),
      metrics_(metrics),
      worker_env_(WorkerEnv()) {
  PrepareErrnoTexts();  // the child's exec error text is looked up, not formatted
  devnull_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);  // -1: children get no stdin
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    // Without them the worker cannot run anything: a broken environment, not bad input.
    spdlog::critical("executor: epoll/eventfd: {}", strerror(errno));
    std::abort();
  }
  // Children that an attempt's leader leaves behind are orphaned when it exits; as their
  // subreaper this process gets them (instead of an init that may never reap them, as in
  // some containers) and reaps them by process group (ReapLingeringLocked).
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    spdlog::warn("executor: PR_SET_CHILD_SUBREAPER: {}", strerror(errno));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeToken;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  if (metrics_ != nullptr) {
    metrics_->SetAttemptsRunning(0);
    metrics_->SetGpusInUse(0);
  }
  thread_ = std::thread([this] { Loop(); });
  for (int i = 0; i < kSpawners; ++i) spawners_.emplace_back([this] { SpawnLoop(); });
  recycler_ = std::thread([this] { RecycleLoop(); });
}

Executor::~Executor() {
  Shutdown();
  for (const SpareDir& spare : spare_dirs_) close(spare.log_fd);
  for (const SpareDir& spare : to_recycle_) close(spare.log_fd);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (devnull_fd_ >= 0) close(devnull_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void Executor::SetChangeCallback(std::function<void()> callback) {
  absl::MutexLock lock(&callback_mu_);
  callback_ = std::move(callback);
}

void Executor::Notify() {
  // Called without mu_; holding callback_mu_ means that once SetChangeCallback(nullptr)
  // returns, the old callback is neither running nor about to run.
  absl::MutexLock lock(&callback_mu_);
  if (callback_) callback_();
}

void Executor::CheckTimers() { WakeLoop(); }

void Executor::WakeLoop() {
  uint64_t one = 1;
  ssize_t ignored = write(wake_fd_, &one, sizeof one);
  (void)ignored;
}

absl::Status Executor::Launch(const v1::Assignment& assignment) {
  const std::string& id = assignment.attempt_id();
  const v1::JobSpec& spec = assignment.spec();
  auto attempt = std::make_unique<Attempt>();
  attempt->id = id;
  attempt->job_id = assignment.job_id();
  attempt->rank = assignment.rank();
  attempt->gpu_ids.assign(assignment.gpu_ids().begin(), assignment.gpu_ids().end());
  attempt->engine = IsEngineJob(assignment.spec());
  attempt->timeout_ms = spec.timeout_ms();
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::FailedPreconditionError("executor is shutting down");
    if (attempts_.count(id) > 0) {
      return absl::AlreadyExistsError(absl::StrCat("attempt ", id, " is already known"));
    }
  }

  // Everything decided before the fork, by one pure function (spawn_plan.h).
  SpawnContext context;
  context.attempts_dir = attempts_dir_;
  context.worker_env = &worker_env_;
  if (attempt->engine) context.engine = FindEngine(config_.engine_path);
  context.ignored_signals = IgnoredSignals();
  context.devnull = devnull_fd_;
  context.is_executable = IsExecutableFile;
  std::unique_ptr<SpawnPlan> plan = PlanSpawn(assignment, config_, context);

  // Refusals and worker-side failures still produce a Finished event, never a silent drop.
  std::string refusal = plan->refusal;  // non-retryable: the spec cannot run here
  std::string failure;                  // retryable: something on this worker went wrong
  if (refusal.empty() && attempt->engine && !config_.storage_root.empty()) {
    // Every spec path inside the roots, before anything runs (common/path_confinement.h).
    absl::Status confined =
        CheckJobConfinement(spec, {config_.storage_root, config_.read_roots, {config_.data_dir}});
    if (!confined.ok()) refusal = absl::StrCat("refused: ", confined.message());
  }
  if (!plan->workdir.empty()) {
    // The attempt directory and its log, a recycled one if there is one: the log of a
    // refused attempt says why.
    const std::string& workdir = plan->workdir;
    std::error_code ec;
    std::optional<SpareDir> spare;
    {
      absl::MutexLock lock(&mu_);
      if (!spare_dirs_.empty()) {
        spare = std::move(spare_dirs_.back());
        spare_dirs_.pop_back();
      }
    }
    attempt->log_path = plan->log_path;
    if (spare && rename(spare->dir.c_str(), workdir.c_str()) == 0) {
      // The spare's log is open, empty (RecycleLoop) and now named workdir/log: no open.
      attempt->log_fd = spare->log_fd;
    } else {
      if (spare) close(spare->log_fd);
      std::filesystem::create_directories(workdir, ec);
    }
    if (ec) {
      failure = absl::StrCat("worker error: cannot create ", workdir, ": ", ec.message());
      attempt->log_path.clear();
    } else if (attempt->log_fd < 0) {
      attempt->log_fd = open(attempt->log_path.c_str(),
                             O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
      if (attempt->log_fd < 0) {
        failure =
            absl::StrCat("worker error: cannot open ", attempt->log_path, ": ", strerror(errno));
        attempt->log_path.clear();
      }
    }
  }
  if (!failure.empty()) refusal.clear();  // the directory failed first: retry elsewhere
  if (refusal.empty() && failure.empty()) {
    for (const SpawnPlan::File& file : plan->files) {
      absl::Status written = WriteFile(file.path, file.content);
      if (!written.ok()) {
        failure = absl::StrCat("worker error: ", written.message());
        break;
      }
    }
  }
  if (refusal.empty() && failure.empty()) {
    plan->Seal();
    attempt->plan = std::move(plan);
  }

  bool notify = false;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::FailedPreconditionError("executor is shutting down");
    if (attempts_.count(id) > 0) {
      return absl::AlreadyExistsError(absl::StrCat("attempt ", id, " is already known"));
    }
    Attempt& a = *attempt;
    attempts_[id] = std::move(attempt);
    if (!refusal.empty() || !failure.empty()) {
      const std::string& why = refusal.empty() ? failure : refusal;
      spdlog::warn("attempt not started: job={} attempt={} reason=\"{}\"", a.job_id, id, why);
      if (a.log_fd >= 0) {
        std::string line = absl::StrCat("stemma-worker: ", why, "\n");
        WriteAll(a.log_fd, line.data(), line.size());
        NoteLogged(a.log_tail, a.log_bytes, line.data(), line.size());
      }
      FinishLocked(a, -1, why, refusal.empty() ? "failed" : "refused", refusal.empty());
      notify = true;
    } else {
      to_spawn_.push_back(id);
      UpdateGaugesLocked();
    }
  }
  if (notify) {
    Notify();
  } else {
    spawn_cv_.Signal();
  }
  return absl::OkStatus();
}

void Executor::Cancel(const std::string& attempt_id, const std::string& reason) {
  bool notify = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = attempts_.find(attempt_id);
    if (it == attempts_.end() || it->second->finished) return;
    TerminateLocked(*it->second, reason.empty() ? "cancelled" : "cancelled: " + reason, "cancelled",
                    false);
    notify = it->second->finished;
  }
  if (notify) Notify();
}

void Executor::Discard(const std::string& attempt_id) {
  absl::MutexLock lock(&mu_);
  auto it = attempts_.find(attempt_id);
  if (it == attempts_.end()) return;
  it->second->discard = true;
  if (it->second->finished) {
    attempts_.erase(it);
    return;
  }
  TerminateLocked(*it->second, "cancelled: not kept by the coordinator", "cancelled", true);
  if (it->second->finished) attempts_.erase(it);
}

void Executor::Forget(const std::string& attempt_id) {
  std::unique_ptr<Attempt> gone;
  {
    absl::MutexLock lock(&mu_);
    auto it = attempts_.find(attempt_id);
    if (it != attempts_.end() && it->second->finished) {
      gone = std::move(it->second);
      attempts_.erase(it);
    }
    changed_.SignalAll();
  }
  // Outside the lock: looking into the directory takes a few system calls.
  if (gone) RecycleDir(*gone);
}

namespace {
constexpr size_t kMaxSpares = 64;
}  // namespace

void Executor::RecycleDir(Attempt& a) {
  if (a.log_path.empty() || a.log_fd < 0) return;
  absl::MutexLock lock(&mu_);
  if (stop_spawners_ || spare_dirs_.size() + to_recycle_.size() >= kMaxSpares) return;
  to_recycle_.push_back(
      SpareDir{absl::StrCat(attempts_dir_, "/", a.id), a.log_fd, a.log_bytes == 0});
  a.log_fd = -1;
  recycle_cv_.Signal();
}

size_t Executor::SpareDirs() const {
  absl::MutexLock lock(&mu_);
  return spare_dirs_.size();
}

void Executor::RecycleLoop() {
  mu_.Lock();
  for (;;) {
    while (!stop_spawners_ && to_recycle_.empty()) recycle_cv_.Wait(&mu_);
    if (stop_spawners_) break;
    SpareDir spare = std::move(to_recycle_.front());
    to_recycle_.pop_front();
    mu_.Unlock();
    const bool reusable = PrepareSpare(spare);
    mu_.Lock();
    if (reusable && spare_dirs_.size() < kMaxSpares) {
      spare_dirs_.push_back(std::move(spare));
    } else {
      close(spare.log_fd);
    }
  }
  mu_.Unlock();
}

bool Executor::PrepareSpare(SpareDir& spare) {
  // getdents64 on a plain descriptor: opendir adds an fstat and a 32 KiB buffer per call.
  const int fd = open(spare.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  alignas(dirent64) char buf[2048];
  bool only_log = true;
  for (;;) {
    const ssize_t n = getdents64(fd, buf, sizeof buf);
    if (n <= 0) {
      only_log &= n == 0;
      break;
    }
    for (ssize_t off = 0; off < n && only_log;) {
      const auto* e = reinterpret_cast<const dirent64*>(buf + off);
      absl::string_view name(e->d_name);
      only_log = name == "." || name == ".." || name == "log";
      off += e->d_reclen;
    }
    if (!only_log) break;
  }
  close(fd);
  if (!only_log) return false;  // the job left files: keep them for the user
  // Emptied here, off every attempt's path: freeing the blocks can wait for the disk (a
  // discard on a volume mounted with -o discard), which cost short jobs a fifth of their rate
  // when the next attempt's start did it.
  if (!spare.log_empty) {
    if (ftruncate(spare.log_fd, 0) != 0) return false;
    spare.log_empty = true;
  }
  return true;
}

void Executor::RecordLost(const std::string& attempt_id, int32_t rank, const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (attempts_.count(attempt_id) > 0) return;
    auto attempt = std::make_unique<Attempt>();
    attempt->id = attempt_id;
    attempt->rank = rank;
    Attempt& a = *attempt;
    attempts_[attempt_id] = std::move(attempt);
    FinishLocked(a, -1, reason, "", true);
  }
  Notify();
}

std::vector<AttemptSnapshot> Executor::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<AttemptSnapshot> out;
  out.reserve(attempts_.size());
  for (const auto& [id, a] : attempts_) {
    if (!a->discard) out.push_back(SnapshotOf(*a));
  }
  return out;
}

size_t Executor::MetricsSince(const std::string& attempt_id, size_t from, size_t max,
                              v1::AttemptEvent::MetricBatch* batch) const {
  absl::MutexLock lock(&mu_);
  auto it = attempts_.find(attempt_id);
  if (it == attempts_.end()) return 0;
  return it->second->out.metrics.Batch(from, max, batch);
}

bool Executor::LogSince(const std::string& attempt_id, int64_t offset, size_t max,
                        std::string* out) const {
  absl::MutexLock lock(&mu_);
  auto it = attempts_.find(attempt_id);
  if (it == attempts_.end()) return false;
  const Attempt& a = *it->second;
  const int64_t start = a.log_bytes - static_cast<int64_t>(a.log_tail.size());
  if (offset < start || offset >= a.log_bytes) return false;
  const size_t from = static_cast<size_t>(offset - start);
  out->assign(a.log_tail, from, std::min(max, a.log_tail.size() - from));
  return true;
}

std::optional<AttemptSnapshot> Executor::Get(const std::string& attempt_id) const {
  absl::MutexLock lock(&mu_);
  auto it = attempts_.find(attempt_id);
  if (it == attempts_.end()) return std::nullopt;
  return SnapshotOf(*it->second);
}

AttemptSnapshot Executor::SnapshotOf(const Attempt& a) const {
  AttemptSnapshot s;
  s.attempt_id = a.id;
  s.job_id = a.job_id;
  s.rank = a.rank;
  s.pid = a.pid;
  s.log_path = a.log_path;
  s.log_bytes = a.log_bytes;
  s.finished = a.finished;
  if (a.finished) s.result = a.result;
  s.progress_version = a.out.progress_version;
  s.progress = a.out.progress();
  s.metric_count = a.out.metrics.size();
  return s;
}

bool Executor::WaitFinished(const std::string& attempt_id, int64_t timeout_ms) const {
  const absl::Time deadline = absl::Now() + absl::Milliseconds(timeout_ms);
  absl::MutexLock lock(&mu_);
  for (;;) {
    auto it = attempts_.find(attempt_id);
    if (it == attempts_.end() || it->second->finished) return true;
    if (changed_.WaitWithDeadline(&mu_, deadline)) {
      it = attempts_.find(attempt_id);
      return it == attempts_.end() || it->second->finished;
    }
  }
}

int Executor::Running() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [id, a] : attempts_) n += a->finished ? 0 : 1;
  return n;
}

void Executor::Shutdown() {
  absl::MutexLock serial(&shutdown_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (!thread_.joinable()) return;
    shutting_down_ = true;
    for (auto& [id, a] : attempts_) {
      if (!a->finished) {
        TerminateLocked(*a, "cancelled: worker shutting down", "cancelled", true);
      }
    }
  }
  WakeLoop();
  thread_.join();
  // Only now: a spawner's children get SIGKILL (PR_SET_PDEATHSIG) when it exits, and every
  // child has been reaped by the time the executor thread returns.
  {
    absl::MutexLock lock(&mu_);
    stop_spawners_ = true;
  }
  spawn_cv_.SignalAll();
  recycle_cv_.SignalAll();
  for (std::thread& t : spawners_) t.join();
  spawners_.clear();
  if (recycler_.joinable()) recycler_.join();
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
    std::unique_ptr<SpawnPlan> plan = std::move(a.plan);
    mu_.Unlock();  // forking takes a while (a vfork parent waits for the child's execve)
    Spawn(a, std::move(plan));
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
        if (token == a.out_token && a.out_fd >= 0) {
          reads.push_back(OutputRead{&a, a.out_fd, a.log_fd});
        } else if (token == a.pid_token) {
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
        if (it == attempts_.end() || it->second->pid_token != token) continue;
        ReapLocked(*it->second);
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

void Executor::Spawn(Attempt& a, std::unique_ptr<SpawnPlan> plan) {
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
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    fail(absl::StrCat("worker error: pipe: ", strerror(errno)));
    return;
  }
  static const pid_t parent = getpid();  // a process's pid never changes
  // exec jobs start with vfork: the child borrows the worker's memory until execve, so
  // no page tables are copied and torn down for every attempt (fork + exit of the copy
  // cost about half of the worker's CPU per job). noop children outlive that moment, so
  // they need a real fork.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  // The child's plan, completed on this stack before the fork: the child only reads it.
  ChildPlan child = plan->child();
  child.out_fd = fds[1];
  child.parent = parent;
  const pid_t pid = plan->noop ? fork() : vfork();
  if (pid == 0) RunChild(child);
  const int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    fail(absl::StrCat("worker error: fork: ", strerror(fork_errno)));
    return;
  }
  // Also done in the child; whichever runs first wins the race. After vfork the child
  // has run it already (and exec'd, so the call here would fail with EACCES).
  if (plan->noop) setpgid(pid, pid);
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
    fail(absl::StrCat("worker error: pidfd_open: ", strerror(err)));
    return;
  }
  spdlog::info("attempt started: job={} attempt={} rank={} pid={} kind={}", a.job_id, a.id, a.rank,
               pid, plan->noop ? "noop" : plan->path);

  bool wake;
  {
    absl::MutexLock lock(&mu_);
    a.spawning = false;
    a.pid = pid;
    a.out_fd = fds[0];
    a.pidfd = pidfd;
    a.out_token = next_token_++;
    a.pid_token = next_token_++;
    tokens_[a.out_token] = a.id;
    tokens_[a.pid_token] = a.id;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = a.out_token;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, a.out_fd, &ev);
    ev.data.u64 = a.pid_token;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, a.pidfd, &ev);
    const int64_t now = clock_->MonoMs();
    if (a.timeout_ms > 0) a.deadline_ms = now + a.timeout_ms;
    // A start is signalled kStartNotifyDelayMs later, or with the finish if that comes
    // first: a short job then costs the session one round (one wake-up, one write, one
    // event batch at the coordinator) instead of two.
    a.start_notify_ms = now + kStartNotifyDelayMs;
    int64_t due = a.start_notify_ms;
    if (a.deadline_ms > 0) due = std::min(due, a.deadline_ms);
    if (a.terminating) {  // cancelled while it was being forked
      kill(-pid, SIGTERM);
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
  const uint64_t before = a.out.progress_version;
  NoteLogged(a.log_tail, a.log_bytes, r.data.data(), static_cast<size_t>(r.logged));
  if (r.write_errno != 0 && !a.log_write_failed) {
    spdlog::error("attempt={} log write to {} failed: {}", a.id, a.log_path,
                  strerror(r.write_errno));
    a.log_write_failed = true;
  }
  if (!r.data.empty()) a.out.Feed(r.data.data(), r.data.size(), clock_->WallMs());
  if (a.out.progress_version != before && a.progress_notify_ms == 0) {
    a.progress_notify_ms = clock_->MonoMs() + kProgressNotifyDelayMs;
  }
  if (r.eof) CloseOutputLocked(a);
}

void Executor::DrainOutputLocked(Attempt& a) {
  while (a.out_fd >= 0) {
    OutputRead r{&a, a.out_fd, a.log_fd};
    ReadOutput(r);
    ApplyOutputLocked(r);
    if (r.would_block) return;
  }
}

void Executor::CloseOutputLocked(Attempt& a) {
  if (a.out_fd < 0) return;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, a.out_fd, nullptr);
  close(a.out_fd);
  a.out_fd = -1;
  tokens_.erase(a.out_token);
}

void Executor::ReapLocked(Attempt& a) {
  // The leader is a zombie now, so its process group id cannot be reused yet: clear out
  // whatever it left behind in the group before reaping it.
  siginfo_t info{};
  if (waitid(P_PID, a.pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == 0) {
    return;  // still alive (spurious wakeup)
  }
  kill(-a.pid, SIGKILL);
  int status = 0;
  pid_t r;
  do {
    r = waitpid(a.pid, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, a.pidfd, nullptr);
  close(a.pidfd);
  a.pidfd = -1;
  tokens_.erase(a.pid_token);
  DrainOutputLocked(a);
  CloseOutputLocked(a);
  lingering_[a.pid] = clock_->MonoMs() + kLingerGiveUpMs;

  int code = -1;
  std::string reason = "exit status unknown";
  if (r > 0 && WIFEXITED(status)) {
    code = WEXITSTATUS(status);
    reason = absl::StrCat("exit ", code);
  } else if (r > 0 && WIFSIGNALED(status)) {
    code = 128 + WTERMSIG(status);
    reason = absl::StrCat("killed by signal ", WTERMSIG(status));
  }
  if (a.terminating) {
    FinishLocked(a, code, a.term_reason, a.term_result, a.term_retryable);
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
    FinishLocked(a, code, reason, code == 0 ? "succeeded" : "failed", code != 0);
  }
}

void Executor::TerminateLocked(Attempt& a, const std::string& reason, const std::string& result,
                               bool retryable) {
  if (a.finished) return;
  if (a.pid == 0 && !a.spawning) {  // not forked yet: never start it
    a.plan.reset();
    FinishLocked(a, -1, reason, result, retryable);
    return;
  }
  if (a.terminating) return;  // the first reason wins (a timeout, then a cancel)
  a.terminating = true;
  a.term_reason = reason;
  a.term_result = result;
  a.term_retryable = retryable;
  if (a.pid == 0) return;  // being forked: its spawner sends SIGTERM once it has a pid
  kill(-a.pid, SIGTERM);
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
      kill(-a->pid, SIGKILL);
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
