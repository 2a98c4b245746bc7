#include "coordinator/coordinator.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <iterator>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "common/status.h"

namespace stemma::coordinator {
namespace {

// "j-12.3" → ("j-12", 3); false when it is not an attempt id.
bool ParseAttemptId(const std::string& attempt_id, std::string* job_id, int* number) {
  auto dot = attempt_id.rfind('.');
  if (dot == std::string::npos || attempt_id.rfind("j-", 0) != 0) return false;
  uint64_t seq;
  if (!absl::SimpleAtoi(attempt_id.substr(2, dot - 2), &seq)) return false;
  if (!absl::SimpleAtoi(attempt_id.substr(dot + 1), number) || *number <= 0) return false;
  *job_id = attempt_id.substr(0, dot);
  return true;
}

absl::Status ValidateWorkerInfo(const v1::WorkerInfo& info) {
  if (info.id().empty() || info.id().size() > 128) {
    return absl::InvalidArgumentError("register: worker id must have 1..128 characters");
  }
  for (char c : info.id()) {
    if (!isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return absl::InvalidArgumentError(
          absl::StrCat("register: worker id '", info.id(), "' may use only [A-Za-z0-9._-]"));
    }
  }
  if (info.gpus_size() > 1024) return absl::InvalidArgumentError("register: more than 1024 GPUs");
  if (info.cpus() < 0 || info.cpus() > 1e6) return absl::InvalidArgumentError("register: bad cpus");
  if (info.memory_mb() < 0) return absl::InvalidArgumentError("register: bad memory_mb");
  return absl::OkStatus();
}

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options, Store* store, const Clock* clock,
                         CoordinatorMetrics* metrics)
    : options_(std::move(options)),
      store_(store),
      clock_(clock),
      metrics_(metrics),
      logs_(options_.data_dir + "/logs"),
      jobs_(clock) {
  jobs_.SetObserver([this](const v1::Job& job, v1::JobState from, v1::JobState to) {
    metrics_->Transition(JobKind(job.spec()), from, to);
  });
}

Coordinator::~Coordinator() { Stop(); }

absl::Status Coordinator::Start() {
  std::string logs = options_.data_dir + "/logs";
  if (::mkdir(logs.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoStatus(absl::StrCat("mkdir ", logs), errno);
  }
  ASSIGN_OR_RETURN(StoreSnapshot snap, store_->Load());
  {
    absl::MutexLock lock(&mu_);
    jobs_.Load(snap);
    workers_.Load(snap, clock_->MonoMs(), options_.lease_ms);
    {
      absl::MutexLock live_lock(&live_mu_);
      for (const auto& [id, w] : workers_.all()) live_[id] = w.live;
    }
    // Resources held by attempts that were live when the coordinator stopped.
    int restored = 0;
    jobs_.ForEach([&](const v1::Job& job) {
      if (!jobs_.IsLive(job)) return;
      for (const auto& part : job.current().parts()) {
        if (part.finished()) continue;
        WorkerEntry* w = workers_.Find(part.worker_id());
        if (w == nullptr) continue;
        Allocation a;
        a.gpu_ids.assign(part.gpu_ids().begin(), part.gpu_ids().end());
        a.cpus = job.spec().resources().cpus();
        a.memory_mb = job.spec().resources().memory_mb();
        workers_.Restore(*w, AllocationKey(job.current().id(), part.rank()), a);
        ++restored;
      }
    });
    spdlog::info("loaded {} jobs, {} workers, {} live attempt parts", jobs_.size(),
                 snap.workers.size(), restored);
    UpdateGauges();
  }
  committer_ = std::make_unique<Committer>(
      store_, [this](double s, size_t n) { metrics_->StoreCommit(s, n); },
      [this](uint64_t durable) { FlushOutbox(durable); });
  scheduler_ = std::thread([this] { SchedulerLoop(); });
  return absl::OkStatus();
}

void Coordinator::Stop() {
  {
    absl::MutexLock lock(&kick_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (scheduler_.joinable()) scheduler_.join();
  committer_.reset();  // commits what is pending
}

uint64_t Coordinator::Finish(Changes&& changes) {
  // Lazy unless someone waits: the caller (Wait) or the messages and events. A change
  // nobody waits for (a job going RUNNING) joins the next transaction.
  const bool outgoing = !changes.events.empty() || !changes.messages.empty();
  if (!outgoing) return committer_->Add(std::move(changes.batch), /*urgent=*/false);
  Outgoing out;
  out.events = std::move(changes.events);
  for (auto& m : changes.messages) {
    auto it = channels_.find(m.worker_id);
    if (it != channels_.end()) out.sends.emplace_back(it->second, std::move(m.message));
  }
  absl::MutexLock lock(&outbox_mu_);
  out.ticket = committer_->Add(std::move(changes.batch), /*urgent=*/true);
  const uint64_t ticket = out.ticket;
  outbox_.push_back(std::move(out));
  return ticket;
}

void Coordinator::FlushOutbox(uint64_t durable) {
  std::vector<Outgoing> ready;
  {
    absl::MutexLock lock(&outbox_mu_);
    size_t n = 0;
    while (n < outbox_.size() && outbox_[n].ticket <= durable) ++n;
    if (n == 0) return;
    ready.assign(std::make_move_iterator(outbox_.begin()),
                 std::make_move_iterator(outbox_.begin() + n));
    outbox_.erase(outbox_.begin(), outbox_.begin() + n);
  }
  // Everything for one worker leaves in one write (an ack and the next assignment, say);
  // messages keep their order within each worker.
  std::vector<std::pair<std::shared_ptr<WorkerChannel>, std::vector<v1::CoordinatorMessage>>>
      per_worker;
  absl::flat_hash_map<const WorkerChannel*, size_t> index;  // channel -> per_worker entry
  std::vector<v1::JobEvent> events;
  for (Outgoing& o : ready) {
    for (auto& [channel, message] : o.sends) {
      auto [it, inserted] = index.try_emplace(channel.get(), per_worker.size());
      if (inserted) per_worker.emplace_back(channel, std::vector<v1::CoordinatorMessage>());
      per_worker[it->second].second.push_back(std::move(message));
    }
    if (events.empty()) {
      events = std::move(o.events);
    } else {
      events.insert(events.end(), std::make_move_iterator(o.events.begin()),
                    std::make_move_iterator(o.events.end()));
    }
  }
  for (auto& [channel, messages] : per_worker) channel->SendAll(std::move(messages));
  if (!events.empty()) hub_.Publish(events);
}

void Coordinator::Kick() {
  absl::MutexLock lock(&kick_mu_);
  kicked_ = true;
}

void Coordinator::SchedulerLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&kick_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kick_mu_) {
        return kicked_ || stopping_;
      };
      kick_mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(options_.tick_ms));
      if (stopping_) return;
      kicked_ = false;
    }
    RunSchedulerPass();
  }
}

