#include "common/rpc.h"

namespace stemma {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

namespace {
class AllowAll final : public Authenticator {
 public:
  absl::Status Authenticate(const grpc::ServerContext&, absl::string_view, Caller* caller) const override {
    caller->principal = "anonymous";
    caller->role = "admin";
    return absl::OkStatus();
  }
};
}  // namespace

std::unique_ptr<Authenticator> MakeAllowAllAuthenticator() { return std::make_unique<AllowAll>(); }

}  // namespace stemma
