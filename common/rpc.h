// The one place where absl::Status and grpc::Status meet, plus the authentication hook.
// Only the rpc adapters (coordinator/rpc, worker, cli) include this header.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"

namespace stemma {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Who is calling. Filled by the Authenticator before any handler runs.
struct Caller {
  std::string principal;  // "anonymous" until authentication arrives
  std::string role;       // "admin" for now
};

// Decides whether a call may proceed. The adapters call Authenticate() first thing in
// every RPC, so TLS client certificates and role tokens slot in here without touching a
// handler. Thread-safe.
class Authenticator {
 public:
  virtual ~Authenticator() = default;
  // UNAUTHENTICATED or PERMISSION_DENIED to refuse.
  virtual absl::Status Authenticate(const grpc::ServerContext& ctx, absl::string_view method,
                                    Caller* caller) const = 0;
};

// Accepts every call as an anonymous admin. The servers bind to loopback by default, so
// this is only safe there.
std::unique_ptr<Authenticator> MakeAllowAllAuthenticator();

// Transport limits shared by both servers.
inline constexpr int kMaxMessageBytes = 4 * 1024 * 1024;

}  // namespace stemma
