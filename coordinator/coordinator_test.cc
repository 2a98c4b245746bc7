// The coordinator core driven directly, with a FakeClock, the memory store and fake
// worker channels.
#include "coordinator/coordinator.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/artifact_files.h"
#include "coordinator/committer.h"

namespace stemma::coordinator {
namespace {

class FakeChannel : public WorkerChannel {
 public:
  bool Send(const v1::CoordinatorMessage& m) override {
    absl::MutexLock l(&mu_);
    sent_.push_back(m);
    return true;
  }
  void Close() override {
    absl::MutexLock l(&mu_);
    closed_ = true;
  }
  // Waits (generously) for a message of the given kind and removes it.
  std::optional<v1::CoordinatorMessage> Take(v1::CoordinatorMessage::MsgCase kind) {
    absl::MutexLock l(&mu_);
    // absl may evaluate a condition several times, on any thread: it must be pure.
    auto present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const auto& m : sent_) {
        if (m.msg_case() == kind) return true;
      }
      return false;
    };
    mu_.AwaitWithTimeout(absl::Condition(&present), absl::Seconds(10));
    for (auto it = sent_.begin(); it != sent_.end(); ++it) {
      if (it->msg_case() == kind) {
        v1::CoordinatorMessage out = *it;
        sent_.erase(it);
        return out;
      }
    }
    return std::nullopt;
  }
  bool closed() {
    absl::MutexLock l(&mu_);
    return closed_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::CoordinatorMessage> sent_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("stemma-coord-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    store_ = MakeMemoryStore();
    StartCoordinator();
  }
  void TearDown() override {
    coord_.reset();
    std::filesystem::remove_all(dir_);
  }
  void StartCoordinator() {
    CoordinatorOptions o;
    o.data_dir = dir_.string();
    o.lease_ms = 1000;
    o.heartbeat_ms = 200;
    o.tick_ms = 1000000;  // passes only when kicked or called
    o.verify_artifacts = verify_artifacts_;
    coord_ = std::make_unique<Coordinator>(o, store_.get(), &clock_, &metrics_);
    ASSERT_TRUE(coord_->Start().ok());
  }

  struct Worker {
    std::string id;
    std::shared_ptr<FakeChannel> channel;
    uint64_t session;
    v1::Registered registered;
  };
  Worker Connect(const std::string& id, int gpus = 0, bool allow_exec = false,
                 std::vector<v1::RunningAttempt> running = {}) {
    v1::Register reg;
    reg.mutable_info()->set_id(id);
    reg.mutable_info()->set_cpus(4);
    reg.mutable_info()->set_memory_mb(1024);
    reg.mutable_info()->set_allow_exec(allow_exec);
    for (int i = 0; i < gpus; ++i) reg.mutable_info()->add_gpus()->set_id(i);
    for (auto& r : running) *reg.add_running() = r;
    Worker w{id, std::make_shared<FakeChannel>(), 0, {}};
    auto r = coord_->Register(reg, w.channel, &w.session);
    EXPECT_TRUE(r.ok()) << r.status();
    w.registered = *r;
    return w;
  }
  std::string SubmitNoop(int max_attempts = 3, int gpus = 0) {
    v1::SubmitRequest req;
    auto* s = req.add_jobs();
    s->mutable_noop();
    s->set_max_attempts(max_attempts);
    s->mutable_backoff()->set_initial_ms(10);
    s->mutable_resources()->set_gpus(gpus);
    auto r = coord_->Submit(req);
    EXPECT_TRUE(r.ok()) << r.status();
    return r->job_ids(0);
  }
  v1::Assignment Assigned(Worker& w) {
    coord_->RunSchedulerPass();
    auto m = w.channel->Take(v1::CoordinatorMessage::kAssign);
    EXPECT_TRUE(m.has_value());
    return m ? m->assign() : v1::Assignment();
  }
  void Report(Worker& w, const v1::Assignment& a, int exit_code, uint64_t seq,
              bool retryable = true) {
    v1::AttemptEvent started;
    started.set_attempt_id(a.attempt_id());
    started.set_rank(a.rank());
    started.mutable_started()->set_pid(123);
    coord_->Event(w.id, w.session, started);
    v1::AttemptEvent fin;
    fin.set_attempt_id(a.attempt_id());
    fin.set_rank(a.rank());
    fin.set_event_seq(seq);
    fin.mutable_finished()->set_exit_code(exit_code);
    fin.mutable_finished()->set_retryable(retryable);
    coord_->Event(w.id, w.session, fin);
  }
  v1::Job Get(const std::string& id) { return *coord_->GetJob(id); }

  // A job that runs on `w` and ends with exit 0 after reporting `metrics` (name, step,
  // value) and `artifacts`.
  std::string RunToSuccess(Worker& w, v1::JobSpec spec, uint64_t seq,
                           const std::vector<std::tuple<std::string, int64_t, double>>& metrics,
                           const std::vector<v1::OutputArtifact>& artifacts) {
    v1::SubmitRequest req;
    *req.add_jobs() = std::move(spec);
    auto r = coord_->Submit(req);
    EXPECT_TRUE(r.ok()) << r.status();
    const std::string id = r->job_ids(0);
    v1::Assignment a = Assigned(w);
    EXPECT_EQ(a.job_id(), id);
    std::vector<v1::AttemptEvent> events(1);
    events[0].set_attempt_id(a.attempt_id());
    events[0].mutable_started()->set_pid(7);
    for (const auto& [name, step, value] : metrics) {
      auto& e = events.emplace_back();
      e.set_attempt_id(a.attempt_id());
      e.mutable_metric()->set_name(name);
      e.mutable_metric()->set_step(step);
      e.mutable_metric()->set_value(value);
      e.mutable_metric()->set_time_ms(5000 + step);
    }
    auto& fin = events.emplace_back();
    fin.set_attempt_id(a.attempt_id());
    fin.set_event_seq(seq);
    fin.mutable_finished()->set_exit_code(0);
    for (const auto& art : artifacts) *fin.mutable_finished()->add_artifacts() = art;
    std::vector<const v1::AttemptEvent*> ptrs;
    for (const auto& e : events) ptrs.push_back(&e);
    coord_->Events(w.id, w.session, absl::MakeConstSpan(ptrs));
    EXPECT_TRUE(w.channel->Take(v1::CoordinatorMessage::kEventAck).has_value());
    EXPECT_EQ(Get(id).state(), v1::SUCCEEDED);
    return id;
  }
  // A checkpoint directory with one weights file and a stemma.json listing it; returns the
  // output as a worker reports it.
  v1::OutputArtifact MakeCheckpoint(const std::string& name, const std::string& weights,
                                    std::vector<std::string> parents = {},
                                    const std::string& operation = "cpt") {
    const std::string path = (dir_ / name).string();
    std::filesystem::create_directories(path);
    WriteFile(path + "/model.safetensors", weights);
    auto sha = Sha256File(path + "/model.safetensors");
    WriteFile(path + "/stemma.json", absl::StrCat(R"({"files": {"model.safetensors": {"sha256": ")",
                                                  *sha, R"(", "bytes": )", weights.size(), "}}}"));
    v1::OutputArtifact out;
    out.set_name("model");
    out.set_type("checkpoint");
    out.set_path(path);
    out.set_manifest_sha256(*Sha256File(path + "/stemma.json"));
    out.set_bytes(static_cast<int64_t>(weights.size()));
    for (auto& p : parents) out.add_parents(p);
    out.set_operation(operation);
    return out;
  }
  static void WriteFile(const std::string& path, const std::string& data) {
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(data.c_str(), f);
    std::fclose(f);
  }
  // The value of a gauge series with these labels, if it exists.
  std::optional<double> Gauge(const std::string& name, const std::string& experiment,
                              const std::string& stage) {
    for (const auto& family : metrics_.registry()->Collect()) {
      if (family.name != name) continue;
      for (const auto& m : family.metric) {
        std::map<std::string, std::string> labels;
        for (const auto& l : m.label) labels[l.name] = l.value;
        if (labels["experiment"] == experiment && labels["stage"] == stage) return m.gauge.value;
      }
    }
    return std::nullopt;
  }

  bool verify_artifacts_ = false;
  std::filesystem::path dir_;
  FakeClock clock_;
  CoordinatorMetrics metrics_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Coordinator> coord_;
};

