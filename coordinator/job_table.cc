#include "coordinator/job_table.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/auth.h"
#include "common/job_spec.h"
#include "common/label_selector.h"
#include "common/status.h"
#include "coordinator/experiments/early_stop.h"
#include "coordinator/wiring.h"

namespace stemma::coordinator {
namespace {

// Who submitted it: the record's owner, else the owner label of older records.
std::string JobOwner(const v1::Job& job) {
  if (!job.owner().empty()) return job.owner();
  auto it = job.spec().labels().find(kOwnerLabel);
  return it == job.spec().labels().end() ? "" : it->second;
}

std::string JobLabel(const v1::Job& job) {
  return job.spec().name().empty() ? job.id()
                                   : absl::StrCat(job.id(), " (", job.spec().name(), ")");
}

}  // namespace

void JobTable::Load(const StoreSnapshot& snapshot) {
  for (const auto& job : snapshot.of<JobsTable>()) {
    next_seq_ = std::max(next_seq_, job.seq() + 1);
    if (IsForgotten(job)) continue;  // `stemma gc jobs --delete`: the id stays taken
    Entry& e = jobs_[job.id()];
    e.job = job;
    order_.push_back(job.id());
    next_seq_ = std::max(next_seq_, job.seq() + 1);
    if (job.state() == v1::QUEUED) Enqueue(job);
    memo_.Load(job);
  }
  for (const auto& id : order_) {
    const v1::JobSpec& spec = jobs_[id].job.spec();
    for (const auto& dep : spec.depends_on()) {
      auto it = jobs_.find(dep);
      if (it != jobs_.end()) it->second.dependents.push_back(id);
    }
    if (auto twin = spec.labels().find(kWaitsForLabel); twin != spec.labels().end()) {
      auto it = jobs_.find(twin->second);
      if (it != jobs_.end()) it->second.dependents.push_back(id);
    }
  }
  for (const auto& [key, ids] : snapshot.of<IdempotencyKeysTable>()) idempotency_[key] = ids;
  for (const v1::Attempt& a : snapshot.of<AttemptsTable>()) {
    const std::string job = AttemptsTable::JobOf(a);
    if (jobs_.contains(job)) history_[job].push_back(a);
  }
  for (auto& [job, attempts] : history_) {
    std::sort(attempts.begin(), attempts.end(),
              [](const v1::Attempt& a, const v1::Attempt& b) { return a.number() < b.number(); });
  }
  // The engine build of the most recently registered worker that has one.
  int64_t newest = -1;
  for (const auto& w : snapshot.of<WorkersTable>()) {
    if (!w.engine_build_id().empty() && w.registered_ms() > newest) {
      newest = w.registered_ms();
      engine_build_ = w.engine_build_id();
    }
  }
  if (observer_) {
    for (const auto& id : order_) {
      observer_(jobs_[id].job, v1::JOB_STATE_UNSPECIFIED, jobs_[id].job.state());
    }
  }
}

absl::StatusOr<JobTable::SubmitResult> JobTable::Submit(const v1::SubmitRequest& request,
                                                        Changes* changes) {
  if (!request.idempotency_key().empty()) {
    if (request.idempotency_key().size() > 256) {
      return absl::InvalidArgumentError("idempotency_key: longer than 256 characters");
    }
    auto it = idempotency_.find(request.idempotency_key());
    if (it != idempotency_.end()) return SubmitResult{it->second, true};
  }
  if (request.jobs_size() == 0) return absl::InvalidArgumentError("jobs: nothing to submit");
  if (request.jobs_size() > 100000) {
    return absl::InvalidArgumentError("jobs: more than 100000 jobs in one request");
  }

  // Validate everything before changing anything.
  std::vector<v1::JobSpec> specs(request.jobs().begin(), request.jobs().end());
  absl::flat_hash_map<std::string, int> by_name;
  std::vector<std::string> ids;
  for (size_t i = 0; i < specs.size(); ++i) {
    ids.push_back(absl::StrCat("j-", next_seq_ + i));
    ApplyDefaults(&specs[i]);
    absl::Status st = ValidateJobSpec(specs[i]);
    if (st.ok() && specs[i].has_early_stop_rule())
      st = experiments::CheckRule(specs[i].early_stop_rule());
    std::string who = specs[i].name().empty() ? absl::StrCat("jobs[", i, "]")
                                              : absl::StrCat("job '", specs[i].name(), "'");
    if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat(who, ": ", st.message()));
    if (!specs[i].name().empty()) {
      auto [it, inserted] = by_name.emplace(specs[i].name(), i);
      if (!inserted) it->second = -1;  // ambiguous: only an error if referenced
    }
  }
  // Resolve dependencies: a name in this request, else an existing job id.
  std::vector<std::vector<int>> local_deps(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    std::string who = specs[i].name().empty() ? absl::StrCat("jobs[", i, "]")
                                              : absl::StrCat("job '", specs[i].name(), "'");
    std::vector<std::string> resolved;
    for (const auto& dep : specs[i].depends_on()) {
      auto n = by_name.find(dep);
      if (n != by_name.end()) {
        if (n->second < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              who, ": depends_on: name '", dep, "' is used by several jobs in this request"));
        }
        if (static_cast<size_t>(n->second) == i) {
          return absl::InvalidArgumentError(absl::StrCat(who, ": depends_on: depends on itself"));
        }
        local_deps[i].push_back(n->second);
        resolved.push_back(ids[n->second]);
      } else if (jobs_.contains(dep)) {
        resolved.push_back(dep);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(who, ": depends_on: unknown job '", dep, "'"));
      }
    }
    std::sort(resolved.begin(), resolved.end());
    resolved.erase(std::unique(resolved.begin(), resolved.end()), resolved.end());
    specs[i].mutable_depends_on()->Assign(resolved.begin(), resolved.end());
  }
  // Cycles can only form inside one request (existing jobs cannot depend on new ones).
  {
    std::vector<int> color(specs.size(), 0);  // 0 new, 1 on the path, 2 done
    std::vector<int> path;
    std::function<bool(int)> visit = [&](int v) {
      color[v] = 1;
      path.push_back(v);
      for (int w : local_deps[v]) {
        if (color[w] == 1) {
          path.push_back(w);
          return true;
        }
        if (color[w] == 0 && visit(w)) return true;
      }
      path.pop_back();
      color[v] = 2;
      return false;
    };
    for (size_t i = 0; i < specs.size(); ++i) {
      if (color[i] == 0 && visit(i)) {
        std::vector<std::string> names;
        auto start = std::find(path.begin(), path.end(), path.back());
        for (auto it = start; it != path.end(); ++it) {
          names.push_back(specs[*it].name().empty() ? ids[*it] : specs[*it].name());
        }
        return absl::InvalidArgumentError(
            absl::StrCat("depends_on: dependency cycle: ", absl::StrJoin(names, " -> ")));
      }
    }
  }

  const int64_t now = clock_->WallMs();
  for (size_t i = 0; i < specs.size(); ++i) {
    Entry& e = jobs_[ids[i]];
    e.job.set_id(ids[i]);
    e.job.set_seq(next_seq_++);
    *e.job.mutable_spec() = std::move(specs[i]);
    if (auto owner = e.job.spec().labels().find(kOwnerLabel);
        owner != e.job.spec().labels().end()) {
      e.job.set_owner(owner->second);  // the caller's subject (docs/tenancy.md)
    }
    e.job.set_attempt_budget(e.job.spec().max_attempts());
    e.job.set_created_ms(now);
    e.job.set_updated_ms(now);
    order_.push_back(ids[i]);
    for (const auto& dep : e.job.spec().depends_on()) jobs_[dep].dependents.push_back(ids[i]);
  }
  for (size_t i = 0; i < specs.size(); ++i) Release(jobs_[ids[i]], changes);
  if (!request.idempotency_key().empty()) {
    idempotency_[request.idempotency_key()] = ids;
    changes->batch.of<IdempotencyKeysTable>().emplace_back(request.idempotency_key(), ids);
  }
  return SubmitResult{std::move(ids), false};
}

