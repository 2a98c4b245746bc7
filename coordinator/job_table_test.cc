#include "coordinator/job_table.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/job_spec.h"

namespace stemma::coordinator {
namespace {

v1::JobSpec Noop(const std::string& name, std::vector<std::string> deps = {}) {
  v1::JobSpec s;
  s.set_name(name);
  s.mutable_noop();
  for (auto& d : deps) s.add_depends_on(d);
  return s;
}

class JobTableTest : public ::testing::Test {
 protected:
  absl::StatusOr<std::vector<std::string>> Submit(std::vector<v1::JobSpec> specs,
                                                  std::string key = "") {
    v1::SubmitRequest req;
    for (auto& s : specs) *req.add_jobs() = s;
    req.set_idempotency_key(key);
    Changes ch;
    auto r = table_.Submit(req, &ch);
    if (!r.ok()) return r.status();
    committed_ += ch.batch.of<JobsTable>().size();
    return r->ids;
  }
  v1::JobState State(const std::string& id) { return table_.Find(id)->state(); }
  void Run(const std::string& id) {
    Changes ch;
    v1::AttemptPart part;
    part.set_worker_id("w0");
    table_.Assign(id, {part}, "", &ch);
    table_.MarkStarted(table_.FindCurrentAttempt(table_.Find(id)->current().id()), 0, &ch);
  }
  void Succeed(const std::string& id) {
    Run(id);
    Changes ch;
    google::protobuf::Map<std::string, std::string> outputs;
    table_.PartSucceeded(table_.FindCurrentAttempt(table_.Find(id)->current().id()), 0, outputs,
                         &ch);
  }
  void Fail(const std::string& id, bool retryable = true) {
    Run(id);
    Changes ch;
    table_.AttemptFailed(table_.FindCurrentAttempt(table_.Find(id)->current().id()), "exit 3", 3,
                         retryable, &ch);
  }

