// Preemption's choice of victims (coordinator/preemption.h) and the scheduler's reservations
// for the jobs that preempt, on real job and worker tables; the work each running job would
// lose is given per job, as the coordinator's Preemptor computes it from checkpoint events.
#include "coordinator/preemption.h"

#include <gtest/gtest.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "common/auth.h"

namespace stemma::coordinator {
namespace {

class PreemptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    jobs_.SetObserver([this](const v1::Job& job, v1::JobState from, v1::JobState to) {
      quotas_.OnTransition(job, from, to);
    });
  }
  void AddWorker(const std::string& id, int gpus, double cpus = 16) {
    v1::WorkerInfo info;
    info.set_id(id);
    info.set_state(v1::WORKER_ALIVE);
    for (int i = 0; i < gpus; ++i) info.add_gpus()->set_id(i);
    info.set_cpus(cpus);
    info.set_memory_mb(1 << 20);
    workers_.Upsert(info).connected = true;
  }
  struct Job {
    int gpus = 1;
    int priority = 0;
    int nodes = 1;
    double cpus = 0;
    std::string owner;
  };
  std::string Submit(const Job& j) {
    v1::SubmitRequest req;
    v1::JobSpec* s = req.add_jobs();
    s->mutable_noop();
    s->mutable_resources()->set_gpus(j.gpus);
    s->mutable_resources()->set_cpus(j.cpus);
    s->set_nodes(j.nodes);
    s->set_priority(j.priority);
    if (!j.owner.empty()) (*s->mutable_labels())[kOwnerLabel] = j.owner;
    Changes ch;
    auto r = jobs_.Submit(req, &ch);
    EXPECT_TRUE(r.ok()) << r.status();
    return r->ids[0];
  }
  // Submits the job and places it as the coordinator would (it must fit now); the clock
  // moves on a second, so later jobs started later.
  std::string Run(const Job& j, int64_t work_lost_ms = 0) {
    const std::string id = Submit(j);
    std::vector<Placement> placed = Place();
    EXPECT_EQ(placed.size(), 1u) << "the job should fit";
    work_lost_[id] = work_lost_ms;
    clock_.Advance(1000);
    return id;
  }
  std::vector<Placement> Place(const std::vector<Reservation>* reservations = nullptr) {
    auto ps = Schedule(jobs_, workers_, clock_.WallMs(), {}, &quotas_, reservations);
    for (const auto& p : ps) {
      const v1::Job* job = jobs_.Find(p.job_id);
      const auto& r = job->spec().resources();
      const std::string attempt = absl::StrCat(p.job_id, ".", job->attempts() + 1);
      std::vector<v1::AttemptPart> parts;
      for (size_t i = 0; i < p.workers.size(); ++i) {
        auto a = workers_.Allocate(*workers_.Find(p.workers[i]), AllocationKey(attempt, i),
                                   r.gpus(), r.cpus(), r.memory_mb());
        v1::AttemptPart part;
        part.set_rank(i);
        part.set_worker_id(p.workers[i]);
        part.mutable_gpu_ids()->Assign(a.gpu_ids.begin(), a.gpu_ids.end());
        parts.push_back(part);
      }
      Changes ch;
      jobs_.Assign(p.job_id, parts, "", &ch);
    }
    return ps;
  }
  std::vector<Preemption> Choose(int lowest = 0,
                                 const std::vector<Reservation>* reservations = nullptr) {
    return ChoosePreemptions(
        jobs_, workers_, clock_.WallMs(), lowest,
        [this](const v1::Job& job) { return work_lost_.at(job.id()); }, &quotas_, reservations);
  }
  void SetQuotas(const std::string& yaml) {
    auto config = ParseQuotaConfig(yaml, "q.yaml");
    ASSERT_TRUE(config.ok()) << config.status();
    quotas_.SetConfig(*config);
  }

  FakeClock clock_;
  Quotas quotas_{&clock_};
  JobTable jobs_{&clock_};
  WorkerTable workers_;
  std::map<std::string, int64_t> work_lost_;
};

