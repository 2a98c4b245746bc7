#include "coordinator/quotas.h"

#include <gtest/gtest.h>

#include "common/auth.h"
#include "coordinator/scheduler.h"

namespace stemma::coordinator {
namespace {

TEST(QuotaConfigTest, ParsesEveryField) {
  auto projects = Tenancy::Parse("vision bob carol\n", "projects.txt");
  ASSERT_TRUE(projects.ok()) << projects.status();
  auto c = ParseQuotaConfig(R"(
fair_share: {enabled: true, half_life: 12h}
default: {max_queued_jobs: 100, max_running_gpus: 8, priority: [0, 100]}
subjects:
  alice: {priority: [-1000, 1000]}
projects:
  vision: {max_running_gpus: 12}
)",
                            "q.yaml", *projects);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->fair_share);
  EXPECT_EQ(c->half_life_ms, 12 * 3600 * 1000);
  EXPECT_EQ(*c->defaults.max_queued_jobs, 100);
  EXPECT_EQ(c->subjects.at("alice").priority->second, 1000);
  EXPECT_EQ(c->projects.at("vision").members.size(), 2u);
}

TEST(QuotaConfigTest, BadFieldsNameTheFileLineAndField) {
  struct Case {
    const char* text;
    const char* want;
  } cases[] = {
      {"default: {max_queued_jobs: lots}",
       "q.yaml: line 1: default.max_queued_jobs: not an integer"},
      {"default:\n  priority: [5, 1]", "default.priority: min is above max"},
      {"subjects: {bob: {gpus: 3}}", "subjects.bob.gpus: unknown field"},
      {"fair_share: {half_life: soon}", "fair_share.half_life: 'soon' is not a duration"},
      {"quota: 1", "quota: unknown field"},
      {"projects: {p: {gpus: 1}}", "projects.p.gpus: unknown field"},
  };
  for (const auto& c : cases) {
    auto r = ParseQuotaConfig(c.text, "q.yaml");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.status().message().find(c.want), std::string::npos) << r.status();
  }
}

// One list of projects: the projects file. A quota file names its projects and sets their
// limits; members in the quota file (the old second list) and projects the projects file
// does not list stop the coordinator at start, naming both files and the field.
TEST(QuotaConfigTest, ProjectsAndMembersComeOnlyFromTheProjectsFile) {
  auto projects = Tenancy::Parse("vision bob carol\n", "projects.txt");
  ASSERT_TRUE(projects.ok());
  auto members =
      ParseQuotaConfig("projects:\n  vision:\n    members: [bob, carol]\n", "q.yaml", *projects);
  ASSERT_FALSE(members.ok());
  EXPECT_NE(members.status().message().find(
                "q.yaml: line 3: projects.vision.members: members are listed in the projects "
                "file (stemma-coordinator --projects projects.txt)"),
            std::string::npos)
      << members.status();
  auto unknown = ParseQuotaConfig("projects: {speech: {max_running_gpus: 2}}", "q.yaml", *projects);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find(
                "q.yaml: line 1: projects.speech: no project speech in the projects file "
                "projects.txt"),
            std::string::npos)
      << unknown.status();
  auto none = ParseQuotaConfig("projects: {vision: {max_running_gpus: 2}}", "q.yaml");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("--projects FILE"), std::string::npos) << none.status();
}

class FairShareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    jobs_.SetObserver([this](const v1::Job& job, v1::JobState from, v1::JobState to) {
      quotas_.OnTransition(job, from, to);
    });
  }
  void AddWorker(const std::string& id, int gpus, double cpus) {
    v1::WorkerInfo info;
    info.set_id(id);
    info.set_state(v1::WORKER_ALIVE);
    for (int i = 0; i < gpus; ++i) info.add_gpus()->set_id(i);
    info.set_cpus(cpus);
    info.set_memory_mb(1 << 20);
    workers_.Upsert(info).connected = true;
  }
  std::vector<std::string> Submit(const std::string& owner, int n, int gpus = 0, int priority = 0) {
    v1::SubmitRequest req;
    for (int i = 0; i < n; ++i) {
      v1::JobSpec* s = req.add_jobs();
      s->mutable_noop();
      s->mutable_resources()->set_gpus(gpus);
      s->set_priority(priority);
      (*s->mutable_labels())[kOwnerLabel] = owner;
    }
    std::vector<const v1::JobSpec*> specs;
    for (const auto& s : req.jobs()) specs.push_back(&s);
    last_check_ = quotas_.CheckSubmit(specs);
    if (!last_check_.ok()) return {};
    Changes ch;
    auto r = jobs_.Submit(req, &ch);
    EXPECT_TRUE(r.ok()) << r.status();
    return r->ids;
  }
  // Places what the scheduler decides; returns the owners of the placed jobs in order.
  std::vector<std::string> Pass() {
    std::vector<std::string> owners;
    for (const auto& p : Schedule(jobs_, workers_, clock_.WallMs(), {}, &quotas_)) {
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
      owners.push_back(JobOwner(*jobs_.Assign(p.job_id, parts, "", &ch)));
    }
    return owners;
  }
  void Finish(const std::string& id) {
    v1::Job* job = const_cast<v1::Job*>(jobs_.Find(id));
    Changes ch;
    jobs_.MarkStarted(job, 0, &ch);
    jobs_.PartSucceeded(job, 0, {}, &ch);
    workers_.Free(*workers_.Find(job->current().parts(0).worker_id()), id + "/0");
  }

  FakeClock clock_;
  JobTable jobs_{&clock_};
  WorkerTable workers_;
  Quotas quotas_{&clock_};
  absl::Status last_check_;
};

