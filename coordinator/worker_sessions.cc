#include "coordinator/worker_sessions.h"

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/job_ranks.h"
#include "common/logging.h"
#include "common/status.h"
#include "coordinator/attempts.h"

namespace stemma::coordinator {
namespace {

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

absl::StatusOr<v1::Registered> WorkerSessions::Register(const v1::Register& request,
                                                        std::shared_ptr<WorkerChannel> channel,
                                                        uint64_t* session) {
  RETURN_IF_ERROR(ValidateWorkerInfo(request.info()));
  CoordinatorCore& c = *core_;
  const std::string& id = request.info().id();
  v1::Registered reply;
  absl::StatusOr<std::string> secret = NewToken();
  if (!secret.ok()) return secret.status();
  uint64_t ticket;
  {
    absl::MutexLock lock(&c.mu);
    WorkerEntry* existing = c.workers.Find(id);
    if (existing != nullptr && existing->connected && c.channels.contains(id) &&
        c.clock->MonoMs() - existing->live->last_heartbeat_mono.load() < c.options.lease_ms) {
      auto known = session_secrets_.find(id);
      if (known == session_secrets_.end() || request.session_secret() != known->second) {
        c.metrics->StaleReport();
        spdlog::warn("worker={} second session refused: its session is alive", id);
        return absl::FailedPreconditionError(absl::StrCat(
            "worker '", id,
            "' already has a live session; a second session under its identity is refused"));
      }
    }
    session_secrets_[id] = *secret;
    reply.set_session_secret(*secret);
    bool draining = existing != nullptr && existing->info.state() == v1::WORKER_DRAINING;
    v1::WorkerInfo info = request.info();
    info.set_state(draining ? v1::WORKER_DRAINING : v1::WORKER_ALIVE);
    info.set_registered_ms(c.clock->WallMs());
    WorkerEntry& w = c.workers.Upsert(info);
    c.jobs.SetEngineBuild(info.engine_build_id());
    w.info.set_state(info.state());
    auto old = c.channels.find(id);
    if (old != c.channels.end() && old->second != channel) old->second->Close();
    c.channels[id] = channel;
    w.connected = true;
    w.session = *session = ++c.next_session;
    w.live->last_heartbeat_mono = c.clock->MonoMs();
    w.live->lost = false;
    w.live->session = w.session;
    {
      absl::MutexLock live_lock(&c.live_mu);
      c.live[id] = w.live;
    }

    // Reconcile what the worker runs with what the coordinator believes it runs.
    Changes changes = c.NewChanges();
    absl::flat_hash_map<std::string, const v1::RunningAttempt*> reported;
    for (const auto& r : request.running()) {
      reported[AllocationKey(r.attempt_id(), r.rank())] = &r;
    }
    for (const auto& r : request.running()) {
      v1::Job* job = c.jobs.FindCurrentAttempt(r.attempt_id());
      if (job == nullptr || !c.jobs.IsLive(*job) || r.rank() < 0 ||
          r.rank() >= job->current().parts_size()) {
        continue;  // not kept: the worker kills it
      }
      const v1::AttemptPart& part = job->current().parts(r.rank());
      if (part.worker_id() != id || part.finished()) continue;
      v1::RunningAttempt* keep = reply.add_keep();
      keep->set_attempt_id(r.attempt_id());
      keep->set_rank(r.rank());
      // Each process of the part has its own log, by global rank (common/job_ranks.h).
      const int ranks = RanksPerPart(job->spec());
      const int first = r.rank() * ranks;
      keep->set_log_offset(c.logs.Size(job->id(), job->current().number(), first));
      for (int local = 1; local < ranks; ++local) {
        (*keep->mutable_local_log_offsets())[local] =
            c.logs.Size(job->id(), job->current().number(), first + local);
      }
    }
    std::vector<std::string> missing;
    for (const auto& [key, a] : w.allocations) {
      if (!reported.contains(key)) missing.push_back(key);
    }
    for (const auto& key : missing) {
      std::string attempt = key.substr(0, key.rfind('/'));
      int rank = std::stoi(key.substr(key.rfind('/') + 1));
      v1::Job* job = c.jobs.FindCurrentAttempt(attempt);
      if (job == nullptr || !c.jobs.IsLive(*job) || rank >= job->current().parts_size()) {
        c.workers.Free(w, key);
        continue;
      }
      if (!job->current().parts(rank).running()) {
        // Assigned but never started: the assignment may have been lost in transit.
        v1::CoordinatorMessage msg;
        *msg.mutable_assign() = Placer::MakeAssignment(*job, rank);
        changes.messages.push_back({id, std::move(msg)});
      } else {
        EndAttempt(c, job, absl::StrCat("lost on worker ", id, " (the worker restarted)"), -1, true,
                   "", &changes);
      }
    }
    changes.batch.of<WorkersTable>().push_back(w.info);
    reply.set_worker_id(id);
    reply.set_lease_ms(c.options.lease_ms);
    reply.set_heartbeat_interval_ms(c.options.heartbeat_ms);
    reply.set_accepts_batches(true);
    spdlog::info("worker={} registered: {} gpus, {} cpus, {} running, {} kept", id,
                 info.gpus_size(), info.cpus(), request.running_size(), reply.keep_size());
    // The answer leads: the worker ignores assignments that come before it, and this
    // change's re-sent assignments (or a placement right after) would otherwise overtake
    // an answer written by the caller.
    OutgoingMessage hello{id, v1::CoordinatorMessage()};
    *hello.message.mutable_registered() = reply;
    changes.messages.insert(changes.messages.begin(), std::move(hello));
    ticket = c.Finish(std::move(changes));
  }
  c.Wait(ticket);
  c.Kick();
  return reply;
}

void WorkerSessions::Events(const std::string& worker_id, uint64_t session,
                            absl::Span<const v1::AttemptEvent* const> events) {
  CoordinatorCore& c = *core_;
  // Logs go to their attempt's file whatever the attempt's state (offsets make a resent
  // chunk harmless), and reported outputs are hashed, before the lock: file work needs none.
  bool state_events = false;
  std::vector<std::vector<ManifestCheck>> checks;
  const std::vector<int> owned = OwnedLogs(worker_id, events);
  for (size_t i = 0; i < events.size(); ++i) {
    const v1::AttemptEvent* event = events[i];
    if (!event->has_log()) {
      state_events = true;
      if (c.options.verify_artifacts && event->has_finished() &&
          event->finished().exit_code() == 0 && !event->finished().artifacts().empty()) {
        checks.resize(events.size());
        for (const auto& a : event->finished().artifacts()) {
          checks[i].push_back(CheckManifest(a.path(), a.manifest_sha256()));
        }
      }
      continue;
    }
    std::string job_id;
    int number;
    const int ranks = owned[i];
    const int local = event->log().local_rank();
    if (ranks == 0 || local < 0 || local >= ranks) {
      c.metrics->StaleReport();
      spdlog::info("worker={} attempt={} log refused: not its attempt", worker_id,
                   event->attempt_id());
    } else if (ParseAttemptId(event->attempt_id(), &job_id, &number)) {
      absl::Status st = c.logs.Append(job_id, number, event->log().offset(), event->log().data(),
                                      event->rank() * ranks + local);
      if (!st.ok()) spdlog::warn("worker={} log: {}", worker_id, st.ToString());
    }
  }
  if (!state_events) return;
  const std::vector<std::string> refused = ConfineFinished(worker_id, events, &checks);
  absl::MutexLock lock(&c.mu);
  WorkerEntry* w = c.workers.Find(worker_id);
  if (w == nullptr || w->session != session) return;
  Changes changes = c.NewChanges();
  core_->mu.AssertHeld();  // as c.mu: ApplyEvent's annotation names core_->mu
  placer_->AssertHeld();
  bool freed = false;
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i]->has_log()) continue;
    freed |= ApplyEvent(worker_id, *w, *events[i],
                        i < checks.size() ? std::move(checks[i]) : std::vector<ManifestCheck>(),
                        refused[i], &changes);
  }
  // The freed resources are placed at once, in the same transaction: one thread hop and
  // one commit less between a job ending and the next one starting.
  if (freed) placer_->Place(&changes);
  c.Finish(std::move(changes));
}