TEST_F(CoordinatorTest, JobRunsToSuccessAndTheFinishIsAcked) {
  Worker w = Connect("w0", 2);
  std::string id = SubmitNoop(3, 1);
  v1::Assignment a = Assigned(w);
  EXPECT_EQ(a.job_id(), id);
  EXPECT_EQ(a.attempt_id(), id + ".1");
  EXPECT_EQ(a.gpu_ids_size(), 1);
  EXPECT_EQ(Get(id).state(), v1::ASSIGNED);
  Report(w, a, 0, 7);
  EXPECT_EQ(Get(id).state(), v1::SUCCEEDED);
  auto ack = w.channel->Take(v1::CoordinatorMessage::kEventAck);
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->event_ack().event_seq(), 7u);
  auto workers = coord_->ListWorkers();
  EXPECT_EQ(workers.workers(0).gpus_in_use_size(), 0);
}

TEST_F(CoordinatorTest, FailedAttemptIsRetriedUntilTheLimit) {
  Worker w = Connect("w0");
  std::string id = SubmitNoop(2);
  Report(w, Assigned(w), 3, 1);
  EXPECT_EQ(Get(id).state(), v1::QUEUED);
  clock_.Advance(20);  // past the backoff
  v1::Assignment second = Assigned(w);
  EXPECT_EQ(second.attempt_id(), id + ".2");
  Report(w, second, 3, 2);
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_EQ(job.attempts(), 2);
  EXPECT_EQ(job.exit_code(), 3);
}

TEST_F(CoordinatorTest, LostWorkerRequeuesAndStaleReportsAreRefused) {
  Worker w0 = Connect("w0");
  std::string id = SubmitNoop(3);
  v1::Assignment first = Assigned(w0);
  clock_.Advance(1500);  // past the lease
  coord_->RunSchedulerPass();
  EXPECT_TRUE(w0.channel->closed());
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::QUEUED);
  EXPECT_NE(job.reason().find("worker w0 lost"), std::string::npos) << job.reason();
  EXPECT_EQ(coord_->ListWorkers().workers(0).state(), v1::WORKER_LOST);
  // Another worker takes the job.
  Worker w1 = Connect("w1");
  clock_.Advance(20);  // past the backoff, within w1's lease
  v1::Assignment second = Assigned(w1);
  EXPECT_EQ(second.attempt_id(), id + ".2");
  // The old attempt's report arrives late (the worker came back): it changes nothing.
  Worker back = Connect("w0", 0, false, {});
  Report(back, first, 0, 9);
  EXPECT_EQ(Get(id).state(), v1::ASSIGNED);
  EXPECT_TRUE(back.channel->Take(v1::CoordinatorMessage::kEventAck).has_value());
  Report(w1, second, 0, 1);
  EXPECT_EQ(Get(id).state(), v1::SUCCEEDED);
}

TEST_F(CoordinatorTest, CancelReachesTheWorker) {
  Worker w = Connect("w0");
  std::string id = SubmitNoop();
  v1::Assignment a = Assigned(w);
  auto job = coord_->Cancel(id, "");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::CANCELLED);
  auto cancel = w.channel->Take(v1::CoordinatorMessage::kCancel);
  ASSERT_TRUE(cancel.has_value());
  EXPECT_EQ(cancel->cancel().attempt_id(), a.attempt_id());
  // The killed process reports; the job stays cancelled.
  Report(w, a, -1, 3);
  EXPECT_EQ(Get(id).state(), v1::CANCELLED);
}

