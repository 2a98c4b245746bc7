#include "coordinator/rpc/grpc_services.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "common/job_ranks.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "common/rpc.h"
#include "common/status.h"
#include "coordinator/experiment_revisions.h"

namespace stemma::coordinator {
namespace {

constexpr char kUserPrefix[] = "/stemma.v1.UserService/";
constexpr char kWorkerSession[] = "/stemma.v1.WorkerService/Session";
constexpr char kRedacted[] = "<redacted>";
// Well under kMaxMessageBytes (4 MiB): the most a ListJobs page carries.
constexpr size_t kListPageBytes = 3 << 20;

// Failpoints for the fault suite: STEMMA_FAILPOINTS=name[,name...] in the coordinator's
// environment makes the process die (as kill -9 would) at that point. Read once.
bool Failpoint(absl::string_view name) {
  static const std::string* armed = [] {
    const char* env = std::getenv("STEMMA_FAILPOINTS");
    return new std::string(env == nullptr ? "" : absl::StrCat(",", env, ","));
  }();
  return !armed->empty() && armed->find(absl::StrCat(",", name, ",")) != std::string::npos;
}

// The submit is durable; its answer is lost.
void MaybeCrashAfterCommit() {
  if (Failpoint("submit_after_commit")) {
    spdlog::warn("failpoint submit_after_commit: exiting before the reply");
    std::_Exit(137);
  }
  if (Failpoint("submit_stall_after_commit")) {  // the reply never comes (a stalled peer)
    spdlog::warn("failpoint submit_stall_after_commit: holding the reply");
    std::this_thread::sleep_for(std::chrono::hours(1));
  }
}

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

std::string Owner(const v1::Job& job) {
  if (!job.owner().empty()) return job.owner();
  auto it = job.spec().labels().find(kOwnerLabel);
  return it == job.spec().labels().end() ? "" : it->second;
}

// Secrets in a job's environment are for its owner and admins only (and the worker that
// runs it), on every path that returns a job (GetArtifact's producer included).
void Redact(const Caller& caller, v1::Job* job) {
  if (!caller.authenticated || !job->spec().has_exec()) return;
  if (Owner(*job) == caller.subject || caller.is(Role::kAdmin)) return;
  for (auto& [k, v] : *job->mutable_spec()->mutable_exec()->mutable_env()) v = kRedacted;
}

// A cancel, retry, drain or pin's idempotency key, scoped to the caller: another user who
// sends the same key never sees this one's answer (nor blocks it). "" for none.
absl::StatusOr<std::string> OperationKey(const Caller& caller, const std::string& key) {
  if (key.empty()) return std::string();
  if (key.size() > 256) {
    return absl::InvalidArgumentError("idempotency_key: longer than 256 characters");
  }
  return absl::StrCat(
      "op:", Sha256Hex(absl::StrCat(caller.authenticated ? caller.subject : "", "\n", key)));
}

class UserServiceImpl final : public v1::UserService::Service {
 public:
  UserServiceImpl(UserHandler* h, const Authenticator* auth, CoordinatorMetrics* m)
      : h_(h), auth_(auth), m_(m) {}

  grpc::Status Submit(grpc::ServerContext* ctx, const v1::SubmitRequest* req,
                      v1::SubmitResponse* resp) override {
    return Call(ctx, "Submit", [&](const Caller& caller) -> absl::Status {
      if (!caller.authenticated) {
        auto r = h_->Submit(*req);
        if (!r.ok()) return r.status();
        MaybeCrashAfterCommit();
        *resp = std::move(*r);
        return absl::OkStatus();
      }
      // The owner is whoever the credential says, whatever the request claims; keys are
      // per caller, so one user's key never returns another's jobs.
      v1::SubmitRequest owned = *req;
      for (auto& job : *owned.mutable_jobs()) {
        auto* labels = job.mutable_labels();
        labels->erase(kOwnerLabel);
        // Experiments set their namespace themselves; a plain job cannot join another's.
        labels->erase(kNamespaceLabel);
        if (static_cast<int>(labels->size()) >= kMaxLabels) {
          return absl::InvalidArgumentError(absl::StrCat(
              "labels: more than ", kMaxLabels - 1, " (the coordinator adds ", kOwnerLabel, ")"));
        }
        (*labels)[kOwnerLabel] = caller.subject;
      }
      if (!req->idempotency_key().empty()) {
        if (req->idempotency_key().size() > 256) {
          return absl::InvalidArgumentError("idempotency_key: longer than 256 characters");
        }
        owned.set_idempotency_key(absl::StrCat(
            "u:", Sha256Hex(absl::StrCat(caller.subject, "\n", req->idempotency_key()))));
      }
      auto r = h_->Submit(owned);
      if (!r.ok()) return r.status();
      MaybeCrashAfterCommit();
      *resp = std::move(*r);
      return absl::OkStatus();
    });
  }