std::vector<int> WorkerSessions::OwnedLogs(const std::string& worker_id,
                                           absl::Span<const v1::AttemptEvent* const> events) {
  std::vector<int> owned(events.size(), 0);
  bool any = false;
  for (const v1::AttemptEvent* e : events) any |= e->has_log();
  if (!any) return owned;
  CoordinatorCore& c = *core_;
  absl::MutexLock lock(&c.mu);
  for (size_t i = 0; i < events.size(); ++i) {
    const v1::AttemptEvent& e = *events[i];
    if (!e.has_log()) continue;
    const v1::Job* job = c.jobs.FindCurrentAttempt(e.attempt_id());
    if (job != nullptr && e.rank() >= 0 && e.rank() < job->current().parts_size() &&
        job->current().parts(e.rank()).worker_id() == worker_id) {
      owned[i] = RanksPerPart(job->spec());
    }
  }
  return owned;
}

std::vector<std::string> WorkerSessions::ConfineFinished(
    const std::string& worker_id, absl::Span<const v1::AttemptEvent* const> events,
    std::vector<std::vector<ManifestCheck>>* checks) {
  std::vector<std::string> refused(events.size());
  std::vector<size_t> finished;
  for (size_t i = 0; i < events.size(); ++i) {
    const v1::AttemptEvent& e = *events[i];
    if (e.has_finished() && e.finished().exit_code() == 0 &&
        (!e.finished().artifacts().empty() || !e.finished().outputs().empty())) {
      finished.push_back(i);
    }
  }
  if (finished.empty()) return refused;
  CoordinatorCore& c = *core_;
  std::string root;
  std::vector<std::string> owners(events.size());
  {
    absl::MutexLock lock(&c.mu);
    if (const WorkerEntry* w = c.workers.Find(worker_id)) root = w->info.storage_root();
    for (size_t i : finished) {
      if (const v1::Job* job = c.jobs.FindCurrentAttempt(events[i]->attempt_id())) {
        owners[i] = job->owner();
      }
    }
  }
  checks->resize(events.size());
  for (size_t i : finished) {
    const v1::AttemptEvent::Finished& f = events[i]->finished();
    refused[i] = ArtifactRegistry::ConfineOutputs(f, root, owners[i], c.options.tenancy);
    if (!refused[i].empty()) continue;
    // What the files are now: a cache hit on them is served only while they stay so.
    std::vector<ManifestCheck>& mine = (*checks)[i];
    mine.resize(f.artifacts_size());
    for (int k = 0; k < f.artifacts_size(); ++k) mine[k].files = StampFiles(f.artifacts(k).path());
  }
  return refused;
}

