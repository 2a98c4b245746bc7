// stemma-coordinator: composes the store, the domain core, the gRPC services and the
// metrics endpoint. Nothing else lives here.
#include <malloc.h>

#include <prometheus/exposer.h>
#include <signal.h>
#include <sys/stat.h>

#include <CLI/CLI.hpp>

#include "absl/synchronization/mutex.h"
#include <memory>
#include <string>
#include <thread>

#include "common/logging.h"
#include "common/rpc.h"
#include "coordinator/coordinator.h"
#include "coordinator/metrics.h"
#include "coordinator/rpc/grpc_services.h"
#include "coordinator/store/store.h"

namespace {

struct Config {
  std::string data = "./stemma-data/coordinator";
  std::string listen = "127.0.0.1:7070";
  std::string metrics_listen;
  int64_t lease_ms = 10000;
  int64_t heartbeat_ms = 2000;
  std::string log_level = "info";
};

int MakeDirs(const std::string& path) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!cur.empty() && ::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return errno;
    }
    if (i < path.size()) cur += path[i];
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Debian's Abseil checks every lock order at run time; that bookkeeping showed up in
  // profiles of busy daemons. Lock order is covered by the annotations and tests.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Every job allocates and frees much the same memory; without this, glibc hands the top of
  // each thread's heap back and grows it again (an mprotect each time, ~0.5 per job).
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
  mallopt(M_TOP_PAD, 4 << 20);
  Config cfg;
  CLI::App app{"stemma-coordinator: schedules Stemma jobs onto workers"};
  app.add_option("--data", cfg.data, "Directory for the database and logs")->capture_default_str();
  app.add_option("--listen", cfg.listen, "gRPC address (loopback by default)")->capture_default_str();
  app.add_option("--metrics-listen", cfg.metrics_listen, "HOST:PORT for Prometheus /metrics");
  app.add_option("--lease-ms", cfg.lease_ms, "A worker silent this long is lost")
      ->check(CLI::Range(int64_t{100}, int64_t{3600000}))
      ->capture_default_str();
  app.add_option("--heartbeat-ms", cfg.heartbeat_ms, "Heartbeat interval for workers")
      ->check(CLI::Range(int64_t{10}, int64_t{600000}))
      ->capture_default_str();
  app.add_option("--log-level", cfg.log_level)->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (cfg.heartbeat_ms * 2 > cfg.lease_ms) {
    std::fprintf(stderr, "stemma-coordinator: --heartbeat-ms must be at most half of --lease-ms\n");
    return 2;
  }
  stemma::InitLogging("coordinator", cfg.log_level);

  // Signals are taken by a dedicated thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  if (int err = MakeDirs(cfg.data); err != 0) {
    spdlog::error("cannot create --data {}: {}", cfg.data, std::strerror(err));
    return 1;
  }
  auto store = stemma::coordinator::OpenSqliteStore(cfg.data + "/stemma.db");
  if (!store.ok()) {
    spdlog::error("{}", store.status().ToString());
    return 1;
  }
  stemma::coordinator::CoordinatorMetrics metrics;
  std::unique_ptr<prometheus::Exposer> exposer;
  if (!cfg.metrics_listen.empty()) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(cfg.metrics_listen);
      exposer->RegisterCollectable(metrics.registry());
    } catch (const std::exception& e) {
      spdlog::error("cannot serve metrics on --metrics-listen {}: {}", cfg.metrics_listen, e.what());
      return 1;
    }
  }

  stemma::coordinator::CoordinatorOptions options;
  options.data_dir = cfg.data;
  options.lease_ms = cfg.lease_ms;
  options.heartbeat_ms = cfg.heartbeat_ms;
  stemma::coordinator::Coordinator coordinator(options, store->get(),
                                               stemma::RealClock::Get(), &metrics);
  if (absl::Status st = coordinator.Start(); !st.ok()) {
    spdlog::error("start: {}", st.ToString());
    return 1;
  }

  auto auth = stemma::MakeAllowAllAuthenticator();
  auto user = stemma::coordinator::MakeUserService(&coordinator, auth.get(), &metrics);
  auto worker = stemma::coordinator::MakeWorkerService(&coordinator, auth.get(), &metrics);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(cfg.listen, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(stemma::kMaxMessageBytes);
  builder.SetMaxSendMessageSize(stemma::kMaxMessageBytes);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.RegisterService(user.get());
  builder.RegisterService(worker.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    spdlog::error("cannot listen on --listen {}", cfg.listen);
    return 1;
  }
  spdlog::info("listening on {} (data {}{}{})", cfg.listen, cfg.data,
               cfg.metrics_listen.empty() ? "" : ", metrics on ", cfg.metrics_listen);

  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: shutting down", sig);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  coordinator.Stop();
  return 0;
}
