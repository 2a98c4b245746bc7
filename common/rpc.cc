#include "common/rpc.h"

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <prometheus/metric_family.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/files.h"
#include "common/logging.h"
#include "common/status.h"

namespace stemma {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::Status Authenticator::Deny(const grpc::ServerContext&, absl::string_view, const Caller&,
                                 absl::string_view, absl::string_view message) const {
  return absl::PermissionDeniedError(message);
}

namespace {

class AllowAll final : public Authenticator {
 public:
  absl::Status Authenticate(const grpc::ServerContext&, absl::string_view method,
                            Caller* caller) const override {
    // Deny by default holds here too: a method without a policy is a bug, not an open door.
    if (AllowedRoles(method) == 0) {
      return absl::PermissionDeniedError(absl::StrCat(method, ": no access policy"));
    }
    *caller = Caller{};
    return absl::OkStatus();
  }
};

class TokenAuthenticator final : public Authenticator {
 public:
  TokenAuthenticator(std::shared_ptr<TokenStore> tokens, bool trust_client_certs,
                     AuthFailureCounter on_failure, ExternalTokenVerifier external)
      : tokens_(std::move(tokens)),
        trust_client_certs_(trust_client_certs),
        on_failure_(std::move(on_failure)),
        external_(std::move(external)) {}

  bool enforcing() const override { return true; }

  absl::Status Authenticate(const grpc::ServerContext& ctx, absl::string_view method,
                            Caller* caller) const override {
    *caller = Caller{};
    caller->subject.clear();
    caller->role = Role::kNone;
    const RoleSet allowed = AllowedRoles(method);
    if (allowed == 0) {
      return Refuse(ctx, method, *caller, "no_policy",
                    absl::PermissionDeniedError(absl::StrCat(method, ": no access policy")));
    }
    const auto& md = ctx.client_metadata();
    auto it = md.find("authorization");
    if (it != md.end()) {
      absl::string_view value(it->second.data(), it->second.size());
      constexpr absl::string_view kBearer = "Bearer ";
      if (!absl::StartsWith(value, kBearer)) {
        return Refuse(ctx, method, *caller, "bad_token",
                      absl::UnauthenticatedError("authorization: expected 'Bearer <token>'"));
      }
      const absl::string_view token = value.substr(kBearer.size());
      absl::StatusOr<TokenIdentity> id = absl::NotFoundError("no tokens");
      if (tokens_ != nullptr) id = tokens_->Lookup(token);
      // Not in the token file and not a Stemma token ("stm_..."): maybe the cluster's.
      if (!id.ok() && external_ != nullptr && !absl::StartsWith(token, "stm_")) {
        id = external_(token);
        if (id.status().code() == absl::StatusCode::kUnavailable) {
          return Refuse(ctx, method, *caller, "token_review_unavailable",
                        absl::UnavailableError(id.status().message()));
        }
      }
      if (!id.ok()) {
        return Refuse(ctx, method, *caller, "bad_token",
                      absl::UnauthenticatedError("invalid or revoked token"));
      }
      caller->subject = id->subject;
      caller->role = id->role;
    } else if (std::string cn = VerifiedCommonName(ctx); !cn.empty()) {
      caller->subject = std::move(cn);
      caller->role = Role::kWorker;
    } else {
      return Refuse(ctx, method, *caller, "missing_token",
                    absl::UnauthenticatedError(
                        "no token: set STEMMA_TOKEN or ~/.config/stemma/token (see stemma "
                        "token create)"));
    }
    caller->authenticated = true;
    if ((allowed & static_cast<RoleSet>(caller->role)) == 0) {
      return Refuse(
          ctx, method, *caller, "denied",
          absl::PermissionDeniedError(absl::StrCat("role ", RoleName(caller->role), " (",
                                                   caller->subject, ") may not call ", method)));
    }
    return absl::OkStatus();
  }

  absl::Status Deny(const grpc::ServerContext& ctx, absl::string_view method, const Caller& caller,
                    absl::string_view reason, absl::string_view message) const override {
    return Refuse(ctx, method, caller, reason, absl::PermissionDeniedError(message));
  }

 private:
  std::string VerifiedCommonName(const grpc::ServerContext& ctx) const {
    if (!trust_client_certs_) return "";
    std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
    if (auth == nullptr || !auth->IsPeerAuthenticated()) return "";
    auto values = auth->FindPropertyValues("x509_common_name");
    if (values.empty()) return "";
    return std::string(values.front().data(), values.front().size());
  }

