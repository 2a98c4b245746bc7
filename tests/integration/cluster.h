// A real Stemma cluster on loopback for integration and fault tests: the coordinator and
// workers run as separate processes from build/bin, the CLI is invoked as a user would,
// and each test gets a fresh temporary directory.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace stemma::testing {

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
  nlohmann::json Json() const;  // stdout parsed as JSON (test fails if it does not parse)
};

class Cluster {
 public:
  Cluster();   // makes the temp dir and picks free ports
  ~Cluster();  // kills everything it started, removes the temp dir

  struct WorkerOptions {
    int gpus = 0;
    int cpus = 8;
    bool allow_exec = true;
    std::vector<std::string> extra;
  };

  void StartCoordinator(std::vector<std::string> extra = {});
  void KillCoordinator(int sig = SIGKILL);
  void StartWorker(const std::string& name, const WorkerOptions& options);
  void StartWorker(const std::string& name) { StartWorker(name, WorkerOptions{}); }
  void KillWorker(const std::string& name, int sig = SIGKILL);
  // Waits until `n` workers are ALIVE.
  void WaitForWorkers(int n);

  // Runs `stemma --coordinator ADDR args...`.
  CliResult Cli(const std::vector<std::string>& args) const;
  // Writes `yaml` to a file, submits it, returns the job ids.
  std::vector<std::string> Submit(const std::string& yaml, const std::string& name = "job.yaml");
  nlohmann::json Get(const std::string& id) const;
  std::string State(const std::string& id) const { return Get(id)["state"]; }
  // Waits until the job reaches one of `states`; returns the state (or "" on timeout).
  std::string WaitFor(const std::string& id, const std::vector<std::string>& states,
                      int timeout_s = 60) const;
  bool WaitUntil(const std::function<bool()>& pred, int timeout_s = 60) const;

  const std::string& dir() const { return dir_; }
  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  std::string coordinator_data() const { return dir_ + "/coordinator"; }
  std::string worker_data(const std::string& name) const { return dir_ + "/worker-" + name; }
  std::string WriteFile(const std::string& name, const std::string& content) const;
  static std::string ReadFile(const std::string& path);
  static std::string BinDir();

  int64_t lease_ms = 1500;
  int64_t heartbeat_ms = 300;

 private:
  pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) const;

  std::string dir_;
  std::string address_;
  std::string metrics_address_;
  pid_t coordinator_ = -1;
  std::map<std::string, pid_t> workers_;
};

// True if a process with this pid exists (and is not a zombie of ours).
bool ProcessAlive(pid_t pid);

}  // namespace stemma::testing
