// `stemma up`: a coordinator and N local workers as child processes, in the foreground,
// until Ctrl-C or SIGTERM.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <memory>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/client.h"
#include "cli/command.h"
#include "cli/process.h"
#include "common/status.h"

namespace stemma::cli {
namespace {

constexpr absl::Duration kStartupTimeout = absl::Seconds(15);
constexpr absl::Duration kStopGrace = absl::Seconds(10);
constexpr absl::Duration kPollInterval = absl::Milliseconds(200);

struct UpOptions {
  std::string data = "./stemma-data";
  std::string listen;  // default: the global --coordinator
  int workers = 1;
  int gpus = 0;
  double cpus = 0;  // 0: the worker's own default
  bool allow_exec = false;
  int metrics_port = 0;
  std::vector<std::string> read_roots;  // passed to every worker
};

// "0.0.0.0:7070" listens everywhere, but clients dial "localhost:7070".
absl::StatusOr<std::string> DialAddress(const std::string& listen) {
  size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port <= 0 || port > 65535) {
    return UsageError(absl::StrCat("bad --listen '", listen, "' (expected HOST:PORT)"));
  }
  std::string host = listen.substr(0, colon);
  if (host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]") {
    return absl::StrCat("localhost:", port);
  }
  return listen;
}

// Owns the children; stops whatever still runs when it goes away, so every return path
// of RunUp leaves nothing behind.
class Supervisor {
 public:
  explicit Supervisor(const sigset_t& child_mask) : child_mask_(child_mask) {}
  ~Supervisor() { StopEverything(); }

  absl::StatusOr<ChildProcess*> Start(const std::string& name, const std::string& path,
                                      const std::vector<std::string>& args,
                                      const std::string& log_path) {
    ASSIGN_OR_RETURN(auto child, ChildProcess::Start(name, path, args, log_path, child_mask_));
    children_.push_back(std::move(child));
    return children_.back().get();
  }

  // Waits up to `timeout` for SIGINT/SIGTERM (returns true) or a child's exit (returns
  // false with *dead set).
  bool WaitForEvent(absl::Duration timeout, ChildProcess** dead) {
    *dead = nullptr;
    if ((*dead = FirstExited()) != nullptr) return false;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGCHLD);
    struct timespec ts = absl::ToTimespec(timeout);
    int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig == SIGINT || sig == SIGTERM) return true;
    *dead = FirstExited();
    return false;
  }

  // Workers first (they may still report to the coordinator), then the coordinator.
  void StopEverything() {
    std::vector<ChildProcess*> workers;
    for (size_t i = 1; i < children_.size(); ++i) workers.push_back(children_[i].get());
    StopAll(workers, kStopGrace);
    if (!children_.empty()) children_[0]->Stop(kStopGrace);
  }

  absl::Status DiedError(const ChildProcess& child, const std::string& when) const {
    std::string line = LastLogLine(child.log_path());
    return absl::InternalError(absl::StrCat(child.name(), " ", child.ExitDescription(), " ", when,
                                            " (see ", child.log_path(),
                                            line.empty() ? "" : "; its last line: ", line, ")"));
  }

 private:
  ChildProcess* FirstExited() {
    for (auto& child : children_) {
      if (child->Poll()) return child.get();
    }
    return nullptr;
  }

  sigset_t child_mask_;
  std::vector<std::unique_ptr<ChildProcess>> children_;
};

bool AllWorkersAlive(const v1::ListWorkersResponse& response, int n) {
  int alive = 0;
  std::set<std::string> alive_ids;
  for (const auto& w : response.workers()) {
    if (w.state() != v1::WORKER_ALIVE) continue;
    ++alive;
    alive_ids.insert(w.id());
  }
  bool named = true;
  for (int i = 0; i < n; ++i) named = named && alive_ids.count(absl::StrCat("w", i)) > 0;
  return named || alive >= n;
}

