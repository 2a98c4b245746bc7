// The retention policy: table-driven cases, and a property over random registries and
// policies: GC never deletes a protected checkpoint.
#include "coordinator/gc_policy.h"

#include <gtest/gtest.h>

#include <random>

#include "absl/strings/str_cat.h"

namespace stemma::coordinator {
namespace {

struct Registry {
  std::vector<v1::Artifact> artifacts;
  GcFacts facts;
  void Index() {
    facts.artifacts.clear();
    for (const auto& a : artifacts) facts.artifacts.push_back(&a);
  }
};

v1::Artifact Checkpoint(int seq, const std::string& job, const std::string& experiment,
                        std::vector<std::string> parents = {}) {
  v1::Artifact a;
  a.set_id(absl::StrCat("a-", seq));
  a.set_seq(seq);
  a.set_name("model");
  a.set_type("checkpoint");
  a.set_path(absl::StrCat("/ckpt/", seq));
  a.set_job_id(job);
  a.set_experiment(experiment);
  a.set_state(v1::ARTIFACT_PRESENT);
  a.set_created_ms(1000 + seq);
  a.set_bytes(100);
  for (auto& p : parents) a.add_parents(p);
  return a;
}

std::map<std::string, bool> Removed(const std::vector<GcPlanEntry>& plan) {
  std::map<std::string, bool> out;
  for (const auto& e : plan) out[e.artifact->id()] = e.remove;
  return out;
}

TEST(GcPolicy, KeepBestAndLatestPerExperiment) {
  Registry r;
  for (int i = 1; i <= 5; ++i) {
    r.artifacts.push_back(Checkpoint(i, absl::StrCat("j-", i), "exp"));
    (*r.artifacts.back().mutable_metrics())["loss"] = 10 - i;  // later is better
    r.facts.job_states[absl::StrCat("j-", i)] = v1::SUCCEEDED;
  }
  (*r.artifacts[0].mutable_metrics())["loss"] = 0.5;  // a-1 is the best
  r.Index();
  v1::GcPolicy p;
  p.set_keep_best(1);
  p.set_metric("loss");
  p.set_keep_latest(1);
  auto removed = Removed(PlanGc(r.facts, p));
  EXPECT_FALSE(removed["a-1"]);  // best
  EXPECT_FALSE(removed["a-5"]);  // latest
  EXPECT_TRUE(removed["a-2"]);
  EXPECT_TRUE(removed["a-3"]);
  EXPECT_TRUE(removed["a-4"]);
  p.set_maximize(true);  // now a-4 (loss 6) is the best besides the latest
  removed = Removed(PlanGc(r.facts, p));
  EXPECT_TRUE(removed["a-1"]);
  EXPECT_FALSE(removed["a-5"]);
}

TEST(GcPolicy, IntermediateStepCheckpointsOfSucceededRunsOnly) {
  Registry r;
  r.artifacts.push_back(Checkpoint(1, "j-1", "e"));
  r.artifacts.back().set_name("checkpoint-100");
  r.artifacts.push_back(Checkpoint(2, "j-1", "e"));
  r.artifacts.push_back(Checkpoint(3, "j-2", "e"));
  r.artifacts.back().set_name("checkpoint-100");
  r.facts.job_states = {{"j-1", v1::SUCCEEDED}, {"j-2", v1::FAILED}};
  r.Index();
  v1::GcPolicy p;
  p.set_drop_intermediate(true);
  auto removed = Removed(PlanGc(r.facts, p));
  EXPECT_TRUE(removed["a-1"]);
  EXPECT_FALSE(removed["a-2"]);  // the final model
  EXPECT_FALSE(removed["a-3"]);  // a failed run's: resumable
}

TEST(GcPolicy, NoRuleDeletesNothingAndExternalsAreNeverConsidered) {
  Registry r;
  r.artifacts.push_back(Checkpoint(1, "", ""));
  r.artifacts.back().set_external(true);
  r.artifacts.push_back(Checkpoint(2, "j-1", "", {"a-1"}));
  r.facts.job_states = {{"j-1", v1::SUCCEEDED}};
  r.Index();
  auto plan = PlanGc(r.facts, v1::GcPolicy());
  ASSERT_EQ(plan.size(), 1u);  // the external base is not even a candidate
  EXPECT_FALSE(plan[0].remove);
  v1::GcPolicy latest0;
  latest0.set_keep_latest(0);
  EXPECT_FALSE(PlanGc(r.facts, latest0)[0].remove);
}

TEST(GcPolicy, BadPoliciesNameTheField) {
  v1::GcPolicy p;
  p.set_keep_best(2);
  EXPECT_NE(ValidateGcPolicy(p).message().find("metric"), std::string::npos);
  p.set_keep_best(-1);
  EXPECT_NE(ValidateGcPolicy(p).message().find("keep_best"), std::string::npos);
  v1::GcPolicy q;
  q.set_keep_latest(-3);
  EXPECT_NE(ValidateGcPolicy(q).message().find("keep_latest"), std::string::npos);
}

// Random registries (DAGs of checkpoints over a few experiments, with results that name
// some of them, pins, live readers and jobs in every state) and random policies: nothing
// protected is ever deleted, only present produced checkpoints of ended jobs are, and a
// policy that keeps more never deletes more.
TEST(GcPolicy, PropertyNeverDeletesAProtectedCheckpoint) {
  std::mt19937 rng(12345);
  const v1::JobState states[] = {v1::PENDING,   v1::QUEUED, v1::ASSIGNED, v1::RUNNING,
                                 v1::SUCCEEDED, v1::FAILED, v1::CANCELLED};
  int deleted_total = 0;
  for (int round = 0; round < 400; ++round) {
    Registry r;
    const int n = 1 + rng() % 60;
    for (int i = 1; i <= n; ++i) {
      std::vector<std::string> parents;
      for (int k = 0, m = rng() % 3; k < m && i > 1; ++k) {
        parents.push_back(absl::StrCat("a-", 1 + rng() % (i - 1)));
      }
      const bool external = i == 1 || rng() % 10 == 0;
      v1::Artifact a = Checkpoint(i, external ? "" : absl::StrCat("j-", 1 + rng() % 20),
                                  absl::StrCat("e", rng() % 3), parents);
      a.set_external(external);
      if (rng() % 4 == 0) a.set_type(rng() % 2 ? "file" : "dataset");  // results
      if (rng() % 5 == 0) a.set_name(absl::StrCat("checkpoint-", rng() % 1000));
      if (rng() % 8 == 0) a.set_pinned(true);
      if (rng() % 10 == 0) a.set_state(v1::ARTIFACT_DELETED);
      if (rng() % 3 != 0) (*a.mutable_metrics())["loss"] = (rng() % 1000) / 100.0;
      r.artifacts.push_back(std::move(a));
    }
    for (int j = 1; j <= 20; ++j) r.facts.job_states[absl::StrCat("j-", j)] = states[rng() % 7];
    for (int k = 0, m = rng() % 6; k < m; ++k) {
      r.facts.read_by_live_jobs.insert(absl::StrCat("a-", 1 + rng() % n));
    }
    r.Index();
    v1::GcPolicy p;
    if (rng() % 2) {
      p.set_keep_best(rng() % 4);
      if (p.keep_best() > 0) p.set_metric("loss");
      p.set_maximize(rng() % 2);
    }
    if (rng() % 2) p.set_keep_latest(rng() % 4);
    p.set_drop_intermediate(rng() % 2);
    if (rng() % 4 == 0) p.set_experiment(absl::StrCat("e", rng() % 3));
    ASSERT_TRUE(ValidateGcPolicy(p).ok());

    // What must survive, computed here from the rules, not from the planner's helper.
    std::set<std::string> must_keep;
    for (const auto& a : r.artifacts) {
      if (a.pinned() || r.facts.read_by_live_jobs.contains(a.id())) must_keep.insert(a.id());
      if (a.state() == v1::ARTIFACT_PRESENT && a.type() != "checkpoint") {
        for (const auto& parent : a.parents()) must_keep.insert(parent);
      }
    }
    auto plan = PlanGc(r.facts, p);
    std::set<std::string> deleted;
    for (const auto& e : plan) {
      if (!e.remove) continue;
      const v1::Artifact& a = *e.artifact;
      deleted.insert(a.id());
      ASSERT_FALSE(must_keep.contains(a.id()))
          << "round " << round << ": " << a.id() << " " << e.reason;
      ASSERT_EQ(a.type(), "checkpoint");
      ASSERT_EQ(a.state(), v1::ARTIFACT_PRESENT);
      ASSERT_FALSE(a.external());
      const v1::JobState s = r.facts.job_states.at(a.job_id());
      ASSERT_TRUE(s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED) << a.id();
      if (!p.experiment().empty()) ASSERT_EQ(a.experiment(), p.experiment());
    }
    // Keeping one more of the latest never deletes something it kept before.
    v1::GcPolicy more = p;
    if (more.keep_best() > 0 || more.keep_latest() > 0) {
      more.set_keep_latest(p.keep_latest() + 1);
      for (const auto& e : PlanGc(r.facts, more)) {
        if (e.remove) ASSERT_TRUE(deleted.contains(e.artifact->id())) << "round " << round;
      }
    }
    deleted_total += static_cast<int>(deleted.size());
  }
  EXPECT_GT(deleted_total, 100);  // the property was exercised, not vacuous
}

}  // namespace
}  // namespace stemma::coordinator