TEST_F(CoordinatorTest, RestartKeepsRunningAttemptsThatTheWorkerStillRuns) {
  Worker w = Connect("w0", 1);
  std::string id = SubmitNoop(3, 1);
  v1::Assignment a = Assigned(w);
  v1::AttemptEvent started;
  started.set_attempt_id(a.attempt_id());
  started.mutable_started()->set_pid(1);
  coord_->Event(w.id, w.session, started);
  ASSERT_EQ(Get(id).state(), v1::RUNNING);

  coord_.reset();  // the coordinator goes away; the store stays
  StartCoordinator();
  EXPECT_EQ(Get(id).state(), v1::RUNNING);
  EXPECT_EQ(coord_->ListWorkers().workers(0).gpus_in_use_size(), 1);
  v1::RunningAttempt running;
  running.set_attempt_id(a.attempt_id());
  Worker again = Connect("w0", 1, false, {running});
  ASSERT_EQ(again.registered.keep_size(), 1);
  EXPECT_EQ(again.registered.keep(0).attempt_id(), a.attempt_id());
  v1::AttemptEvent fin;
  fin.set_attempt_id(a.attempt_id());
  fin.set_event_seq(1);
  fin.mutable_finished()->set_exit_code(0);
  coord_->Event(again.id, again.session, fin);
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::SUCCEEDED);
  EXPECT_EQ(job.attempts(), 1);  // not restarted
}

TEST_F(CoordinatorTest, WorkerThatRestartedLosesItsRunningAttempts) {
  Worker w = Connect("w0");
  std::string id = SubmitNoop();
  v1::Assignment a = Assigned(w);
  v1::AttemptEvent started;
  started.set_attempt_id(a.attempt_id());
  started.mutable_started()->set_pid(1);
  coord_->Event(w.id, w.session, started);
  Worker fresh = Connect("w0");  // registers again with nothing running
  EXPECT_EQ(fresh.registered.keep_size(), 0);
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::QUEUED);
  EXPECT_NE(job.reason().find("worker restarted"), std::string::npos) << job.reason();
}

TEST_F(CoordinatorTest, ExecNeedsAWorkerThatAllowsIt) {
  Connect("w0", 0, /*allow_exec=*/false);
  v1::SubmitRequest req;
  req.add_jobs()->mutable_exec()->add_argv("/bin/true");
  auto r = coord_->Submit(req);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("--allow-exec"), std::string::npos);
  EXPECT_EQ(coord_->ListJobs({})->total(), 0);
}

TEST_F(CoordinatorTest, GangJobGetsRanksAndARendezvous) {
  Worker w0 = Connect("w0", 1), w1 = Connect("w1", 1);
  v1::SubmitRequest req;
  auto* s = req.add_jobs();
  s->mutable_noop();
  s->set_nodes(2);
  s->mutable_resources()->set_gpus(1);
  std::string id = coord_->Submit(req)->job_ids(0);
  coord_->RunSchedulerPass();
  auto a0 = w0.channel->Take(v1::CoordinatorMessage::kAssign);
  auto a1 = w1.channel->Take(v1::CoordinatorMessage::kAssign);
  ASSERT_TRUE(a0 && a1);
  EXPECT_EQ(a0->assign().world_size(), 2);
  EXPECT_NE(a0->assign().rank(), a1->assign().rank());
  EXPECT_FALSE(a0->assign().rendezvous().empty());
  EXPECT_EQ(a0->assign().rendezvous(), a1->assign().rendezvous());
  // One part fails: the other is told to stop, and the job is requeued.
  Worker& failing = a0->assign().rank() == 0 ? w0 : w1;
  Worker& other = a0->assign().rank() == 0 ? w1 : w0;
  Report(failing, failing.id == "w0" ? a0->assign() : a1->assign(), 1, 1);
  EXPECT_TRUE(other.channel->Take(v1::CoordinatorMessage::kCancel).has_value());
  EXPECT_EQ(Get(id).state(), v1::QUEUED);
}

TEST_F(CoordinatorTest, ConcurrentSubmitsWithOneKeyMakeOneJob) {
  std::vector<std::thread> threads;
  std::vector<std::string> ids(16);
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      v1::SubmitRequest req;
      req.set_idempotency_key("same");
      req.add_jobs()->mutable_noop();
      ids[i] = coord_->Submit(req)->job_ids(0);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& id : ids) EXPECT_EQ(id, ids[0]);
  EXPECT_EQ(coord_->ListJobs({})->total(), 1);
}

// ------------------------------------------------------------ metric series, registry

v1::JobSpec Spec(const std::string& name, const std::string& experiment = "",
                 const std::string& stage = "") {
  v1::JobSpec s;
  s.set_name(name);
  s.mutable_noop();
  s.set_experiment(experiment);
  if (!stage.empty()) (*s.mutable_labels())["stage"] = stage;
  return s;
}