  absl::Status Refuse(const grpc::ServerContext& ctx, absl::string_view method,
                      const Caller& caller, absl::string_view reason, absl::Status status) const {
    if (on_failure_) on_failure_(reason);
    // Never the token: method, peer, who it claimed to be, and why. A flood of refused calls
    // (the metric counts each) is logged at a bounded rate, saying how many were left out.
    int64_t suppressed = 0;
    if (!log_limit_.Allow(&suppressed)) return status;
    spdlog::warn(
        "auth: refused method={} reason={} peer={} subject={} role={}: {}{}", std::string(method),
        std::string(reason), ctx.peer(), caller.subject.empty() ? "-" : caller.subject,
        std::string(RoleName(caller.role)), std::string(status.message()),
        suppressed == 0 ? std::string()
                        : absl::StrCat(" (", suppressed, " refusals before it not logged)"));
    return status;
  }

  std::shared_ptr<TokenStore> tokens_;
  const bool trust_client_certs_;
  AuthFailureCounter on_failure_;
  ExternalTokenVerifier external_;
  mutable LogRateLimiter log_limit_{20};
};

absl::Status CheckReadable(absl::string_view what, const std::string& path) {
  if (::access(path.c_str(), R_OK) != 0) {
    return ErrnoStatus(absl::StrCat(what, " ", path), errno);
  }
  return absl::OkStatus();
}

class RpcEndInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcEndInterceptor(absl::string_view method, const RpcEndObserver* observer)
      : method_(method), observer_(observer), start_(std::chrono::steady_clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      (*observer_)(
          method_, static_cast<absl::StatusCode>(methods->GetSendStatus().error_code()),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    }
    methods->Proceed();
  }

 private:
  absl::string_view method_;  // points into the method name gRPC keeps for the server's life
  const RpcEndObserver* observer_;
  const std::chrono::steady_clock::time_point start_;  // the interceptor is made as the call starts
};

class RpcEndInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcEndInterceptorFactory(RpcEndObserver observer) : observer_(std::move(observer)) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    absl::string_view method = info->method() != nullptr ? info->method() : "";
    if (auto slash = method.rfind('/');
        slash != absl::string_view::npos && absl::StartsWith(method, "/stemma.")) {
      method.remove_prefix(slash + 1);
    }
    return new RpcEndInterceptor(method, &observer_);
  }

 private:
  const RpcEndObserver observer_;
};

// Reads each watched file again when its size or modification time changed.
class CertificateExpiryCollectable final : public prometheus::Collectable {
 public:
  explicit CertificateExpiryCollectable(std::vector<WatchedCertificate> files) {
    for (auto& f : files) {
      if (!f.path.empty()) watched_.push_back({std::move(f)});
    }
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    prometheus::MetricFamily family;
    family.name = "stemma_tls_certificate_expiry_timestamp_seconds";
    family.help =
        "Earliest notAfter (Unix seconds) of the certificates in each PEM file the TLS credentials "
        "load";
    family.type = prometheus::MetricType::Gauge;
    absl::MutexLock lock(&mu_);
    for (Watched& w : watched_) {
      Refresh(w);
      if (!w.expiry) continue;
      prometheus::ClientMetric m;
      m.label.push_back({"certificate", w.file.certificate});
      m.gauge.value = static_cast<double>(*w.expiry);
      family.metric.push_back(std::move(m));
    }
    if (family.metric.empty()) return {};
    return {std::move(family)};
  }

 private:
  struct Watched {
    WatchedCertificate file;
    std::optional<int64_t> expiry;
    struct timespec mtime {};
    off_t size = -1;
    bool warned = false;
  };

  static void Refresh(Watched& w) {
    struct stat st {};
    if (::stat(w.file.path.c_str(), &st) == 0 && st.st_size == w.size &&
        st.st_mtim.tv_sec == w.mtime.tv_sec && st.st_mtim.tv_nsec == w.mtime.tv_nsec) {
      return;
    }
    absl::StatusOr<std::string> text = files::ReadFile(w.file.path);
    absl::StatusOr<int64_t> expiry =
        text.ok() ? EarliestCertificateExpiry(*text) : absl::NotFoundError("cannot read it");
    if (!expiry.ok()) {
      // Keep the last value: a file caught in the middle of a replacement is read again.
      if (!w.warned) {
        spdlog::warn("certificate expiry: {} ({}): {}", w.file.path, w.file.certificate,
                     std::string(expiry.status().message()));
      }
      w.warned = true;
      return;
    }
    w.expiry = *expiry;
    w.mtime = st.st_mtim;
    w.size = st.st_size;
    w.warned = false;
  }