void JobTable::Enqueue(const v1::Job& job) {
  queue_.emplace(-job.spec().priority(), job.seq(), job.id());
  const auto& r = job.spec().resources();
  queued_gpus_.insert(r.gpus());
  queued_cpus_.insert(r.cpus());
  queued_memory_.insert(r.memory_mb());
}

void JobTable::Dequeue(const v1::Job& job) {
  queue_.erase({-job.spec().priority(), job.seq(), job.id()});
  const auto& r = job.spec().resources();
  queued_gpus_.erase(queued_gpus_.find(r.gpus()));
  queued_cpus_.erase(queued_cpus_.find(r.cpus()));
  queued_memory_.erase(queued_memory_.find(r.memory_mb()));
}

JobTable::Demand JobTable::MinQueuedDemand() const {
  Demand d;
  if (queue_.empty()) return d;
  d.gpus = *queued_gpus_.begin();
  d.cpus = *queued_cpus_.begin();
  d.memory_mb = *queued_memory_.begin();
  return d;
}

const v1::Job* JobTable::Find(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second.job;
}

const v1::Job* JobTable::FindByName(const std::string& name, const std::string& owner) const {
  if (name.empty()) return nullptr;
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
    auto e = jobs_.find(*it);
    if (e != jobs_.end() && e->second.job.spec().name() == name &&
        (owner.empty() || e->second.job.owner() == owner)) {
      return &e->second.job;
    }
  }
  return nullptr;
}