TEST_F(CoordinatorTest, MetricEventsAreStoredQueryableAndLiveGaugesFollowTheJob) {
  Worker w = Connect("w0");
  v1::SubmitRequest req;
  *req.add_jobs() = Spec("cpt-uk", "family", "cpt");
  std::string id = coord_->Submit(req)->job_ids(0);
  v1::Assignment a = Assigned(w);
  auto send = [&](const std::string& attempt, const std::string& name, int64_t step, double v) {
    v1::AttemptEvent e;
    e.set_attempt_id(attempt);
    e.mutable_metric()->set_name(name);
    e.mutable_metric()->set_step(step);
    e.mutable_metric()->set_value(v);
    (*e.mutable_metric()->mutable_labels())["split"] = "train";
    coord_->Event(w.id, w.session, e);
  };
  for (int step = 1; step <= 3; ++step) {
    send(a.attempt_id(), "loss", step, 3.0 - step * 0.5);
    send(a.attempt_id(), "tokens_per_s", step, 1000 * step);
  }
  send(absl::StrCat(id, ".9"), "loss", 4, 99);  // not its attempt: refused, not stored
  EXPECT_EQ(Gauge("stemma_train_loss", "family", "cpt"), 1.5);
  EXPECT_EQ(Gauge("stemma_train_tokens_per_second", "family", "cpt"), 3000);
  EXPECT_EQ(Gauge("stemma_train_step", "family", "cpt"), 3);

  v1::QueryMetricsRequest q;
  q.add_job_ids(id);
  auto all = coord_->QueryMetrics(q);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->points_size(), 6);
  EXPECT_EQ(all->points(0).name(), "loss");
  EXPECT_EQ(all->points(0).attempt(), 1);
  EXPECT_EQ(all->points(0).labels().at("split"), "train");
  EXPECT_EQ(all->points(5).step(), 3);
  q.set_name_pattern("loss");
  q.set_last_only(true);
  auto last = coord_->QueryMetrics(q);
  ASSERT_TRUE(last.ok());
  ASSERT_EQ(last->points_size(), 1);
  EXPECT_DOUBLE_EQ(last->points(0).value(), 1.5);

  v1::AttemptEvent fin;
  fin.set_attempt_id(a.attempt_id());
  fin.set_event_seq(1);
  fin.mutable_finished()->set_exit_code(0);
  coord_->Event(w.id, w.session, fin);
  EXPECT_EQ(Get(id).state(), v1::SUCCEEDED);
  EXPECT_FALSE(Gauge("stemma_train_loss", "family", "cpt").has_value());  // ended: removed

  v1::QueryMetricsRequest by_experiment;
  by_experiment.set_experiment("family");
  auto exp = coord_->QueryMetrics(by_experiment);
  ASSERT_TRUE(exp.ok());
  EXPECT_EQ(exp->points_size(), 6);
  by_experiment.set_experiment("nope");
  EXPECT_EQ(coord_->QueryMetrics(by_experiment).status().code(), absl::StatusCode::kNotFound);
  v1::QueryMetricsRequest unknown;
  unknown.add_job_ids("j-999");
  EXPECT_EQ(coord_->QueryMetrics(unknown).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(coord_->QueryMetrics({}).status().code(), absl::StatusCode::kInvalidArgument);
}

// A worker packs an attempt's points into MetricBatch events; stored and answered they are
// the same series as one Metric event per point (what older workers send).
TEST_F(CoordinatorTest, MetricBatchesStoreTheSameSeriesAsOneEventPerPoint) {
  Worker w = Connect("w0", 2);
  v1::SubmitRequest req;
  *req.add_jobs() = Spec("single", "fam", "cpt");
  *req.add_jobs() = Spec("packed", "fam", "cpt2");
  auto ids = coord_->Submit(req);
  ASSERT_TRUE(ids.ok());
  v1::Assignment a1 = Assigned(w);
  v1::Assignment a2 = Assigned(w);
  if (a1.job_id() != ids->job_ids(0)) std::swap(a1, a2);
  struct P {
    std::string name;
    int64_t step;
    double value;
    std::string split;  // "" : no labels
  };
  std::vector<P> points;
  for (int step = 1; step <= 4; ++step) {
    points.push_back({"loss", step, 3.0 - step * 0.25, ""});
    points.push_back({"tokens_per_s", step, 1000.0 * step, ""});
    points.push_back({"heldout", step, 2.0 + step, step % 2 == 0 ? "uk" : ""});
  }
  // What arrives together is applied in one pass (one transaction): two deliveries, split
  // mid-step, for both kinds of worker.
  const std::vector<std::pair<size_t, size_t>> deliveries = {{0, 5}, {5, points.size()}};
  for (auto [from, to] : deliveries) {
    std::vector<v1::AttemptEvent> events(to - from);
    std::vector<const v1::AttemptEvent*> ptrs;
    for (size_t i = from; i < to; ++i) {
      const P& p = points[i];
      v1::AttemptEvent& e = events[i - from];
      e.set_attempt_id(a1.attempt_id());
      e.mutable_metric()->set_name(p.name);
      e.mutable_metric()->set_step(p.step);
      e.mutable_metric()->set_value(p.value);
      e.mutable_metric()->set_time_ms(7000 + p.step);
      if (!p.split.empty()) (*e.mutable_metric()->mutable_labels())["split"] = p.split;
      ptrs.push_back(&e);
    }
    coord_->Events(w.id, w.session, absl::MakeConstSpan(ptrs));
  }
  // The same points as one batch per delivery, names interned per batch.
  for (auto [from, to] : deliveries) {
    v1::AttemptEvent e;
    e.set_attempt_id(a2.attempt_id());
    auto* b = e.mutable_metrics();
    std::map<std::string, uint32_t> names;
    bool labelled = false;
    for (size_t i = from; i < to; ++i) labelled |= !points[i].split.empty();
    for (size_t i = from; i < to; ++i) {
      const P& p = points[i];
      auto [it, fresh] = names.emplace(p.name, static_cast<uint32_t>(names.size()));
      if (fresh) b->add_names(p.name);
      b->add_name_index(it->second);
      b->add_steps(p.step);
      b->add_values(p.value);
      b->add_times_ms(7000 + p.step);
      if (labelled) {
        if (p.split.empty()) {
          b->add_label_index(0);
        } else {
          (*b->add_label_sets()->mutable_labels())["split"] = p.split;
          b->add_label_index(static_cast<uint32_t>(b->label_sets_size()));
        }
      }
    }
    coord_->Event(w.id, w.session, e);
  }
  // A batch whose columns disagree is refused whole.
  v1::AttemptEvent bad;
  bad.set_attempt_id(a2.attempt_id());
  bad.mutable_metrics()->add_names("loss");
  bad.mutable_metrics()->add_name_index(0);
  bad.mutable_metrics()->add_name_index(0);
  bad.mutable_metrics()->add_steps(9);
  bad.mutable_metrics()->add_values(0.5);
  coord_->Event(w.id, w.session, bad);
  EXPECT_EQ(Gauge("stemma_train_loss", "fam", "cpt2"), 2.0);
  EXPECT_EQ(Gauge("stemma_train_step", "fam", "cpt2"), 4);
  EXPECT_EQ(Gauge("stemma_train_tokens_per_second", "fam", "cpt2"), 4000);

  auto query = [&](const std::string& id, bool last_only) {
    v1::QueryMetricsRequest q;
    q.add_job_ids(id);
    q.set_last_only(last_only);
    auto r = coord_->QueryMetrics(q);
    EXPECT_TRUE(r.ok()) << r.status();
    std::vector<std::string> out;
    for (v1::MetricPoint p : r->points()) {
      p.clear_job_id();
      out.push_back(p.ShortDebugString());
    }
    return out;
  };
  for (bool last_only : {false, true}) {
    SCOPED_TRACE(last_only);
    const std::vector<std::string> single = query(a1.job_id(), last_only);
    if (last_only) {
      EXPECT_GE(single.size(), 3u);  // a point per series
    } else {
      EXPECT_EQ(single.size(), points.size());
    }
    EXPECT_EQ(query(a2.job_id(), last_only), single);
  }
}