int Coordinator::RunSchedulerPass() {
  auto start = std::chrono::steady_clock::now();
  int placed;
  {
    absl::MutexLock lock(&mu_);
    Changes changes = NewChanges();
    ExpireLeases(&changes);
    placed = Place(&changes);
    UpdateGauges();
    if (!changes.batch.empty() || !changes.messages.empty()) Finish(std::move(changes));
  }
  metrics_->SchedulerPass(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return placed;
}

void Coordinator::ExpireLeases(Changes* changes) {
  const int64_t now = clock_->MonoMs();
  for (auto& [id, w] : workers_.all()) {
    const int64_t last = w.live->last_heartbeat_mono.load();
    if (w.info.state() == v1::WORKER_LOST || last + options_.lease_ms > now) continue;
    spdlog::warn("worker={} lost: no heartbeat for {} ms", id, now - last);
    w.info.set_state(v1::WORKER_LOST);
    w.live->lost = true;
    auto ch = channels_.find(id);
    if (ch != channels_.end()) {
      ch->second->Close();
      channels_.erase(ch);
    }
    w.connected = false;
    std::vector<std::string> attempts;
    for (const auto& [key, a] : w.allocations) attempts.push_back(key.substr(0, key.rfind('/')));
    for (const auto& attempt : attempts) {
      v1::Job* job = jobs_.FindCurrentAttempt(attempt);
      if (job == nullptr || !jobs_.IsLive(*job)) continue;
      EndAttempt(job, absl::StrCat("worker ", id, " lost (no heartbeat for ", options_.lease_ms, " ms)"),
                 -1, true, "", changes);
    }
    // Anything left (e.g. parts of ended attempts) is freed too.
    std::vector<std::string> keys;
    for (const auto& [key, a] : w.allocations) keys.push_back(key);
    for (const auto& key : keys) workers_.Free(w, key);
    changes->batch.workers.push_back(w.info);
  }
}

int Coordinator::Place(Changes* changes) {
  const int64_t now = clock_->WallMs();
  std::vector<Placement> placements = Schedule(jobs_, workers_, now, options_.scheduler);
  for (const auto& p : placements) {
    const v1::Job* queued = jobs_.Find(p.job_id);
    const auto& r = queued->spec().resources();
    double wait_s = (now - queued->queued_ms()) / 1000.0;
    double latency_s = (now - std::max(queued->queued_ms(), queued->not_before_ms())) / 1000.0;
    std::string attempt_id = absl::StrCat(p.job_id, ".", queued->attempts() + 1);
    std::vector<v1::AttemptPart> parts;
    for (size_t rank = 0; rank < p.workers.size(); ++rank) {
      WorkerEntry* w = workers_.Find(p.workers[rank]);
      Allocation a = workers_.Allocate(*w, AllocationKey(attempt_id, rank), r.gpus(), r.cpus(),
                                       r.memory_mb());
      v1::AttemptPart part;
      part.set_rank(rank);
      part.set_worker_id(p.workers[rank]);
      part.mutable_gpu_ids()->Assign(a.gpu_ids.begin(), a.gpu_ids.end());
      parts.push_back(std::move(part));
    }
    std::string rendezvous;
    if (p.workers.size() > 1) {
      const WorkerEntry* w0 = workers_.Find(p.workers[0]);
      // A port derived from the job keeps concurrent gangs on one host apart.
      uint64_t seq = queued->seq();
      rendezvous = absl::StrCat(w0->info.host().empty() ? "127.0.0.1" : w0->info.host(), ":",
                                29500 + (seq % 20000));
    }
    v1::Job* job = jobs_.Assign(p.job_id, std::move(parts), rendezvous, changes);
    for (int rank = 0; rank < job->current().parts_size(); ++rank) {
      v1::CoordinatorMessage msg;
      *msg.mutable_assign() = MakeAssignment(*job, rank);
      changes->messages.push_back({job->current().parts(rank).worker_id(), std::move(msg)});
    }
    metrics_->QueueWait(std::max(0.0, wait_s));
    metrics_->SchedulingLatency(std::max(0.0, latency_s));
  }
  return static_cast<int>(placements.size());
}

v1::Assignment Coordinator::MakeAssignment(const v1::Job& job, int rank) const {
  v1::Assignment a;
  a.set_job_id(job.id());
  a.set_attempt_id(job.current().id());
  *a.mutable_spec() = job.spec();
  a.set_rank(rank);
  a.set_world_size(job.current().parts_size());
  a.set_rendezvous(job.current().rendezvous());
  *a.mutable_gpu_ids() = job.current().parts(rank).gpu_ids();
  return a;
}

void Coordinator::UpdateGauges() {
  int alive = 0, draining = 0, lost = 0, free = 0, used = 0;
  for (const auto& [id, w] : workers_.all()) {
    switch (w.info.state()) {
      case v1::WORKER_ALIVE: ++alive; break;
      case v1::WORKER_DRAINING: ++draining; break;
      case v1::WORKER_LOST: ++lost; continue;
      default: continue;
    }
    int f = w.free_gpus();
    free += f;
    used += static_cast<int>(w.gpu_used.size()) - f;
  }
  metrics_->WorkerCounts(alive, draining, lost);
  metrics_->Gpus(free, used);
}

void Coordinator::StopParts(const v1::Job& job, const std::string& reason,
                            const std::string& except_worker, Changes* changes) {
  for (const auto& part : job.current().parts()) {
    WorkerEntry* w = workers_.Find(part.worker_id());
    if (w != nullptr) workers_.Free(*w, AllocationKey(job.current().id(), part.rank()));
    if (part.finished() || part.worker_id() == except_worker) continue;
    v1::CoordinatorMessage msg;
    msg.mutable_cancel()->set_attempt_id(job.current().id());
    msg.mutable_cancel()->set_reason(reason);
    changes->messages.push_back({part.worker_id(), std::move(msg)});
  }
}

void Coordinator::EndAttempt(v1::Job* job, const std::string& result, int exit_code,
                             bool retryable, const std::string& except_worker, Changes* changes) {
  StopParts(*job, result, except_worker, changes);
  metrics_->AttemptEnded(retryable ? "failed" : "failed_permanently");
  spdlog::info("job={} attempt={} failed: {}", job->id(), job->current().id(), result);
  jobs_.AttemptFailed(job, result, exit_code, retryable, changes);
}

// ---------------------------------------------------------------------------- users

absl::StatusOr<v1::SubmitResponse> Coordinator::Submit(const v1::SubmitRequest& request) {
  uint64_t ticket;
  v1::SubmitResponse resp;
  {
    absl::MutexLock lock(&mu_);
    bool exec = false;
    for (const auto& spec : request.jobs()) exec |= spec.kind_case() == v1::JobSpec::kExec;
    if (exec) {
      bool allowed = false;
      int registered = 0;
      for (const auto& [id, w] : workers_.all()) {
        if (w.info.state() == v1::WORKER_LOST) continue;
        ++registered;
        allowed |= w.info.allow_exec();
      }
      if (!allowed) {
        return absl::FailedPreconditionError(absl::StrCat(
            "exec jobs need a worker started with --allow-exec; none of the ", registered,
            " registered workers allows it"));
      }
    }
    Changes changes = NewChanges();
    ASSIGN_OR_RETURN(JobTable::SubmitResult result, jobs_.Submit(request, &changes));
    resp.mutable_job_ids()->Assign(result.ids.begin(), result.ids.end());
    resp.set_existing(result.existing);
    if (!result.existing) {
      metrics_->Submitted(static_cast<int>(result.ids.size()));
      Place(&changes);  // idle capacity takes new jobs in the same transaction
    }
    // An existing key may still be on its way to disk: wait for everything so far.
    ticket = result.existing ? committer_->LastTicket() : Finish(std::move(changes));
  }
  committer_->Wait(ticket);
  return resp;
}

absl::StatusOr<v1::Job> Coordinator::GetJob(const std::string& id) {
  absl::MutexLock lock(&mu_);
  const v1::Job* job = jobs_.Find(id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job ", id));
  return *job;
}

absl::StatusOr<v1::ListJobsResponse> Coordinator::ListJobs(const v1::ListJobsRequest& request) {
  absl::MutexLock lock(&mu_);
  return jobs_.List(request);
}

absl::StatusOr<v1::Job> Coordinator::Cancel(const std::string& id, const std::string& reason) {
  uint64_t ticket;
  v1::Job result;
  {
    absl::MutexLock lock(&mu_);
    const v1::Job* job = jobs_.Find(id);
    if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job ", id));
    Changes changes = NewChanges();
    bool live = jobs_.IsLive(*job);
    std::string why = reason.empty() ? "cancelled by user" : absl::StrCat("cancelled: ", reason);
    RETURN_IF_ERROR(jobs_.Cancel(id, why, &changes));
    if (live) {
      StopParts(*job, why, "", &changes);
      metrics_->AttemptEnded("cancelled");
    }
    result = *job;
    ticket = Finish(std::move(changes));
  }
  Kick();
  committer_->Wait(ticket);
  return result;
}

absl::StatusOr<v1::Job> Coordinator::Retry(const std::string& id) {
  uint64_t ticket;
  v1::Job result;
  {
    absl::MutexLock lock(&mu_);
    Changes changes = NewChanges();
    RETURN_IF_ERROR(jobs_.Retry(id, &changes));
    result = *jobs_.Find(id);
    ticket = Finish(std::move(changes));
  }
  Kick();
  committer_->Wait(ticket);
  return result;
}

v1::ListWorkersResponse Coordinator::ListWorkers() {
  absl::MutexLock lock(&mu_);
  v1::ListWorkersResponse resp;
  const int64_t now = clock_->MonoMs();
  std::vector<const WorkerEntry*> all;
  for (const auto& [id, w] : workers_.all()) all.push_back(&w);
  std::sort(all.begin(), all.end(),
            [](const WorkerEntry* a, const WorkerEntry* b) { return a->info.id() < b->info.id(); });
  for (const auto* w : all) *resp.add_workers() = workers_.View(*w, now);
  return resp;
}

absl::StatusOr<v1::WorkerInfo> Coordinator::Drain(const std::string& worker_id, bool undrain) {
  uint64_t ticket;
  v1::WorkerInfo view;
  {
    absl::MutexLock lock(&mu_);
    WorkerEntry* w = workers_.Find(worker_id);
    if (w == nullptr) return absl::NotFoundError(absl::StrCat("no worker ", worker_id));
    if (w->info.state() == v1::WORKER_LOST) {
      return absl::FailedPreconditionError(absl::StrCat("worker ", worker_id, " is lost"));
    }
    w->info.set_state(undrain ? v1::WORKER_ALIVE : v1::WORKER_DRAINING);
    Changes changes = NewChanges();
    changes.batch.workers.push_back(w->info);
    view = workers_.View(*w, clock_->MonoMs());
    ticket = Finish(std::move(changes));
  }
  Kick();
  committer_->Wait(ticket);
  return view;
}

std::shared_ptr<EventHub::Subscription> Coordinator::Watch(const v1::WatchRequest& request,
                                                           std::vector<v1::JobEvent>* initial) {
  std::vector<std::string> ids(request.job_ids().begin(), request.job_ids().end());
  absl::MutexLock lock(&mu_);
  auto sub = hub_.Subscribe(ids);
  if (request.send_initial()) {
    auto add = [&](const v1::Job& job) {
      v1::JobEvent ev;
      *ev.mutable_job() = job;
      ev.set_previous(v1::JOB_STATE_UNSPECIFIED);  // a snapshot, not a transition
      initial->push_back(std::move(ev));
    };
    if (ids.empty()) {
      jobs_.ForEach(add);
      std::sort(initial->begin(), initial->end(), [](const auto& a, const auto& b) {
        return a.job().seq() < b.job().seq();
      });
    } else {
      for (const auto& id : ids) {
        if (const v1::Job* job = jobs_.Find(id)) add(*job);
      }
    }
  }
  return sub;
}

void Coordinator::Unwatch(const std::shared_ptr<EventHub::Subscription>& sub) {
  hub_.Unsubscribe(sub);
}

// -------------------------------------------------------------------------- workers

absl::StatusOr<v1::Registered> Coordinator::Register(const v1::Register& request,
                                                     std::shared_ptr<WorkerChannel> channel,
                                                     uint64_t* session) {
  RETURN_IF_ERROR(ValidateWorkerInfo(request.info()));
  const std::string& id = request.info().id();
  v1::Registered reply;
  uint64_t ticket;
  {
    absl::MutexLock lock(&mu_);
    WorkerEntry* existing = workers_.Find(id);
    bool draining = existing != nullptr && existing->info.state() == v1::WORKER_DRAINING;
    v1::WorkerInfo info = request.info();
    info.set_state(draining ? v1::WORKER_DRAINING : v1::WORKER_ALIVE);
    info.set_registered_ms(clock_->WallMs());
    WorkerEntry& w = workers_.Upsert(info);
    w.info.set_state(info.state());
    auto old = channels_.find(id);
    if (old != channels_.end() && old->second != channel) old->second->Close();
    channels_[id] = channel;
    w.connected = true;
    w.session = *session = ++next_session_;
    w.live->last_heartbeat_mono = clock_->MonoMs();
    w.live->lost = false;
    w.live->session = w.session;
    {
      absl::MutexLock live_lock(&live_mu_);
      live_[id] = w.live;
    }

    // Reconcile what the worker runs with what the coordinator believes it runs.
    Changes changes = NewChanges();
    absl::flat_hash_map<std::string, const v1::RunningAttempt*> reported;
    for (const auto& r : request.running()) {
      reported[AllocationKey(r.attempt_id(), r.rank())] = &r;
    }
    for (const auto& r : request.running()) {
      v1::Job* job = jobs_.FindCurrentAttempt(r.attempt_id());
      if (job == nullptr || !jobs_.IsLive(*job) || r.rank() < 0 ||
          r.rank() >= job->current().parts_size()) {
        continue;  // not kept: the worker kills it
      }
      const v1::AttemptPart& part = job->current().parts(r.rank());
      if (part.worker_id() != id || part.finished()) continue;
      v1::RunningAttempt* keep = reply.add_keep();
      keep->set_attempt_id(r.attempt_id());
      keep->set_rank(r.rank());
      keep->set_log_offset(logs_.Size(job->id(), job->current().number()));
    }
    std::vector<std::string> missing;
    for (const auto& [key, a] : w.allocations) {
      if (!reported.contains(key)) missing.push_back(key);
    }
    for (const auto& key : missing) {
      std::string attempt = key.substr(0, key.rfind('/'));
      int rank = std::stoi(key.substr(key.rfind('/') + 1));
      v1::Job* job = jobs_.FindCurrentAttempt(attempt);
      if (job == nullptr || !jobs_.IsLive(*job) || rank >= job->current().parts_size()) {
        workers_.Free(w, key);
        continue;
      }
      if (!job->current().parts(rank).running()) {
        // Assigned but never started: the assignment may have been lost in transit.
        v1::CoordinatorMessage msg;
        *msg.mutable_assign() = MakeAssignment(*job, rank);
        changes.messages.push_back({id, std::move(msg)});
      } else {
        EndAttempt(job, absl::StrCat("lost on worker ", id, " (the worker restarted)"), -1, true,
                   "", &changes);
      }
    }
    changes.batch.workers.push_back(w.info);
    reply.set_worker_id(id);
    reply.set_lease_ms(options_.lease_ms);
    reply.set_heartbeat_interval_ms(options_.heartbeat_ms);
    reply.set_accepts_batches(true);
    spdlog::info("worker={} registered: {} gpus, {} cpus, {} running, {} kept", id,
                 info.gpus_size(), info.cpus(), request.running_size(), reply.keep_size());
    // The answer leads: the worker ignores assignments that come before it, and this
    // change's re-sent assignments (or a placement right after) would otherwise overtake
    // an answer written by the caller.
    OutgoingMessage hello{id, v1::CoordinatorMessage()};
    *hello.message.mutable_registered() = reply;
    changes.messages.insert(changes.messages.begin(), std::move(hello));
    ticket = Finish(std::move(changes));
  }
  committer_->Wait(ticket);
  Kick();
  return reply;
}

absl::StatusOr<v1::HeartbeatAck> Coordinator::Heartbeat(const std::string& worker_id,
                                                        uint64_t session,
                                                        const v1::Heartbeat& heartbeat) {
  std::shared_ptr<Liveness> live;
  {
    absl::ReaderMutexLock lock(&live_mu_);
    auto it = live_.find(worker_id);
    if (it != live_.end()) live = it->second;
  }
  if (live == nullptr || live->session.load() != session) {
    return absl::FailedPreconditionError("session replaced; register again");
  }
  if (live->lost.load()) return absl::FailedPreconditionError("lease expired; register again");
  const int64_t now = clock_->MonoMs();
  const int64_t previous = live->last_heartbeat_mono.exchange(now);
  metrics_->HeartbeatAge((now - previous) / 1000.0);
  v1::HeartbeatAck ack;
  ack.set_seq(heartbeat.seq());
  return ack;
}

void Coordinator::Events(const std::string& worker_id, uint64_t session,
                         absl::Span<const v1::AttemptEvent* const> events) {
  // Logs go to their attempt's file whatever the attempt's state (offsets make a resent
  // chunk harmless), before the lock: the file write needs none.
  bool state_events = false;
  for (const v1::AttemptEvent* event : events) {
    if (!event->has_log()) {
      state_events = true;
      continue;
    }
    std::string job_id;
    int number;
    if (ParseAttemptId(event->attempt_id(), &job_id, &number)) {
      absl::Status st = logs_.Append(job_id, number, event->log().offset(), event->log().data());
      if (!st.ok()) spdlog::warn("worker={} log: {}", worker_id, st.ToString());
    }
  }
  if (!state_events) return;
  absl::MutexLock lock(&mu_);
  WorkerEntry* w = workers_.Find(worker_id);
  if (w == nullptr || w->session != session) return;
  Changes changes = NewChanges();
  bool freed = false;
  for (const v1::AttemptEvent* event : events) {
    if (!event->has_log()) freed |= ApplyEvent(worker_id, *w, *event, &changes);
  }
  // The freed resources are placed at once, in the same transaction: one thread hop and
  // one commit less between a job ending and the next one starting.
  if (freed) Place(&changes);
  Finish(std::move(changes));
}

bool Coordinator::ApplyEvent(const std::string& worker_id, WorkerEntry& w,
                             const v1::AttemptEvent& event, Changes* changes) {
  v1::Job* job = jobs_.FindCurrentAttempt(event.attempt_id());
  bool valid = job != nullptr && event.rank() >= 0 && event.rank() < job->current().parts_size() &&
               job->current().parts(event.rank()).worker_id() == worker_id;
  auto ack = [&] {
    if (event.has_finished()) {
      v1::CoordinatorMessage msg;
      msg.mutable_event_ack()->set_event_seq(event.event_seq());
      changes->messages.push_back({worker_id, std::move(msg)});
    }
  };
  if (!valid) {
    metrics_->StaleReport();
    spdlog::info("worker={} attempt={} stale report refused", worker_id, event.attempt_id());
    if (!event.has_finished()) {
      v1::CoordinatorMessage msg;
      msg.mutable_cancel()->set_attempt_id(event.attempt_id());
      msg.mutable_cancel()->set_reason("stale attempt");
      changes->messages.push_back({worker_id, std::move(msg)});
    }
    ack();
    return false;
  }
  const v1::AttemptPart& part = job->current().parts(event.rank());
  if (event.has_started()) {
    if (jobs_.IsLive(*job) && !part.finished()) jobs_.MarkStarted(job, event.rank(), changes);
    return false;
  }
  if (event.has_progress()) {
    if (jobs_.IsLive(*job)) jobs_.SetProgress(job, event.progress(), changes);
    return false;
  }
  if (!event.has_finished()) return false;
  const auto& f = event.finished();
  if (!part.finished()) {
    workers_.Free(w, AllocationKey(event.attempt_id(), event.rank()));
    if (!jobs_.IsLive(*job)) {
      // Cancelled while it ran: record how the part ended.
      job->mutable_current()->mutable_parts(event.rank())->set_finished(true);
      job->mutable_current()->mutable_parts(event.rank())->set_exit_code(f.exit_code());
      changes->batch.jobs.push_back(*job);
    } else if (f.exit_code() == 0) {
      metrics_->AttemptEnded("succeeded");
      jobs_.PartSucceeded(job, event.rank(), f.outputs(), changes);
    } else {
      job->mutable_current()->mutable_parts(event.rank())->set_finished(true);
      job->mutable_current()->mutable_parts(event.rank())->set_exit_code(f.exit_code());
      EndAttempt(job, f.reason().empty() ? absl::StrCat("exit ", f.exit_code()) : f.reason(),
                 f.exit_code(), f.retryable(), worker_id, changes);
    }
  }
  ack();
  return true;
}

void Coordinator::Disconnected(const std::string& worker_id, uint64_t session) {
  absl::MutexLock lock(&mu_);
  WorkerEntry* w = workers_.Find(worker_id);
  if (w == nullptr || w->session != session) return;
  w->connected = false;
  channels_.erase(worker_id);
  spdlog::info("worker={} disconnected; its lease runs for {} ms", worker_id, options_.lease_ms);
}

}  // namespace stemma::coordinator