v1::Job* JobTable::FindCurrentAttempt(const std::string& attempt_id) {
  auto dot = attempt_id.rfind('.');
  if (dot == std::string::npos) return nullptr;
  auto it = jobs_.find(attempt_id.substr(0, dot));
  if (it == jobs_.end() || it->second.job.current().id() != attempt_id) return nullptr;
  return &it->second.job;
}

absl::StatusOr<v1::ListJobsResponse> JobTable::List(const v1::ListJobsRequest& req) const {
  int page_size = req.page_size() == 0 ? 100 : req.page_size();
  if (page_size < 0 || page_size > 1000) {
    return absl::InvalidArgumentError("page_size: must be within 1..1000");
  }
  uint64_t after = 0;
  if (!req.page_token().empty() && !absl::SimpleAtoi(req.page_token(), &after)) {
    return absl::InvalidArgumentError("page_token: not a token from a previous page");
  }
  absl::StatusOr<LabelSelector> selector = LabelSelector::Parse(req.selector());
  if (!selector.ok()) return selector.status();
  auto matches = [&](const v1::Job& j) {
    if (j.archived() && !req.include_archived()) return false;
    if (!req.owner().empty() && JobOwner(j) != req.owner()) return false;
    if (req.finished_before_ms() > 0 &&
        (j.finished_ms() <= 0 || j.finished_ms() >= req.finished_before_ms())) {
      return false;
    }
    if (!selector->Matches(j.spec().labels())) return false;
    if (req.states_size() > 0 &&
        std::find(req.states().begin(), req.states().end(), j.state()) == req.states().end()) {
      return false;
    }
    if (!req.kind().empty() && JobKind(j.spec()) != req.kind()) return false;
    if (!req.experiment().empty() && j.spec().experiment() != req.experiment()) return false;
    for (const auto& [k, v] : req.labels()) {
      auto it = j.spec().labels().find(k);
      if (it == j.spec().labels().end() || it->second != v) return false;
    }
    return true;
  };
  v1::ListJobsResponse resp;
  // Jobs are kept in submission order, so the token is the last sequence number seen.
  auto start = std::upper_bound(
      order_.begin(), order_.end(), after,
      [this](uint64_t s, const std::string& id) { return s < jobs_.at(id).job.seq(); });
  int64_t total = 0;
  for (const auto& id : order_) total += matches(jobs_.at(id).job);
  resp.set_total(total);
  for (auto it = start; it != order_.end(); ++it) {
    const v1::Job& j = jobs_.at(*it).job;
    if (!matches(j)) continue;
    if (resp.jobs_size() == page_size) {
      resp.set_next_page_token(absl::StrCat(resp.jobs(resp.jobs_size() - 1).seq()));
      break;
    }
    *resp.add_jobs() = j;
  }
  return resp;
}

void JobTable::Record(Entry& e, v1::JobState previous, Changes* changes) {
  e.job.set_updated_ms(clock_->WallMs());
  changes->batch.of<JobsTable>().push_back(e.job);
  if (!changes->want_events) return;
  if (changes->want_event && !changes->want_event(e.job.id())) return;
  v1::JobEvent ev;
  *ev.mutable_job() = e.job;
  ev.set_previous(previous);
  changes->events.push_back(std::move(ev));
}

