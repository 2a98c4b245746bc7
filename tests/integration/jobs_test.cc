// End-to-end behaviour of jobs on a real coordinator, real workers and the CLI.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>

#include "tests/integration/cluster.h"

namespace stemma::testing {
namespace {

class JobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    c_.StartCoordinator();
    c_.StartWorker("w0");
    c_.WaitForWorkers(1);
  }
  // An exec job running a shell snippet (the shell is the program under test here).
  static std::string Sh(const std::string& name, const std::string& script,
                        const std::string& extra = "") {
    std::string quoted;
    for (char ch : script) {
      if (ch == '"' || ch == '\\') quoted += '\\';
      quoted += ch;
    }
    return "name: " + name + "\nexec: {argv: [/bin/sh, -c, \"" + quoted + "\"]}\n" + extra;
  }
  Cluster c_;
};

TEST_F(JobsTest, DagRunsInOrderAndAFailedDependencyFailsItsDependents) {
  std::string order = c_.dir() + "/order.txt";
  auto ids = c_.Submit(Sh("a", "echo a >> " + order) + "---\n" +
                       Sh("b", "echo b >> " + order, "depends_on: [a]\n") + "---\n" +
                       Sh("c", "echo c >> " + order, "depends_on: [a, b]\n") + "---\n" +
                       "name: broken\nnoop: {exit_code: 3}\nmax_attempts: 1\ndepends_on: [c]\n"
                       "---\nname: after-broken\nnoop: {}\ndepends_on: [broken]\n");
  ASSERT_EQ(ids.size(), 5u);
  EXPECT_EQ(c_.WaitFor(ids[4], {"SUCCEEDED", "FAILED", "CANCELLED"}), "FAILED");
  EXPECT_EQ(Cluster::ReadFile(order), "a\nb\nc\n");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c_.State(ids[i]), "SUCCEEDED");
  auto broken = c_.Get(ids[3]);
  EXPECT_EQ(broken["state"], "FAILED");
  EXPECT_EQ(broken["exit_code"], 3);
  auto after = c_.Get(ids[4]);
  std::string reason = after["reason"];
  EXPECT_NE(reason.find("dependency " + ids[3] + " (broken) failed"), std::string::npos) << reason;
  EXPECT_EQ(after["attempts"], 0);  // it never ran
}

TEST_F(JobsTest, CancelKillsTheWholeProcessGroup) {
  std::string pidfile = c_.dir() + "/child.pid";
  auto ids = c_.Submit(Sh("sleeper", "sleep 300 & echo $! > " + pidfile + "; wait"));
  ASSERT_EQ(c_.WaitFor(ids[0], {"RUNNING"}), "RUNNING");
  ASSERT_TRUE(c_.WaitUntil([&] { return !Cluster::ReadFile(pidfile).empty(); }));
  pid_t child = std::stoi(Cluster::ReadFile(pidfile));
  ASSERT_TRUE(ProcessAlive(child));
  auto r = c_.Cli({"cancel", ids[0]});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(c_.State(ids[0]), "CANCELLED");
  // The grandchild (same process group) goes too.
  EXPECT_TRUE(c_.WaitUntil([&] { return !ProcessAlive(child); }, 20));
  // The worker's GPUs/CPUs are free again: a new job runs.
  auto next = c_.Submit("noop: {}\n");
  EXPECT_EQ(c_.WaitFor(next[0], {"SUCCEEDED"}), "SUCCEEDED");
}

TEST_F(JobsTest, RetriesFollowBackoffAndTheLimitThenRetryRevives) {
  std::string stamps = c_.dir() + "/stamps.txt";
  auto ids = c_.Submit(Sh("flaky", "date +%s%N >> " + stamps + "; exit 4",
                          "max_attempts: 3\nbackoff: {initial_ms: 300, multiplier: 2}\n"));
  EXPECT_EQ(c_.WaitFor(ids[0], {"FAILED"}), "FAILED");
  auto job = c_.Get(ids[0]);
  EXPECT_EQ(job["attempts"], 3);
  EXPECT_EQ(job["exit_code"], 4);
  std::istringstream in(Cluster::ReadFile(stamps));
  std::vector<int64_t> t;
  for (int64_t ns; in >> ns;) t.push_back(ns / 1000000);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_GE(t[1] - t[0], 300);  // first retry after the initial backoff
  EXPECT_GE(t[2] - t[1], 600);  // then doubled
  auto r = c_.Cli({"retry", ids[0]});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(c_.WaitFor(ids[0], {"FAILED"}), "FAILED");
  EXPECT_EQ(c_.Get(ids[0])["attempts"], 6);
}