TEST_F(CoordinatorTest, SucceededJobsRegisterTheirCheckpointsWithLineageMetricsAndConsumers) {
  Worker w = Connect("w0", 0, /*allow_exec=*/true);
  const std::string base = (dir_ / "base").string();
  auto cpt = MakeCheckpoint("cpt-uk", "weights-1", {base});
  std::string j1 =
      RunToSuccess(w, Spec("cpt", "fam", "cpt"), 1, {{"loss", 10, 2.5}, {"loss", 20, 2.0}}, {cpt});
  auto soup = MakeCheckpoint("soup", "weights-2", {cpt.path(), base}, "soup");
  std::string j2 = RunToSuccess(w, Spec("soup", "fam", "soup"), 2, {}, {soup});

  auto list = coord_->ListArtifacts({});
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->artifacts_size(), 3);  // newest first: soup, cpt, the external base
  const v1::Artifact& s = list->artifacts(0);
  const v1::Artifact& c = list->artifacts(1);
  const v1::Artifact& b = list->artifacts(2);
  EXPECT_TRUE(b.external());
  EXPECT_EQ(b.path(), base);
  EXPECT_EQ(c.job_id(), j1);
  EXPECT_EQ(c.experiment(), "fam");
  EXPECT_EQ(c.stage(), "cpt");
  EXPECT_EQ(c.manifest_sha256(), cpt.manifest_sha256());
  EXPECT_EQ(c.operation(), "cpt");
  ASSERT_EQ(c.parents_size(), 1);
  EXPECT_EQ(c.parents(0), b.id());
  EXPECT_DOUBLE_EQ(c.metrics().at("loss"), 2.0);  // the last value
  EXPECT_EQ(c.verification(), v1::UNCHECKED);     // checking is off by default
  EXPECT_EQ(std::vector<std::string>(s.parents().begin(), s.parents().end()),
            (std::vector<std::string>{c.id(), b.id()}));

  v1::LineageRequest lr;
  lr.set_id(s.id());
  auto lineage = coord_->Lineage(lr);
  ASSERT_TRUE(lineage.ok());
  ASSERT_EQ(lineage->artifacts_size(), 3);  // each ancestor once, the base reached twice
  EXPECT_EQ(lineage->artifacts(0).id(), s.id());
  lr.set_max_depth(1);
  lr.set_id("ckpt:" + c.id());
  lineage = coord_->Lineage(lr);
  ASSERT_TRUE(lineage.ok());
  EXPECT_EQ(lineage->artifacts_size(), 2);

  // An evaluation reading the soup (a file inside it) credits its metric to it.
  v1::JobSpec eval;
  eval.set_name("eval");
  eval.mutable_exec()->add_argv("/bin/eval");
  eval.mutable_exec()->add_argv(soup.path() + "/model.safetensors");
  std::string j3 = RunToSuccess(w, eval, 3, {{"heldout_loss/uk", 0, 3.25}}, {});
  auto details = coord_->GetArtifact(soup.path());
  ASSERT_TRUE(details.ok()) << details.status();
  EXPECT_EQ(details->artifact().id(), s.id());
  EXPECT_DOUBLE_EQ(details->artifact().metrics().at("heldout_loss/uk"), 3.25);
  EXPECT_EQ(details->producer().id(), j2);
  ASSERT_EQ(details->parents_size(), 2);
  ASSERT_EQ(details->consumer_jobs_size(), 1);
  EXPECT_EQ(details->consumer_jobs(0), j3);
  auto cd = coord_->GetArtifact(c.id());
  ASSERT_EQ(cd->children_size(), 1);
  EXPECT_EQ(cd->children(0).id(), s.id());
  EXPECT_EQ(coord_->GetArtifact("a-999").status().code(), absl::StatusCode::kNotFound);

  // Verify reads the files; a changed weights file is found.
  auto ok = coord_->VerifyArtifact(c.id());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->ok());
  EXPECT_EQ(ok->files_checked(), 2);
  EXPECT_EQ(ok->artifact().verification(), v1::VERIFIED);
  WriteFile(cpt.path() + "/model.safetensors", "weights-X");
  auto bad = coord_->VerifyArtifact(c.id());
  ASSERT_TRUE(bad.ok());
  EXPECT_FALSE(bad->ok());
  ASSERT_EQ(bad->problems_size(), 1);
  EXPECT_NE(bad->problems(0).find("model.safetensors"), std::string::npos) << bad->problems(0);
  EXPECT_EQ(bad->artifact().verification(), v1::MISMATCH);

  // The registry is durable: a restarted coordinator has it, and new ids continue.
  coord_.reset();
  StartCoordinator();
  list = coord_->ListArtifacts({});
  ASSERT_EQ(list->artifacts_size(), 3);
  EXPECT_EQ(list->artifacts(1).verification(), v1::MISMATCH);
  Worker again = Connect("w0", 0, true);
  auto more = MakeCheckpoint("later", "weights-3", {soup.path()});
  RunToSuccess(again, Spec("later"), 4, {}, {more});
  EXPECT_EQ(coord_->ListArtifacts({})->artifacts(0).id(), "a-4");
}

