#include "coordinator/rpc/grpc_services.h"

#include <chrono>

#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/rpc.h"

namespace stemma::coordinator {
namespace {

// Times one call into the method's histogram.
class RpcTimer {
 public:
  explicit RpcTimer(prometheus::Histogram& h) : h_(h), start_(std::chrono::steady_clock::now()) {}
  ~RpcTimer() {
    h_.Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }

 private:
  prometheus::Histogram& h_;
  std::chrono::steady_clock::time_point start_;
};

class UserServiceImpl final : public v1::UserService::Service {
 public:
  UserServiceImpl(UserHandler* h, const Authenticator* auth, CoordinatorMetrics* m)
      : h_(h), auth_(auth), m_(m) {}

  grpc::Status Submit(grpc::ServerContext* ctx, const v1::SubmitRequest* req,
                      v1::SubmitResponse* resp) override {
    return Call(ctx, "Submit", [&]() -> absl::Status {
      auto r = h_->Submit(*req);
      if (!r.ok()) return r.status();
      *resp = std::move(*r);
      return absl::OkStatus();
    });
  }

  grpc::Status GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                      v1::JobResponse* resp) override {
    return Call(ctx, "GetJob", [&]() -> absl::Status {
      auto r = h_->GetJob(req->id());
      if (!r.ok()) return r.status();
      *resp->mutable_job() = std::move(*r);
      return absl::OkStatus();
    });
  }

  grpc::Status ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                        v1::ListJobsResponse* resp) override {
    return Call(ctx, "ListJobs", [&]() -> absl::Status {
      auto r = h_->ListJobs(*req);
      if (!r.ok()) return r.status();
      *resp = std::move(*r);
      return absl::OkStatus();
    });
  }

  grpc::Status Cancel(grpc::ServerContext* ctx, const v1::CancelRequest* req,
                      v1::JobResponse* resp) override {
    return Call(ctx, "Cancel", [&]() -> absl::Status {
      auto r = h_->Cancel(req->id(), req->reason());
      if (!r.ok()) return r.status();
      *resp->mutable_job() = std::move(*r);
      return absl::OkStatus();
    });
  }

  grpc::Status Retry(grpc::ServerContext* ctx, const v1::RetryRequest* req,
                     v1::JobResponse* resp) override {
    return Call(ctx, "Retry", [&]() -> absl::Status {
      auto r = h_->Retry(req->id());
      if (!r.ok()) return r.status();
      *resp->mutable_job() = std::move(*r);
      return absl::OkStatus();
    });
  }