TEST_F(PreemptionTest, TakesTheJobsWithTheLeastWorkSinceTheirLastCheckpoint) {
  AddWorker("w0", 4);
  const std::string a = Run({}, 100'000), b = Run({}, 10'000), c = Run({}, 50'000),
                    d = Run({}, 5'000);
  const std::string high = Submit({.gpus = 2, .priority = 10});
  auto ps = Choose();
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].job_id, high);
  EXPECT_EQ(ps[0].victims, (std::vector<std::string>{d, b}));  // cheapest first
  ASSERT_EQ(ps[0].reservations.size(), 1u);
  EXPECT_EQ(ps[0].reservations[0].worker_id, "w0");
  EXPECT_EQ(ps[0].reservations[0].gpus, 2);
}

TEST_F(PreemptionTest, TiesGoToTheLowestPriorityThenTheMostRecentlyStarted) {
  AddWorker("w0", 3);
  const std::string older = Run({.priority = 1}, 7), newer = Run({.priority = 1}, 7),
                    lowest = Run({.priority = 0}, 7);
  Submit({.gpus = 1, .priority = 5});
  auto ps = Choose();
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].victims, (std::vector<std::string>{lowest}));
  // With the lowest one already stopping, the newer of the two equal ones goes.
  v1::Job* stopping = jobs_.FindCurrentAttempt(jobs_.Find(lowest)->current().id());
  Changes ch;
  jobs_.MarkPreempting(stopping, "j-other", &ch);
  ps = Choose();
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].victims, (std::vector<std::string>{newer})) << older;
}

TEST_F(PreemptionTest, OnlyStrictlyLowerPriorityIsPreempted) {
  AddWorker("w0", 2);
  Run({.gpus = 2, .priority = 5});
  Submit({.gpus = 1, .priority = 5});
  EXPECT_TRUE(Choose(/*lowest=*/5).empty());
  EXPECT_TRUE(Choose(/*lowest=*/0).empty()) << "equal priority, whatever the caller's bound";
  Submit({.gpus = 1, .priority = 6});
  EXPECT_EQ(Choose(5).size(), 1u);
}

TEST_F(PreemptionTest, TheSetIsMinimal) {
  AddWorker("w0", 5);
  const std::string small = Run({.gpus = 1}, 1), big = Run({.gpus = 4}, 2);
  Submit({.gpus = 4, .priority = 1});
  auto ps = Choose();
  ASSERT_EQ(ps.size(), 1u);
  // The cheapest first (small, then big) frees 5; without small, big alone frees enough.
  EXPECT_EQ(ps[0].victims, (std::vector<std::string>{big})) << small;
}

TEST_F(PreemptionTest, AllVictimsOfASinglePartJobAreOnOneWorker) {
  AddWorker("w0", 4);
  AddWorker("w1", 4);
  // w1's cheapest job is the cheapest of all, but freeing w1 costs more in all.
  const std::string a = Run({.gpus = 2}, 5), c = Run({.gpus = 2}, 5);
  const std::string b = Run({.gpus = 2}, 1), d = Run({.gpus = 2}, 100);
  ASSERT_EQ(jobs_.Find(a)->current().parts(0).worker_id(), "w0");
  ASSERT_EQ(jobs_.Find(b)->current().parts(0).worker_id(), "w1");
  Submit({.gpus = 4, .priority = 1});
  auto ps = Choose();
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].victims, (std::vector<std::string>{c, a}));
  EXPECT_EQ(ps[0].reservations[0].worker_id, "w0") << b << d;
}

TEST_F(PreemptionTest, AGangFreesEnoughWorkersTakingTheCheapest) {
  AddWorker("w0", 4);
  AddWorker("w1", 4);
  AddWorker("w2", 4);
  const std::string on0 = Run({.gpus = 4}, 10), on1 = Run({.gpus = 4}, 1),
                    on2 = Run({.gpus = 4}, 5);
  const std::string gang = Submit({.gpus = 4, .priority = 3, .nodes = 2});
  auto ps = Choose();
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].job_id, gang);
  EXPECT_EQ(ps[0].victims, (std::vector<std::string>{on1, on2})) << on0;
  ASSERT_EQ(ps[0].reservations.size(), 2u);
  EXPECT_EQ(ps[0].reservations[0].worker_id, "w1");
  EXPECT_EQ(ps[0].reservations[1].worker_id, "w2");
}