  mutable absl::Mutex mu_;
  mutable std::vector<Watched> watched_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeRpcEndInterceptor(
    RpcEndObserver observer) {
  return std::make_unique<RpcEndInterceptorFactory>(std::move(observer));
}

std::shared_ptr<prometheus::Collectable> MakeCertificateExpiryCollectable(
    std::vector<WatchedCertificate> files) {
  return std::make_shared<CertificateExpiryCollectable>(std::move(files));
}

absl::StatusOr<std::unique_ptr<HealthServer>> HealthServer::Start(const std::string& address) {
  std::unique_ptr<HealthServer> h(new HealthServer());
  // The default health service is added to servers built while this is on: only this one.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  // The health service is the server's only one; gRPC wants a polled queue beside it.
  h->cq_ = builder.AddCompletionQueue(/*is_frequently_polled=*/true);
  h->server_ = builder.BuildAndStart();
  grpc::EnableDefaultHealthCheckService(false);
  if (h->server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on --health-listen ", address));
  }
  h->poller_ = std::thread([cq = h->cq_.get()] {
    void* tag;
    bool ok;
    while (cq->Next(&tag, &ok)) {
    }
  });
  h->server_->GetHealthCheckService()->SetServingStatus(true);
  return h;
}

HealthServer::~HealthServer() {
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  if (cq_ == nullptr) return;
  cq_->Shutdown();
  if (poller_.joinable()) {
    poller_.join();
    return;
  }
  void* tag;
  bool ok;
  while (cq_->Next(&tag, &ok)) {
  }
}

std::unique_ptr<Authenticator> MakeAllowAllAuthenticator() { return std::make_unique<AllowAll>(); }

std::unique_ptr<Authenticator> MakeTokenAuthenticator(std::shared_ptr<TokenStore> tokens,
                                                      bool trust_client_certs,
                                                      AuthFailureCounter on_failure,
                                                      ExternalTokenVerifier external) {
  return std::make_unique<TokenAuthenticator>(std::move(tokens), trust_client_certs,
                                              std::move(on_failure), std::move(external));
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsOptions& o) {
  if (o.cert_file.empty() && o.key_file.empty()) {
    if (!o.client_ca_file.empty()) {
      return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
    }
    return grpc::InsecureServerCredentials();
  }
  if (o.cert_file.empty() || o.key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  RETURN_IF_ERROR(CheckReadable("--tls-cert", o.cert_file));
  RETURN_IF_ERROR(CheckReadable("--tls-key", o.key_file));
  RETURN_IF_ERROR(CheckPrivateKeyFile("--tls-key", o.key_file));
  if (!o.client_ca_file.empty())
    RETURN_IF_ERROR(CheckReadable("--tls-client-ca", o.client_ca_file));
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      o.key_file, o.cert_file, o.client_ca_file, o.refresh_s);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!o.client_ca_file.empty()) {
    options.watch_root_certs();
    // Workers may prove who they are with a certificate; the CLI (tokens only) may not
    // have one. A certificate that is presented must verify.
    options.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientSecurity& s, grpc::ChannelArguments* args) {
  if (!s.tls()) {
    if (!s.cert_file.empty()) {
      return absl::InvalidArgumentError("a client certificate needs a CA (--ca)");
    }
    return grpc::InsecureChannelCredentials();
  }
  RETURN_IF_ERROR(CheckReadable("CA file", s.ca_file));
  if (s.cert_file.empty() != s.key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider;
  if (!s.cert_file.empty()) {
    RETURN_IF_ERROR(CheckReadable("--tls-cert", s.cert_file));
    RETURN_IF_ERROR(CheckReadable("--tls-key", s.key_file));
    RETURN_IF_ERROR(CheckPrivateKeyFile("--tls-key", s.key_file));
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        s.key_file, s.cert_file, s.ca_file, 5);
  } else {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(s.ca_file, 5);
  }
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (!s.cert_file.empty()) options.watch_identity_key_cert_pairs();
  if (!s.server_name.empty() && args != nullptr) args->SetSslTargetNameOverride(s.server_name);
  return grpc::experimental::TlsCredentials(options);
}

void AddCallCredentials(const ClientSecurity& s, grpc::ClientContext* ctx) {
  if (!s.token_file.empty()) {
    absl::StatusOr<std::string> fresh = ReadSecretFile(s.token_file);
    if (fresh.ok() && !fresh->empty()) {
      ctx->AddMetadata("authorization", "Bearer " + *fresh);
      return;
    }
  }
  if (!s.token.empty()) ctx->AddMetadata("authorization", "Bearer " + s.token);
}

}  // namespace stemma
