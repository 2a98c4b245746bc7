// The coordinator core driven directly, with a FakeClock, the memory store and fake
// worker channels.
#include "coordinator/coordinator.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
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
  void Report(Worker& w, const v1::Assignment& a, int exit_code, uint64_t seq, bool retryable = true) {
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

}  // namespace
}  // namespace stemma::coordinator