void JobTable::SetState(Entry& e, v1::JobState to, const std::string& reason, Changes* changes) {
  v1::JobState from = e.job.state();
  if (from == v1::QUEUED) Dequeue(e.job);
  e.job.set_state(to);
  e.job.set_reason(reason);
  const int64_t now = clock_->WallMs();
  if (to == v1::QUEUED) {
    Enqueue(e.job);
    e.job.set_queued_ms(now);
  }
  if (IsTerminal(to)) {
    e.job.set_finished_ms(now);
    memo_.Leave(e.job);
  }
  Record(e, from, changes);
  if (observer_) observer_(e.job, from, to);
}

void JobTable::Release(Entry& e, Changes* changes) {
  bool waiting = false;
  // Dependencies stopped early (or skipped because of one): read by no one downstream.
  std::set<std::string> pruned;
  for (const auto& dep : e.job.spec().depends_on()) {
    const v1::Job& d = jobs_.at(dep).job;
    if (!d.early_stop().empty() && (d.state() == v1::SUCCEEDED || d.state() == v1::CANCELLED)) {
      pruned.insert(d.spec().name().empty() ? d.id() : d.spec().name());
      continue;
    }
    if (d.state() == v1::FAILED || d.state() == v1::CANCELLED) {
      SetState(e, v1::FAILED,
               absl::StrCat("dependency ", JobLabel(d),
                            d.state() == v1::FAILED ? " failed" : " was cancelled",
                            d.reason().empty() ? "" : ": ", d.reason()),
               changes);
      ReleaseDependents(e, changes);
      return;
    }
    if (d.state() != v1::SUCCEEDED) waiting = true;
  }
  if (waiting) {
    if (e.job.state() != v1::PENDING) SetState(e, v1::PENDING, "waiting for dependencies", changes);
    return;
  }
  // Early stopping: a fan-in reads the survivors only (the list items that read a stopped
  // trial go); a job that reads a stopped trial any other way (one-to-one) is skipped.
  if (!pruned.empty()) {
    std::string skipped_for;
    if (!DropReadsOf(e.job.mutable_spec(), pruned, &skipped_for)) {
      const std::string why = absl::StrCat("upstream ", skipped_for, " stopped early");
      e.job.set_early_stop(why);
      SetState(e, v1::CANCELLED, why, changes);
      ReleaseDependents(e, changes);
      return;
    }
  }
  // An experiment cell reads its dependencies' outputs: the tokens the expansion left in its
  // spec become the paths those jobs reported (coordinator/wiring.h).
  absl::Status wired = WireInputs(
      e.job.mutable_spec(),
      [&](const std::string& name) -> const google::protobuf::Map<std::string, std::string>* {
        for (const auto& dep : e.job.spec().depends_on()) {
          const v1::Job& d = jobs_.at(dep).job;
          if (d.spec().name() == name || d.id() == name) return &d.outputs();
        }
        return nullptr;
      },
      e.job.id());
  if (!wired.ok()) {
    SetState(e, v1::FAILED, absl::StrCat("cannot wire its inputs: ", wired.message()), changes);
    ReleaseDependents(e, changes);
    return;
  }
  if (ServeFromCache(e, changes)) return;
  if (WaitForTwin(e, changes)) return;
  e.job.set_not_before_ms(0);
  SetState(e, v1::QUEUED, "", changes);
}

bool JobTable::WaitForTwin(Entry& e, Changes* changes) {
  const v1::Job* twin = memo_.FindTwin(&e.job);
  if (twin == nullptr) return false;
  Entry& running = jobs_.at(twin->id());
  if (std::find(running.dependents.begin(), running.dependents.end(), e.job.id()) ==
      running.dependents.end()) {
    running.dependents.push_back(e.job.id());
  }
  SetState(e, v1::PENDING,
           absl::StrCat("waiting for ", JobLabel(running.job), ": the same job (cache key) is ",
                        StateName(running.job.state())),
           changes);
  return true;
}

bool JobTable::ServeFromCache(Entry& e, Changes* changes) {
  const v1::Job* source = memo_.FindHit(&e.job, engine_build_);
  if (source == nullptr) return false;
  const v1::Job& from = *source;
  if (!from.early_stop().empty()) e.job.set_early_stop(from.early_stop());
  *e.job.mutable_outputs() = from.outputs();
  e.job.set_exit_code(0);
  e.job.set_engine_build_id(from.engine_build_id());
  SetState(e, v1::SUCCEEDED,
           from.early_stop().empty()
               ? absl::StrCat("memoized from ", from.id())
               : absl::StrCat("memoized from ", from.id(), " (", from.early_stop(), ")"),
           changes);
  ReleaseDependents(e, changes);
  return true;
}