// DATA/coordinator and DATA/worker-<i> for each worker.
absl::Status MakeDataDirs(const std::filesystem::path& data, int workers) {
  std::vector<std::filesystem::path> dirs = {data / "coordinator"};
  for (int i = 0; i < workers; ++i) dirs.push_back(data / absl::StrCat("worker-", i));
  for (const auto& dir : dirs) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
    }
  }
  return absl::OkStatus();
}

// The command line of worker `i` (named w<i>, its data in DATA/worker-<i>).
std::vector<std::string> WorkerArgs(const UpOptions& o, const std::filesystem::path& data,
                                    const std::string& address, int i) {
  std::vector<std::string> wargs = {"--coordinator", address,
                                    "--data",        (data / absl::StrCat("worker-", i)).string(),
                                    "--name",        absl::StrCat("w", i),
                                    "--gpus",        absl::StrCat(o.gpus)};
  if (o.cpus > 0) wargs.insert(wargs.end(), {"--cpus", absl::StrCat(o.cpus)});
  if (o.allow_exec) wargs.push_back("--allow-exec");
  for (const std::string& dir : o.read_roots) wargs.insert(wargs.end(), {"--read-root", dir});
  if (o.metrics_port > 0) {
    wargs.insert(wargs.end(),
                 {"--metrics-listen", absl::StrCat("127.0.0.1:", o.metrics_port + 1 + i)});
  }
  return wargs;
}