TEST_F(CoordinatorTest, FailedAttemptsRegisterNothingAndReportedHashesAreCheckedWhenAsked) {
  coord_.reset();
  verify_artifacts_ = true;
  StartCoordinator();
  Worker w = Connect("w0");
  auto out = MakeCheckpoint("first", "w1");
  v1::SubmitRequest req;
  auto* spec = req.add_jobs();
  *spec = Spec("retried");
  spec->set_max_attempts(2);
  spec->mutable_backoff()->set_initial_ms(1);
  std::string id = coord_->Submit(req)->job_ids(0);
  v1::Assignment a = Assigned(w);
  v1::AttemptEvent fail;
  fail.set_attempt_id(a.attempt_id());
  fail.set_event_seq(1);
  fail.mutable_finished()->set_exit_code(3);
  *fail.mutable_finished()->add_artifacts() = out;
  coord_->Event(w.id, w.session, fail);
  EXPECT_EQ(coord_->ListArtifacts({})->artifacts_size(), 0);

  auto good = MakeCheckpoint("good", "w2");
  auto lying = MakeCheckpoint("lying", "w3");
  lying.set_manifest_sha256(std::string(64, '0'));
  auto missing = good;
  missing.set_name("results");
  missing.set_type("file");
  missing.set_path((dir_ / "not-here.json").string());
  RunToSuccess(w, Spec("checked"), 2, {}, {good, lying, missing});
  std::map<std::string, v1::Verification> by_path;
  auto list = coord_->ListArtifacts({});
  ASSERT_TRUE(list.ok());
  for (const auto& art : list->artifacts()) by_path[art.path()] = art.verification();
  EXPECT_EQ(by_path[good.path()], v1::VERIFIED);
  EXPECT_EQ(by_path[lying.path()], v1::MISMATCH);
  EXPECT_EQ(by_path[missing.path()], v1::UNREADABLE);
}