  FakeClock clock_;
  JobTable table_{&clock_};
  size_t committed_ = 0;
};

TEST_F(JobTableTest, DagRunsInOrder) {
  auto ids = Submit({Noop("a"), Noop("b", {"a"}), Noop("c", {"a", "b"})});
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(State((*ids)[0]), v1::QUEUED);
  EXPECT_EQ(State((*ids)[1]), v1::PENDING);
  EXPECT_EQ(State((*ids)[2]), v1::PENDING);
  Succeed((*ids)[0]);
  EXPECT_EQ(State((*ids)[1]), v1::QUEUED);
  EXPECT_EQ(State((*ids)[2]), v1::PENDING);
  Succeed((*ids)[1]);
  EXPECT_EQ(State((*ids)[2]), v1::QUEUED);
  // Dependencies are stored as ids, not names.
  EXPECT_EQ(table_.Find((*ids)[2])->spec().depends_on_size(), 2);
  EXPECT_EQ(table_.Find((*ids)[2])->spec().depends_on(0), (*ids)[0]);
}

TEST_F(JobTableTest, FailedDependencyFailsDependentsWithTheReason) {
  v1::JobSpec a = Noop("a");
  a.set_max_attempts(1);
  auto ids = Submit({a, Noop("b", {"a"}), Noop("c", {"b"})});
  ASSERT_TRUE(ids.ok());
  Fail((*ids)[0]);
  EXPECT_EQ(State((*ids)[0]), v1::FAILED);
  EXPECT_EQ(State((*ids)[1]), v1::FAILED);
  EXPECT_EQ(State((*ids)[2]), v1::FAILED);
  EXPECT_NE(table_.Find((*ids)[1])->reason().find("dependency " + (*ids)[0] + " (a) failed"),
            std::string::npos)
      << table_.Find((*ids)[1])->reason();
  // A later job depending on a failed one fails at once.
  auto late = Submit({Noop("d", {(*ids)[0]})});
  ASSERT_TRUE(late.ok());
  EXPECT_EQ(State((*late)[0]), v1::FAILED);
}

TEST_F(JobTableTest, RetryLimitAndBackoff) {
  v1::JobSpec a = Noop("a");
  a.set_max_attempts(2);
  a.mutable_backoff()->set_initial_ms(500);
  auto ids = Submit({a});
  ASSERT_TRUE(ids.ok());
  const std::string id = (*ids)[0];
  Fail(id);
  EXPECT_EQ(State(id), v1::QUEUED);
  EXPECT_EQ(table_.Find(id)->not_before_ms(), clock_.WallMs() + 500);
  Fail(id);
  EXPECT_EQ(State(id), v1::FAILED);
  EXPECT_EQ(table_.Find(id)->attempts(), 2);
  EXPECT_NE(table_.Find(id)->reason().find("2 of 2 attempts"), std::string::npos);
}

TEST_F(JobTableTest, NonRetryableFailureEndsAtOnce) {
  auto ids = Submit({Noop("a")});
  ASSERT_TRUE(ids.ok());
  Fail((*ids)[0], /*retryable=*/false);
  EXPECT_EQ(State((*ids)[0]), v1::FAILED);
  EXPECT_EQ(table_.Find((*ids)[0])->attempts(), 1);
}

TEST_F(JobTableTest, RetryRevivesTheJobAndItsDependents) {
  v1::JobSpec a = Noop("a");
  a.set_max_attempts(1);
  auto ids = Submit({a, Noop("b", {"a"})});
  ASSERT_TRUE(ids.ok());
  Fail((*ids)[0]);
  ASSERT_EQ(State((*ids)[1]), v1::FAILED);
  Changes ch;
  ASSERT_TRUE(table_.Retry((*ids)[0], &ch).ok());
  EXPECT_EQ(State((*ids)[0]), v1::QUEUED);
  EXPECT_EQ(State((*ids)[1]), v1::PENDING);
  EXPECT_EQ(table_.Find((*ids)[0])->attempt_budget(), 2);
  EXPECT_FALSE(table_.Retry((*ids)[1], &ch).ok());  // PENDING: nothing to retry
}

TEST_F(JobTableTest, CancelEndsTheJobAndFailsDependents) {
  auto ids = Submit({Noop("a"), Noop("b", {"a"})});
  ASSERT_TRUE(ids.ok());
  Changes ch;
  ASSERT_TRUE(table_.Cancel((*ids)[0], "", &ch).ok());
  EXPECT_EQ(State((*ids)[0]), v1::CANCELLED);
  EXPECT_EQ(State((*ids)[1]), v1::FAILED);
  EXPECT_NE(table_.Find((*ids)[1])->reason().find("was cancelled"), std::string::npos);
  EXPECT_EQ(table_.Cancel((*ids)[0], "", &ch).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(table_.Cancel("j-999", "", &ch).code(), absl::StatusCode::kNotFound);
}

TEST_F(JobTableTest, BadSubmissionsChangeNothing) {
  struct Case {
    std::vector<v1::JobSpec> specs;
    std::string expect;
  };
  v1::JobSpec bad_gpus = Noop("g");
  bad_gpus.mutable_resources()->set_gpus(-1);
  std::vector<Case> cases = {
      {{Noop("a", {"b"}), Noop("b", {"a"})}, "dependency cycle: a -> b -> a"},
      {{Noop("a", {"c"}), Noop("b", {"a"}), Noop("c", {"b"})}, "dependency cycle"},
      {{Noop("a", {"nope"})}, "unknown job 'nope'"},
      {{Noop("a", {"a"})}, "depends on itself"},
      {{Noop("x"), bad_gpus}, "job 'g': resources.gpus"},
      {{Noop("d"), Noop("d"), Noop("e", {"d"})}, "used by several jobs"},
  };
  for (const auto& c : cases) {
    auto r = Submit(c.specs);
    ASSERT_FALSE(r.ok()) << c.expect;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << r.status();
  }
  EXPECT_EQ(table_.size(), 0u);
  EXPECT_EQ(committed_, 0u);
}

TEST_F(JobTableTest, IdempotencyKeyReturnsTheSameJobs) {
  auto first = Submit({Noop("a"), Noop("b")}, "k1");
  auto second = Submit({Noop("a"), Noop("b")}, "k1");
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(*first, *second);
  EXPECT_EQ(table_.size(), 2u);
}

TEST_F(JobTableTest, QueueOrderIsPriorityThenFifo) {
  v1::JobSpec hi = Noop("hi");
  hi.set_priority(10);
  auto ids = Submit({Noop("l1"), Noop("l2"), hi});
  ASSERT_TRUE(ids.ok());
  std::vector<std::string> order;
  for (const auto& [p, seq, id] : table_.queue()) order.push_back(id);
  EXPECT_EQ(order, (std::vector<std::string>{(*ids)[2], (*ids)[0], (*ids)[1]}));
}

TEST_F(JobTableTest, ListFiltersAndPages) {
  std::vector<v1::JobSpec> specs;
  for (int i = 0; i < 25; ++i) {
    v1::JobSpec s = Noop("n" + std::to_string(i));
    (*s.mutable_labels())["team"] = i % 2 ? "odd" : "even";
    specs.push_back(s);
  }
  ASSERT_TRUE(Submit(specs).ok());
  v1::ListJobsRequest req;
  (*req.mutable_labels())["team"] = "odd";
  req.set_page_size(5);
  std::vector<std::string> seen;
  for (;;) {
    auto page = table_.List(req);
    ASSERT_TRUE(page.ok());
    EXPECT_EQ(page->total(), 12);
    for (const auto& j : page->jobs()) seen.push_back(j.spec().name());
    if (page->next_page_token().empty()) break;
    req.set_page_token(page->next_page_token());
  }
  EXPECT_EQ(seen.size(), 12u);
  EXPECT_EQ(seen.front(), "n1");
  EXPECT_EQ(seen.back(), "n23");
  req.set_page_token("garbage");
  EXPECT_FALSE(table_.List(req).ok());
}

TEST_F(JobTableTest, ReloadKeepsEverything) {
  auto ids = Submit({Noop("a"), Noop("b", {"a"})}, "key");
  ASSERT_TRUE(ids.ok());
  StoreSnapshot snap;
  table_.ForEach([&](const v1::Job& j) { snap.of<JobsTable>().push_back(j); });
  std::sort(snap.of<JobsTable>().begin(), snap.of<JobsTable>().end(),
            [](const auto& a, const auto& b) { return a.seq() < b.seq(); });
  snap.of<IdempotencyKeysTable>().push_back({"key", *ids});
  JobTable reloaded(&clock_);
  reloaded.Load(snap);
  EXPECT_EQ(reloaded.queue().size(), 1u);
  Changes ch;
  v1::AttemptPart part;
  part.set_worker_id("w0");
  reloaded.Assign((*ids)[0], {part}, "", &ch);
  google::protobuf::Map<std::string, std::string> outputs;
  reloaded.PartSucceeded(reloaded.FindCurrentAttempt((*ids)[0] + ".1"), 0, outputs, &ch);
  EXPECT_EQ(reloaded.Find((*ids)[1])->state(), v1::QUEUED);  // dependents were rebuilt
  // New ids continue after the loaded ones.
  v1::SubmitRequest req;
  *req.add_jobs() = Noop("c");
  auto r = reloaded.Submit(req, &ch);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->ids[0], "j-3");
}

}  // namespace
}  // namespace stemma::coordinator

