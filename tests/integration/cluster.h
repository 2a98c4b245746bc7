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
    // With tokens enabled, the worker gets a worker token for its name unless this says
    // otherwise ("" = none); with TLS, the CA.
    std::string token = "default";
    // The address the worker dials ("" = the coordinator's): a proxy between them, say.
    std::string coordinator;
    // Extra environment of the worker ("K=V").
    std::vector<std::string> env;
  };

  // Security (call before StartCoordinator). EnableTls makes a CA and a server certificate
  // for 127.0.0.1/localhost with openssl; the coordinator then serves TLS and every CLI
  // call gets the CA. With `mtls`, the coordinator also accepts worker certificates.
  void EnableTls(bool mtls = false);
  // A token file for the coordinator, and an admin token the harness's own CLI calls use.
  void EnableTokens();
  // A new token made with `stemma token create --file` (the coordinator reloads the file).
  std::string CreateToken(const std::string& role, const std::string& subject);
  // A client certificate signed by the test CA with common name `cn`; returns the cert
  // path (the key is beside it, KEY = cert path with .key for .pem).
  std::string MakeClientCert(const std::string& cn);
  // Makes a CA (ca-NAME.pem/.key) and a server certificate signed by it into
  // server-NAME.pem/.key; returns the CA path.
  std::string MakeCaAndServerCert(const std::string& name);
  // The coordinator's --listen when it differs from address() (0.0.0.0:PORT, say).
  void set_listen(const std::string& listen) { listen_ = listen; }
  bool tls() const { return !ca_.empty(); }
  bool tokens() const { return !tokens_file_.empty(); }
  const std::string& ca() const { return ca_; }
  const std::string& tokens_file() const { return tokens_file_; }
  const std::string& admin_token() const { return admin_token_; }
  std::string server_cert() const { return dir_ + "/server.pem"; }
  std::string server_key() const { return dir_ + "/server.key"; }

  void StartCoordinator(std::vector<std::string> extra = {});
  // Starts the coordinator without waiting for it; for tests of refusals at start.
  pid_t SpawnCoordinator(std::vector<std::string> extra, const std::vector<std::string>& env = {});
  // Waits for a process this harness started; its exit code (128+signal when killed), or
  // -1 if it is still running after `timeout_s`.
  int WaitExit(pid_t pid, int timeout_s = 20);
  void KillCoordinator(int sig = SIGKILL);
  pid_t coordinator_pid() const { return coordinator_; }
  pid_t worker_pid(const std::string& name) const {
    return workers_.count(name) ? workers_.at(name) : -1;
  }
  void StartWorker(const std::string& name, const WorkerOptions& options);
  void StartWorker(const std::string& name) { StartWorker(name, WorkerOptions{}); }
  void KillWorker(const std::string& name, int sig = SIGKILL);
  // Waits until `n` workers are ALIVE.
  void WaitForWorkers(int n);

  // Runs `stemma --coordinator ADDR args...` (as admin when tokens are enabled). Every CLI
  // run has HOME = dir() and none of the developer's STEMMA_* variables (the cluster's CA
  // with TLS), so that no ~/.config/stemma of the developer's reaches it and it writes none.
  CliResult Cli(const std::vector<std::string>& args) const;
  // The same with this token ("" = none) and extra environment ("K=V").
  CliResult CliAs(const std::string& token, const std::vector<std::string>& args,
                  const std::vector<std::string>& env = {}) const;
  // `stemma args...` without --coordinator (HOME and environment as above, `env` added): how
  // the CLI finds its coordinator (config contexts) is then under test.
  CliResult CliBare(const std::vector<std::string>& args,
                    const std::vector<std::string>& env = {}) const;
  // "env ... HOME=DIR BIN/stemma --coordinator ADDR": Cli() as a shell command to append
  // arguments to, for a test that runs the CLI through a shell (in the background, say).
  std::string CliCommand() const;
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
  CliResult RunCli(const std::string& token, const std::vector<std::string>& args,
                   const std::vector<std::string>& env, bool bare) const;
  pid_t Spawn(const std::vector<std::string>& argv, const std::string& log,
              const std::vector<std::string>& env = {}) const;
  std::vector<std::string> SecurityFlags() const;
  std::string ca_;
  std::string listen_;
  bool mtls_ = false;
  std::string tokens_file_;
  std::string admin_token_;

  std::string dir_;
  std::string address_;
  std::string metrics_address_;
  pid_t coordinator_ = -1;
  std::map<std::string, pid_t> workers_;
};

// Runs a shell command; its stdout.
std::string RunShell(const std::string& command);

// True if a process with this pid exists (and is not a zombie of ours).
bool ProcessAlive(pid_t pid);

}  // namespace stemma::testing