  grpc::Status ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* resp) override {
    return Call(ctx, "ListWorkers", [&]() -> absl::Status {
      *resp = h_->ListWorkers();
      return absl::OkStatus();
    });
  }

  grpc::Status Drain(grpc::ServerContext* ctx, const v1::DrainRequest* req,
                     v1::DrainResponse* resp) override {
    return Call(ctx, "Drain", [&]() -> absl::Status {
      auto r = h_->Drain(req->worker_id(), req->undrain());
      if (!r.ok()) return r.status();
      *resp->mutable_worker() = std::move(*r);
      return absl::OkStatus();
    });
  }

  grpc::Status Watch(grpc::ServerContext* ctx, const v1::WatchRequest* req,
                     grpc::ServerWriter<v1::JobEvent>* writer) override {
    Caller caller;
    absl::Status auth = auth_->Authenticate(*ctx, "Watch", &caller);
    if (!auth.ok()) return ToGrpcStatus(auth);
    std::vector<v1::JobEvent> events;
    auto sub = h_->Watch(*req, &events);
    grpc::Status result = grpc::Status::OK;
    for (;;) {
      for (const auto& ev : events) {
        if (!writer->Write(ev)) {
          h_->Unwatch(sub);
          return grpc::Status::OK;
        }
      }
      events.clear();
      if (ctx->IsCancelled()) break;
      if (!sub->Next(&events, 200)) {
        result = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                              "watch fell too far behind; watch again");
        break;
      }
    }
    h_->Unwatch(sub);
    return result;
  }

  grpc::Status Logs(grpc::ServerContext* ctx, const v1::LogsRequest* req,
                    grpc::ServerWriter<v1::LogChunk>* writer) override {
    Caller caller;
    absl::Status auth = auth_->Authenticate(*ctx, "Logs", &caller);
    if (!auth.ok()) return ToGrpcStatus(auth);
    auto job = h_->GetJob(req->job_id());
    if (!job.ok()) return ToGrpcStatus(job.status());
    if (req->attempt() < 0 || req->attempt() > job->attempts()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "attempt: job " + req->job_id() + " has " +
                              std::to_string(job->attempts()) + " attempts");
    }
    const LogStore& logs = h_->logs();
    int attempt = req->attempt() > 0 ? req->attempt() : 1;
    int64_t offset = 0;
    constexpr int64_t kChunk = 64 * 1024;
    for (;;) {
      uint64_t gen = logs.generation();
      auto data = logs.Read(req->job_id(), attempt, offset, kChunk);
      if (!data.ok()) return ToGrpcStatus(data.status());
      if (!data->empty()) {
        v1::LogChunk chunk;
        chunk.set_attempt_id(req->job_id() + "." + std::to_string(attempt));
        offset += data->size();
        chunk.set_data(std::move(*data));
        if (!writer->Write(chunk)) return grpc::Status::OK;
        continue;
      }
      // At the end of this attempt's log: move on, wait, or stop.
      job = h_->GetJob(req->job_id());
      if (!job.ok()) return ToGrpcStatus(job.status());
      if (req->attempt() == 0 && attempt < job->attempts()) {
        ++attempt;
        offset = 0;
        continue;
      }
      bool ended = job->state() == v1::SUCCEEDED || job->state() == v1::FAILED ||
                   job->state() == v1::CANCELLED;
      if (!req->follow() || ended || ctx->IsCancelled()) {
        if (ended && req->follow()) {
          // A last chunk may still be in flight from the worker; read once more.
          auto tail = logs.Read(req->job_id(), attempt, offset, kChunk);
          if (tail.ok() && !tail->empty()) continue;
        }
        return grpc::Status::OK;
      }
      logs.WaitForAppend(gen, 250);
    }
  }

 private:
  template <typename F>
  grpc::Status Call(grpc::ServerContext* ctx, const char* method, F&& f) {
    RpcTimer timer(m_->Rpc(method));
    Caller caller;
    absl::Status st = auth_->Authenticate(*ctx, method, &caller);
    if (st.ok()) st = f();
    return ToGrpcStatus(st);
  }

  UserHandler* h_;
  const Authenticator* auth_;
  CoordinatorMetrics* m_;
};

// One worker session stream: writes are serialized; Close cancels the call, which ends
// the blocking Read in the session thread.
class StreamChannel final : public WorkerChannel {
 public:
  // `batches`: the worker declared that it handles CoordinatorBatch.
  StreamChannel(grpc::ServerContext* ctx,
                grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream,
                bool batches)
      : ctx_(ctx), stream_(stream), batches_(batches) {}

  bool Send(const v1::CoordinatorMessage& message) override {
    absl::MutexLock lock(&mu_);
    return WriteLocked(message);
  }

  // One stream message for all of them (a CoordinatorBatch), or a few when they would
  // not fit in one.
  bool SendAll(std::vector<v1::CoordinatorMessage> messages) override {
    absl::MutexLock lock(&mu_);
    if (!batches_) {  // an older worker: one message each, sent together
      for (size_t i = 0; i < messages.size(); ++i) {
        if (!WriteLocked(messages[i], i + 1 < messages.size())) return false;
      }
      return true;
    }
    if (messages.size() == 1) return WriteLocked(messages[0]);
    v1::CoordinatorMessage batch;
    size_t bytes = 0;
    for (auto& m : messages) {
      const size_t size = m.ByteSizeLong();
      if (bytes > 0 && bytes + size > kBatchBytes) {
        if (!WriteLocked(batch)) return false;
        batch.Clear();
        bytes = 0;
      }
      *batch.mutable_batch()->add_messages() = std::move(m);
      bytes += size + 8;
    }
    return bytes == 0 || WriteLocked(batch);
  }