TEST_F(CoordinatorTest, GcDryRunChangesNothingAndApplyDeletesOnlyUnprotectedCheckpoints) {
  Worker w = Connect("w0");
  std::vector<v1::OutputArtifact> outs;
  for (int i = 0; i < 4; ++i) {
    outs.push_back(MakeCheckpoint(absl::StrCat("trial", i), absl::StrCat("weights", i)));
    RunToSuccess(w, Spec(absl::StrCat("trial", i), "sweep"), i + 1, {{"heldout_loss", 0, 4.0 - i}},
                 {outs.back()});
  }
  // trial3 (loss 1) is the best; trial0 is pinned; a queued job will read trial1.
  ASSERT_TRUE(coord_->PinArtifact("a-1", false).ok());
  v1::SubmitRequest reader;
  auto* spec = reader.add_jobs();
  spec->set_name("reader");
  spec->mutable_exec()->add_argv(outs[1].path());
  spec->mutable_resources()->set_gpus(8);  // never placed: stays QUEUED
  Worker exec = Connect("w1", 0, true);
  ASSERT_TRUE(coord_->Submit(reader).ok());

  v1::GcRequest gc;
  gc.mutable_policy()->set_keep_best(1);
  gc.mutable_policy()->set_metric("heldout_loss");
  auto dry = coord_->CollectGarbage(gc);
  ASSERT_TRUE(dry.ok()) << dry.status();
  std::map<std::string, bool> doomed;
  for (const auto& d : dry->decisions()) doomed[d.artifact().id()] = d.deleted();
  EXPECT_EQ(doomed, (std::map<std::string, bool>{
                        {"a-1", false}, {"a-2", false}, {"a-3", true}, {"a-4", false}}));
  EXPECT_FALSE(dry->applied());
  EXPECT_TRUE(std::filesystem::exists(outs[2].path()));

  gc.set_apply(true);
  auto applied = coord_->CollectGarbage(gc);
  ASSERT_TRUE(applied.ok());
  EXPECT_TRUE(applied->applied());
  EXPECT_EQ(applied->bytes_freed(), outs[2].bytes());
  EXPECT_FALSE(std::filesystem::exists(outs[2].path()));
  for (int i : {0, 1, 3}) EXPECT_TRUE(std::filesystem::exists(outs[i].path())) << i;
  auto deleted = coord_->GetArtifact("a-3");
  EXPECT_EQ(deleted->artifact().state(), v1::ARTIFACT_DELETED);
  EXPECT_NE(deleted->artifact().deleted_by().find("not among the best 1 by heldout_loss"),
            std::string::npos)
      << deleted->artifact().deleted_by();
  EXPECT_EQ(coord_->ListArtifacts({})->artifacts_size(), 3);  // deleted ones need --all
  v1::GcRequest bad;
  bad.mutable_policy()->set_keep_best(2);
  EXPECT_EQ(coord_->CollectGarbage(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

// Counts what reaches the store; thread-safe, so a test can watch it while the committer
// commits.
class RecordingStore : public Store {
 public:
  absl::StatusOr<StoreSnapshot> Load() override { return StoreSnapshot{}; }
  absl::Status Commit(const StoreBatch& batch) override {
    absl::MutexLock l(&mu_);
    for (const auto& j : batch.of<JobsTable>()) committed_.push_back(j.id());
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> IntegrityCheck() override { return std::string("ok"); }
  absl::StatusOr<std::vector<v1::MetricPoint>> ReadMetrics(const MetricQuery&, bool*) override {
    return std::vector<v1::MetricPoint>();
  }
  std::vector<std::string> committed() {
    absl::MutexLock l(&mu_);
    return committed_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> committed_;
};

TEST(CommitterTest, ALazyRecordAddedWhileIdleIsCommittedWithoutCompany) {
  // Nothing waits for a lazy record (a job going RUNNING), but it must still reach the
  // store about kLazyCommitMs later, also when the committer was idle with no deadline.
  RecordingStore store;
  absl::Mutex mu;
  uint64_t durable = 0;
  Committer committer(&store, nullptr, [&](uint64_t t) {
    absl::MutexLock l(&mu);
    durable = t;
  });
  absl::SleepFor(absl::Milliseconds(20));  // let it go idle
  StoreBatch batch;
  batch.of<JobsTable>().emplace_back().set_id("j-7");
  const uint64_t ticket = committer.Add(std::move(batch), /*urgent=*/false);
  bool done = false;
  for (int i = 0; i < 2000 && !done; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
    absl::MutexLock l(&mu);
    done = durable >= ticket;
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(store.committed(), std::vector<std::string>{"j-7"});
}

TEST(CommitterTest, UrgentRecordsAndLaterLazyOnesKeepTheirOrderAndAllArrive) {
  RecordingStore store;
  Committer committer(&store, nullptr);
  StoreBatch a;
  a.of<JobsTable>().emplace_back().set_id("j-1");
  committer.Wait(committer.Add(std::move(a)));
  EXPECT_EQ(store.committed(), std::vector<std::string>{"j-1"});
  StoreBatch b;
  b.of<JobsTable>().emplace_back().set_id("j-2");
  const uint64_t lazy = committer.Add(std::move(b), /*urgent=*/false);
  committer.Wait(lazy);  // waiting makes it urgent
  EXPECT_EQ(store.committed(), (std::vector<std::string>{"j-1", "j-2"}));
}

// The value of the series of `family` whose labels include `want`, if it exists.
std::optional<double> SeriesValue(CoordinatorMetrics& metrics, const std::string& family,
                                  const std::map<std::string, std::string>& want) {
  for (const auto& f : metrics.registry()->Collect()) {
    if (f.name != family) continue;
    for (const auto& m : f.metric) {
      std::map<std::string, std::string> labels;
      for (const auto& l : m.label) labels[l.name] = l.value;
      bool match = true;
      for (const auto& [k, v] : want) match = match && labels.count(k) > 0 && labels[k] == v;
      if (match) return f.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
    }
  }
  return std::nullopt;
}

TEST_F(CoordinatorTest, EvalResultsAndRegisteredCheckpointsAreExportedAsTheyLand) {
  Worker w = Connect("w0", 0, /*allow_exec=*/true);
  const auto registered = [&](const std::string& op) {
    return SeriesValue(metrics_, "stemma_registry_checkpoints_registered_total",
                       {{"operation", op}});
  };
  // Created at 0: the first registration is an increase Prometheus can see.
  EXPECT_EQ(registered("cpt"), 0);
  EXPECT_EQ(registered("soup"), 0);
  EXPECT_EQ(registered("other"), 0);
  RunToSuccess(w, Spec("cpt", "fam", "cpt"), 1, {}, {MakeCheckpoint("cpt-a", "w-1")});
  RunToSuccess(w, Spec("cpt2", "fam", "cpt"), 2, {}, {MakeCheckpoint("cpt-b", "w-2")});
  RunToSuccess(w, Spec("soup", "fam", "soup"), 3, {}, {MakeCheckpoint("soup", "w-3", {}, "soup")});
  RunToSuccess(w, Spec("odd", "fam", "odd"), 4, {}, {MakeCheckpoint("odd", "w-4", {}, "made-up")});
  EXPECT_EQ(registered("cpt"), 2);
  EXPECT_EQ(registered("soup"), 1);
  EXPECT_EQ(registered("other"), 1);  // an operation no engine command names: bounded labels

  // An eval cell of a matrix stage: its points land as they arrive, labelled by its cell.
  v1::JobSpec eval = Spec("eval-dense[family=slavic]", "fam", "eval-dense");
  eval.mutable_eval()->set_model((dir_ / "soup").string());
  auto* task = eval.mutable_eval()->add_tasks();
  task->set_type("perplexity");
  task->set_language("uk");
  task->set_data((dir_ / "tok").string());
  task->set_heldout_fraction(0.2);
  const std::map<std::string, std::string> cell = {{"experiment", "fam"},
                                                   {"stage", "eval-dense"},
                                                   {"cell", "eval-dense[family=slavic]"},
                                                   {"metric", "ppl/uk"}};
  RunToSuccess(w, eval, 5, {{"ppl/uk", 0, 12.5}, {"ppl/uk", 0, 11.25}, {"bpb/uk", 0, 1.5}}, {});
  EXPECT_EQ(SeriesValue(metrics_, "stemma_eval_score", cell),
            11.25);  // the last, kept after the end
  EXPECT_EQ(SeriesValue(metrics_, "stemma_eval_score",
                        {{"cell", "eval-dense[family=slavic]"}, {"metric", "bpb/uk"}}),
            1.5);
  // Training jobs' measured values are not eval results.
  RunToSuccess(w, Spec("cpt3", "fam", "cpt"), 6, {{"heldout_loss/uk", 0, 3.0}}, {});
  EXPECT_FALSE(SeriesValue(metrics_, "stemma_eval_score", {{"stage", "cpt"}}).has_value());
}

TEST_F(CoordinatorTest, TrainingProgressFollowsTheJobsProgressEvents) {
  Worker w = Connect("w0");
  v1::SubmitRequest req;
  *req.add_jobs() = Spec("cpt-uk", "family", "cpt");
  const std::string id = coord_->Submit(req)->job_ids(0);
  v1::Assignment a = Assigned(w);
  const std::map<std::string, std::string> stage = {{"experiment", "family"}, {"stage", "cpt"}};
  auto progress = [&](double fraction) {
    v1::AttemptEvent e;
    e.set_attempt_id(a.attempt_id());
    e.mutable_progress()->set_fraction(fraction);
    e.mutable_progress()->set_step(static_cast<int64_t>(fraction * 100));
    coord_->Event(w.id, w.session, e);
  };
  progress(0.1);  // before any training point: no series yet
  EXPECT_FALSE(SeriesValue(metrics_, "stemma_train_progress_ratio", stage).has_value());
  v1::AttemptEvent loss;
  loss.set_attempt_id(a.attempt_id());
  loss.mutable_metric()->set_name("loss");
  loss.mutable_metric()->set_step(25);
  loss.mutable_metric()->set_value(2.5);
  coord_->Event(w.id, w.session, loss);
  progress(0.25);
  EXPECT_EQ(SeriesValue(metrics_, "stemma_train_progress_ratio", stage), 0.25);
  progress(0);  // a progress without a fraction changes nothing
  EXPECT_EQ(SeriesValue(metrics_, "stemma_train_progress_ratio", stage), 0.25);
  Report(w, a, 0, 1);
  EXPECT_EQ(Get(id).state(), v1::SUCCEEDED);
  EXPECT_FALSE(SeriesValue(metrics_, "stemma_train_progress_ratio", stage).has_value());  // ended
}

TEST(CoordinatorMetricsTest, RpcCodesAreCreatedAtZeroForEveryMethodAndUnknownMethodsAreBounded) {
  CoordinatorMetrics m;
  const auto count = [&](const std::string& method, const std::string& code) {
    return SeriesValue(m, "stemma_rpc_requests_total", {{"method", method}, {"code", code}});
  };
  for (const char* method :
       {"Submit", "ListJobs", "Watch", "SubmitExperiment", "Session", "other"}) {
    EXPECT_EQ(count(method, "OK"), 0) << method;
    EXPECT_EQ(count(method, "UNAUTHENTICATED"), 0) << method;
    EXPECT_EQ(count(method, "DATA_LOSS"), 0) << method;
  }
  m.RpcEnded("GetJob", absl::StatusCode::kNotFound);
  m.RpcEnded("GetJob", absl::StatusCode::kNotFound);
  m.RpcEnded("Submit", absl::StatusCode::kOk);
  m.RpcEnded("/some.Service/Probe", absl::StatusCode::kUnimplemented);
  EXPECT_EQ(count("GetJob", "NOT_FOUND"), 2);
  EXPECT_EQ(count("GetJob", "OK"), 0);
  EXPECT_EQ(count("Submit", "OK"), 1);
  EXPECT_EQ(count("other", "UNIMPLEMENTED"), 1);
  EXPECT_FALSE(count("/some.Service/Probe", "UNIMPLEMENTED").has_value());
  EXPECT_EQ(SeriesValue(m, "stemma_store_commit_errors_total", {}), 0);
  m.StoreCommitFailed();
  EXPECT_EQ(SeriesValue(m, "stemma_store_commit_errors_total", {}), 1);
}

// Fails the first `failures` commits, then takes them.
class FlakyStore : public RecordingStore {
 public:
  explicit FlakyStore(int failures) : failures_(failures) {}
  absl::Status Commit(const StoreBatch& batch) override {
    if (failures_.fetch_sub(1) > 0) return absl::UnavailableError("disk I/O error");
    return RecordingStore::Commit(batch);
  }

 private:
  std::atomic<int> failures_;
};

TEST(CommitterTest, AFailedCommitIsReportedToTheObserverAndRetriedUntilItSucceeds) {
  FlakyStore store(2);
  absl::Mutex mu;
  std::vector<bool> reported;
  Committer committer(&store, [&](double, size_t records, bool ok) {
    absl::MutexLock l(&mu);
    reported.push_back(ok);
    EXPECT_EQ(records, 1u);
  });
  StoreBatch batch;
  batch.of<JobsTable>().emplace_back().set_id("j-9");
  committer.Wait(committer.Add(std::move(batch)));
  EXPECT_EQ(store.committed(), std::vector<std::string>{"j-9"});
  absl::MutexLock l(&mu);
  EXPECT_EQ(reported, (std::vector<bool>{false, false, true}));
}

// A prepared corpus (`stemma-engine prepare`) has manifest.json, not stemma.json: its hash is
// the manifest's, and the deep check covers every listed file and the content_hash.
TEST(ArtifactFilesTest, ACorpusVerifiesByItsManifestJsonAndEveryFile) {
  const std::string dir = ::testing::TempDir() + "/corpus_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/train");
  auto write = [](const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
  };
  write(dir + "/train/uk.txt", "один\nдва\n");
  write(dir + "/suites.json", "{}\n");
  const std::string a = *Sha256File(dir + "/suites.json"), b = *Sha256File(dir + "/train/uk.txt");
  write(dir + "/listing", absl::StrCat(a, "  suites.json\n", b, "  train/uk.txt\n"));
  const std::string content_hash = *Sha256File(dir + "/listing");
  std::filesystem::remove(dir + "/listing");
  auto manifest = [&](const std::string& hash) {
    return absl::StrCat(
        R"({"format": "stemma.corpus/1", "content_hash": ")", hash, R"(", "files": [)",
        R"({"path": "train/uk.txt", "bytes": 16, "lines": 2, "sha256": ")", b, R"("},)",
        R"({"path": "suites.json", "bytes": 3, "lines": 1, "sha256": ")", a, R"("}]})");
  };
  write(dir + "/manifest.json", manifest(content_hash));
  EXPECT_EQ(ManifestFile(dir), dir + "/manifest.json");
  const std::string sha = *Sha256File(dir + "/manifest.json");
  DeepCheck ok = VerifyArtifactFiles(dir, sha);
  EXPECT_TRUE(ok.problems.empty()) << ok.problems.front();
  EXPECT_EQ(ok.files_checked, 3);
  EXPECT_EQ(CheckManifest(dir, "0000").result, v1::MISMATCH);

  write(dir + "/train/uk.txt", "один\nтри\n");  // same size, other bytes
  DeepCheck changed = VerifyArtifactFiles(dir, sha);
  ASSERT_EQ(changed.problems.size(), 1u);
  EXPECT_NE(changed.problems[0].find("train/uk.txt: sha256 differs"), std::string::npos)
      << changed.problems[0];

  write(dir + "/train/uk.txt", "один\nдва\n");
  write(dir + "/manifest.json", manifest(std::string(64, '0')));
  DeepCheck listing = VerifyArtifactFiles(dir, *Sha256File(dir + "/manifest.json"));
  ASSERT_EQ(listing.problems.size(), 1u);
  EXPECT_NE(listing.problems[0].find("content_hash does not match"), std::string::npos)
      << listing.problems[0];
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace stemma::coordinator