TEST_F(PreemptionTest, CpusArePreemptedLikeGpus) {
  AddWorker("w0", 0, /*cpus=*/4);
  const std::string a = Run({.gpus = 0, .cpus = 2}, 3), b = Run({.gpus = 0, .cpus = 2}, 1);
  Submit({.gpus = 0, .priority = 2, .cpus = 3});
  auto ps = Choose();
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].victims, (std::vector<std::string>{b, a}));
}

TEST_F(PreemptionTest, NothingIsPreemptedForAJobThatFitsOrCanNeverFit) {
  AddWorker("w0", 4);
  Run({.gpus = 2});
  Submit({.gpus = 2, .priority = 9});  // fits in what is free: the next pass places it
  EXPECT_TRUE(Choose().empty());
  Place();
  Submit({.gpus = 8, .priority = 9});  // no worker has 8
  EXPECT_TRUE(Choose().empty());
}

// A job waiting for its victims preempts nothing more, and what is kept for it is neither
// free for another preemption nor for placement.
TEST_F(PreemptionTest, ReservationsKeepWhatVictimsFreeForTheirJob) {
  AddWorker("w0", 2);
  AddWorker("w1", 2);
  const std::string v0 = Run({.gpus = 2}, 1), v1 = Run({.gpus = 2}, 2);
  const std::string high = Submit({.gpus = 2, .priority = 5});
  std::vector<Preemption> first = Choose();
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(first[0].victims, (std::vector<std::string>{v0}));
  std::vector<Reservation> reserved = first[0].reservations;
  Changes ch;
  jobs_.MarkPreempting(jobs_.FindCurrentAttempt(jobs_.Find(v0)->current().id()), high, &ch);
  EXPECT_TRUE(Choose(0, &reserved).empty()) << "it waits for v0, and v0 is stopping";

  // v0 stops and is requeued; a second low job arrives too: w0 stays for `high`.
  v1::Job* stopped = jobs_.FindCurrentAttempt(jobs_.Find(v0)->current().id());
  workers_.Free(*workers_.Find("w0"), AllocationKey(stopped->current().id(), 0));
  jobs_.AttemptPreempted(stopped, 5, false, &ch);
  EXPECT_EQ(jobs_.Find(v0)->state(), v1::QUEUED);
  const std::string other = Submit({.gpus = 2, .priority = 1});
  std::vector<Placement> placed = Place(&reserved);
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_EQ(placed[0].job_id, high);
  EXPECT_EQ(placed[0].workers, (std::vector<std::string>{"w0"}));
  EXPECT_EQ(jobs_.Find(other)->state(), v1::QUEUED) << v1;
}

TEST_F(PreemptionTest, ReservedResourcesAreNotFreeForLowerJobsBeforeTheirJobFits) {
  AddWorker("w0", 4);
  const std::string v = Run({.gpus = 2}, 1);
  Run({.gpus = 2}, 1);
  std::vector<Reservation> reserved = {{"j-preempting", "w0", 4, 0, 0}};
  // 2 of the 4 reserved GPUs are free already; a low job that needs 2 does not get them.
  workers_.Free(*workers_.Find("w0"), AllocationKey(jobs_.Find(v)->current().id(), 0));
  Submit({.gpus = 2});
  EXPECT_TRUE(Place(&reserved).empty());
  EXPECT_EQ(Place().size(), 1u) << "without the reservation it fits";
}

// Quotas (coordinator/quotas.h): a job within its quota is not preempted for one beyond its
// own: a job whose owner would pass max_running_gpus preempts nothing.
TEST_F(PreemptionTest, AJobBeyondItsQuotaPreemptsNothing) {
  SetQuotas("subjects: {bob: {max_running_gpus: 2}}");
  AddWorker("w0", 4);
  const std::string alice = Run({.gpus = 2, .owner = "alice"}, 1);
  const std::string bob = Run({.gpus = 2, .owner = "bob"}, 1);
  Submit({.gpus = 2, .priority = 9, .owner = "bob"});
  EXPECT_TRUE(Choose().empty()) << "bob holds his 2 GPUs already";
  Submit({.gpus = 2, .priority = 9, .owner = "carol"});
  auto ps = Choose();
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].victims.size(), 1u);
  EXPECT_EQ(ps[0].victims[0], bob) << "equal cost: the most recently started, not " << alice;
}

}  // namespace
}  // namespace stemma::coordinator
