#include "worker/executor.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

#include "worker/attempt_output.h"
#include "worker/engine_binary.h"
#include "worker/executor_internal.h"
#include "worker/job_confinement.h"
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
#include "common/job_ranks.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "common/path_confinement.h"
#include "common/status.h"

extern char** environ;

namespace stemma::worker {

namespace executor_internal {

void NoteLogged(std::string& tail, int64_t& log_bytes, const char* data, size_t n) {
  log_bytes += static_cast<int64_t>(n);
  if (n >= kLogTailBytes) {
    tail.assign(data + (n - kLogTailBytes / 2), kLogTailBytes / 2);
    return;
  }
  if (tail.size() + n > kLogTailBytes) tail.erase(0, tail.size() + n - kLogTailBytes / 2);
  tail.append(data, n);
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

}  // namespace executor_internal

using executor_internal::kSpawners;
using executor_internal::kWakeToken;
using executor_internal::NoteLogged;
using executor_internal::WriteAll;

namespace {

// Whether `path` is an executable regular file (the PATH lookups).
bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

absl::Status WriteFile(const std::string& path, const std::string& data) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
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
  collector_ = std::thread([this] { CollectLoop(); });
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

std::string Executor::OpenAttemptDir(const std::string& workdir, const std::string& log_path,
                                     Attempt& attempt) {
  std::string failure;
  std::error_code ec;
  std::optional<SpareDir> spare;
  {
    absl::MutexLock lock(&mu_);
    if (!spare_dirs_.empty()) {
      spare = std::move(spare_dirs_.back());
      spare_dirs_.pop_back();
    }
  }
  attempt.log_path = log_path;
  if (spare && rename(spare->dir.c_str(), workdir.c_str()) == 0) {
    // The spare's log is open, empty (RecycleLoop) and now named workdir/log: no open.
    attempt.log_fd = spare->log_fd;
  } else {
    if (spare) close(spare->log_fd);
    std::filesystem::create_directories(workdir, ec);
  }
  if (ec) {
    failure = absl::StrCat("worker error: cannot create ", workdir, ": ", ec.message());
    attempt.log_path.clear();
  } else if (attempt.log_fd < 0) {
    attempt.log_fd =
        open(attempt.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
    if (attempt.log_fd < 0) {
      failure = absl::StrCat("worker error: cannot open ", attempt.log_path, ": ", strerror(errno));
      attempt.log_path.clear();
    }
  }
  return failure;
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
  attempt->train = attempt->engine && assignment.spec().kind_case() == v1::JobSpec::kTrain;
  attempt->timeout_ms = spec.timeout_ms();
  // Declared outputs are checked once, by the first part (exec_outputs.h).
  if (spec.has_exec() && spec.exec().outputs_size() > 0 && assignment.rank() == 0) {
    attempt->exec_spec = std::make_unique<v1::JobSpec>(spec);
    // A manifest older than this is a previous run's (exec_outputs.h); the file system's
    // clock (coarse) may lag the wall clock a little.
    attempt->launched_wall_ms = clock_->WallMs() - 100;
  }
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
  context.job_ruleset = config_.job_ruleset_fd;
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
  if (!plan->workdir.empty()) failure = OpenAttemptDir(plan->workdir, plan->log_path, *attempt);
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
  if (refusal.empty() && failure.empty() && !plan->noop && !config_.storage_root.empty()) {
    // What the job's owner may write (job_confinement.h): outputs that a symbolic link would
    // take out of the owner's prefix are refused; the child's writes are confined.
    absl::StatusOr<int> confined = ConfineOwnedWrites(spec, config_.storage_root, plan->workdir);
    if (confined.ok()) {
      plan->write_ruleset_fd = *confined;
    } else if (absl::IsPermissionDenied(confined.status())) {
      refusal = absl::StrCat("refused: ", confined.status().message());
    } else {
      failure = absl::StrCat("worker error: ", confined.status().message());
    }
  }
  if (refusal.empty() && failure.empty()) {
    AddRanks(assignment, context, *attempt, plan->write_ruleset_fd, &refusal, &failure);
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

void Executor::AddRanks(const v1::Assignment& assignment, const SpawnContext& context,
                        Attempt& attempt, int write_ruleset_fd, std::string* refusal,
                        std::string* failure) {
  const int ranks = RanksPerPart(assignment.spec());
  for (int local = 1; local < ranks && refusal->empty() && failure->empty(); ++local) {
    std::unique_ptr<SpawnPlan> plan = PlanSpawn(assignment, config_, context, local);
    if (!plan->refusal.empty()) {
      *refusal = plan->refusal;
      break;
    }
    auto process = std::make_unique<RankProcess>();
    process->local_rank = local;
    process->log_path = plan->log_path;
    process->log_fd =
        open(plan->log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
    if (process->log_fd < 0) {
      *failure = absl::StrCat("worker error: cannot open ", plan->log_path, ": ", strerror(errno));
      break;
    }
    // A copy of the descriptor: each plan closes its own.
    if (write_ruleset_fd >= 0) plan->write_ruleset_fd = fcntl(write_ruleset_fd, F_DUPFD_CLOEXEC, 0);
    plan->Seal();
    attempt.more.push_back(std::move(process));
    attempt.more_plans.push_back(std::move(plan));
  }
  if (!refusal->empty() || !failure->empty()) {  // none of the part's ranks will run
    attempt.more.clear();
    attempt.more_plans.clear();
  }
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

void Executor::Preempt(const std::string& attempt_id, const std::string& preempted_by) {
  std::string workdir;
  bool notify = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = attempts_.find(attempt_id);
    if (it == attempts_.end() || it->second->finished || !it->second->preempted_by.empty()) return;
    Attempt& a = *it->second;
    a.preempted_by = preempted_by.empty() ? "a higher-priority job" : preempted_by;
    if (a.train && a.pid != 0 && !a.log_path.empty()) {
      workdir = a.log_path.substr(0, a.log_path.rfind('/'));
    } else {
      TerminateLocked(a, absl::StrCat("preempted by ", a.preempted_by), "preempted", true);
      notify = a.finished;
    }
  }
  if (notify) Notify();
  if (workdir.empty()) return;
  // Written whole (temporary name, then rename), outside the lock: the trainer checks for it
  // after every step.
  const std::string tmp = workdir + "/.preempt.tmp",
                    path = absl::StrCat(workdir, "/", std::string(engine_contract::kPreemptFile));
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && write(fd, preempted_by.data(), preempted_by.size()) ==
                           static_cast<ssize_t>(preempted_by.size());
  if (fd >= 0) ok &= close(fd) == 0;
  ok = ok && rename(tmp.c_str(), path.c_str()) == 0;
  spdlog::info("attempt preempting: attempt={} by={}: {}", attempt_id, preempted_by,
               ok ? "asked to checkpoint and exit" : std::strerror(errno));
  if (!ok) {
    absl::MutexLock lock(&mu_);
    auto it = attempts_.find(attempt_id);
    if (it != attempts_.end() && !it->second->finished) {
      TerminateLocked(*it->second, absl::StrCat("preempted by ", it->second->preempted_by),
                      "preempted", true);
    }
  }
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

bool Executor::LogSince(const std::string& attempt_id, int64_t offset, size_t max, std::string* out,
                        int local_rank) const {
  absl::MutexLock lock(&mu_);
  auto it = attempts_.find(attempt_id);
  if (it == attempts_.end()) return false;
  const RankProcess* p = it->second->Local(local_rank);
  if (p == nullptr) return false;
  const RankProcess& a = *p;
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
  for (const auto& p : a.more) {
    s.more_logs.push_back({p->local_rank, p->log_path, p->log_bytes});
  }
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
    stop_collector_ = true;  // nothing left to collect: every attempt has finished
  }
  spawn_cv_.SignalAll();
  recycle_cv_.SignalAll();
  collect_cv_.SignalAll();
  if (collector_.joinable()) collector_.join();
  for (std::thread& t : spawners_) t.join();
  spawners_.clear();
  if (recycler_.joinable()) recycler_.join();
}

}  // namespace stemma::worker
