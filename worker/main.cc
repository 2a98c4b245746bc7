// stemma-worker: the daemon on each GPU node. Builds the one WorkerConfig from flags, then
// composes the executor, the session with the coordinator and the /metrics endpoint.
#include <malloc.h>
#include <prometheus/exposer.h>
#include <prometheus/registry.h>
#include <signal.h>
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
#include "common/logging.h"
#include "common/rpc.h"
#include "worker/config.h"
#include "worker/engine_binary.h"
#include "worker/executor.h"
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

int Main(int argc, char** argv) {
  WorkerConfig config;
  if (const char* env = std::getenv("STEMMA_COORDINATOR"); env != nullptr && *env != '\0') {
    config.coordinator = env;
  }
  int gpus = -1;
  int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int64_t memory_mb = -1;
  std::string labels;
  std::string name;
  ClientSecurity security;
  std::string token_file;
  bool insecure = false;
  std::string health_listen;

  CLI::App app{"stemma-worker: runs Stemma job attempts on this machine for a coordinator"};
  app.add_option("--coordinator", config.coordinator, "coordinator HOST:PORT")
      ->capture_default_str();
  app.add_option("--data", config.data_dir, "data directory")->capture_default_str();
  app.add_option("--name", name, "worker id (default: DATA/worker.id, else the hostname)");
  app.add_option("--gpus", gpus, "declare N fake GPUs (default: discover with nvidia-smi)")
      ->check(CLI::Range(0, 4096));
  app.add_option("--cpus", cpus, "CPUs offered")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--memory-mb", memory_mb, "memory offered in MiB (default: /proc/meminfo)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--labels", labels, "labels k=v,k2=v2");
  app.add_option("--metrics-listen", config.metrics_listen,
                 "HOST:PORT for Prometheus /metrics (empty: off)");
  app.add_option("--health-listen", health_listen,
                 "HOST:PORT for grpc.health.v1 (plaintext, nothing else on it; empty: off)");
  app.add_flag("--allow-exec", config.allow_exec, "allow exec jobs (arbitrary commands)");
  app.add_option("--host", config.host, "host advertised for gang rendezvous")
      ->capture_default_str();
  app.add_option("--kill-grace-ms", config.kill_grace_ms, "SIGTERM to SIGKILL delay")
      ->check(CLI::Range(int64_t{0}, int64_t{24} * 3600 * 1000))
      ->capture_default_str();
  app.add_option("--ca", security.ca_file, "PEM CA of the coordinator's certificate (enables TLS)");
  app.add_option("--tls-cert", security.cert_file,
                 "PEM client certificate (mTLS: its common name is the worker id)");
  app.add_option("--tls-key", security.key_file, "PEM private key of --tls-cert");
  app.add_option("--token-file", token_file,
                 "file with this worker's token (mode 0600; default $STEMMA_TOKEN)");
  app.add_option("--tls-server-name", security.server_name,
                 "name expected in the coordinator's certificate (default: its host)");
  app.add_flag("--insecure", insecure,
               "allow a coordinator beyond loopback without TLS (tokens and job secrets "
               "travel in clear text)");
  app.add_option("--log-level", config.log_level, "trace|debug|info|warn|error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
  app.add_option("--storage-root", config.storage_root,
                 "relative paths in engine specs resolve here, and engine jobs write only "
                 "below it (default: the current directory)");
  app.add_option("--read-root", config.read_roots,
                 "a directory engine jobs may also read (repeatable; e.g. a corpus)");
  app.add_option("--engine", config.engine_path,
                 "the stemma-engine binary (default: beside stemma-worker, else on PATH)");
  app.add_option("--engine-build-id", config.engine_build_id,
                 "the engine's build id for memoization (default: a hash of the engine binary; "
                 "give one id to identical builds deployed as different files)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    return BadFlag(e.what());
  }
  if (config.coordinator.empty()) return BadFlag("--coordinator: must not be empty");
  if (config.host.empty()) return BadFlag("--host: must not be empty");
  absl::StatusOr<std::map<std::string, std::string>> parsed_labels = ParseLabels(labels);
  if (!parsed_labels.ok()) return BadFlag(std::string(parsed_labels.status().message()));
  config.labels = *std::move(parsed_labels);
  config.cpus = cpus;

  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = ReadSecretFile(token_file);
    if (!token.ok()) return BadFlag("--token-file: " + std::string(token.status().message()));
    security.token = *token;
  } else if (const char* t = std::getenv("STEMMA_TOKEN"); t != nullptr && *t != '\0') {
    security.token = t;
  }
  if (!IsLoopbackAddress(config.coordinator) && !security.tls()) {
    if (!insecure) {
      return BadFlag("--coordinator " + config.coordinator +
                     " is beyond loopback: give --ca (TLS), or --insecure to talk in clear text");
    }
    std::fprintf(stderr,
                 "%s: *** INSECURE: talking to %s without TLS: the token and job secrets "
                 "travel in clear text ***\n",
                 kProgram, config.coordinator.c_str());
  }
  {
    grpc::ChannelArguments probe;
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
        MakeChannelCredentials(security, &probe);
    if (!creds.ok()) return BadFlag(std::string(creds.status().message()));
  }
  {
    std::error_code root_ec;
    const auto root = std::filesystem::absolute(config.storage_root.empty()
                                                    ? std::filesystem::current_path(root_ec)
                                                    : std::filesystem::path(config.storage_root),
                                                root_ec);
    if (root_ec) return BadFlag("--storage-root: " + root_ec.message());
    config.storage_root = root.lexically_normal().string();
    for (std::string& dir : config.read_roots) {
      const auto read = std::filesystem::absolute(dir, root_ec);
      if (root_ec || dir.empty()) return BadFlag("--read-root '" + dir + "': not a directory");
      dir = read.lexically_normal().string();
    }
  }

  // Block the stop signals before any thread starts, so that every thread inherits the
  // mask and only the sigwait below sees them. Children get a clean mask (executor.cc).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  InitLogging("worker", config.log_level);

  std::error_code ec;
  std::filesystem::create_directories(config.data_dir, ec);
  if (ec) {
    std::fprintf(stderr, "%s: cannot create --data %s: %s\n", kProgram, config.data_dir.c_str(),
                 ec.message().c_str());
    return 1;
  }
  absl::StatusOr<std::string> id = ResolveWorkerId(name, config.data_dir);
  if (!id.ok()) {
    std::fprintf(stderr, "%s: %s\n", kProgram, std::string(id.status().message()).c_str());
    return 1;
  }
  config.worker_id = *id;

  if (gpus >= 0) {
    config.gpus = FakeGpus(gpus);
  } else {
    absl::StatusOr<std::vector<v1::Gpu>> found = DiscoverGpus();
    if (found.ok()) {
      config.gpus = *std::move(found);
    } else {
      spdlog::warn("GPU discovery failed, offering none: {}", found.status().ToString());
    }
  }
  if (memory_mb >= 0) {
    config.memory_mb = memory_mb;
  } else if (absl::StatusOr<int64_t> mem = TotalMemoryMb(); mem.ok()) {
    config.memory_mb = *mem;
  } else {
    spdlog::warn("cannot read the memory size, offering 0: {}", mem.status().ToString());
  }

  auto registry = std::make_shared<prometheus::Registry>();
  Metrics metrics(registry.get());
  // The exposer holds collectables weakly: this one lives as long as Main.
  const std::shared_ptr<prometheus::Collectable> certificates =
      MakeCertificateExpiryCollectable({{.certificate = "ca", .path = security.ca_file},
                                        {.certificate = "client", .path = security.cert_file}});
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
  if (!health_listen.empty()) {
    absl::StatusOr<std::unique_ptr<HealthServer>> started = HealthServer::Start(health_listen);
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
      health_listen.empty() ? "off" : health_listen);

  // The id of the binary the executor will run (worker/engine_binary.h), for cache keys.
  if (config.engine_build_id.empty()) {
    config.engine_build_id = EngineBuildId(FindEngine(config.engine_path));
  }
  spdlog::info("engine build id: {}",
               config.engine_build_id.empty() ? "(no engine)" : config.engine_build_id);
  Executor executor(config, &metrics);
  Session session(config, &executor, &metrics, security);
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