TEST_F(JobsTest, LogsAreShippedAndOutliveACoordinatorRestart) {
  auto ids = c_.Submit(Sh("talker", "echo hello from stemma; echo to stderr >&2"));
  ASSERT_EQ(c_.WaitFor(ids[0], {"SUCCEEDED"}), "SUCCEEDED");
  ASSERT_TRUE(c_.WaitUntil(
      [&] {
        return c_.Cli({"logs", ids[0]}).out.find("to stderr") != std::string::npos;
      },
      20));
  c_.KillCoordinator(SIGTERM);
  c_.StartCoordinator();
  auto r = c_.Cli({"logs", ids[0]});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("hello from stemma"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("to stderr"), std::string::npos) << r.out;
}

TEST_F(JobsTest, LogsFollowStreamsUntilTheJobEnds) {
  auto ids = c_.Submit(Sh("slow-talker", "for i in 1 2 3; do echo line$i; sleep 0.3; done"));
  auto r = c_.Cli({"logs", "-f", ids[0]});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "line1\nline2\nline3\n");
}

TEST_F(JobsTest, ArgvIsNeverInterpretedByAShell) {
  std::string marker = c_.dir() + "/pwned";
  auto ids = c_.Submit("exec: {argv: [/bin/echo, \"; touch " + marker + "\", \"$(touch " + marker +
                       ")\"]}\n");
  ASSERT_EQ(c_.WaitFor(ids[0], {"SUCCEEDED"}), "SUCCEEDED");
  EXPECT_FALSE(std::filesystem::exists(marker));
  ASSERT_TRUE(c_.WaitUntil([&] { return !c_.Cli({"logs", ids[0]}).out.empty(); }, 20));
  EXPECT_NE(c_.Cli({"logs", ids[0]}).out.find("; touch"), std::string::npos);
}