  void Close() override {
    absl::MutexLock lock(&mu_);
    if (!closed_) ctx_->TryCancel();
    closed_ = true;
  }

  // Called when the session ends: no write may touch the stream afterwards.
  void Detach() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

 private:
  // Well under kMaxMessageBytes: a batch of large messages is split.
  static constexpr size_t kBatchBytes = kMaxMessageBytes / 4;

  // `more`: another message follows at once, so the transport may send both together.
  bool WriteLocked(const v1::CoordinatorMessage& message, bool more = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (closed_) return false;
    grpc::WriteOptions options;
    if (more) options.set_buffer_hint();
    if (!stream_->Write(message, options)) closed_ = true;
    return !closed_;
  }

  absl::Mutex mu_;
  grpc::ServerContext* ctx_;
  grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream_;
  const bool batches_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

class WorkerServiceImpl final : public v1::WorkerService::Service {
 public:
  WorkerServiceImpl(WorkerHandler* h, const Authenticator* auth, CoordinatorMetrics* m)
      : h_(h), auth_(auth), m_(m), heartbeat_(&m->Rpc("Heartbeat")), event_(&m->Rpc("Event")) {}

  grpc::Status Session(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream) override {
    Caller caller;
    absl::Status auth = auth_->Authenticate(*ctx, "Session", &caller);
    if (!auth.ok()) return ToGrpcStatus(auth);
    v1::WorkerMessage msg;
    if (!stream->Read(&msg)) return grpc::Status::OK;
    if (!msg.has_register_()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "a session must start with Register");
    }
    auto channel = std::make_shared<StreamChannel>(ctx, stream, msg.register_().accepts_batches());
    uint64_t session = 0;
    absl::StatusOr<v1::Registered> registered;
    {
      RpcTimer t(m_->Rpc("Register"));
      registered = h_->Register(msg.register_(), channel, &session);
    }
    if (!registered.ok()) return ToGrpcStatus(registered.status());
    const std::string worker_id = registered->worker_id();  // Registered went out already
    grpc::Status result = grpc::Status::OK;
    while (stream->Read(&msg)) {
      if (msg.has_heartbeat()) {
        RpcTimer t(*heartbeat_);
        auto ack = h_->Heartbeat(worker_id, session, msg.heartbeat());
        if (!ack.ok()) {
          result = ToGrpcStatus(ack.status());
          break;
        }
        v1::CoordinatorMessage reply;
        *reply.mutable_heartbeat_ack() = *ack;
        channel->Send(reply);
      } else if (msg.has_event()) {
        RpcTimer t(*event_);
        h_->Event(worker_id, session, msg.event());
      } else if (msg.has_events()) {
        RpcTimer t(*event_);
        const auto& events = msg.events().events();
        h_->Events(worker_id, session, absl::MakeConstSpan(events.data(), events.size()));
      } else if (msg.has_register_()) {
        result = grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "already registered");
        break;
      }
    }
    channel->Detach();
    h_->Disconnected(worker_id, session);
    return result;
  }

 private:
  WorkerHandler* h_;
  const Authenticator* auth_;
  CoordinatorMetrics* m_;
  prometheus::Histogram* heartbeat_;
  prometheus::Histogram* event_;
};

}  // namespace

std::unique_ptr<v1::UserService::Service> MakeUserService(UserHandler* handler,
                                                          const Authenticator* auth,
                                                          CoordinatorMetrics* metrics) {
  return std::make_unique<UserServiceImpl>(handler, auth, metrics);
}

std::unique_ptr<v1::WorkerService::Service> MakeWorkerService(WorkerHandler* handler,
                                                              const Authenticator* auth,
                                                              CoordinatorMetrics* metrics) {
  return std::make_unique<WorkerServiceImpl>(handler, auth, metrics);
}

}  // namespace stemma::coordinator