bool WorkerSessions::ApplyEvent(const std::string& worker_id, WorkerEntry& w,
                                const v1::AttemptEvent& event, std::vector<ManifestCheck> checks,
                                const std::string& refused, Changes* changes) {
  CoordinatorCore& c = *core_;
  c.mu.AssertHeld();
  v1::Job* job = c.jobs.FindCurrentAttempt(event.attempt_id());
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
    c.metrics->StaleReport();
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
    if (c.jobs.IsLive(*job) && !part.finished()) c.jobs.MarkStarted(job, event.rank(), changes);
    return false;
  }
  if (event.has_progress()) {
    if (c.jobs.IsLive(*job)) {
      c.jobs.SetProgress(job, event.progress(), changes);
      series_->AssertHeld();
      series_->Progress(*job, event.progress());
    }
    return false;
  }
  if (event.has_metrics()) {
    series_->AssertHeld();
    if (c.jobs.IsLive(*job) && !part.finished()) {
      absl::Status recorded = series_->RecordBatch(*job, event.metrics(), changes);
      if (recorded.ok() && job->spec().kind_case() == v1::JobSpec::kTrain) {
        preemptor_->AssertHeld();
        preemptor_->OnMetrics(*job, event.metrics());
      }
      if (!recorded.ok()) {
        spdlog::warn("worker={} attempt={} {}", worker_id, event.attempt_id(),
                     std::string(recorded.message()));
      } else if (job->spec().has_early_stop_rule()) {
        // Early stopping reads the points one by one (only jobs that have it pay for that).
        const auto& b = event.metrics();
        stopper_->AssertHeld();
        for (int i = 0; i < b.name_index_size(); ++i) {
          v1::AttemptEvent::Metric m;
          m.set_name(b.names(static_cast<int>(b.name_index(i))));
          m.set_step(b.steps(i));
          m.set_value(b.values(i));
          if (b.times_ms_size() > 0) m.set_time_ms(b.times_ms(i));
          if (b.label_index_size() > 0 && b.label_index(i) > 0) {
            *m.mutable_labels() = b.label_sets(static_cast<int>(b.label_index(i)) - 1).labels();
          }
          stopper_->OnMetric(job, m, changes);
        }
      }
    }
    return false;
  }
  if (event.has_metric()) {  // a worker from before MetricBatch
    series_->AssertHeld();
    if (c.jobs.IsLive(*job) && !part.finished()) {
      series_->Record(*job, event.metric(), changes);
      stopper_->AssertHeld();
      stopper_->OnMetric(job, event.metric(), changes);
    }
    return false;
  }
  if (!event.has_finished()) return false;
  const auto& f = event.finished();
  if (!part.finished()) {
    c.workers.Free(w, AllocationKey(event.attempt_id(), event.rank()));
    if (!c.jobs.IsLive(*job)) {
      // Cancelled while it ran: record how the part ended.
      job->mutable_current()->mutable_parts(event.rank())->set_finished(true);
      job->mutable_current()->mutable_parts(event.rank())->set_exit_code(f.exit_code());
      changes->batch.of<JobsTable>().push_back(*job);
    } else if (f.preempted()) {
      // Stopped for a higher-priority job (its checkpoint saved): requeued at once, the
      // attempt not counted.
      job->mutable_current()->mutable_parts(event.rank())->set_finished(true);
      job->mutable_current()->mutable_parts(event.rank())->set_exit_code(f.exit_code());
      preemptor_->AssertHeld();
      preemptor_->Requeue(job, worker_id, f.exit_code(), changes);
    } else if (f.exit_code() == 0 && !refused.empty()) {
      // An output outside the storage root or the owner's prefixes: nothing is registered,
      // and a retry would report it again.
      spdlog::warn("worker={} attempt={} {}", worker_id, event.attempt_id(), refused);
      job->mutable_current()->mutable_parts(event.rank())->set_finished(true);
      job->mutable_current()->mutable_parts(event.rank())->set_exit_code(f.exit_code());
      EndAttempt(c, job, refused, f.exit_code(), /*retryable=*/false, worker_id, changes);
    } else if (f.exit_code() == 0) {
      c.metrics->AttemptEnded("succeeded");
      registry_->AssertHeld();
      registry_->Stage(event.attempt_id(), f.artifacts(), std::move(checks));
      // The engine build that produced the outputs: rank 0's (a cache hit needs the same).
      if (event.rank() == 0) job->set_engine_build_id(w.info.engine_build_id());
      c.jobs.PartSucceeded(job, event.rank(), f.outputs(), changes);
      if (job->state() == v1::SUCCEEDED) registry_->JobSucceeded(*job, changes);
    } else {
      job->mutable_current()->mutable_parts(event.rank())->set_finished(true);
      job->mutable_current()->mutable_parts(event.rank())->set_exit_code(f.exit_code());
      EndAttempt(c, job, f.reason().empty() ? absl::StrCat("exit ", f.exit_code()) : f.reason(),
                 f.exit_code(), f.retryable(), worker_id, changes);
    }
  }
  ack();
  return true;
}

void WorkerSessions::Disconnected(const std::string& worker_id, uint64_t session) {
  CoordinatorCore& c = *core_;
  absl::MutexLock lock(&c.mu);
  WorkerEntry* w = c.workers.Find(worker_id);
  if (w == nullptr || w->session != session) return;
  w->connected = false;
  c.channels.erase(worker_id);
  spdlog::info("worker={} disconnected; its lease runs for {} ms", worker_id, c.options.lease_ms);
}

}  // namespace stemma::coordinator
