#include "coordinator/scheduler.h"

#include <gtest/gtest.h>

namespace stemma::coordinator {
namespace {

class SchedulerTest : public ::testing::Test {
 protected:
  void AddWorker(const std::string& id, int gpus, double cpus, bool allow_exec = false) {
    v1::WorkerInfo info;
    info.set_id(id);
    info.set_state(v1::WORKER_ALIVE);
    for (int i = 0; i < gpus; ++i) info.add_gpus()->set_id(i);
    info.set_cpus(cpus);
    info.set_memory_mb(1 << 20);
    info.set_allow_exec(allow_exec);
    workers_.Upsert(info).connected = true;
  }
  std::string Submit(int gpus, int nodes = 1, int priority = 0, bool exec = false) {
    v1::SubmitRequest req;
    v1::JobSpec* s = req.add_jobs();
    if (exec) {
      s->mutable_exec()->add_argv("/bin/true");
    } else {
      s->mutable_noop();
    }
    s->mutable_resources()->set_gpus(gpus);
    s->set_nodes(nodes);
    s->set_priority(priority);
    Changes ch;
    auto r = jobs_.Submit(req, &ch);
    EXPECT_TRUE(r.ok()) << r.status();
    return r->ids[0];
  }
  // Applies placements as the coordinator would.
  std::vector<Placement> Pass() {
    auto ps = Schedule(jobs_, workers_, clock_.WallMs());
    for (const auto& p : ps) {
      const auto& r = jobs_.Find(p.job_id)->spec().resources();
      std::vector<v1::AttemptPart> parts;
      for (size_t i = 0; i < p.workers.size(); ++i) {
        auto a = workers_.Allocate(*workers_.Find(p.workers[i]), p.job_id + "/" + std::to_string(i),
                                   r.gpus(), r.cpus(), r.memory_mb());
        v1::AttemptPart part;
        part.set_worker_id(p.workers[i]);
        part.mutable_gpu_ids()->Assign(a.gpu_ids.begin(), a.gpu_ids.end());
        parts.push_back(part);
      }
      Changes ch;
      jobs_.Assign(p.job_id, parts, "", &ch);
    }
    return ps;
  }

  FakeClock clock_;
  JobTable jobs_{&clock_};
  WorkerTable workers_;
};

TEST_F(SchedulerTest, GpuAwarePlacementWithExactIds) {
  AddWorker("w0", 4, 16);
  std::string a = Submit(3), b = Submit(2), c = Submit(1);
  auto ps = Pass();
  ASSERT_EQ(ps.size(), 2u);  // b does not fit after a; c backfills
  EXPECT_EQ(ps[0].job_id, a);
  EXPECT_EQ(ps[1].job_id, c);
  const auto& ga = jobs_.Find(a)->current().parts(0).gpu_ids();
  const auto& gc = jobs_.Find(c)->current().parts(0).gpu_ids();
  EXPECT_EQ(std::vector<int>(ga.begin(), ga.end()), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(std::vector<int>(gc.begin(), gc.end()), (std::vector<int>{3}));
  EXPECT_EQ(jobs_.Find(b)->state(), v1::QUEUED);
}

TEST_F(SchedulerTest, PriorityFirstThenFifo) {
  AddWorker("w0", 1, 16);
  std::string low1 = Submit(1), low2 = Submit(1), high = Submit(1, 1, 5);
  auto ps = Pass();
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].job_id, high);
  workers_.Free(*workers_.Find("w0"), high + "/0");
  ps = Pass();
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].job_id, low1);
  (void)low2;
}

TEST_F(SchedulerTest, GangIsAllOrNothingOnDistinctWorkers) {
  AddWorker("w0", 2, 8);
  AddWorker("w1", 2, 8);
  std::string big = Submit(2, /*nodes=*/3);
  EXPECT_TRUE(Pass().empty());
  EXPECT_EQ(jobs_.Find(big)->state(), v1::QUEUED);
  for (const auto& [id, w] : workers_.all()) EXPECT_EQ(w.free_gpus(), 2);  // nothing held
  AddWorker("w2", 2, 8);
  auto ps = Pass();
  ASSERT_EQ(ps.size(), 1u);
  std::set<std::string> distinct(ps[0].workers.begin(), ps[0].workers.end());
  EXPECT_EQ(distinct.size(), 3u);
}

TEST_F(SchedulerTest, DrainingAndDisconnectedWorkersGetNothing) {
  AddWorker("w0", 1, 8);
  workers_.Find("w0")->info.set_state(v1::WORKER_DRAINING);
  AddWorker("w1", 1, 8);
  workers_.Find("w1")->connected = false;
  Submit(0);
  EXPECT_TRUE(Pass().empty());
  workers_.Find("w0")->info.set_state(v1::WORKER_ALIVE);
  EXPECT_EQ(Pass().size(), 1u);
}

TEST_F(SchedulerTest, ExecOnlyWhereAllowed) {
  AddWorker("w0", 0, 8, /*allow_exec=*/false);
  std::string e = Submit(0, 1, 0, /*exec=*/true);
  EXPECT_TRUE(Pass().empty());
  AddWorker("w1", 0, 8, /*allow_exec=*/true);
  auto ps = Pass();
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].workers[0], "w1");
  (void)e;
}

TEST_F(SchedulerTest, BackoffDelaysPlacement) {
  AddWorker("w0", 0, 8);
  std::string a = Submit(0);
  Changes ch;
  v1::AttemptPart part;
  part.set_worker_id("w0");
  jobs_.Assign(a, {part}, "", &ch);
  jobs_.AttemptFailed(jobs_.FindCurrentAttempt(a + ".1"), "exit 1", 1, true, &ch);
  ASSERT_EQ(jobs_.Find(a)->state(), v1::QUEUED);
  EXPECT_TRUE(Pass().empty());
  clock_.Advance(1001);
  EXPECT_EQ(Pass().size(), 1u);
}

TEST_F(SchedulerTest, CpuSlotsLimitConcurrency) {
  AddWorker("w0", 0, 3);
  for (int i = 0; i < 10; ++i) Submit(0);
  EXPECT_EQ(Pass().size(), 3u);
  EXPECT_TRUE(Pass().empty());
}

}  // namespace
}  // namespace stemma::coordinator