  grpc::Status GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                      v1::JobResponse* resp) override {
    return Call(ctx, "GetJob", [&](const Caller& caller) -> absl::Status {
      auto r = h_->GetJob(req->id(), caller.authenticated ? caller.subject : "");
      if (!r.ok()) return r.status();
      for (v1::Attempt& a : h_->AttemptHistory(r->id())) *resp->add_history() = std::move(a);
      *resp->mutable_job() = std::move(*r);
      Redact(caller, resp->mutable_job());
      return absl::OkStatus();
    });
  }

  grpc::Status ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                        v1::ListJobsResponse* resp) override {
    return Call(ctx, "ListJobs", [&](const Caller& caller) -> absl::Status {
      v1::ListJobsRequest in = *req;
      if (in.mine() && caller.authenticated) (*in.mutable_labels())[kOwnerLabel] = caller.subject;
      auto r = h_->ListJobs(in);
      if (!r.ok()) return r.status();
      *resp = std::move(*r);
      for (auto& job : *resp->mutable_jobs()) Redact(caller, &job);
      // A page of large jobs (up to 1,000 x 256 KiB) would pass the send limit: cut it
      // short, and let the client ask for the rest (the token is the last seq sent, as the
      // job table makes it).
      if (resp->ByteSizeLong() > kListPageBytes && resp->jobs_size() > 1) {
        size_t bytes = 64;
        int keep = 0;
        for (; keep < resp->jobs_size(); ++keep) {
          const size_t size = resp->jobs(keep).ByteSizeLong() + 8;
          if (keep > 0 && bytes + size > kListPageBytes) break;
          bytes += size;
        }
        auto* jobs = resp->mutable_jobs();
        jobs->DeleteSubrange(keep, jobs->size() - keep);
        resp->set_next_page_token(absl::StrCat(resp->jobs(keep - 1).seq()));
      }
      return absl::OkStatus();
    });
  }

  grpc::Status Cancel(grpc::ServerContext* ctx, const v1::CancelRequest* req,
                      v1::JobResponse* resp) override {
    return Call(ctx, "Cancel", [&](const Caller& caller) -> absl::Status {
      if (absl::Status own = CheckOwner(*ctx, "Cancel", caller, req->id()); !own.ok()) return own;
      ASSIGN_OR_RETURN(std::string key, OperationKey(caller, req->idempotency_key()));
      auto r = h_->Cancel(req->id(), req->reason(), key);
      if (!r.ok()) return r.status();
      *resp->mutable_job() = std::move(*r);
      Redact(caller, resp->mutable_job());
      return absl::OkStatus();
    });
  }

  grpc::Status Retry(grpc::ServerContext* ctx, const v1::RetryRequest* req,
                     v1::JobResponse* resp) override {
    return Call(ctx, "Retry", [&](const Caller& caller) -> absl::Status {
      if (absl::Status own = CheckOwner(*ctx, "Retry", caller, req->id()); !own.ok()) return own;
      ASSIGN_OR_RETURN(std::string key, OperationKey(caller, req->idempotency_key()));
      auto r = h_->Retry(req->id(), key);
      if (!r.ok()) return r.status();
      *resp->mutable_job() = std::move(*r);
      Redact(caller, resp->mutable_job());
      return absl::OkStatus();
    });
  }