absl::StatusOr<int> RunUp(const GlobalOptions& g, UpOptions o) {
  if (o.workers < 0) return UsageError("--workers must be 0 or more");
  if (o.gpus < 0) return UsageError("--gpus must be 0 or more");
  if (o.cpus < 0) return UsageError("--cpus must be positive");
  if (o.metrics_port < 0 || o.metrics_port + o.workers + 1 > 65535) {
    return UsageError("--metrics-port must leave room for the coordinator and every worker");
  }
  if (o.listen.empty()) o.listen = g.coordinator;
  ASSIGN_OR_RETURN(std::string address, DialAddress(o.listen));
  ASSIGN_OR_RETURN(std::string coordinator_bin, FindSiblingBinary("stemma-coordinator"));
  std::string worker_bin;
  if (o.workers > 0) {
    ASSIGN_OR_RETURN(worker_bin, FindSiblingBinary("stemma-worker"));
  }

  // Signals are taken synchronously (sigtimedwait) by this thread. Block them before gRPC
  // starts any thread, so that every thread inherits the mask; children get the old one.
  sigset_t blocked, old_mask;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGINT);
  sigaddset(&blocked, SIGTERM);
  sigaddset(&blocked, SIGCHLD);
  sigprocmask(SIG_BLOCK, &blocked, &old_mask);

  // A new client (connection) for each poll: a reused channel that saw "connection
  // refused" waits out gRPC's reconnect backoff, which adds seconds to startup.
  auto poll = [&]() {
    return CoordinatorClient(address, g.timeout()).ListWorkers(absl::Seconds(1));
  };
  if (poll().ok()) {
    return absl::AlreadyExistsError(
        absl::StrCat("a coordinator already answers at ", address, " (use --listen)"));
  }

  const std::filesystem::path data(o.data);
  RETURN_IF_ERROR(MakeDataDirs(data, o.workers));

  Supervisor supervisor(old_mask);
  // One machine: the coordinator sees the workers' files, so it checks reported outputs.
  std::vector<std::string> args = {"--data", (data / "coordinator").string(), "--listen", o.listen,
                                   "--verify-artifacts"};
  if (o.metrics_port > 0) {
    args.insert(args.end(), {"--metrics-listen", absl::StrCat("127.0.0.1:", o.metrics_port)});
  }
  const std::string coordinator_log = (data / "coordinator.log").string();
  ASSIGN_OR_RETURN(ChildProcess * coordinator,
                   supervisor.Start("stemma-coordinator", coordinator_bin, args, coordinator_log));

  // Wait for the coordinator to answer.
  const absl::Time coordinator_deadline = absl::Now() + kStartupTimeout;
  while (true) {
    ChildProcess* dead = nullptr;
    if (supervisor.WaitForEvent(absl::ZeroDuration(), &dead)) return 0;
    if (dead != nullptr) return supervisor.DiedError(*dead, "while starting");
    if (poll().ok()) break;
    if (absl::Now() >= coordinator_deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("the coordinator did not answer at ", address, " within ",
                       absl::FormatDuration(kStartupTimeout), " (see ", coordinator_log, ")"));
    }
    if (supervisor.WaitForEvent(kPollInterval, &dead)) return 0;
    if (dead != nullptr) return supervisor.DiedError(*dead, "while starting");
  }

  for (int i = 0; i < o.workers; ++i) {
    ASSIGN_OR_RETURN(ChildProcess * unused,
                     supervisor.Start(absl::StrCat("stemma-worker w", i), worker_bin,
                                      WorkerArgs(o, data, address, i),
                                      (data / absl::StrCat("worker-", i, ".log")).string()));
    (void)unused;
  }
  std::string logs = (data / "coordinator.log").string();
  if (o.workers == 1) absl::StrAppend(&logs, ", ", (data / "worker-0.log").string());
  if (o.workers > 1) absl::StrAppend(&logs, ", ", (data / "worker-<i>.log").string());
  std::cout << "stemma up: coordinator at " << address << ", " << o.workers << " workers, data in "
            << o.data << " (logs: " << logs << ")" << std::endl;

  // Wait for every worker to register.
  const absl::Time workers_deadline = absl::Now() + kStartupTimeout;
  while (true) {
    ChildProcess* dead = nullptr;
    auto listed = poll();
    if (listed.ok() && AllWorkersAlive(*listed, o.workers)) break;
    if (absl::Now() >= workers_deadline) {
      return absl::DeadlineExceededError(absl::StrCat("the workers did not all register within ",
                                                      absl::FormatDuration(kStartupTimeout),
                                                      " (see the worker logs in ", o.data, ")"));
    }
    if (supervisor.WaitForEvent(kPollInterval, &dead)) return 0;
    if (dead != nullptr) return supervisor.DiedError(*dead, "while starting");
  }
  std::cout << "ready" << std::endl;

  while (true) {
    ChildProcess* dead = nullptr;
    if (supervisor.WaitForEvent(absl::Seconds(1), &dead)) break;
    if (dead != nullptr) return supervisor.DiedError(*dead, "unexpectedly");
  }
  supervisor.StopEverything();
  std::cout << "stemma up: stopped" << std::endl;
  (void)coordinator;
  return 0;
}

}  // namespace

void AddUpCommand(CLI::App* app, const GlobalOptions* globals, Action* action) {
  auto o = std::make_shared<UpOptions>();
  CLI::App* sub = app->add_subcommand(
      "up", "Run a coordinator and local workers in the foreground until Ctrl-C");
  sub->add_option("--data", o->data, "data directory (default ./stemma-data)");
  sub->add_option("--listen", o->listen,
                  "coordinator address (default: --coordinator, else localhost:7070)");
  sub->add_option("--workers", o->workers, "local workers (default 1)");
  sub->add_option("--gpus", o->gpus, "GPUs per worker (default 0)");
  sub->add_option("--cpus", o->cpus, "CPUs per worker (default: the worker's own)");
  sub->add_flag("--allow-exec", o->allow_exec, "let workers run exec jobs");
  sub->add_option("--read-root", o->read_roots,
                  "a directory engine jobs may read besides the current one (repeatable)");
  sub->add_option("--metrics-port", o->metrics_port,
                  "metrics on BASE (coordinator) and BASE+1+i (worker i); 0 = off");
  sub->callback([=] { *action = [=] { return RunUp(*globals, *o); }; });
}

}  // namespace stemma::cli
