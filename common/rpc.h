// The one place where absl::Status and grpc::Status meet, plus authentication (who is
// calling, may they) and transport security (TLS credentials for servers and clients).
// Only the rpc adapters (coordinator/rpc, worker, cli) include this header.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>
#include <prometheus/collectable.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/auth.h"

namespace stemma {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Who is calling. Filled by the Authenticator before any handler runs, for each call.
struct Caller {
  std::string subject = "local";  // token subject or certificate name
  Role role = Role::kAdmin;
  bool authenticated = false;  // false: authentication is off (loopback, zero-config)

  bool is(Role r) const { return role == r; }
};

// Decides whether a call may proceed. The adapters call Authenticate() first thing in
// every RPC with the full method name ("/stemma.v1.UserService/Submit"); nothing reaches a
// handler without it. Thread-safe.
class Authenticator {
 public:
  virtual ~Authenticator() = default;
  // UNAUTHENTICATED (no or unknown credential) or PERMISSION_DENIED (the role may not call
  // the method, or the method has no entry in MethodRoles()) to refuse.
  virtual absl::Status Authenticate(const grpc::ServerContext& ctx, absl::string_view method,
                                    Caller* caller) const = 0;
  // Records a refusal decided by an adapter after Authenticate (not the owner of a job, a
  // worker registering under another id): counted and logged like the others. Returns
  // PERMISSION_DENIED with `message`.
  virtual absl::Status Deny(const grpc::ServerContext& ctx, absl::string_view method,
                            const Caller& caller, absl::string_view reason,
                            absl::string_view message) const;
  // True when callers are authenticated (tokens or certificates); false for AllowAll.
  virtual bool enforcing() const { return false; }
};

// Accepts every call as the admin "local". Only for daemons that listen on loopback.
std::unique_ptr<Authenticator> MakeAllowAllAuthenticator();

// Called with a reason ("missing_token", "bad_token", "denied", "no_policy",
// "wrong_identity", "not_owner") for each refused call.
using AuthFailureCounter = std::function<void(absl::string_view reason)>;

// Bearer tokens ("authorization: Bearer stm_...") looked up in `tokens`, resolved on every
// call (never cached on the connection); with `trust_client_certs`, a caller without a
// token whose TLS client certificate verified is the worker named by the certificate's
// common name. Then the method's row of MethodRoles() decides. Refusals are counted and
// logged with method, peer and subject, never the token.
//
// `external` (optional) resolves bearer tokens that are neither in `tokens` nor Stemma tokens
// ("stm_..."): a Kubernetes service-account token through the TokenReview API
// (common/k8s_token_review.h).
// NOT_FOUND from it refuses the call as a bad token; UNAVAILABLE refuses it with
// UNAVAILABLE (reason "token_review_unavailable"), so the caller retries.
using ExternalTokenVerifier = std::function<absl::StatusOr<TokenIdentity>(absl::string_view token)>;
std::unique_ptr<Authenticator> MakeTokenAuthenticator(std::shared_ptr<TokenStore> tokens,
                                                      bool trust_client_certs,
                                                      AuthFailureCounter on_failure,
                                                      ExternalTokenVerifier external = nullptr);

// Server TLS from PEM files, re-read when they change (every `refresh_s` seconds: replace
// them atomically, by rename). Without `cert_file` the server is plaintext.
struct ServerTlsOptions {
  std::string cert_file;       // server certificate chain
  std::string key_file;        // its private key
  std::string client_ca_file;  // set: clients may present certificates signed by it (mTLS)
  unsigned refresh_s = 5;
};
// INVALID_ARGUMENT / NOT_FOUND naming the flag's file when a file is missing or unreadable.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsOptions& options);

// How a client reaches a server: TLS when `ca_file` is set (the server's certificate must
// chain to it and name the host), a client certificate for mTLS when cert and key are set,
// and a bearer token on every call when `token` is set.
struct ClientSecurity {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  std::string token;
  // Read again for each call when set (a Kubernetes projected token is rotated in place);
  // `token` is used when it cannot be read or is empty.
  std::string token_file;
  std::string server_name;  // expected name in the server certificate; default: the host

  bool tls() const { return !ca_file.empty(); }
};
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientSecurity& security, grpc::ChannelArguments* args);
// Adds the token (if any) to one call.
void AddCallCredentials(const ClientSecurity& security, grpc::ClientContext* ctx);

// Called once as each call of a server ends, with the method's short name ("Submit",
// "Session"; the full name for a method the server does not know), the status its
// handler returned and the call's duration in seconds (from its start: a stream's whole
// life). For RPC counters by method and code (the caller keeps labels bounded).
using RpcEndObserver =
    std::function<void(absl::string_view method, absl::StatusCode code, double seconds)>;
// ServerBuilder::experimental().SetInterceptorCreators takes these.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeRpcEndInterceptor(
    RpcEndObserver observer);

// grpc.health.v1 on a plaintext port of its own, with no other service on it (health is
// unauthenticated, and every service of a server is on every one of its ports): what
// kubelet's grpc probe asks. Answers SERVING for service "" until the object is destroyed.
class HealthServer {
 public:
  // UNAVAILABLE naming --health-listen when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HealthServer>> Start(const std::string& address);
  ~HealthServer();

 private:
  HealthServer() = default;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  std::thread poller_;
};

// stemma_tls_certificate_expiry_timestamp_seconds{certificate}: the earliest notAfter in
// each PEM file a daemon's TLS credentials load, read again whenever the file changed when
// Prometheus scrapes (the credentials reload the same files within seconds; see
// ServerTlsOptions), so a renewed certificate shows at the next scrape. A file that cannot
// be read keeps its last value (and is logged). `certificate` names the file's use: server,
// client_ca (the coordinator), client, ca (the worker). Not `endpoint`: the Prometheus
// operator sets that target label on every series it scrapes.
struct WatchedCertificate {
  std::string certificate;
  std::string path;
};
std::shared_ptr<prometheus::Collectable> MakeCertificateExpiryCollectable(
    std::vector<WatchedCertificate> files);

// Transport limits shared by both servers.
inline constexpr int kMaxMessageBytes = 4 * 1024 * 1024;

}  // namespace stemma