  grpc::Status ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* resp) override {
    return Call(ctx, "ListWorkers", [&](const Caller&) -> absl::Status {
      *resp = h_->ListWorkers();
      return absl::OkStatus();
    });
  }

  grpc::Status Drain(grpc::ServerContext* ctx, const v1::DrainRequest* req,
                     v1::DrainResponse* resp) override {
    return Call(ctx, "Drain", [&](const Caller& caller) -> absl::Status {
      ASSIGN_OR_RETURN(std::string key, OperationKey(caller, req->idempotency_key()));
      auto r = h_->Drain(req->worker_id(), req->undrain(), key);
      if (!r.ok()) return r.status();
      *resp->mutable_worker() = std::move(*r);
      return absl::OkStatus();
    });
  }

  // Metric series and the checkpoint registry: forwarded as they are.
  grpc::Status QueryMetrics(grpc::ServerContext* ctx, const v1::QueryMetricsRequest* req,
                            v1::QueryMetricsResponse* resp) override {
    return Forward(ctx, "QueryMetrics", resp, [&] { return h_->QueryMetrics(*req); });
  }
  grpc::Status ListArtifacts(grpc::ServerContext* ctx, const v1::ListArtifactsRequest* req,
                             v1::ListArtifactsResponse* resp) override {
    return Forward(ctx, "ListArtifacts", resp, [&] { return h_->ListArtifacts(*req); });
  }
  grpc::Status GetArtifact(grpc::ServerContext* ctx, const v1::GetArtifactRequest* req,
                           v1::ArtifactDetails* resp) override {
    return Call(ctx, "GetArtifact", [&](const Caller& caller) -> absl::Status {
      auto r = h_->GetArtifact(req->id());
      if (!r.ok()) return r.status();
      *resp = std::move(*r);
      if (resp->has_producer()) Redact(caller, resp->mutable_producer());
      return absl::OkStatus();
    });
  }
  grpc::Status Lineage(grpc::ServerContext* ctx, const v1::LineageRequest* req,
                       v1::LineageResponse* resp) override {
    return Forward(ctx, "Lineage", resp, [&] { return h_->Lineage(*req); });
  }
  grpc::Status VerifyArtifact(grpc::ServerContext* ctx, const v1::VerifyArtifactRequest* req,
                              v1::VerifyArtifactResponse* resp) override {
    return Forward(ctx, "VerifyArtifact", resp, [&] { return h_->VerifyArtifact(req->id()); });
  }
  // Pins are the owner's (and the owner's projects' and admins'): anyone else's unpin would
  // hand a checkpoint to gc.
  grpc::Status PinArtifact(grpc::ServerContext* ctx, const v1::PinArtifactRequest* req,
                           v1::Artifact* resp) override {
    return Call(ctx, "PinArtifact", [&](const Caller& caller) -> absl::Status {
      if (caller.authenticated && !caller.is(Role::kAdmin)) {
        auto a = h_->GetArtifact(req->id());
        if (a.ok() && !h_->tenancy().Shares(caller.subject, a->artifact().owner())) {
          return auth_->Deny(*ctx, absl::StrCat(kUserPrefix, "PinArtifact"), caller, "not_owner",
                             absl::StrCat("artifact ", a->artifact().id(), " belongs to ",
                                          a->artifact().owner(), ", not to ", caller.subject));
        }
      }
      ASSIGN_OR_RETURN(std::string key, OperationKey(caller, req->idempotency_key()));
      auto r = h_->PinArtifact(req->id(), req->unpin(), key);
      if (!r.ok()) return r.status();
      *resp = std::move(*r);
      return absl::OkStatus();
    });
  }
  // A user's gc sees only what the user may manage; an admin's sees everything.
  grpc::Status CollectGarbage(grpc::ServerContext* ctx, const v1::GcRequest* req,
                              v1::GcResponse* resp) override {
    return Call(ctx, "CollectGarbage", [&](const Caller& caller) -> absl::Status {
      v1::GcRequest scoped = *req;
      scoped.mutable_policy()->set_requester(
          caller.authenticated && !caller.is(Role::kAdmin) ? caller.subject : "");
      auto r = h_->CollectGarbage(scoped);
      if (!r.ok()) return r.status();
      *resp = std::move(*r);
      return absl::OkStatus();
    });
  }
  // Like CollectGarbage: a user's sees only the jobs it may manage; an admin's every job. The
  // key is scoped to the caller like the other operations'.
  grpc::Status CollectJobs(grpc::ServerContext* ctx, const v1::GcJobsRequest* req,
                           v1::GcJobsResponse* resp) override {
    return Call(ctx, "CollectJobs", [&](const Caller& caller) -> absl::Status {
      v1::GcJobsRequest scoped = *req;
      scoped.set_requester(caller.authenticated && !caller.is(Role::kAdmin) ? caller.subject : "");
      ASSIGN_OR_RETURN(std::string key, OperationKey(caller, req->idempotency_key()));
      scoped.set_idempotency_key(key);
      auto r = h_->CollectJobs(scoped);
      if (!r.ok()) return r.status();
      *resp = std::move(*r);
      return absl::OkStatus();
    });
  }
  grpc::Status SubmitExperiment(grpc::ServerContext* ctx, const v1::SubmitExperimentRequest* req,
                                v1::SubmitExperimentResponse* resp) override {
    return Call(ctx, "SubmitExperiment", [&](const Caller& caller) -> absl::Status {
      auto r = h_->SubmitExperiment(*req, caller.authenticated ? caller.subject : std::string());
      if (!r.ok()) return r.status();
      *resp = std::move(*r);
      return absl::OkStatus();
    });
  }
  grpc::Status ListExperiments(grpc::ServerContext* ctx, const v1::ListExperimentsRequest*,
                               v1::ListExperimentsResponse* resp) override {
    return Forward(ctx, "ListExperiments", resp, [&] { return h_->ListExperiments(); });
  }
  // A name is looked up in the caller's namespace unless the request names another (reading
  // across namespaces is allowed; docs/tenancy.md).
  grpc::Status GetExperiment(grpc::ServerContext* ctx, const v1::GetExperimentRequest* req,
                             v1::GetExperimentResponse* resp) override {
    return Call(ctx, "GetExperiment", [&](const Caller& caller) -> absl::Status {
      v1::GetExperimentRequest in = *req;
      if (caller.authenticated && in.owner().empty()) {
        in.set_owner(h_->tenancy().Namespace(caller.subject));
      }
      auto r = h_->GetExperiment(in);
      if (!r.ok()) return r.status();
      *resp = std::move(*r);
      return absl::OkStatus();
    });
  }
  // One handler call whose StatusOr answer is the response.
  template <typename Response, typename F>
  grpc::Status Forward(grpc::ServerContext* ctx, const char* method, Response* resp, F&& f) {
    return Call(ctx, method, [&](const Caller&) -> absl::Status {
      auto r = f();
      if (!r.ok()) return r.status();
      *resp = std::move(*r);
      return absl::OkStatus();
    });
  }

  grpc::Status Watch(grpc::ServerContext* ctx, const v1::WatchRequest* req,
                     grpc::ServerWriter<v1::JobEvent>* writer) override {
    Caller caller;
    absl::Status auth = auth_->Authenticate(*ctx, absl::StrCat(kUserPrefix, "Watch"), &caller);
    if (!auth.ok()) return ToGrpcStatus(auth);
    std::vector<v1::JobEvent> events;
    auto sub = h_->Watch(*req, &events);
    grpc::Status result = grpc::Status::OK;
    for (;;) {
      for (auto& ev : events) {
        Redact(caller, ev.mutable_job());
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
    absl::Status auth = auth_->Authenticate(*ctx, absl::StrCat(kUserPrefix, "Logs"), &caller);
    if (!auth.ok()) return ToGrpcStatus(auth);
    if (absl::Status own = CheckOwner(*ctx, "Logs", caller, req->job_id()); !own.ok()) {
      return ToGrpcStatus(own);
    }
    auto job = h_->GetJob(req->job_id());
    if (!job.ok()) return ToGrpcStatus(job.status());
    if (req->attempt() < 0 || req->attempt() > job->attempts()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "attempt: job " + req->job_id() + " has " +
                              std::to_string(job->attempts()) + " attempts");
    }
    // One log per engine process (common/job_ranks.h); rank 0's is the job's.
    const int ranks = std::max(1, job->spec().nodes()) * RanksPerPart(job->spec());
    const int rank = req->has_rank() ? req->rank() : 0;
    if (rank < 0 || rank >= ranks) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat(
              "rank: job ", req->job_id(), " has ",
              ranks == 1 ? "one rank (0)" : absl::StrCat(ranks, " ranks (0..", ranks - 1, ")")));
    }
    const LogStore& logs = h_->logs();
    // Where an attempt's log is read from: its start, or what arrived since since_ms, or its
    // last tail_lines lines (negative: none of what is there now).
    auto start_of = [&](int attempt) -> absl::StatusOr<int64_t> {
      int64_t from = 0;
      if (req->since_ms() > 0)
        from = logs.OffsetSince(req->job_id(), attempt, req->since_ms(), rank);
      if (req->tail_lines() < 0) return logs.Size(req->job_id(), attempt, rank);
      if (req->tail_lines() > 0) {
        ASSIGN_OR_RETURN(int64_t tail,
                         logs.OffsetOfLastLines(req->job_id(), attempt, req->tail_lines(), rank));
        from = std::max(from, tail);
      }
      return from;
    };
    int attempt = req->attempt() > 0 ? req->attempt() : 1;
    absl::StatusOr<int64_t> start = start_of(attempt);
    if (!start.ok()) return ToGrpcStatus(start.status());
    int64_t offset = *start;
    constexpr int64_t kChunk = 64 * 1024;
    for (;;) {
      uint64_t gen = logs.generation();
      // A chunk never spans two records, so that it carries its bytes' receive time.
      const LogStore::RecordSpan span = logs.RecordAt(req->job_id(), attempt, offset, rank);
      auto data = logs.Read(req->job_id(), attempt, offset,
                            std::clamp<int64_t>(span.end - offset, 1, kChunk), rank);
      if (!data.ok()) return ToGrpcStatus(data.status());
      if (!data->empty()) {
        v1::LogChunk chunk;
        chunk.set_attempt_id(req->job_id() + "." + std::to_string(attempt));
        chunk.set_rank(rank);
        chunk.set_time_ms(span.time_ms);
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
        start = start_of(attempt);
        if (!start.ok()) return ToGrpcStatus(start.status());
        offset = *start;
        continue;
      }
      bool ended = job->state() == v1::SUCCEEDED || job->state() == v1::FAILED ||
                   job->state() == v1::CANCELLED;
      if (!req->follow() || ended || ctx->IsCancelled()) {
        if (ended && req->follow()) {
          // A last chunk may still be in flight from the worker; read once more.
          auto tail = logs.Read(req->job_id(), attempt, offset, kChunk, rank);
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
    absl::Status st = auth_->Authenticate(*ctx, absl::StrCat(kUserPrefix, method), &caller);
    if (st.ok()) st = f(caller);
    return ToGrpcStatus(st);
  }

  // Users act on their own jobs only; admins on every job. NOT_FOUND passes through so
  // that the handler says it (a job that does not exist has no owner to protect).
  absl::Status CheckOwner(const grpc::ServerContext& ctx, const char* method, const Caller& caller,
                          const std::string& id) {
    if (!caller.authenticated || caller.is(Role::kAdmin)) return absl::OkStatus();
    auto job = h_->GetJob(id);
    if (!job.ok()) return absl::OkStatus();
    if (Owner(*job) == caller.subject) return absl::OkStatus();
    return auth_->Deny(
        ctx, absl::StrCat(kUserPrefix, method), caller, "not_owner",
        absl::StrCat("job ", id, " belongs to ", Owner(*job).empty() ? "nobody" : Owner(*job),
                     ", not to ", caller.subject));
  }

  UserHandler* h_;
  const Authenticator* auth_;
  CoordinatorMetrics* m_;
};

// One worker session stream. Messages are queued and written by the channel's own writer
// thread, so a caller (the committer's durable hook, above all) never waits for a slow
// peer: a worker that stops reading holds up its own stream only. A queue that passes
// kMaxQueuedBytes means the worker is not keeping up; the stream is then cancelled and the
// worker registers again. Close cancels the call, which ends the blocking Read in the
// session thread and any Write stuck in the writer.
class StreamChannel final : public WorkerChannel {
 public:
  static constexpr size_t kMaxQueuedBytes = 64 << 20;

  // `batches`: the worker declared that it handles CoordinatorBatch.
  StreamChannel(grpc::ServerContext* ctx,
                grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream,
                bool batches)
      : ctx_(ctx), stream_(stream), batches_(batches), writer_([this] { WriterLoop(); }) {}

  ~StreamChannel() override { Detach(); }

  bool Send(const v1::CoordinatorMessage& message) override {
    std::vector<v1::CoordinatorMessage> one;
    one.push_back(message);
    return SendAll(std::move(one));
  }

  bool SendAll(std::vector<v1::CoordinatorMessage> messages) override {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    for (auto& m : messages) {
      queued_bytes_ += m.ByteSizeLong();
      queue_.push_back(std::move(m));
    }
    if (queued_bytes_ > kMaxQueuedBytes) {
      spdlog::warn("session: {} bytes queued for a worker that does not read; closing its stream",
                   queued_bytes_);
      CloseLocked();
      return false;
    }
    return true;
  }

  void Close() override {
    absl::MutexLock lock(&mu_);
    CloseLocked();
  }

  // Waits up to `timeout` for the queue to be written out.
  void Drain(std::chrono::milliseconds timeout) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &StreamChannel::DrainedOrClosed),
                         absl::FromChrono(timeout));
  }

  // Called when the session ends: stops the writer; no write touches the stream after
  // this returns. Idempotent. `cancel` false: the handler returns a status the client must
  // see (a refused registration), which cancelling the call would replace with CANCELLED.
  void Detach(bool cancel = true) {
    {
      absl::MutexLock lock(&mu_);
      if (!closed_ && cancel) ctx_->TryCancel();
      closed_ = true;
    }
    if (writer_.joinable()) writer_.join();
  }

 private:
  // Well under kMaxMessageBytes: a batch of large messages is split.
  static constexpr size_t kBatchBytes = kMaxMessageBytes / 4;

  void CloseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!closed_) ctx_->TryCancel();
    closed_ = true;
  }
  // Await conditions: members, so that the thread-safety analysis sees the lock they run
  // under (Mutex evaluates a Condition with mu_ held).
  bool DrainedOrClosed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || (queue_.empty() && !writing_);
  }
  bool HasWorkOrClosed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || !queue_.empty();
  }

  void WriterLoop() {
    std::vector<v1::CoordinatorMessage> take;
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &StreamChannel::HasWorkOrClosed));
        if (closed_) return;
        take.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
        queue_.clear();
        queued_bytes_ = 0;
        writing_ = true;
      }
      const bool ok = WriteAll(&take);
      take.clear();
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {
        CloseLocked();
        return;
      }
    }
  }

  // Everything queued since the last write, as one stream message where the worker takes
  // batches (a few when they would not fit in one).
  bool WriteAll(std::vector<v1::CoordinatorMessage>* messages) {
    if (!batches_ || messages->size() == 1) {
      for (size_t i = 0; i < messages->size(); ++i) {
        if (!Write((*messages)[i], i + 1 < messages->size())) return false;
      }
      return true;
    }
    v1::CoordinatorMessage batch;
    size_t bytes = 0;
    for (auto& m : *messages) {
      const size_t size = m.ByteSizeLong();
      if (bytes > 0 && bytes + size > kBatchBytes) {
        if (!Write(batch, false)) return false;
        batch.Clear();
        bytes = 0;
      }
      *batch.mutable_batch()->add_messages() = std::move(m);
      bytes += size + 8;
    }
    return bytes == 0 || Write(batch, false);
  }

  // Writer thread only. `more`: another message follows at once.
  bool Write(const v1::CoordinatorMessage& message, bool more) {
    grpc::WriteOptions options;
    if (more) options.set_buffer_hint();
    return stream_->Write(message, options);
  }

  absl::Mutex mu_;
  grpc::ServerContext* ctx_;
  grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream_;
  const bool batches_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;  // the writer holds messages taken off queue_
  std::deque<v1::CoordinatorMessage> queue_ ABSL_GUARDED_BY(mu_);
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread writer_;  // last: starts once the members above exist
};

