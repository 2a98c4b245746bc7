// The coordinator core driven directly (coordinator_test_fixture.h): jobs through their
// lifecycle, lost and restarted workers, restarts of the coordinator, gangs, idempotency.
#include "coordinator/coordinator_test_fixture.h"

namespace stemma::coordinator {
namespace {

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
  // A restarted daemon has no session secret: it is let in once the old session's lease ran out.
  clock_.Advance(1500);
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

// A cancel, retry or drain sent again with its key (the client's answer was lost) is
// answered as the first and changes nothing more: a retry grows the attempt budget once,
// also after a restart; the key used for another job is refused naming the field.
TEST_F(CoordinatorTest, OperationKeysAnswerAgainWithoutChangingAnythingMore) {
  Worker w = Connect("w1");
  const std::string id = SubmitNoop(/*max_attempts=*/1);
  Report(w, Assigned(w), 1, 1, /*retryable=*/false);
  ASSERT_EQ(Get(id).state(), v1::FAILED);
  auto first = coord_->Retry(id, "op:k1");
  ASSERT_TRUE(first.ok()) << first.status();
  const int budget = first->attempt_budget();
  EXPECT_EQ(budget, 2);
  Report(w, Assigned(w), 1, 2, /*retryable=*/false);  // the retried attempt fails too
  ASSERT_EQ(Get(id).state(), v1::FAILED);
  auto again = coord_->Retry(id, "op:k1");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->state(), v1::FAILED);
  EXPECT_EQ(Get(id).attempt_budget(), budget);
  // Without a key the same call is a second retry.
  ASSERT_TRUE(coord_->Retry(id).ok());
  EXPECT_EQ(Get(id).attempt_budget(), budget + 1);

  const std::string other = SubmitNoop();
  ASSERT_TRUE(coord_->Cancel(other, "", "op:k2").ok());
  auto cancel_again = coord_->Cancel(other, "", "op:k2");
  ASSERT_TRUE(cancel_again.ok()) << cancel_again.status();  // not "has already ended"
  EXPECT_EQ(cancel_again->state(), v1::CANCELLED);
  ASSERT_TRUE(coord_->Drain("w1", false, "op:k3").ok());
  ASSERT_TRUE(coord_->Drain("w1", true).ok());
  auto drain_again = coord_->Drain("w1", false, "op:k3");  // answered, not drained again
  ASSERT_TRUE(drain_again.ok()) << drain_again.status();
  EXPECT_EQ(drain_again->state(), v1::WORKER_ALIVE);

  coord_.reset();  // the keys are durable
  StartCoordinator();
  ASSERT_TRUE(coord_->Retry(id, "op:k1").ok());
  EXPECT_EQ(Get(id).attempt_budget(), budget + 1);
  auto misused = coord_->Cancel(SubmitNoop(), "", "op:k1");
  ASSERT_EQ(misused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(misused.status().message().find("idempotency_key: already used for retry of " + id),
            std::string::npos)
      << misused.status();
}

// A per-cell value looked up from a variable by a matrix key is not an axis: changing it
// changes that cell's spec, and the revision names the field that changed.
TEST_F(CoordinatorTest, APerCellValueChangeNamesTheLeafField) {
  auto file = [](const std::string& romance_lr) {
    return "name: lrs\nvars:\n  lr: {slavic: 1.0e-3, romance: " + romance_lr +
           "}\nstages:\n  cpt:\n    matrix: {family: [slavic, romance]}\n    train:\n"
           "      model: /m\n      data: {datasets: [{path: /d}], seq_len: 8}\n      steps: 4\n"
           "      optimizer: {lr: \"${{ vars.lr[matrix.family] }}\"}\n";
  };
  v1::SubmitExperimentRequest req;
  req.set_file("lrs.yaml");
  req.set_text(file("3.0e-3"));
  auto first = coord_->SubmitExperiment(req, "");
  ASSERT_TRUE(first.ok()) << first.status();
  req.set_text(file("2.0e-3"));
  req.set_dry_run(true);
  auto second = coord_->SubmitExperiment(req, "");
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->changed_size(), 1);
  EXPECT_EQ(second->changed(0), "cpt[family=romance]");
  EXPECT_EQ(second->added_size(), 0) << "the value is not an axis: no cell is added";
  for (const auto& c : second->cells()) {
    if (c.job_name() == "cpt[family=romance]") {
      EXPECT_EQ(c.plan().rfind("run: changed (train.optimizer.lr)", 0), 0u) << c.plan();
    }
  }
}

}  // namespace
}  // namespace stemma::coordinator
