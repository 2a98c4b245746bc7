#include "cli/client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rpc.h"
#include "stemma/v1/user_service.grpc.pb.h"

namespace stemma::cli {
namespace {

// Job lists and worker lists can be large; give responses more room than the default.
constexpr int kMaxReceiveBytes = 64 * 1024 * 1024;

std::chrono::system_clock::time_point ToChrono(absl::Time t) { return absl::ToChronoTime(t); }

}  // namespace

class CoordinatorClient::Impl {
 public:
  explicit Impl(const std::string& address) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxReceiveBytes);
    args.SetMaxSendMessageSize(kMaxReceiveBytes);
    // Reconnect quickly: `stemma up` polls a starting coordinator, and watches reconnect
    // to a restarted one; gRPC's default backoff would add seconds to both.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // A fresh client means a fresh connection, not a shared one still in backoff.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    stub_ = v1::UserService::NewStub(channel_);
  }
  v1::UserService::Stub* stub() { return stub_.get(); }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::UserService::Stub> stub_;
};

CoordinatorClient::CoordinatorClient(std::string address, absl::Duration timeout)
    : address_(std::move(address)), timeout_(timeout), impl_(std::make_unique<Impl>(address_)) {}

CoordinatorClient::~CoordinatorClient() = default;

namespace {

// The one conversion from gRPC errors to what the user reads.
absl::Status Convert(const grpc::Status& status, const std::string& address,
                     absl::Duration timeout) {
  if (status.ok()) return absl::OkStatus();
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return absl::UnavailableError(absl::StrCat("cannot reach the coordinator at ", address,
                                                 " (start one with 'stemma up')"));
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::DeadlineExceededError(absl::StrCat("the coordinator at ", address,
                                                      " did not answer within ",
                                                      absl::FormatDuration(timeout)));
    default: {
      absl::Status converted = FromGrpcStatus(status);
      if (converted.message().empty()) {
        return absl::Status(converted.code(), absl::StatusCodeToString(converted.code()));
      }
      return converted;
    }
  }
}

template <typename Request, typename Response, typename Method>
absl::StatusOr<Response> Unary(v1::UserService::Stub* stub, Method method, const Request& request,
                               const std::string& address, absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(ToChrono(absl::Now() + timeout));
  Response response;
  grpc::Status status = (stub->*method)(&ctx, request, &response);
  if (!status.ok()) return Convert(status, address, timeout);
  return response;
}

}  // namespace

absl::StatusOr<v1::SubmitResponse> CoordinatorClient::Submit(const v1::SubmitRequest& request) {
  return Unary<v1::SubmitRequest, v1::SubmitResponse>(impl_->stub(), &v1::UserService::Stub::Submit,
                                                      request, address_, timeout_);
}

absl::StatusOr<v1::Job> CoordinatorClient::GetJob(const std::string& id) {
  v1::GetJobRequest request;
  request.set_id(id);
  auto response = Unary<v1::GetJobRequest, v1::JobResponse>(
      impl_->stub(), &v1::UserService::Stub::GetJob, request, address_, timeout_);
  if (!response.ok()) return response.status();
  return std::move(*response->mutable_job());
}

absl::StatusOr<v1::ListJobsResponse> CoordinatorClient::ListJobs(
    const v1::ListJobsRequest& request) {
  return Unary<v1::ListJobsRequest, v1::ListJobsResponse>(
      impl_->stub(), &v1::UserService::Stub::ListJobs, request, address_, timeout_);
}

absl::StatusOr<v1::Job> CoordinatorClient::Cancel(const std::string& id,
                                                  const std::string& reason) {
  v1::CancelRequest request;
  request.set_id(id);
  request.set_reason(reason);
  auto response = Unary<v1::CancelRequest, v1::JobResponse>(
      impl_->stub(), &v1::UserService::Stub::Cancel, request, address_, timeout_);
  if (!response.ok()) return response.status();
  return std::move(*response->mutable_job());
}

absl::StatusOr<v1::Job> CoordinatorClient::Retry(const std::string& id) {
  v1::RetryRequest request;
  request.set_id(id);
  auto response = Unary<v1::RetryRequest, v1::JobResponse>(
      impl_->stub(), &v1::UserService::Stub::Retry, request, address_, timeout_);
  if (!response.ok()) return response.status();
  return std::move(*response->mutable_job());
}

absl::StatusOr<v1::ListWorkersResponse> CoordinatorClient::ListWorkers() {
  return ListWorkers(timeout_);
}

absl::StatusOr<v1::ListWorkersResponse> CoordinatorClient::ListWorkers(absl::Duration timeout) {
  return Unary<v1::ListWorkersRequest, v1::ListWorkersResponse>(
      impl_->stub(), &v1::UserService::Stub::ListWorkers, v1::ListWorkersRequest(), address_,
      timeout);
}

absl::StatusOr<v1::WorkerInfo> CoordinatorClient::Drain(const std::string& worker_id,
                                                        bool undrain) {
  v1::DrainRequest request;
  request.set_worker_id(worker_id);
  request.set_undrain(undrain);
  auto response = Unary<v1::DrainRequest, v1::DrainResponse>(
      impl_->stub(), &v1::UserService::Stub::Drain, request, address_, timeout_);
  if (!response.ok()) return response.status();
  return std::move(*response->mutable_worker());
}

absl::Status CoordinatorClient::Watch(const v1::WatchRequest& request,
                                      const std::function<bool(const v1::JobEvent&)>& on_event,
                                      absl::Time deadline, int64_t* received) {
  grpc::ClientContext ctx;
  if (deadline != absl::InfiniteFuture()) ctx.set_deadline(ToChrono(deadline));
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = impl_->stub()->Watch(&ctx, request);
  v1::JobEvent event;
  while (reader->Read(&event)) {
    ++*received;
    if (!on_event(event)) {
      ctx.TryCancel();
      (void)reader->Finish();
      return absl::OkStatus();
    }
  }
  grpc::Status status = reader->Finish();
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::DeadlineExceededError("deadline passed");
  }
  return Convert(status, address_, timeout_);
}

absl::Status CoordinatorClient::Logs(const v1::LogsRequest& request,
                                     const std::function<void(const v1::LogChunk&)>& on_chunk) {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<v1::LogChunk>> reader = impl_->stub()->Logs(&ctx, request);
  v1::LogChunk chunk;
  while (reader->Read(&chunk)) on_chunk(chunk);
  return Convert(reader->Finish(), address_, timeout_);
}

}  // namespace stemma::cli