void JobTable::ReleaseDependents(Entry& e, Changes* changes) {
  // Release() decides for each waiting dependent: still waiting, queued, or failed.
  for (const auto& id : e.dependents) {
    Entry& d = jobs_.at(id);
    if (d.job.state() == v1::PENDING) Release(d, changes);
  }
}

v1::Job* JobTable::Assign(const std::string& id, std::vector<v1::AttemptPart> parts,
                          const std::string& rendezvous, Changes* changes) {
  Entry& e = jobs_.at(id);
  int n = e.job.attempts() + 1;
  e.job.set_attempts(n);
  v1::Attempt* a = e.job.mutable_current();
  if (!a->id().empty()) {  // the attempt it replaces joins the history
    history_[id].push_back(*a);
    changes->batch.of<AttemptsTable>().push_back(*a);
  }
  a->Clear();
  a->set_id(absl::StrCat(id, ".", n));
  a->set_number(n);
  a->set_assigned_ms(clock_->WallMs());
  a->set_rendezvous(rendezvous);
  for (auto& p : parts) *a->add_parts() = std::move(p);
  e.job.clear_progress();
  SetState(e, v1::ASSIGNED, "", changes);
  return &e.job;
}

void JobTable::MarkStarted(v1::Job* job, int rank, Changes* changes) {
  Entry& e = jobs_.at(job->id());
  if (rank >= 0 && rank < e.job.current().parts_size()) {
    e.job.mutable_current()->mutable_parts(rank)->set_running(true);
  }
  if (e.job.state() == v1::ASSIGNED) {
    e.job.mutable_current()->set_started_ms(clock_->WallMs());
    SetState(e, v1::RUNNING, "", changes);
  } else {
    Record(e, e.job.state(), changes);
  }
}

void JobTable::SetProgress(v1::Job* job, const v1::Progress& progress, Changes* changes) {
  Entry& e = jobs_.at(job->id());
  *e.job.mutable_progress() = progress;
  Record(e, e.job.state(), changes);
}

void JobTable::PartSucceeded(v1::Job* job, int rank,
                             const google::protobuf::Map<std::string, std::string>& outputs,
                             Changes* changes) {
  Entry& e = jobs_.at(job->id());
  v1::Attempt* a = e.job.mutable_current();
  if (rank >= 0 && rank < a->parts_size()) {
    a->mutable_parts(rank)->set_finished(true);
    a->mutable_parts(rank)->set_running(false);
    a->mutable_parts(rank)->set_exit_code(0);
  }
  for (const auto& [k, v] : outputs) (*e.job.mutable_outputs())[k] = v;
  if (!IsLive(e.job)) {  // e.g. cancelled while it ran: only the part is recorded
    Record(e, e.job.state(), changes);
    return;
  }
  for (const auto& p : a->parts()) {
    if (!p.finished()) {
      Record(e, e.job.state(), changes);
      return;
    }
  }
  a->set_finished_ms(clock_->WallMs());
  a->set_result("exit 0");
  e.job.set_exit_code(0);
  memo_.Succeeded(&e.job);
  SetState(e, v1::SUCCEEDED, e.job.early_stop(), changes);
  ReleaseDependents(e, changes);
}

void JobTable::AttemptFailed(v1::Job* job, const std::string& result, int exit_code, bool retryable,
                             Changes* changes) {
  Entry& e = jobs_.at(job->id());
  v1::Attempt* a = e.job.mutable_current();
  a->set_finished_ms(clock_->WallMs());
  a->set_result(result);
  for (auto& p : *a->mutable_parts()) p.set_running(false);
  e.job.set_exit_code(exit_code);
  std::string why = absl::StrCat("attempt ", a->number(), " failed: ", result);
  if (retryable && e.job.attempts() < e.job.attempt_budget()) {
    // Backoff restarts with each manual retry (which grants a fresh budget).
    int used = e.job.attempts() - (e.job.attempt_budget() - e.job.spec().max_attempts());
    int64_t delay = BackoffMs(e.job.spec(), used + 1);
    e.job.set_not_before_ms(clock_->WallMs() + delay);
    SetState(e, v1::QUEUED, absl::StrCat(why, "; retrying in ", delay, " ms"), changes);
    return;
  }
  if (retryable)
    absl::StrAppend(&why, " (", e.job.attempts(), " of ", e.job.attempt_budget(),
                    " attempts used)");
  SetState(e, v1::FAILED, why, changes);
  ReleaseDependents(e, changes);
}