namespace stemma::coordinator {
namespace {

// A directory with a base checkpoint and an output "out1" (empty manifests both).
std::filesystem::path CheckpointDir(const std::string& tag) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("stemma-" + tag + "-test-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "base");
  std::filesystem::create_directories(dir / "out1");
  std::ofstream(dir / "base" / "stemma.json") << "{\"files\": {}}";
  std::ofstream(dir / "out1" / "stemma.json") << "{\"files\": {}}";
  return dir;
}

// A revert of the base onto itself: an engine job whose cache key follows `layers`.
v1::JobSpec Revert(const std::filesystem::path& dir, const std::string& name,
                   const std::string& out, const std::string& layers) {
  v1::JobSpec s;
  s.set_name(name);
  s.mutable_revert()->set_base((dir / "base").string());
  s.mutable_revert()->set_model((dir / "base").string());
  s.mutable_revert()->add_layers(layers);
  s.mutable_revert()->set_out(out);
  return s;
}

std::string SubmitOne(JobTable& table, const v1::JobSpec& s) {
  v1::SubmitRequest req;
  *req.add_jobs() = s;
  Changes ch;
  auto r = table.Submit(req, &ch);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->ids[0] : "";
}

// Memoization: the same engine job with the same inputs ends at once with the first one's
// outputs; a changed field, or outputs that are gone, run again.
TEST(JobTableMemo, SameKeyIsServedAndMissingOutputsAreAMiss) {
  const std::filesystem::path dir = CheckpointDir("memo");
  FakeClock clock;
  JobTable table(&clock);
  auto revert = [&](const std::string& name, const std::string& out, const std::string& layers) {
    return Revert(dir, name, out, layers);
  };
  auto submit = [&](const v1::JobSpec& s) { return SubmitOne(table, s); };
  const std::string first = submit(revert("r1", (dir / "out1").string(), "middle"));
  ASSERT_EQ(table.Find(first)->state(), v1::QUEUED);
  ASSERT_FALSE(table.Find(first)->cache_key().empty());
  {
    Changes ch;
    v1::AttemptPart part;
    part.set_worker_id("w0");
    table.Assign(first, {part}, "", &ch);
    google::protobuf::Map<std::string, std::string> outputs;
    outputs["model"] = (dir / "out1").string();
    table.PartSucceeded(table.FindCurrentAttempt(table.Find(first)->current().id()), 0, outputs,
                        &ch);
  }
  // Another output path, same inputs: served from the first run.
  const std::string second = submit(revert("r2", (dir / "out2").string(), "middle"));
  EXPECT_EQ(table.Find(second)->state(), v1::SUCCEEDED);
  EXPECT_EQ(table.Find(second)->reason(), "memoized from " + first);
  EXPECT_EQ(table.Find(second)->outputs().at("model"), (dir / "out1").string());
  EXPECT_EQ(table.Find(second)->attempts(), 0);
  // Another layer range is another key.
  const std::string third = submit(revert("r3", (dir / "out3").string(), "2:4"));
  EXPECT_EQ(table.Find(third)->state(), v1::QUEUED);
  // Opting out.
  v1::JobSpec nocache = revert("r4", (dir / "out4").string(), "middle");
  (*nocache.mutable_labels())["stemma.cache"] = "false";
  EXPECT_EQ(table.Find(submit(nocache))->state(), v1::QUEUED);
  // A changed input (its manifest) is another key.
  std::ofstream(dir / "base" / "stemma.json") << "{\"files\": {\"x\": 1}}";
  EXPECT_EQ(table.Find(submit(revert("r5", (dir / "out5").string(), "middle")))->state(),
            v1::QUEUED);
  std::ofstream(dir / "base" / "stemma.json") << "{\"files\": {}}";
  // The outputs gone: a miss, not a hit that serves nothing.
  std::filesystem::remove_all(dir / "out1");
  EXPECT_EQ(table.Find(submit(revert("r6", (dir / "out6").string(), "middle")))->state(),
            v1::QUEUED);
  std::filesystem::remove_all(dir);
}

// A second copy of an engine job that is still queued or running waits for it (no duplicate
// run into the same outputs) and is served from it; if it fails, the copy runs itself; a
// restarted coordinator still knows who waits for whom.
TEST(JobTableMemo, ACopyOfAnUnfinishedJobWaitsForItAndIsServedFromIt) {
  const std::filesystem::path dir = CheckpointDir("twin");
  FakeClock clock;
  JobTable table(&clock);
  auto revert = [&](const std::string& name, const std::string& layers) {
    v1::JobSpec s = Revert(dir, name, (dir / name).string(), layers);
    s.set_max_attempts(1);
    return s;
  };
  auto submit = [&](JobTable& t, const v1::JobSpec& s) { return SubmitOne(t, s); };
  auto start = [&](JobTable& t, const std::string& id) {
    Changes ch;
    v1::AttemptPart part;
    part.set_worker_id("w0");
    t.Assign(id, {part}, "", &ch);
  };
  const std::string first = submit(table, revert("r1", "middle"));
  const std::string copy = submit(table, revert("r2", "middle"));
  EXPECT_EQ(table.Find(copy)->state(), v1::PENDING);
  EXPECT_EQ(table.Find(copy)->reason(),
            "waiting for " + first + " (r1): the same job (cache key) is QUEUED");
  EXPECT_EQ(table.queue().size(), 1u);  // only the first one runs
  start(table, first);

  // A coordinator restarted here: the copy still waits for the first one.
  StoreSnapshot snap;
  table.ForEach([&](const v1::Job& j) { snap.of<JobsTable>().push_back(j); });
  std::sort(snap.of<JobsTable>().begin(), snap.of<JobsTable>().end(),
            [](const auto& a, const auto& b) { return a.seq() < b.seq(); });
  JobTable reloaded(&clock);
  reloaded.Load(snap);
  const std::string third = submit(reloaded, revert("r3", "middle"));
  EXPECT_EQ(reloaded.Find(third)->state(), v1::PENDING) << reloaded.Find(third)->reason();
  {
    Changes ch;
    google::protobuf::Map<std::string, std::string> outputs;
    outputs["model"] = (dir / "out1").string();
    reloaded.PartSucceeded(reloaded.FindCurrentAttempt(first + ".1"), 0, outputs, &ch);
  }
  for (const std::string& id : {copy, third}) {
    EXPECT_EQ(reloaded.Find(id)->state(), v1::SUCCEEDED) << id;
    EXPECT_EQ(reloaded.Find(id)->reason(), "memoized from " + first) << id;
    EXPECT_EQ(reloaded.Find(id)->attempts(), 0) << id;
  }

  // The one waited for fails: the copy runs itself.
  const std::string other = submit(reloaded, revert("r4", "2:4"));
  const std::string other_copy = submit(reloaded, revert("r5", "2:4"));
  ASSERT_EQ(reloaded.Find(other_copy)->state(), v1::PENDING);
  start(reloaded, other);
  {
    Changes ch;
    reloaded.AttemptFailed(reloaded.FindCurrentAttempt(other + ".1"), "exit 3", 3, false, &ch);
  }
  EXPECT_EQ(reloaded.Find(other)->state(), v1::FAILED);
  EXPECT_EQ(reloaded.Find(other_copy)->state(), v1::QUEUED) << reloaded.Find(other_copy)->reason();
  // Opting out of the cache opts out of waiting too.
  v1::JobSpec nocache = revert("r6", "2:4");
  (*nocache.mutable_labels())["stemma.cache"] = "false";
  EXPECT_EQ(reloaded.Find(submit(reloaded, nocache))->state(), v1::QUEUED);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace stemma::coordinator

namespace stemma::coordinator {
namespace {

// A glob input (tokenize's `input: [raw/*.txt.gz]`) stands in the key for the files it
// matches: adding or changing one of them is a different job; the same files, the same key.
TEST(JobTableMemo, AGlobInputIsKeyedByTheFilesItMatches) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("stemma_memo_glob_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "raw");
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / "raw" / name) << text;
  };
  write("a.txt", "alpha");
  write("b.txt", "beta");
  v1::JobSpec spec;
  spec.mutable_tokenize()->set_tokenizer((dir / "tok").string());
  spec.mutable_tokenize()->add_input((dir / "raw/*.txt").string());
  spec.mutable_tokenize()->set_format("text");
  spec.mutable_tokenize()->set_language("xx");
  spec.mutable_tokenize()->set_out((dir / "ds").string());
  const std::string first = CacheKey(spec, "build");
  ASSERT_FALSE(first.empty());
  EXPECT_EQ(CacheKey(spec, "build"), first);
  write("c.txt", "gamma");
  const std::string added = CacheKey(spec, "build");
  EXPECT_NE(added, first);
  write("b.txt", "BETA");
  EXPECT_NE(CacheKey(spec, "build"), added);
  write("b.txt", "beta");
  EXPECT_EQ(CacheKey(spec, "build"), added);
  write("notes.md", "not matched");
  EXPECT_EQ(CacheKey(spec, "build"), added);
  std::filesystem::remove_all(dir);
}

// `stemma gc jobs`: what may be archived or forgotten, and the attempt history.
TEST_F(JobTableTest, CollectArchivesFinishedJobsThatNoUnfinishedJobNeeds) {
  auto ids = Submit({Noop("up"), Noop("down", {"up"}), Noop("lone"), Noop("mine")});
  ASSERT_TRUE(ids.ok());
  const std::string up = (*ids)[0], down = (*ids)[1], lone = (*ids)[2], mine = (*ids)[3];
  Succeed(up);  // `down` is QUEUED now, waiting to run: it still needs `up`
  Succeed(lone);
  Fail(mine, /*retryable=*/false);
  clock_.Advance(1000);
  v1::GcJobsRequest req;
  req.set_finished_before_ms(clock_.WallMs());
  auto all = [](const v1::Job&) { return true; };
  Changes ch;
  auto dry = table_.Collect(req, all, &ch);
  ASSERT_TRUE(dry.ok()) << dry.status();
  EXPECT_EQ(std::vector<std::string>(dry->job_ids().begin(), dry->job_ids().end()),
            (std::vector<std::string>{lone, mine}));
  EXPECT_FALSE(dry->applied());
  EXPECT_TRUE(ch.batch.of<JobsTable>().empty());
  // Ownership: what `may_manage` refuses is never selected.
  auto not_mine = [&](const v1::Job& j) { return j.id() != mine; };
  EXPECT_EQ(table_.Collect(req, not_mine, &ch)->job_ids_size(), 1);
  // Finished too recently, or in another state: not selected.
  v1::GcJobsRequest early = req;
  early.set_finished_before_ms(clock_.WallMs() - 5000);
  EXPECT_EQ(table_.Collect(early, all, &ch)->job_ids_size(), 0);
  v1::GcJobsRequest failed = req;
  failed.add_states(v1::FAILED);
  EXPECT_EQ(table_.Collect(failed, all, &ch)->job_ids(0), mine);
  v1::GcJobsRequest running = req;
  running.add_states(v1::RUNNING);
  EXPECT_EQ(table_.Collect(running, all, &ch).status().code(), absl::StatusCode::kInvalidArgument);

  req.set_apply(true);
  ASSERT_TRUE(table_.Collect(req, all, &ch).ok());
  EXPECT_TRUE(table_.Find(lone)->archived());
  EXPECT_EQ(ch.batch.of<JobsTable>().size(), 2u);
  v1::ListJobsRequest list;
  EXPECT_EQ(table_.List(list)->jobs_size(), 2);  // up and down
  list.set_include_archived(true);
  EXPECT_EQ(table_.List(list)->jobs_size(), 4);

  // Forgetting: `up` stays while `down` needs it, and goes with it once both finished.
  req.set_forget(true);
  ASSERT_TRUE(table_.Collect(req, all, &ch).ok());
  EXPECT_EQ(table_.Find(lone), nullptr);
  EXPECT_NE(table_.Find(up), nullptr);
  Succeed(down);
  clock_.Advance(1000);
  req.set_finished_before_ms(clock_.WallMs());
  auto gone = table_.Collect(req, all, &ch);
  EXPECT_EQ(std::vector<std::string>(gone->job_ids().begin(), gone->job_ids().end()),
            (std::vector<std::string>{up, down}));
  EXPECT_EQ(table_.Find(up), nullptr);
}

TEST_F(JobTableTest, HistoryKeepsEveryAttemptAndSurvivesALoad) {
  v1::JobSpec flaky = Noop("flaky");
  flaky.set_max_attempts(3);
  auto ids = Submit({flaky});
  ASSERT_TRUE(ids.ok());
  const std::string id = (*ids)[0];
  StoreSnapshot snapshot;
  for (int i = 0; i < 2; ++i) {
    clock_.Advance(60'000);  // past the backoff
    Changes ch;
    v1::AttemptPart part;
    part.set_worker_id("w" + std::to_string(i));
    table_.Assign(id, {part}, "", &ch);
    for (const auto& a : ch.batch.of<AttemptsTable>()) snapshot.of<AttemptsTable>().push_back(a);
    table_.AttemptFailed(table_.FindCurrentAttempt(table_.Find(id)->current().id()), "exit 3", 3,
                         true, &ch);
  }
  std::vector<v1::Attempt> history = table_.History(id);
  ASSERT_EQ(history.size(), 2u);
  EXPECT_EQ(history[0].number(), 1);
  EXPECT_EQ(history[0].parts(0).worker_id(), "w0");
  EXPECT_EQ(history[1].number(), 2);
  EXPECT_EQ(history[1].result(), "exit 3");
  ASSERT_EQ(snapshot.of<AttemptsTable>().size(), 1u);  // the replaced one; the current is the job's
  snapshot.of<JobsTable>().push_back(*table_.Find(id));
  JobTable loaded(&clock_);
  loaded.Load(snapshot);
  EXPECT_EQ(loaded.History(id).size(), 2u);
  EXPECT_EQ(loaded.History(id)[0].parts(0).worker_id(), "w0");
}

}  // namespace
}  // namespace stemma::coordinator
