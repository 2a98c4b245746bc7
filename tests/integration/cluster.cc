#include "tests/integration/cluster.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace stemma::testing {
namespace {

int FreePort() {
  // Ports spread by pid so parallel test processes do not collide.
  static int next = 0;
  return 21000 + (::getpid() * 7 + next++ * 131) % 30000;
}

std::string ReadFd(int fd) {
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, n);
  return out;
}

// The developer's settings of the CLI, which a test's CLI run never sees (RunCli, CliCommand).
constexpr const char* kDeveloperCliVariables[] = {"STEMMA_CONFIG",          "STEMMA_COORDINATOR",
                                                  "STEMMA_TOKEN_FILE",      "STEMMA_CA",
                                                  "STEMMA_TLS_SERVER_NAME", "STEMMA_TOKEN"};

}  // namespace

nlohmann::json CliResult::Json() const {
  auto j = nlohmann::json::parse(out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << "not JSON: " << out << "\nstderr: " << err;
  return j;
}

std::string Cluster::BinDir() {
  if (const char* b = std::getenv("STEMMA_BIN")) return b;
  return std::filesystem::canonical("/proc/self/exe").parent_path().string();
}

Cluster::Cluster() {
  char tmpl[] = "/tmp/stemma-it.XXXXXX";
  dir_ = ::mkdtemp(tmpl);
  address_ = "127.0.0.1:" + std::to_string(FreePort());
  metrics_address_ = "127.0.0.1:" + std::to_string(FreePort());
}

Cluster::~Cluster() {
  for (auto& [name, pid] : workers_) {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  KillCoordinator(SIGKILL);
  if (!::testing::Test::HasFailure())
    std::filesystem::remove_all(dir_);
  else
    std::fprintf(stderr, "kept %s for inspection\n", dir_.c_str());
}

pid_t Cluster::Spawn(const std::vector<std::string>& argv, const std::string& log,
                     const std::vector<std::string>& env) const {
  pid_t pid = ::fork();
  if (pid == 0) {
    // Daemons die with the test process, even when it crashes.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (const auto& kv : env) ::putenv(const_cast<char*>(kv.c_str()));
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

std::string RunShell(const std::string& command) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

std::string Cluster::MakeCaAndServerCert(const std::string& name) {
  const std::string ca = dir_ + "/ca-" + name;
  const std::string server = dir_ + "/server-" + name;
  std::ofstream(dir_ + "/san.ext") << "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
  const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ";
  std::string cmd = "cd " + dir_ + " && openssl req -x509" + ec + "-keyout " + ca + ".key -out " +
                    ca + ".pem -days 2 -subj /CN=stemma-test-ca-" + name + " 2>&1 && openssl req" +
                    ec + "-keyout " + server + ".key -out " + server +
                    ".csr -subj /CN=localhost 2>&1 && openssl x509 -req -in " + server +
                    ".csr -CA " + ca + ".pem -CAkey " + ca + ".key -CAcreateserial -out " + server +
                    ".pem -days 2 -extfile san.ext 2>&1";
  std::string out = RunShell(cmd + "; echo rc=$?");
  EXPECT_NE(out.find("rc=0"), std::string::npos) << out;
  return ca + ".pem";
}

void Cluster::EnableTls(bool mtls) {
  ca_ = MakeCaAndServerCert("1");
  std::filesystem::copy_file(dir_ + "/server-1.pem", server_cert());
  std::filesystem::copy_file(dir_ + "/server-1.key", server_key());
  mtls_ = mtls;
}

std::string Cluster::MakeClientCert(const std::string& cn) {
  const std::string base = dir_ + "/client-" + cn;
  std::string cmd = "cd " + dir_ +
                    " && openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
                    "-keyout " +
                    base + ".key -out " + base + ".csr -subj /CN=" + cn +
                    " 2>&1 && openssl x509 -req -in " + base +
                    ".csr -CA ca-1.pem -CAkey "
                    "ca-1.key -CAcreateserial -out " +
                    base + ".pem -days 2 2>&1";
  std::string out = RunShell(cmd + "; echo rc=$?");
  EXPECT_NE(out.find("rc=0"), std::string::npos) << out;
  return base + ".pem";
}

void Cluster::EnableTokens() {
  tokens_file_ = dir_ + "/tokens";
  admin_token_ = CreateToken("admin", "test-admin");
}

std::string Cluster::CreateToken(const std::string& role, const std::string& subject) {
  CliResult r =
      CliAs("", {"token", "create", "--role", role, "--subject", subject, "--file", tokens_file_});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::string token = r.out;
  while (!token.empty() && (token.back() == '\n' || token.back() == ' ')) token.pop_back();
  return token;
}

std::vector<std::string> Cluster::SecurityFlags() const {
  std::vector<std::string> flags;
  if (tls()) {
    flags.insert(flags.end(), {"--tls-cert", server_cert(), "--tls-key", server_key()});
    if (mtls_) flags.insert(flags.end(), {"--tls-client-ca", ca_});
  }
  if (tokens()) flags.insert(flags.end(), {"--tokens", tokens_file_});
  return flags;
}

pid_t Cluster::SpawnCoordinator(std::vector<std::string> extra,
                                const std::vector<std::string>& env) {
  std::vector<std::string> argv = {BinDir() + "/stemma-coordinator",
                                   "--data",
                                   coordinator_data(),
                                   "--listen",
                                   listen_.empty() ? address_ : listen_,
                                   "--metrics-listen",
                                   metrics_address_,
                                   "--lease-ms",
                                   std::to_string(lease_ms),
                                   "--heartbeat-ms",
                                   std::to_string(heartbeat_ms)};
  std::vector<std::string> security = SecurityFlags();
  argv.insert(argv.end(), security.begin(), security.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  return Spawn(argv, dir_ + "/coordinator.log", env);
}

int Cluster::WaitExit(pid_t pid, int timeout_s) {
  int status = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

void Cluster::StartCoordinator(std::vector<std::string> extra) {
  coordinator_ = SpawnCoordinator(std::move(extra));
  bool up = WaitUntil([&] { return Cli({"workers", "-o", "json"}).exit_code == 0; }, 20);
  ASSERT_TRUE(up) << ReadFile(dir_ + "/coordinator.log");
}

void Cluster::KillCoordinator(int sig) {
  if (coordinator_ <= 0) return;
  ::kill(coordinator_, sig);
  ::waitpid(coordinator_, nullptr, 0);
  coordinator_ = -1;
}

void Cluster::StartWorker(const std::string& name, const WorkerOptions& o) {
  std::vector<std::string> argv = {BinDir() + "/stemma-worker",
                                   "--coordinator",
                                   o.coordinator.empty() ? address_ : o.coordinator,
                                   "--data",
                                   worker_data(name),
                                   "--name",
                                   name,
                                   "--gpus",
                                   std::to_string(o.gpus),
                                   "--cpus",
                                   std::to_string(o.cpus),
                                   "--kill-grace-ms",
                                   "500"};
  if (o.allow_exec) argv.push_back("--allow-exec");
  if (tls()) argv.insert(argv.end(), {"--ca", ca_});
  if (tokens() && !o.token.empty()) {
    const std::string token = o.token == "default" ? CreateToken("worker", name) : o.token;
    const std::string file = dir_ + "/token-" + name;
    std::ofstream(file) << token << "\n";
    ::chmod(file.c_str(), 0600);
    argv.insert(argv.end(), {"--token-file", file});
  }
  argv.insert(argv.end(), o.extra.begin(), o.extra.end());
  workers_[name] = Spawn(argv, dir_ + "/worker-" + name + ".log", o.env);
}

void Cluster::KillWorker(const std::string& name, int sig) {
  pid_t pid = workers_[name];
  if (pid <= 0) return;
  ::kill(pid, sig);
  ::waitpid(pid, nullptr, 0);
  workers_[name] = -1;
}

void Cluster::WaitForWorkers(int n) {
  bool ok = WaitUntil(
      [&] {
        auto r = Cli({"workers", "-o", "json"});
        if (r.exit_code != 0) return false;
        auto j = nlohmann::json::parse(r.out, nullptr, false);
        if (!j.is_array()) return false;
        int alive = 0;
        for (const auto& w : j) alive += w.value("state", "") == "ALIVE";
        return alive >= n;
      },
      30);
  ASSERT_TRUE(ok) << "workers did not register; coordinator log:\n"
                  << ReadFile(dir_ + "/coordinator.log");
}

CliResult Cluster::Cli(const std::vector<std::string>& args) const {
  return CliAs(admin_token_, args);
}

CliResult Cluster::CliAs(const std::string& token, const std::vector<std::string>& args,
                         const std::vector<std::string>& env) const {
  return RunCli(token, args, env, /*bare=*/false);
}

CliResult Cluster::CliBare(const std::vector<std::string>& args,
                           const std::vector<std::string>& env) const {
  return RunCli(admin_token_, args, env, /*bare=*/true);
}

std::string Cluster::CliCommand() const {
  std::string cmd = "env";
  for (const char* name : kDeveloperCliVariables) cmd += std::string(" -u ") + name;
  cmd += " HOME=" + dir_;
  if (tls()) cmd += " STEMMA_CA=" + ca_;
  if (!admin_token_.empty()) cmd += " STEMMA_TOKEN=" + admin_token_;
  return cmd + " " + BinDir() + "/stemma --coordinator " + address_;
}

CliResult Cluster::RunCli(const std::string& token, const std::vector<std::string>& args,
                          const std::vector<std::string>& env, bool bare) const {
  int out[2], err[2];
  EXPECT_EQ(::pipe(out), 0);
  EXPECT_EQ(::pipe(err), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::close(out[0]);
    ::close(err[0]);
    // Nothing from the developer's own ~/.config/stemma (config.yaml, token, ca.pem) or
    // STEMMA_* variables: HOME is the test's directory, which a test may fill, and a CLI run
    // never writes into the real one. `env` may set any of them again.
    ::setenv("HOME", dir_.c_str(), 1);
    for (const char* name : kDeveloperCliVariables) ::unsetenv(name);
    if (tls()) ::setenv("STEMMA_CA", ca_.c_str(), 1);
    if (!token.empty()) ::setenv("STEMMA_TOKEN", token.c_str(), 1);
    for (const auto& kv : env) ::putenv(const_cast<char*>(kv.c_str()));
    std::vector<std::string> argv = {BinDir() + "/stemma"};
    if (!bare) argv.insert(argv.end(), {"--coordinator", address_});
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> a;
    for (auto& s : argv) a.push_back(s.data());
    a.push_back(nullptr);
    ::execv(a[0], a.data());
    _exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  CliResult r;
  std::thread t([&] { r.err = ReadFd(err[0]); });
  r.out = ReadFd(out[0]);
  t.join();
  ::close(out[0]);
  ::close(err[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::string Cluster::WriteFile(const std::string& name, const std::string& content) const {
  std::string path = dir_ + "/" + name;
  std::ofstream(path) << content;
  return path;
}

std::string Cluster::ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> Cluster::Submit(const std::string& yaml, const std::string& name) {
  auto r = Cli({"submit", "-f", WriteFile(name, yaml)});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> ids;
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) ids.push_back(line.substr(0, line.find(' ')));  // "id name"
  }
  return ids;
}

nlohmann::json Cluster::Get(const std::string& id) const {
  auto r = Cli({"get", id, "-o", "json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.Json();
}

std::string Cluster::WaitFor(const std::string& id, const std::vector<std::string>& states,
                             int timeout_s) const {
  std::string last;
  WaitUntil(
      [&] {
        auto r = Cli({"get", id, "-o", "json"});
        if (r.exit_code != 0) return false;
        last = nlohmann::json::parse(r.out)["state"];
        return std::find(states.begin(), states.end(), last) != states.end();
      },
      timeout_s);
  return std::find(states.begin(), states.end(), last) != states.end() ? last : "";
}

bool Cluster::WaitUntil(const std::function<bool()>& pred, int timeout_s) const {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pred();
}

bool ProcessAlive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  std::getline(stat, s);
  auto close = s.rfind(')');
  return close == std::string::npos || s.size() < close + 3 || s[close + 2] != 'Z';
}

}  // namespace stemma::testing
