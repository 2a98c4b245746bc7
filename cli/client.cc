#include "cli/client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cli/command.h"
#include "common/auth.h"
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
    // The token from $STEMMA_TOKEN or a file, the CA from --ca / $STEMMA_CA / the config
    // directory. A token file that is named but unusable fails every call with its reason.
    absl::StatusOr<std::string> token = FindClientToken();
    if (token.ok()) {
      security_.token = *token;
    } else {
      setup_ = token.status();
    }
    security_.ca_file = FindClientCaFile();
    if (const char* name = std::getenv("STEMMA_TLS_SERVER_NAME"); name != nullptr) {
      security_.server_name = name;
    }
    if (setup_.ok() && !security_.tls() && !security_.token.empty() &&
        !IsLoopbackAddress(address)) {
      setup_ = absl::FailedPreconditionError(
          absl::StrCat("refusing to send a token in clear text to ", address,
                       ": give the coordinator's CA with --ca or STEMMA_CA"));
    }
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
    auto credentials = MakeChannelCredentials(security_, &args);
    if (!credentials.ok()) {
      if (setup_.ok()) setup_ = credentials.status();
      credentials = grpc::InsecureChannelCredentials();  // never used: setup_ fails calls
    }
    channel_ = grpc::CreateCustomChannel(address, *credentials, args);
    stub_ = v1::UserService::NewStub(channel_);
  }
  v1::UserService::Stub* stub() { return stub_.get(); }
  // OK, or why no call can be made (an unusable token file or CA).
  const absl::Status& setup() const { return setup_; }
  void Prepare(grpc::ClientContext* ctx) const { AddCallCredentials(security_, ctx); }

 private:
  ClientSecurity security_;
  absl::Status setup_;
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
      // gRPC spells it "Ssl handshake failed", "Handshake failed", "SSL_ERROR_SSL"...
      if (const std::string lower = absl::AsciiStrToLower(status.error_message());
          absl::StrContains(lower, "ssl") || absl::StrContains(lower, "handshake") ||
          absl::StrContains(lower, "tls") || absl::StrContains(lower, "certificate")) {
        return absl::UnavailableError(absl::StrCat(
            "cannot reach the coordinator at ", address, " over TLS: ", status.error_message(),
            " (check --ca / STEMMA_CA and that the coordinator serves TLS)"));
      }
      // A coordinator that serves TLS closes a plaintext connection during setup ("failed to
      // connect ...: Socket closed"; no coordinator says "Connection refused"): "start one"
      // would send the user after a coordinator that is running.
      if (const std::string lower = absl::AsciiStrToLower(status.error_message());
          absl::StrContains(lower, "failed to connect") &&
          (absl::StrContains(lower, "socket closed") ||
           absl::StrContains(lower, "connection reset") || absl::StrContains(lower, "eof"))) {
        return absl::UnavailableError(absl::StrCat(
            "the coordinator at ", address, " closed the connection during setup (",
            status.error_message(),
            "): if it serves TLS, give its CA with --ca or STEMMA_CA (a TLS handshake failure)"));
      }
      return absl::UnavailableError(absl::StrCat("cannot reach the coordinator at ", address,
                                                 " (start one with 'stemma up')"));
    case grpc::StatusCode::UNAUTHENTICATED:
      return FromCoordinator(absl::UnauthenticatedError(absl::StrCat(
          "the coordinator at ", address, " refused the credentials: ", status.error_message())));
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::DeadlineExceededError(absl::StrCat("the coordinator at ", address,
                                                      " did not answer within ",
                                                      absl::FormatDuration(timeout)));
    default: {
      absl::Status converted = FromGrpcStatus(status);
      if (converted.message().empty()) {
        converted = absl::Status(converted.code(), absl::StatusCodeToString(converted.code()));
      }
      return FromCoordinator(std::move(converted));
    }
  }
}

}  // namespace