class WorkerServiceImpl final : public v1::WorkerService::Service {
 public:
  WorkerServiceImpl(WorkerHandler* h, const Authenticator* auth, CoordinatorMetrics* m)
      : h_(h), auth_(auth), m_(m), heartbeat_(&m->Rpc("Heartbeat")), event_(&m->Rpc("Event")) {}

  grpc::Status Session(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream) override {
    Caller caller;
    absl::Status auth = auth_->Authenticate(*ctx, kWorkerSession, &caller);
    if (!auth.ok()) return ToGrpcStatus(auth);
    v1::WorkerMessage msg;
    if (!stream->Read(&msg)) return grpc::Status::OK;
    if (!msg.has_register_()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "a session must start with Register");
    }
    // A worker's id is its credential's subject: nobody registers as somebody else (that
    // would take over the real worker's attempts and outputs).
    if (caller.authenticated && msg.register_().info().id() != caller.subject) {
      return ToGrpcStatus(
          auth_->Deny(*ctx, kWorkerSession, caller, "wrong_identity",
                      absl::StrCat("worker credential for '", caller.subject,
                                   "' cannot register as '", msg.register_().info().id(), "'")));
    }
    auto channel = std::make_shared<StreamChannel>(ctx, stream, msg.register_().accepts_batches());
    uint64_t session = 0;
    absl::StatusOr<v1::Registered> registered;
    {
      RpcTimer t(m_->Rpc("Register"));
      registered = h_->Register(msg.register_(), channel, &session);
    }
    if (!registered.ok()) {
      channel->Detach(/*cancel=*/false);
      return ToGrpcStatus(registered.status());
    }
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
    // Let what is queued (a last ack, a cancel) go out before the stream closes, briefly.
    channel->Drain(std::chrono::milliseconds(200));
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
