// stemma-worker: the daemon on each GPU node. Builds the one WorkerConfig from flags, then
// composes the executor, the session with the coordinator and the /metrics endpoint.
#include <malloc.h>
#include <prometheus/exposer.h>
#include <prometheus/registry.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "common/log_format.h"
#include "common/logging.h"
#include "common/rpc.h"
#include "worker/config.h"
#include "worker/engine_binary.h"
#include "worker/executor.h"
#include "worker/job_confinement.h"
#include "worker/metrics.h"
#include "worker/resources.h"
#include "worker/session.h"

namespace stemma::worker {
namespace {

constexpr char kProgram[] = "stemma-worker";

int BadFlag(const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", kProgram, message.c_str());
  return 2;
}

// The Landlock rule set of every exec and engine child (job_confinement.h), into
// config->job_ruleset_fd. A kernel without Landlock is an error only when jobs could then
// read the token file: a worker with --allow-exec and --token-file.
// `hidden`: a mount namespace already hides the token file (the rule set then only needs
// to keep jobs from undoing that and from the worker's /proc).
absl::Status ConfineJobs(const std::string& token_file, bool hidden, WorkerConfig* config) {
  std::vector<std::pair<std::string, std::string>> job_dirs = {
      {"--storage-root", config->storage_root}, {"--data", config->data_dir}};
  for (const std::string& dir : config->read_roots) job_dirs.emplace_back("--read-root", dir);
  absl::StatusOr<int> ruleset = MakeJobRuleset(hidden ? "" : token_file, job_dirs);
  if (ruleset.ok()) {
    config->job_ruleset_fd = *ruleset;
    spdlog::info("jobs confined with Landlock ABI {}{}", LandlockAbi(),
                 token_file.empty() ? "" : " (the token file is not readable by jobs)");
    return absl::OkStatus();
  }
  if (!absl::IsUnimplemented(ruleset.status())) return ruleset.status();
  if (config->allow_exec && !token_file.empty()) {
    return absl::FailedPreconditionError(
        "--allow-exec with --token-file needs Landlock (Linux >= 5.13, lsm=landlock), which "
        "this kernel lacks: exec jobs could read the worker's token");
  }
  spdlog::warn("no Landlock on this kernel: jobs are not confined ({})",
               ruleset.status().ToString());
  return absl::OkStatus();
}

// The flags that are not WorkerConfig fields.
struct Flags {
  int gpus = -1;
  int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int64_t memory_mb = -1;
  std::string labels;
  std::string name;
  ClientSecurity security;
  std::string token_file;
  bool hidden_token_file = false;  // by a mount namespace
  bool insecure = false;
  std::string health_listen;
  std::string log_format = "text";
};

void AddFlags(CLI::App& app, WorkerConfig* config, Flags* f) {
  app.add_option("--coordinator", config->coordinator, "coordinator HOST:PORT")
      ->capture_default_str();
  app.add_option("--data", config->data_dir, "data directory")->capture_default_str();
  app.add_option("--name", f->name, "worker id (default: DATA/worker.id, else the hostname)");
  app.add_option("--gpus", f->gpus, "declare N fake GPUs (default: discover with nvidia-smi)")
      ->check(CLI::Range(0, 4096));
  app.add_option("--cpus", f->cpus, "CPUs offered")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--memory-mb", f->memory_mb, "memory offered in MiB (default: /proc/meminfo)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--labels", f->labels, "labels k=v,k2=v2");
  app.add_option("--metrics-listen", config->metrics_listen,
                 "HOST:PORT for Prometheus /metrics (empty: off)");
  app.add_option("--health-listen", f->health_listen,
                 "HOST:PORT for grpc.health.v1 (plaintext, nothing else on it; empty: off)");
  app.add_flag("--allow-exec", config->allow_exec, "allow exec jobs (arbitrary commands)");
  app.add_option("--host", config->host, "host advertised for gang rendezvous")
      ->capture_default_str();
  app.add_option("--kill-grace-ms", config->kill_grace_ms, "SIGTERM to SIGKILL delay")
      ->check(CLI::Range(int64_t{0}, int64_t{24} * 3600 * 1000))
      ->capture_default_str();
  app.add_option("--ca", f->security.ca_file,
                 "PEM CA of the coordinator's certificate (enables TLS)");
  app.add_option("--tls-cert", f->security.cert_file,
                 "PEM client certificate (mTLS: its common name is the worker id)");
  app.add_option("--tls-key", f->security.key_file, "PEM private key of --tls-cert");
  app.add_option("--token-file", f->token_file,
                 "file with this worker's token (mode 0600; default $STEMMA_TOKEN)");
  app.add_option("--tls-server-name", f->security.server_name,
                 "name expected in the coordinator's certificate (default: its host)");
  app.add_flag("--insecure", f->insecure,
               "allow a coordinator beyond loopback without TLS (tokens and job secrets "
               "travel in clear text)");
  app.add_option("--log-level", config->log_level, "trace|debug|info|warn|error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
  app.add_option("--log-format", f->log_format, "text | json (one JSON object per line)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  app.add_option("--storage-root", config->storage_root,
                 "relative paths in engine specs resolve here, and engine jobs write only "
                 "below it (default: the current directory)");
  app.add_option("--read-root", config->read_roots,
                 "a directory engine jobs may also read (repeatable; e.g. a corpus)");
  app.add_option("--engine", config->engine_path,
                 "the stemma-engine binary (default: beside stemma-worker, else on PATH)");
  app.add_option("--engine-build-id", config->engine_build_id,
                 "the engine's build id for memoization (default: a hash of the engine binary; "
                 "give one id to identical builds deployed as different files)");
}

// Checks the parsed flags and reads the token; the exit code when the worker cannot start.
std::optional<int> CheckFlags(const std::string& env_token, WorkerConfig* config, Flags* f) {
  if (config->coordinator.empty()) return BadFlag("--coordinator: must not be empty");
  if (config->host.empty()) return BadFlag("--host: must not be empty");
  absl::StatusOr<std::map<std::string, std::string>> parsed_labels = ParseLabels(f->labels);
  if (!parsed_labels.ok()) return BadFlag(std::string(parsed_labels.status().message()));
  config->labels = *std::move(parsed_labels);
  config->cpus = f->cpus;

  if (!f->token_file.empty()) {
    absl::StatusOr<std::string> token = ReadSecretFile(f->token_file);
    if (!token.ok()) return BadFlag("--token-file: " + std::string(token.status().message()));
    f->security.token = *token;
    // Read again at each connection: a Kubernetes projected token is rotated in place.
    f->security.token_file = f->token_file;
    // Now, while this is the only thread (job_confinement.h).
    if (absl::Status hidden = HideFileFromJobs(f->token_file); hidden.ok()) {
      f->hidden_token_file = true;
    } else if (!absl::IsFailedPrecondition(hidden)) {
      return BadFlag("--token-file: " + std::string(hidden.message()));
    }
  } else {
    f->security.token = env_token;
  }
  if (!IsLoopbackAddress(config->coordinator) && !f->security.tls()) {
    if (!f->insecure) {
      return BadFlag("--coordinator " + config->coordinator +
                     " is beyond loopback: give --ca (TLS), or --insecure to talk in clear text");
    }
    std::fprintf(stderr,
                 "%s: *** INSECURE: talking to %s without TLS: the token and job secrets "
                 "travel in clear text ***\n",
                 kProgram, config->coordinator.c_str());
  }
  {
    grpc::ChannelArguments probe;
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
        MakeChannelCredentials(f->security, &probe);
    if (!creds.ok()) return BadFlag(std::string(creds.status().message()));
  }
  {
    std::error_code root_ec;
    const auto root = std::filesystem::absolute(config->storage_root.empty()
                                                    ? std::filesystem::current_path(root_ec)
                                                    : std::filesystem::path(config->storage_root),
                                                root_ec);
    if (root_ec) return BadFlag("--storage-root: " + root_ec.message());
    config->storage_root = root.lexically_normal().string();
    for (std::string& dir : config->read_roots) {
      const auto read = std::filesystem::absolute(dir, root_ec);
      if (root_ec || dir.empty()) return BadFlag("--read-root '" + dir + "': not a directory");
      dir = read.lexically_normal().string();
    }
  }
  return std::nullopt;
}

int Main(int argc, char** argv) {
  // Jobs run as this user: a non-dumpable worker's /proc entries (environ, cwd, fd, mem)
  // belong to root, so a job without CAP_SYS_PTRACE cannot open them (Landlock shields
  // them from the rest, job_confinement.h).
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  // Out of the environment that children inherit and out of /proc/PID/environ, whether or
  // not --token-file is given.
  const std::string env_token = TakeEnvironmentSecret("STEMMA_TOKEN");
  WorkerConfig config;
  if (const char* env = std::getenv("STEMMA_COORDINATOR"); env != nullptr && *env != '\0') {
    config.coordinator = env;
  }
  Flags f;
  CLI::App app{"stemma-worker: runs Stemma job attempts on this machine for a coordinator"};
  AddFlags(app, &config, &f);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    return BadFlag(e.what());
  }
  if (std::optional<int> bad = CheckFlags(env_token, &config, &f); bad.has_value()) return *bad;

  // Block the stop signals before any thread starts, so that every thread inherits the
  // mask and only the sigwait below sees them. Children get a clean mask (executor.cc).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  InitLogging("worker", config.log_level);
  SetLogFormat(f.log_format);

  std::error_code ec;
  std::filesystem::create_directories(config.data_dir, ec);
  if (ec) {
    std::fprintf(stderr, "%s: cannot create --data %s: %s\n", kProgram, config.data_dir.c_str(),
                 ec.message().c_str());
    return 1;
  }
  absl::StatusOr<std::string> id = ResolveWorkerId(f.name, config.data_dir);
  if (!id.ok()) {
    std::fprintf(stderr, "%s: %s\n", kProgram, std::string(id.status().message()).c_str());
    return 1;
  }
  config.worker_id = *id;
  // A worker whose engine cannot run would take engine jobs and fail them: it does not start.
  if (absl::Status engine = CheckEngine(FindEngine(config.engine_path)); !engine.ok()) {
    std::fprintf(stderr, "%s: %s\n", kProgram, std::string(engine.message()).c_str());
    return 1;
  }
  if (f.hidden_token_file) {
    spdlog::info("the token file is hidden from jobs by a private mount namespace");
  }
  if (absl::Status confined = ConfineJobs(f.token_file, f.hidden_token_file, &config);
      !confined.ok()) {
    std::fprintf(stderr, "%s: %s\n", kProgram, std::string(confined.message()).c_str());
    return 2;
  }

  if (f.gpus >= 0) {
    config.gpus = FakeGpus(f.gpus);
  } else {
    absl::StatusOr<std::vector<v1::Gpu>> found = DiscoverGpus();
    if (found.ok()) {
      config.gpus = *std::move(found);
    } else {
      spdlog::warn("GPU discovery failed, offering none: {}", found.status().ToString());
    }
  }
  if (f.memory_mb >= 0) {
    config.memory_mb = f.memory_mb;
  } else if (absl::StatusOr<int64_t> mem = TotalMemoryMb(); mem.ok()) {
    config.memory_mb = *mem;
  } else {
    spdlog::warn("cannot read the memory size, offering 0: {}", mem.status().ToString());
  }

  auto registry = std::make_shared<prometheus::Registry>();
  Metrics metrics(registry.get());
  // The exposer holds collectables weakly: this one lives as long as Main.
  const std::shared_ptr<prometheus::Collectable> certificates =
      MakeCertificateExpiryCollectable({{.certificate = "ca", .path = f.security.ca_file},
                                        {.certificate = "client", .path = f.security.cert_file}});
  std::unique_ptr<prometheus::Exposer> exposer;
  if (!config.metrics_listen.empty()) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(config.metrics_listen);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: --metrics-listen %s: %s\n", kProgram, config.metrics_listen.c_str(),
                   e.what());
      return 1;
    }
    exposer->RegisterCollectable(registry);
    exposer->RegisterCollectable(certificates);
  }
  // SERVING while the daemon runs, whether or not the coordinator is reachable: a probe
  // that failed with the coordinator would restart every worker (and kill its attempts)
  // during a coordinator outage. stemma_worker_connected says whether it is registered.
  std::unique_ptr<HealthServer> health;
  if (!f.health_listen.empty()) {
    absl::StatusOr<std::unique_ptr<HealthServer>> started = HealthServer::Start(f.health_listen);
    if (!started.ok()) {
      std::fprintf(stderr, "%s: %s\n", kProgram, std::string(started.status().message()).c_str());
      return 1;
    }
    health = *std::move(started);
  }

  spdlog::info(
      "starting worker={} coordinator={} data={} host={} gpus={} cpus={} memory_mb={} "
      "allow_exec={} metrics={} health={}",
      config.worker_id, config.coordinator, config.data_dir, config.host, config.gpus.size(),
      config.cpus, config.memory_mb, config.allow_exec,
      config.metrics_listen.empty() ? "off" : config.metrics_listen,
      f.health_listen.empty() ? "off" : f.health_listen);

  // The id of the binary the executor will run (worker/engine_binary.h), for cache keys.
  if (config.engine_build_id.empty()) {
    config.engine_build_id = EngineBuildId(FindEngine(config.engine_path));
  }
  spdlog::info("engine build id: {}",
               config.engine_build_id.empty() ? "(no engine)" : config.engine_build_id);
  Executor executor(config, &metrics);
  Session session(config, &executor, &metrics, f.security);
  std::thread session_thread([&session] { session.Run(); });

  int sig = 0;
  while (sigwait(&stop_signals, &sig) != 0) {
  }
  spdlog::info("signal {}: stopping; killing every attempt", sig);
  executor.Shutdown();
  // Let the session ship the Finished events of the killed attempts if it is connected.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  session.Stop();
  session_thread.join();
  spdlog::info("stopped");
  return 0;
}

}  // namespace
}  // namespace stemma::worker

int main(int argc, char** argv) {
  // Debian's Abseil checks every lock order at run time; that bookkeeping showed up in
  // profiles of busy daemons. Lock order is covered by the annotations and tests.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Every job allocates and frees much the same memory; without this, glibc hands the top of
  // each thread's heap back and grows it again (an mprotect each time, ~0.5 per job).
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
  mallopt(M_TOP_PAD, 4 << 20);
  return stemma::worker::Main(argc, argv);
}