template <typename Request, typename Response, typename Method>
absl::StatusOr<Response> Unary(CoordinatorClient::Impl* impl, Method method, const Request& request,
                               const std::string& address, absl::Duration timeout) {
  if (!impl->setup().ok()) return impl->setup();
  grpc::ClientContext ctx;
  ctx.set_deadline(ToChrono(absl::Now() + timeout));
  impl->Prepare(&ctx);
  Response response;
  grpc::Status status = (impl->stub()->*method)(&ctx, request, &response);
  if (!status.ok()) return Convert(status, address, timeout);
  return response;
}

namespace {

std::string NewIdempotencyKey() {
  std::random_device rd;
  return absl::StrFormat("cli-%08x%08x%08x%08x", rd(), rd(), rd(), rd());
}

}  // namespace

// Every submit (and cancel, retry, drain, pin) carries an idempotency key (the caller's, or a
// fresh random one per command), and a call whose answer is lost is sent again with the same
// key until `timeout` has passed: a change committed just before a crash is found, not made
// twice, and not reported as failed. `what` names the call ("submit"); `unsure` ends the
// message when no answer came at all.
template <typename Request, typename Response, typename Method>
absl::StatusOr<Response> KeyedCall(CoordinatorClient::Impl* impl, Method method,
                                   const Request& keyed, const std::string& address,
                                   absl::Duration timeout, const char* what,
                                   const std::string& unsure) {
  if (!impl->setup().ok()) return impl->setup();
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(100);
  bool sent_once = false;
  grpc::Status status;
  for (int attempt = 0;; ++attempt) {
    grpc::ClientContext ctx;
    ctx.set_deadline(ToChrono(deadline));
    // After a failure, wait for the coordinator to be back rather than failing at once.
    if (attempt > 0) ctx.set_wait_for_ready(true);
    impl->Prepare(&ctx);
    Response response;
    status = (impl->stub()->*method)(&ctx, keyed, &response);
    if (status.ok()) return response;
    const bool lost = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (!lost) return Convert(status, address, timeout);
    // A connection that was never made cannot have carried the request: nothing to find.
    const bool never_connected = status.error_code() == grpc::StatusCode::UNAVAILABLE &&
                                 (absl::StrContains(status.error_message(), "onnection refused") ||
                                  absl::StrContains(status.error_message(), "ailed to connect"));
    if (attempt == 0 && never_connected) return Convert(status, address, timeout);
    sent_once = sent_once || !never_connected;
    if (absl::Now() + backoff >= deadline) break;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
  if (!sent_once) return Convert(status, address, timeout);
  return absl::UnavailableError(
      absl::StrCat("the coordinator at ", address, " did not confirm the ", what, " within ",
                   absl::FormatDuration(timeout), " (", status.error_message(), "); ", unsure));
}

// The submit's `unsure`: how to get the same jobs without duplicates.
std::string SubmitAgain(const char* again, const std::string& key) {
  return absl::StrCat("it may have been committed: ", again, " with --idempotency-key ", key,
                      " to get the same jobs without duplicates");
}

// A cancel, retry, drain or pin: one fresh key per command, reused by its own resends.
template <typename Request, typename Response, typename Method>
absl::StatusOr<Response> KeyedOperation(CoordinatorClient::Impl* impl, Method method,
                                        Request request, const std::string& address,
                                        absl::Duration timeout, const char* what,
                                        const std::string& check) {
  if (request.idempotency_key().empty()) request.set_idempotency_key(NewIdempotencyKey());
  return KeyedCall<Request, Response>(impl, method, request, address, timeout, what,
                                      absl::StrCat("it may have been applied: check with ", check));
}

absl::StatusOr<v1::SubmitResponse> CoordinatorClient::Submit(const v1::SubmitRequest& request) {
  v1::SubmitRequest keyed = request;
  if (keyed.idempotency_key().empty()) keyed.set_idempotency_key(NewIdempotencyKey());
  return KeyedCall<v1::SubmitRequest, v1::SubmitResponse>(
      impl_.get(), &v1::UserService::Stub::Submit, keyed, address_, timeout_, "submit",
      SubmitAgain("submit again", keyed.idempotency_key()));
}

absl::StatusOr<v1::Job> CoordinatorClient::GetJob(const std::string& id) {
  v1::GetJobRequest request;
  request.set_id(id);
  auto response = Unary<v1::GetJobRequest, v1::JobResponse>(
      impl_.get(), &v1::UserService::Stub::GetJob, request, address_, timeout_);
  if (!response.ok()) return response.status();
  return std::move(*response->mutable_job());
}

absl::StatusOr<v1::JobResponse> CoordinatorClient::GetJobWithHistory(const std::string& id) {
  v1::GetJobRequest request;
  request.set_id(id);
  return Unary<v1::GetJobRequest, v1::JobResponse>(impl_.get(), &v1::UserService::Stub::GetJob,
                                                   request, address_, timeout_);
}

absl::StatusOr<v1::GcJobsResponse> CoordinatorClient::CollectJobs(
    const v1::GcJobsRequest& request) {
  if (!request.apply()) {
    return Unary<v1::GcJobsRequest, v1::GcJobsResponse>(
        impl_.get(), &v1::UserService::Stub::CollectJobs, request, address_, timeout_);
  }
  return KeyedOperation<v1::GcJobsRequest, v1::GcJobsResponse>(
      impl_.get(), &v1::UserService::Stub::CollectJobs, request, address_, timeout_, "gc jobs",
      "'stemma ls --archived'");
}

absl::StatusOr<v1::ListJobsResponse> CoordinatorClient::ListJobs(
    const v1::ListJobsRequest& request) {
  return Unary<v1::ListJobsRequest, v1::ListJobsResponse>(
      impl_.get(), &v1::UserService::Stub::ListJobs, request, address_, timeout_);
}

absl::StatusOr<v1::Job> CoordinatorClient::Cancel(const std::string& id,
                                                  const std::string& reason) {
  v1::CancelRequest request;
  request.set_id(id);
  request.set_reason(reason);
  auto response = KeyedOperation<v1::CancelRequest, v1::JobResponse>(
      impl_.get(), &v1::UserService::Stub::Cancel, request, address_, timeout_, "cancel",
      absl::StrCat("'stemma get ", id, "'"));
  if (!response.ok()) return response.status();
  return std::move(*response->mutable_job());
}

absl::StatusOr<v1::Job> CoordinatorClient::Retry(const std::string& id) {
  v1::RetryRequest request;
  request.set_id(id);
  auto response = KeyedOperation<v1::RetryRequest, v1::JobResponse>(
      impl_.get(), &v1::UserService::Stub::Retry, request, address_, timeout_, "retry",
      absl::StrCat("'stemma get ", id, "'"));
  if (!response.ok()) return response.status();
  return std::move(*response->mutable_job());
}

absl::StatusOr<v1::ListWorkersResponse> CoordinatorClient::ListWorkers() {
  return ListWorkers(timeout_);
}

absl::StatusOr<v1::ListWorkersResponse> CoordinatorClient::ListWorkers(absl::Duration timeout) {
  return Unary<v1::ListWorkersRequest, v1::ListWorkersResponse>(
      impl_.get(), &v1::UserService::Stub::ListWorkers, v1::ListWorkersRequest(), address_,
      timeout);
}

absl::StatusOr<v1::WorkerInfo> CoordinatorClient::Drain(const std::string& worker_id,
                                                        bool undrain) {
  v1::DrainRequest request;
  request.set_worker_id(worker_id);
  request.set_undrain(undrain);
  auto response = KeyedOperation<v1::DrainRequest, v1::DrainResponse>(
      impl_.get(), &v1::UserService::Stub::Drain, request, address_, timeout_,
      undrain ? "undrain" : "drain", "'stemma workers'");
  if (!response.ok()) return response.status();
  return std::move(*response->mutable_worker());
}

absl::StatusOr<v1::SubmitExperimentResponse> CoordinatorClient::SubmitExperiment(
    const v1::SubmitExperimentRequest& request) {
  if (request.dry_run()) {  // a plan changes nothing: no key, no retry
    return Unary<v1::SubmitExperimentRequest, v1::SubmitExperimentResponse>(
        impl_.get(), &v1::UserService::Stub::SubmitExperiment, request, address_, timeout_);
  }
  v1::SubmitExperimentRequest keyed = request;
  if (keyed.idempotency_key().empty()) keyed.set_idempotency_key(NewIdempotencyKey());
  return KeyedCall<v1::SubmitExperimentRequest, v1::SubmitExperimentResponse>(
      impl_.get(), &v1::UserService::Stub::SubmitExperiment, keyed, address_, timeout_, "sweep",
      SubmitAgain("run the sweep again", keyed.idempotency_key()));
}

absl::StatusOr<v1::ListExperimentsResponse> CoordinatorClient::ListExperiments() {
  return Unary<v1::ListExperimentsRequest, v1::ListExperimentsResponse>(
      impl_.get(), &v1::UserService::Stub::ListExperiments, v1::ListExperimentsRequest(), address_,
      timeout_);
}

absl::StatusOr<v1::GetExperimentResponse> CoordinatorClient::GetExperiment(
    const v1::GetExperimentRequest& request) {
  return Unary<v1::GetExperimentRequest, v1::GetExperimentResponse>(
      impl_.get(), &v1::UserService::Stub::GetExperiment, request, address_, timeout_);
}

absl::StatusOr<v1::QueryMetricsResponse> CoordinatorClient::QueryMetrics(
    const v1::QueryMetricsRequest& request) {
  return Unary<v1::QueryMetricsRequest, v1::QueryMetricsResponse>(
      impl_.get(), &v1::UserService::Stub::QueryMetrics, request, address_, timeout_);
}

absl::StatusOr<v1::ListArtifactsResponse> CoordinatorClient::ListArtifacts(
    const v1::ListArtifactsRequest& request) {
  return Unary<v1::ListArtifactsRequest, v1::ListArtifactsResponse>(
      impl_.get(), &v1::UserService::Stub::ListArtifacts, request, address_, timeout_);
}

absl::StatusOr<v1::ArtifactDetails> CoordinatorClient::GetArtifact(const std::string& id) {
  v1::GetArtifactRequest request;
  request.set_id(id);
  return Unary<v1::GetArtifactRequest, v1::ArtifactDetails>(
      impl_.get(), &v1::UserService::Stub::GetArtifact, request, address_, timeout_);
}

absl::StatusOr<v1::LineageResponse> CoordinatorClient::Lineage(const v1::LineageRequest& request) {
  return Unary<v1::LineageRequest, v1::LineageResponse>(
      impl_.get(), &v1::UserService::Stub::Lineage, request, address_, timeout_);
}

absl::StatusOr<v1::VerifyArtifactResponse> CoordinatorClient::VerifyArtifact(
    const std::string& id) {
  v1::VerifyArtifactRequest request;
  request.set_id(id);
  return Unary<v1::VerifyArtifactRequest, v1::VerifyArtifactResponse>(
      impl_.get(), &v1::UserService::Stub::VerifyArtifact, request, address_, timeout_);
}

absl::StatusOr<v1::Artifact> CoordinatorClient::PinArtifact(const std::string& id, bool unpin) {
  v1::PinArtifactRequest request;
  request.set_id(id);
  request.set_unpin(unpin);
  return KeyedOperation<v1::PinArtifactRequest, v1::Artifact>(
      impl_.get(), &v1::UserService::Stub::PinArtifact, request, address_, timeout_,
      unpin ? "unpin" : "pin", absl::StrCat("'stemma ckpt show ", id, "'"));
}

absl::StatusOr<v1::GcResponse> CoordinatorClient::CollectGarbage(const v1::GcRequest& request) {
  return Unary<v1::GcRequest, v1::GcResponse>(impl_.get(), &v1::UserService::Stub::CollectGarbage,
                                              request, address_, timeout_);
}

absl::Status CoordinatorClient::Watch(const v1::WatchRequest& request,
                                      const std::function<bool(const v1::JobEvent&)>& on_event,
                                      absl::Time deadline, int64_t* received) {
  if (!impl_->setup().ok()) return impl_->setup();
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
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
  if (!impl_->setup().ok()) return impl_->setup();
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  std::unique_ptr<grpc::ClientReader<v1::LogChunk>> reader = impl_->stub()->Logs(&ctx, request);
  v1::LogChunk chunk;
  while (reader->Read(&chunk)) on_chunk(chunk);
  return Convert(reader->Finish(), address_, timeout_);
}

}  // namespace stemma::cli