TEST_F(FairShareTest, OneJobOfALightUserRunsBeforeTheHeavyUsersBacklog) {
  AddWorker("w1", 0, 2);
  std::vector<std::string> bob = Submit("bob", 200);
  EXPECT_EQ(Pass(), (std::vector<std::string>{"bob", "bob"}));
  std::vector<std::string> carol = Submit("carol", 1);
  clock_.Advance(5000);
  Finish(bob[0]);
  // bob has 198 jobs queued before carol's, and more usage: carol's runs next.
  EXPECT_EQ(Pass(), (std::vector<std::string>{"carol"}));
  EXPECT_EQ(jobs_.Find(carol[0])->state(), v1::ASSIGNED);
}

TEST_F(FairShareTest, APassSpreadsFreeSlotsOverOwnersOfEqualPriority) {
  AddWorker("w1", 0, 6);
  Submit("a", 50);
  Submit("b", 50);
  Submit("c", 50);
  std::vector<std::string> owners = Pass();
  ASSERT_EQ(owners.size(), 6u);
  for (const char* o : {"a", "b", "c"}) {
    EXPECT_EQ(std::count(owners.begin(), owners.end(), o), 2) << o;
  }
}

TEST_F(FairShareTest, HigherPriorityStillComesFirst) {
  AddWorker("w1", 0, 1);
  Submit("carol", 1);
  Submit("bob", 1, 0, /*priority=*/5);
  EXPECT_EQ(Pass(), (std::vector<std::string>{"bob"}));
}

TEST_F(FairShareTest, WithFairShareOffTheQueueIsFifo) {
  QuotaConfig c;
  c.fair_share = false;
  quotas_.SetConfig(c);
  AddWorker("w1", 0, 1);
  Submit("bob", 3);
  Submit("carol", 1);
  EXPECT_EQ(Pass(), (std::vector<std::string>{"bob"}));
}

TEST_F(FairShareTest, RunningGpusStopAtTheOwnersAndTheProjectsLimits) {
  QuotaConfig c;
  c.source = "q.yaml";
  c.subjects["bob"].max_running_gpus = 2;
  c.projects["vision"].members = {"carol", "dave"};
  c.projects["vision"].limits.max_running_gpus = 3;
  quotas_.SetConfig(c);
  AddWorker("w1", 8, 64);
  Submit("bob", 5, 1);
  Submit("carol", 5, 1);
  Submit("dave", 5, 1);
  std::vector<std::string> owners = Pass();
  EXPECT_EQ(std::count(owners.begin(), owners.end(), "bob"), 2);
  EXPECT_EQ(std::count(owners.begin(), owners.end(), "carol") +
                std::count(owners.begin(), owners.end(), "dave"),
            3);
  EXPECT_TRUE(Pass().empty());  // 3 GPUs free, but nobody may take them
}

TEST_F(FairShareTest, SubmitsOverALimitAreRefusedNamingIt) {
  QuotaConfig c;
  c.source = "q.yaml";
  c.defaults.max_queued_jobs = 10;
  c.defaults.priority = std::make_pair(int64_t{0}, int64_t{100});
  c.defaults.max_running_gpus = 4;
  c.projects["vision"].members = {"carol"};
  c.projects["vision"].limits.max_queued_jobs = 9;
  quotas_.SetConfig(c);
  EXPECT_EQ(Submit("bob", 8).size(), 8u);
  EXPECT_TRUE(Submit("bob", 3).empty());
  EXPECT_EQ(last_check_.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(last_check_.message().find("max_queued_jobs 10 (default in q.yaml): bob has 8 jobs "
                                       "waiting and this submit adds 3"),
            std::string::npos)
      << last_check_;
  EXPECT_TRUE(Submit("bob", 1, 0, 2147483647).empty());
  EXPECT_EQ(last_check_.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(last_check_.message().find("priority: 2147483647 is outside 0..100"), std::string::npos)
      << last_check_;
  EXPECT_TRUE(Submit("bob", 1, 8).empty());
  EXPECT_NE(last_check_.message().find("needs 8 GPUs, above the quota max_running_gpus 4"),
            std::string::npos)
      << last_check_;
  EXPECT_EQ(Submit("carol", 8).size(), 8u);
  EXPECT_TRUE(Submit("carol", 2).empty());
  EXPECT_NE(last_check_.message().find("of project vision"), std::string::npos) << last_check_;
}

TEST_F(FairShareTest, UsageDecaysWithTheHalfLife) {
  QuotaConfig c;
  c.half_life_ms = 10000;
  quotas_.SetConfig(c);
  AddWorker("w1", 0, 1);
  std::vector<std::string> ids = Submit("bob", 1);
  Pass();
  clock_.Advance(9000);
  Finish(ids[0]);
  const double after = quotas_.Usage("bob", clock_.WallMs());
  EXPECT_NEAR(after, 10.0, 1e-6);  // 9 s of one slot + the minimum charge
  EXPECT_NEAR(quotas_.Usage("bob", clock_.WallMs() + 10000), 5.0, 1e-6);
}

}  // namespace
}  // namespace stemma::coordinator
