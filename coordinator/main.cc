// stemma-coordinator: composes the store, the domain core, the gRPC services and the
// metrics endpoint. Nothing else lives here.
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/support/server_interceptor.h>
#include <malloc.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <signal.h>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "common/k8s_token_review.h"
#include "common/log_format.h"
#include "common/logging.h"
#include "common/rpc.h"
#include "common/status.h"
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
  std::string log_format = "text";
  bool verify_artifacts = false;  // read reported outputs and check their manifest sha256
  // Security: TLS from files (reloaded when they change), tokens from a digest file.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;  // mTLS: workers may authenticate with a certificate
  std::string tokens;
  bool insecure = false;
  std::string health_listen;  // grpc.health.v1, plaintext, on its own port
  std::string quotas;         // quotas and fair share (coordinator/quotas.h)
  std::string metrics_auth;   // USER:PASSWORD file: /metrics needs HTTP basic auth
  std::string projects;       // subject -> projects (coordinator/tenancy.h)
  // Identity from the Kubernetes cluster (common/k8s_token_review.h).
  stemma::TokenReviewOptions k8s;
  std::vector<std::string> k8s_roles;
  int64_t k8s_ttl_s = 60;
  bool no_preemption = false;
  int64_t preemption_grace_s = 300;
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

void AddFlags(CLI::App& app, Config* c) {
  Config& cfg = *c;
  app.add_option("--data", cfg.data, "Directory for the database and logs")->capture_default_str();
  app.add_option("--listen", cfg.listen, "gRPC address (loopback by default)")
      ->capture_default_str();
  app.add_option("--metrics-listen", cfg.metrics_listen, "HOST:PORT for Prometheus /metrics");
  app.add_option("--lease-ms", cfg.lease_ms, "A worker silent this long is lost")
      ->check(CLI::Range(int64_t{100}, int64_t{3600000}))
      ->capture_default_str();
  app.add_option("--heartbeat-ms", cfg.heartbeat_ms, "Heartbeat interval for workers")
      ->check(CLI::Range(int64_t{10}, int64_t{600000}))
      ->capture_default_str();
  app.add_flag("--verify-artifacts", cfg.verify_artifacts,
               "Check the manifest sha256 of every output a worker reports (needs the "
               "workers' file systems; `stemma up` sets it)");
  app.add_option("--tls-cert", cfg.tls_cert, "PEM server certificate chain (enables TLS)");
  app.add_option("--tls-key", cfg.tls_key, "PEM private key of --tls-cert");
  app.add_option("--tls-client-ca", cfg.tls_client_ca,
                 "PEM CA for client certificates: workers may authenticate with one (mTLS)");
  app.add_option("--tokens", cfg.tokens,
                 "token file (sha256 digests, roles, subjects; see stemma token create); "
                 "enables authentication");
  app.add_flag("--insecure", cfg.insecure,
               "allow listening beyond loopback without TLS and tokens (anyone who can reach "
               "the port can run jobs)");
  app.add_option("--metrics-auth", cfg.metrics_auth,
                 "file (mode 0600) holding USER:PASSWORD: /metrics then needs HTTP basic auth "
                 "(its series name every user's experiments, stages and metrics)");
  app.add_option("--quotas", cfg.quotas,
                 "YAML file of per-subject and per-project limits (queued jobs, running GPUs, "
                 "priority range) and fair share; re-read when it changes "
                 "(docs/operator-guide.md)");
  app.add_flag("--no-preemption", cfg.no_preemption,
               "never stop running jobs for higher-priority ones (priorities then only order "
               "the queue)");
  app.add_option("--preemption-grace-s", cfg.preemption_grace_s,
                 "how long a preempted attempt has to save its checkpoint and exit before it is "
                 "killed and requeued anyway")
      ->check(CLI::Range(int64_t{1}, int64_t{86400}))
      ->capture_default_str();
  app.add_option("--health-listen", cfg.health_listen,
                 "HOST:PORT for grpc.health.v1 (plaintext, nothing else on it)");
  app.add_option("--projects", cfg.projects,
                 "File of projects and their members (PROJECT SUBJECT... per line): members "
                 "share experiments, storage prefixes and artifacts (docs/tenancy.md)");
  app.add_option("--k8s-token-review", cfg.k8s.api_server,
                 "Kubernetes API server URL (https://kubernetes.default.svc): bearer tokens "
                 "that are not Stemma tokens are verified there (TokenReview), e.g. workers' "
                 "projected service-account tokens; enables authentication");
  app.add_option("--k8s-role", cfg.k8s_roles,
                 "NAMESPACE/SERVICEACCOUNT=ROLE, repeatable: the role of a service account's "
                 "tokens (a worker's subject is its pod's name)");
  app.add_option("--k8s-audience", cfg.k8s.audience, "audience the tokens must be issued for")
      ->capture_default_str();
  app.add_option("--k8s-ca", cfg.k8s.ca_file, "CA of the API server")->capture_default_str();
  app.add_option("--k8s-token-file", cfg.k8s.token_file,
                 "the coordinator's own service-account token, for the TokenReview calls")
      ->capture_default_str();
  app.add_option("--k8s-review-ttl-s", cfg.k8s_ttl_s, "how long an accepted token is cached")
      ->check(CLI::Range(int64_t{1}, int64_t{3600}))
      ->capture_default_str();
  app.add_option("--log-level", cfg.log_level)
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  app.add_option("--log-format", cfg.log_format, "text | json (one JSON object per line)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
}

// The authenticator --tokens and --k8s-token-review ask for (`enabled`: either was given);
// INVALID_ARGUMENT (and the like) naming the flag when one cannot be used. Its metrics are
// registered on `metrics`.
absl::StatusOr<std::unique_ptr<stemma::Authenticator>> MakeAuthenticator(
    Config& cfg, bool enabled, stemma::coordinator::CoordinatorMetrics& metrics) {
  std::shared_ptr<stemma::TokenReviewer> reviewer;
  if (!cfg.k8s.api_server.empty()) {
    for (const std::string& r : cfg.k8s_roles) {
      RETURN_IF_ERROR(stemma::ParseK8sRole(r, &cfg.k8s.roles));
    }
    cfg.k8s.ttl_ms = cfg.k8s_ttl_s * 1000;
    ASSIGN_OR_RETURN(reviewer, stemma::TokenReviewer::Create(cfg.k8s));
  }
  if (!enabled) {
    if (!cfg.tls_client_ca.empty()) {
      // Certificates alone would admit workers while users stayed unauthenticated.
      return absl::InvalidArgumentError("--tls-client-ca needs --tokens");
    }
    return stemma::MakeAllowAllAuthenticator();
  }
  absl::StatusOr<std::unique_ptr<stemma::TokenStore>> store =
      cfg.tokens.empty() ? stemma::TokenStore::FromText("", "no --tokens")
                         : stemma::TokenStore::Open(cfg.tokens);
  if (!store.ok()) {
    return absl::Status(store.status().code(),
                        absl::StrCat("--tokens: ", store.status().message()));
  }
  auto& failures = prometheus::BuildCounter()
                       .Name("stemma_auth_failures_total")
                       .Help("Calls refused by authentication or authorisation, by reason")
                       .Register(*metrics.registry());
  auto& malformed = prometheus::BuildGauge()
                        .Name("stemma_auth_token_file_malformed_lines")
                        .Help(
                            "Lines of the --tokens file skipped at its last reload (their "
                            "tokens are refused); -1: the file could not be read")
                        .Register(*metrics.registry())
                        .Add({});
  (*store)->SetReloadObserver([&malformed](int lines) { malformed.Set(lines); });
  // Bounded label set: the reasons are fixed strings.
  return stemma::MakeTokenAuthenticator(
      std::shared_ptr<stemma::TokenStore>(std::move(*store)), !cfg.tls_client_ca.empty(),
      [&failures](absl::string_view reason) {
        failures.Add({{"reason", std::string(reason)}}).Increment();
      },
      reviewer == nullptr
          ? stemma::ExternalTokenVerifier()
          : [reviewer](absl::string_view token) { return reviewer->Review(token); });
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
  AddFlags(app, &cfg);
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
  stemma::SetLogFormat(cfg.log_format);

  // Open beyond loopback only with TLS and tokens, or when told so in as many words.
  const bool tls = !cfg.tls_cert.empty();
  const bool tokens = !cfg.tokens.empty() || !cfg.k8s.api_server.empty();
  if (!stemma::IsLoopbackAddress(cfg.listen) && !(tls && tokens)) {
    if (!cfg.insecure) {
      std::fprintf(stderr,
                   "stemma-coordinator: --listen %s reaches beyond loopback without %s%s%s: "
                   "give --tls-cert/--tls-key and --tokens, or --insecure to run it open\n",
                   cfg.listen.c_str(), tls ? "" : "TLS", !tls && !tokens ? " and " : "",
                   tokens ? "" : "tokens");
      return 2;
    }
    spdlog::warn(
        "*** INSECURE: listening on {} without {}: anyone who can reach this port "
        "can submit jobs and register workers ***",
        cfg.listen, !tls && !tokens ? "TLS or tokens" : (tls ? "tokens" : "TLS"));
  }

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
  // The exposer holds collectables weakly: this one lives as long as main.
  const std::shared_ptr<prometheus::Collectable> certificates =
      stemma::MakeCertificateExpiryCollectable(
          {{.certificate = "server", .path = cfg.tls_cert},
           {.certificate = "client_ca", .path = cfg.tls_client_ca}});
  std::unique_ptr<prometheus::Exposer> exposer;
  if (!cfg.metrics_listen.empty()) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(cfg.metrics_listen);
      if (!cfg.metrics_auth.empty()) {
        absl::StatusOr<std::string> text = stemma::ReadSecretFile(cfg.metrics_auth);
        absl::StatusOr<std::function<bool(const std::string&, const std::string&)>> check =
            absl::UnknownError("unread");
        check = text.ok() ? stemma::coordinator::MetricsBasicAuth(*text, cfg.metrics_auth)
                          : decltype(check)(text.status());
        if (!check.ok()) {
          std::fprintf(stderr, "stemma-coordinator: --metrics-auth: %s\n",
                       std::string(check.status().message()).c_str());
          return 2;
        }
        exposer->RegisterAuth(*std::move(check), "stemma");
      }
      exposer->RegisterCollectable(metrics.registry());
      exposer->RegisterCollectable(certificates);
    } catch (const std::exception& e) {
      spdlog::error("cannot serve metrics on --metrics-listen {}: {}", cfg.metrics_listen,
                    e.what());
      return 1;
    }
  }

  stemma::coordinator::CoordinatorOptions options;
  options.data_dir = cfg.data;
  options.lease_ms = cfg.lease_ms;
  options.heartbeat_ms = cfg.heartbeat_ms;
  options.verify_artifacts = cfg.verify_artifacts;
  options.quotas_file = cfg.quotas;
  options.scheduler.preemption = !cfg.no_preemption;
  options.scheduler.preemption_grace_ms = cfg.preemption_grace_s * 1000;
  if (!cfg.projects.empty()) {
    auto tenancy = stemma::coordinator::Tenancy::Load(cfg.projects);
    if (!tenancy.ok()) {
      std::fprintf(stderr, "stemma-coordinator: --projects: %s\n",
                   std::string(tenancy.status().message()).c_str());
      return 2;
    }
    options.tenancy = std::move(*tenancy);
  }
  stemma::coordinator::Coordinator coordinator(options, store->get(), stemma::RealClock::Get(),
                                               &metrics);
  if (absl::Status st = coordinator.Start(); !st.ok()) {
    spdlog::error("start: {}", st.ToString());
    return 1;
  }

  absl::StatusOr<std::unique_ptr<stemma::Authenticator>> made_auth =
      MakeAuthenticator(cfg, tokens, metrics);
  if (!made_auth.ok()) {
    std::fprintf(stderr, "stemma-coordinator: %s\n",
                 std::string(made_auth.status().message()).c_str());
    return 2;
  }
  std::unique_ptr<stemma::Authenticator> auth = *std::move(made_auth);
  auto credentials = stemma::MakeServerCredentials(
      {.cert_file = cfg.tls_cert, .key_file = cfg.tls_key, .client_ca_file = cfg.tls_client_ca});
  if (!credentials.ok()) {
    std::fprintf(stderr, "stemma-coordinator: %s\n",
                 std::string(credentials.status().message()).c_str());
    return 2;
  }
  auto user = stemma::coordinator::MakeUserService(&coordinator, auth.get(), &metrics);
  auto worker = stemma::coordinator::MakeWorkerService(&coordinator, auth.get(), &metrics);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(cfg.listen, *credentials, &port);
  builder.SetMaxReceiveMessageSize(stemma::kMaxMessageBytes);
  builder.SetMaxSendMessageSize(stemma::kMaxMessageBytes);
  // Keepalive policy: workers ping every few seconds even when idle; a client that pings
  // more often than every 5 s without data is sent GOAWAY (too_many_pings) after 3 strikes.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 3);
  // The server pings idle connections so that dead peers are found without traffic.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  // Bounded concurrency per connection, and handshakes that cannot hang a connection slot.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 1000);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10000);
  builder.RegisterService(user.get());
  builder.RegisterService(worker.get());
  {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors;
    interceptors.push_back(stemma::MakeRpcEndInterceptor(
        [&metrics](absl::string_view method, absl::StatusCode code, double seconds) {
          metrics.RpcEnded(method, code, seconds);
        }));
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  // The health service must not be on this server (every service is on every port, and
  // health is unauthenticated): it gets a server of its own below.
  grpc::EnableDefaultHealthCheckService(false);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    spdlog::error("cannot listen on --listen {}", cfg.listen);
    return 1;
  }
  std::unique_ptr<stemma::HealthServer> health;
  if (!cfg.health_listen.empty()) {
    auto started = stemma::HealthServer::Start(cfg.health_listen);
    if (!started.ok()) {
      spdlog::error("{}", std::string(started.status().message()));
      return 1;
    }
    health = std::move(*started);
  }
  spdlog::info("listening on {} ({}, {}; data {}{}{}{}{})", cfg.listen, tls ? "TLS" : "plaintext",
               tokens ? "tokens" : "no authentication", cfg.data,
               cfg.metrics_listen.empty() ? "" : ", metrics on ", cfg.metrics_listen,
               cfg.health_listen.empty() ? "" : ", health on ", cfg.health_listen);

  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: shutting down", sig);
  health.reset();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  coordinator.Stop();
  return 0;
}