TEST_F(JobsTest, BadInputGetsAClearErrorAndChangesNothing) {
  struct Case {
    std::string yaml;
    std::string expect;
  };
  std::string big(5 * 1024 * 1024, 'x');
  std::vector<Case> cases = {
      {"noop: {}\nresorces: {gpus: 1}\n", "resorces"},
      {"noop: {}\nresources: {gpus: -1}\n", "resources.gpus"},
      {"noop: {}\nresources: {memory_mb: 999999999999}\n", "resources.memory_mb"},
      {"noop: {}\nresources: {gpus: 1000000}\n", "resources.gpus"},
      {"name: a\nnoop: {}\ndepends_on: [b]\n---\nname: b\nnoop: {}\ndepends_on: [a]\n",
       "dependency cycle"},
      {"noop: {}\ndepends_on: [j-424242]\n", "unknown job 'j-424242'"},
      {"name: " + big + "\nnoop: {}\n", ""},  // over the message limit
      {"name: nothing-to-run\n", "kind"},
  };
  for (const auto& c : cases) {
    auto r = c_.Cli({"submit", "-f", c_.WriteFile("bad.yaml", c.yaml)});
    EXPECT_NE(r.exit_code, 0) << c.expect;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;  // one line
    EXPECT_NE(r.err.find("error"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
  }
  auto ls = c_.Cli({"ls", "--all", "-o", "json"});
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  EXPECT_EQ(ls.Json().size(), 0u);
}

TEST(ExecPolicy, RefusedWhenNoWorkerAllowsExec) {
  Cluster c;
  c.StartCoordinator();
  Cluster::WorkerOptions o;
  o.allow_exec = false;
  c.StartWorker("w0", o);
  c.WaitForWorkers(1);
  std::string marker = c.dir() + "/ran";
  auto r = c.Cli({"submit", "-f",
                  c.WriteFile("exec.yaml", "exec: {argv: [/usr/bin/touch, " + marker + "]}\n")});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--allow-exec"), std::string::npos) << r.err;
  EXPECT_EQ(c.Cli({"ls", "--all", "-o", "json"}).Json().size(), 0u);
  EXPECT_FALSE(std::filesystem::exists(marker));
}

TEST(Placement, GpusAreExclusiveAndVisibleToTheChild) {
  Cluster c;
  c.StartCoordinator();
  Cluster::WorkerOptions o;
  o.gpus = 2;
  c.StartWorker("w0", o);
  c.WaitForWorkers(1);
  std::string dir = c.dir();
  auto ids = c.Submit(
      "name: g1\nresources: {gpus: 1}\nexec: {argv: [/bin/sh, -c, 'echo $CUDA_VISIBLE_DEVICES > " +
      dir +
      "/g1; sleep 1']}\n---\n"
      "name: g2\nresources: {gpus: 1}\nexec: {argv: [/bin/sh, -c, 'echo $CUDA_VISIBLE_DEVICES > " +
      dir +
      "/g2; sleep 1']}\n---\n"
      "name: g3\nresources: {gpus: 2}\nexec: {argv: [/bin/sh, -c, 'echo $CUDA_VISIBLE_DEVICES > " +
      dir + "/g3']}\n");
  for (const auto& id : ids) ASSERT_EQ(c.WaitFor(id, {"SUCCEEDED"}), "SUCCEEDED");
  std::set<std::string> singles = {Cluster::ReadFile(dir + "/g1"), Cluster::ReadFile(dir + "/g2")};
  EXPECT_EQ(singles, (std::set<std::string>{"0\n", "1\n"}));
  EXPECT_EQ(Cluster::ReadFile(dir + "/g3"), "0,1\n");
}

TEST(Placement, GangJobGetsRanksWorldSizeAndRendezvousOnDistinctWorkers) {
  Cluster c;
  c.StartCoordinator();
  c.StartWorker("w0");
  c.StartWorker("w1");
  c.WaitForWorkers(2);
  std::string dir = c.dir();
  auto ids = c.Submit(
      "name: gang\nnodes: 2\nexec: {argv: [/bin/sh, -c, 'echo $RANK $WORLD_SIZE "
      "$MASTER_ADDR:$MASTER_PORT > " +
      dir + "/rank$RANK']}\n");
  ASSERT_EQ(c.WaitFor(ids[0], {"SUCCEEDED", "FAILED"}), "SUCCEEDED");
  std::string r0 = Cluster::ReadFile(dir + "/rank0"), r1 = Cluster::ReadFile(dir + "/rank1");
  EXPECT_EQ(r0.substr(0, 4), "0 2 ");
  EXPECT_EQ(r1.substr(0, 4), "1 2 ");
  EXPECT_EQ(r0.substr(4), r1.substr(4));  // same rendezvous
  auto job = c.Get(ids[0]);
  std::set<std::string> workers(job["workers"].begin(), job["workers"].end());
  EXPECT_EQ(workers, (std::set<std::string>{"w0", "w1"}));
}

TEST(Placement, DrainedWorkerGetsNoNewJobs) {
  Cluster c;
  c.StartCoordinator();
  c.StartWorker("w0");
  c.StartWorker("w1");
  c.WaitForWorkers(2);
  auto r = c.Cli({"drain", "w0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string yaml;
  for (int i = 0; i < 6; ++i) yaml += (i ? "---\n" : "") + std::string("noop: {duration_ms: 50}\n");
  auto ids = c.Submit(yaml);
  for (const auto& id : ids) {
    ASSERT_EQ(c.WaitFor(id, {"SUCCEEDED"}), "SUCCEEDED");
    EXPECT_EQ(c.Get(id)["workers"][0], "w1");
  }
  auto workers = c.Cli({"workers", "-o", "json"}).Json();
  for (const auto& w : workers) {
    if (w["id"] == "w0") EXPECT_EQ(w["state"], "DRAINING");
  }
}

TEST_F(JobsTest, WatchStreamsStateChanges) {
  auto ids = c_.Submit("noop: {duration_ms: 300}\n");
  auto r = c_.Cli({"watch", ids[0], "-o", "json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::istringstream in(r.out);
  std::vector<std::string> states;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded()) states.push_back(j.contains("state") ? j["state"] : j["job"]["state"]);
  }
  ASSERT_FALSE(states.empty()) << r.out;
  EXPECT_EQ(states.back(), "SUCCEEDED");
}

TEST_F(JobsTest, MetricsEndpointServesTheCoordinatorSeries) {
  c_.Submit("noop: {}\n");
  std::string cmd = "curl -sf http://" + c_.metrics_address() + "/metrics > " + c_.dir() + "/m.txt";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::string m = Cluster::ReadFile(c_.dir() + "/m.txt");
  for (const char* name :
       {"stemma_coordinator_jobs{", "stemma_coordinator_job_transitions_total",
        "stemma_scheduler_queue_wait_seconds", "stemma_scheduler_latency_seconds",
        "stemma_rpc_server_handling_seconds", "stemma_coordinator_workers{",
        "stemma_coordinator_gpus{", "stemma_coordinator_heartbeat_age_seconds",
        "stemma_store_transaction_seconds"}) {
    EXPECT_NE(m.find(name), std::string::npos) << name;
  }
}

}  // namespace
}  // namespace stemma::testing