void JobTable::MarkPreempting(v1::Job* job, const std::string& by, Changes* changes) {
  Entry& e = jobs_.at(job->id());
  e.job.mutable_current()->set_preempted_by(by);
  Record(e, e.job.state(), changes);
}

void JobTable::AttemptPreempted(v1::Job* job, int exit_code, bool killed, Changes* changes) {
  Entry& e = jobs_.at(job->id());
  v1::Attempt* a = e.job.mutable_current();
  if (a->preempted_by().empty()) a->set_preempted_by("a higher-priority job");
  const std::string by = a->preempted_by();
  a->set_finished_ms(clock_->WallMs());
  a->set_result(absl::StrCat(
      killed ? "killed: not stopped in time after being preempted by " : "preempted by ", by));
  for (auto& p : *a->mutable_parts()) p.set_running(false);
  e.job.set_exit_code(exit_code);
  e.job.set_preemptions(e.job.preemptions() + 1);
  e.job.set_preempted_by(by);
  e.job.set_attempt_budget(e.job.attempt_budget() + 1);  // this attempt does not count
  e.job.set_not_before_ms(0);
  SetState(e, v1::QUEUED,
           absl::StrCat("attempt ", a->number(), " preempted by ", by,
                        killed ? " (killed after the grace period)" : "",
                        "; requeued, the attempt not counted"),
           changes);
}

void JobTable::SetEarlyStop(v1::Job* job, const std::string& reason, Changes* changes) {
  Entry& e = jobs_.at(job->id());
  e.job.set_early_stop(reason);
  Record(e, e.job.state(), changes);
}

absl::Status JobTable::Cancel(const std::string& id, const std::string& reason, Changes* changes) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  Entry& e = it->second;
  if (IsTerminal(e.job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " has already ended (", StateName(e.job.state()), ")"));
  }
  if (IsLive(e.job)) {
    e.job.mutable_current()->set_finished_ms(clock_->WallMs());
    e.job.mutable_current()->set_result("cancelled");
  }
  SetState(e, v1::CANCELLED, reason.empty() ? "cancelled by user" : reason, changes);
  ReleaseDependents(e, changes);
  return absl::OkStatus();
}

absl::Status JobTable::Retry(const std::string& id, Changes* changes) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  Entry& e = it->second;
  if (e.job.state() != v1::FAILED && e.job.state() != v1::CANCELLED) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " is ", StateName(e.job.state()),
                     "; only FAILED or CANCELLED jobs can be retried"));
  }
  e.job.set_attempt_budget(e.job.attempts() + e.job.spec().max_attempts());
  e.job.set_finished_ms(0);
  Release(e, changes);
  // Dependents that failed only because of this job wait for it again.
  std::vector<std::string> stack(e.dependents.begin(), e.dependents.end());
  while (!stack.empty()) {
    Entry& d = jobs_.at(stack.back());
    stack.pop_back();
    if (d.job.state() == v1::FAILED && d.job.attempts() == 0 &&
        d.job.reason().rfind("dependency ", 0) == 0) {
      d.job.set_finished_ms(0);
      SetState(d, v1::PENDING, "waiting for dependencies", changes);
      stack.insert(stack.end(), d.dependents.begin(), d.dependents.end());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> JobTable::SeenOperation(const std::string& key, const std::string& operation,
                                             const std::string& target) const {
  if (key.empty()) return false;
  auto it = idempotency_.find(key);
  if (it == idempotency_.end()) return false;
  const std::vector<std::string>& was = it->second;
  if (was.size() == 2 && was[0] == operation && was[1] == target) return true;
  return absl::FailedPreconditionError(
      absl::StrCat("idempotency_key: already used for ",
                   was.size() == 2 ? absl::StrCat(was[0], " of ", was[1]) : std::string("a submit"),
                   ", not for ", operation, " of ", target, " (send a fresh key per operation)"));
}

void JobTable::RememberOperation(const std::string& key, const std::string& operation,
                                 const std::string& target, Changes* changes) {
  if (key.empty()) return;
  std::vector<std::string> value{operation, target};
  idempotency_[key] = value;
  changes->batch.of<IdempotencyKeysTable>().emplace_back(key, std::move(value));
}

}  // namespace stemma::coordinator
