// Fault tests: kill -9 the coordinator or a worker mid-flight (real processes).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "common/rpc.h"
#include "stemma/v1/worker_service.grpc.pb.h"
#include "tests/integration/cluster.h"

namespace stemma::testing {
namespace {

std::string RunCommand(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

TEST(Fault, CoordinatorKilledWith200JobsInFlightLosesNothing) {
  Cluster c;
  c.lease_ms = 3000;
  c.StartCoordinator();
  Cluster::WorkerOptions o;
  o.cpus = 16;
  c.StartWorker("w0", o);
  c.StartWorker("w1", o);
  c.WaitForWorkers(2);
  const std::string done = c.dir() + "/done.txt";
  std::vector<std::string> acked;
  for (int batch = 0; batch < 4; ++batch) {
    std::string yaml = "jobs:\n";
    for (int i = 0; i < 50; ++i) {
      int ms = 100 + ((batch * 50 + i) * 37) % 700;
      yaml += "  - {name: f" + std::to_string(batch * 50 + i) +
              ", exec: {argv: [/bin/sh, -c, 'sleep " + std::to_string(ms / 1000.0) +
              "; echo $STEMMA_JOB_ID >> " + done + "']}}\n";
    }
    auto ids = c.Submit(yaml, "batch" + std::to_string(batch) + ".yaml");
    ASSERT_EQ(ids.size(), 50u);
    acked.insert(acked.end(), ids.begin(), ids.end());
  }
  // Let some finish and some run, then crash the coordinator.
  ASSERT_TRUE(c.WaitUntil([&] {
    std::string text = Cluster::ReadFile(done);
    return std::count(text.begin(), text.end(), '\n') >= 20;
  }));
  c.KillCoordinator(SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(800));  // attempts finish meanwhile
  c.StartCoordinator();

  for (const auto& id : acked) {
    ASSERT_EQ(c.WaitFor(id, {"SUCCEEDED", "FAILED", "CANCELLED"}, 120), "SUCCEEDED") << id;
  }
  // Every acknowledged job is there, ran exactly once, and was not restarted.
  std::map<std::string, int> runs;
  std::istringstream in(Cluster::ReadFile(done));
  for (std::string line; std::getline(in, line);) runs[line]++;
  auto all = c.Cli({"ls", "--all", "-o", "json"}).Json();
  EXPECT_EQ(all.size(), acked.size());
  for (const auto& j : all) {
    EXPECT_EQ(j["attempts"], 1) << j["id"];
  }
  for (const auto& id : acked) EXPECT_EQ(runs[id], 1) << id;

  c.KillCoordinator(SIGTERM);
  std::string check =
      RunCommand("sqlite3 " + c.coordinator_data() + "/stemma.db 'PRAGMA integrity_check'");
  EXPECT_EQ(check, "ok\n");
}

TEST(Fault, KilledWorkerIsLostAfterItsLeaseAndTheRetryLimitHolds) {
  Cluster c;
  c.lease_ms = 1500;
  c.StartCoordinator();
  c.StartWorker("w0");
  c.WaitForWorkers(1);
  const std::string dir = c.dir();
  auto ids = c.Submit(
      "name: long\nmax_attempts: 2\nbackoff: {initial_ms: 100}\n"
      "exec: {argv: [/bin/sh, -c, 'echo $$ > " +
      dir + "/pid-$STEMMA_ATTEMPT_ID; sleep 300']}\n");
  ASSERT_EQ(c.WaitFor(ids[0], {"RUNNING"}), "RUNNING");
  std::string pidfile = dir + "/pid-" + ids[0] + ".1";
  ASSERT_TRUE(c.WaitUntil([&] { return !Cluster::ReadFile(pidfile).empty(); }));
  pid_t child = std::stoi(Cluster::ReadFile(pidfile));

  c.KillWorker("w0", SIGKILL);
  // The attempt's process does not outlive its worker.
  EXPECT_TRUE(c.WaitUntil([&] { return !ProcessAlive(child); }, 20));
  // After the lease, the job is requeued; a new worker takes attempt 2.
  c.StartWorker("w1");
  ASSERT_TRUE(c.WaitUntil(
      [&] {
        auto j = c.Get(ids[0]);
        return j["attempts"] == 2 && j["state"] == "RUNNING";
      },
      30));
  auto workers = c.Cli({"workers", "-o", "json"}).Json();
  for (const auto& w : workers) {
    if (w["id"] == "w0") EXPECT_EQ(w["state"], "LOST");
  }
  c.KillWorker("w1", SIGKILL);
  ASSERT_EQ(c.WaitFor(ids[0], {"FAILED"}, 30), "FAILED");
  auto job = c.Get(ids[0]);
  EXPECT_EQ(job["attempts"], 2);
  std::string reason = job["reason"];
  EXPECT_NE(reason.find("lost"), std::string::npos) << reason;
  EXPECT_NE(reason.find("2 of 2"), std::string::npos) << reason;
}

TEST(Fault, WorkerRestartedWithTheSameNameKeepsServing) {
  Cluster c;
  c.StartCoordinator();
  c.StartWorker("w0");
  c.WaitForWorkers(1);
  auto ids = c.Submit("noop: {duration_ms: 60000}\nmax_attempts: 2\nbackoff: {initial_ms: 50}\n");
  ASSERT_EQ(c.WaitFor(ids[0], {"RUNNING"}), "RUNNING");
  c.KillWorker("w0", SIGKILL);
  c.StartWorker("w0");
  // The restarted worker reports nothing running: the attempt is lost at once and the
  // job runs again as attempt 2 (no need to wait for the lease).
  ASSERT_TRUE(c.WaitUntil([&] { return c.Get(ids[0])["attempts"] == 2; }, 30));
  EXPECT_EQ(c.Cli({"cancel", ids[0]}).exit_code, 0);
}

// A submit whose answer is lost in a crash (after the commit, before the reply): the CLI
// sends it again with the idempotency key it chose itself, reaches the restarted
// coordinator, and prints the job that was committed. One job, no error, no duplicate.
TEST(Fault, SubmitAnsweredByACrashIsRetriedWithItsKeyAndNeverDuplicated) {
  Cluster c;
  pid_t doomed = c.SpawnCoordinator({}, {"STEMMA_FAILPOINTS=submit_after_commit"});
  ASSERT_TRUE(c.WaitUntil([&] { return c.Cli({"ls"}).exit_code == 0; }, 20));
  const std::string file = c.WriteFile("one.yaml", "name: once\nnoop: {duration_ms: 1}\n");
  CliResult submit;
  std::thread client([&] { submit = c.Cli({"--timeout", "30", "submit", "-f", file}); });
  EXPECT_EQ(c.WaitExit(doomed, 20), 137);  // died between commit and reply
  c.StartCoordinator();
  client.join();
  EXPECT_EQ(submit.exit_code, 0) << submit.err;
  auto all = c.Cli({"ls", "--all", "-o", "json"}).Json();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(submit.out.substr(0, submit.out.find_first_of(" \n")), all[0]["id"]);
}

// A worker whose stream stops reading holds up its own stream only: the coordinator keeps
// committing and answering everyone else (issue 11, "no commit waits on a slow peer").
TEST(Fault, AWorkerStreamThatStopsReadingDoesNotStallOtherClients) {
  Cluster c;
  c.lease_ms = 60000;  // the stuck worker stays registered for the whole test
  c.heartbeat_ms = 1000;
  c.StartCoordinator();
  auto channel = grpc::CreateChannel(c.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::WorkerService::NewStub(channel);
  grpc::ClientContext ctx;
  auto stream = stub->Session(&ctx);
  v1::WorkerMessage reg;
  auto* info = reg.mutable_register_()->mutable_info();
  info->set_id("w-stuck");
  info->set_cpus(100000);
  info->set_memory_mb(1 << 30);
  reg.mutable_register_()->set_incarnation("stuck");
  reg.mutable_register_()->set_accepts_batches(true);
  ASSERT_TRUE(stream->Write(reg));
  v1::CoordinatorMessage registered;
  ASSERT_TRUE(stream->Read(&registered));  // the only read it will ever do
  std::atomic<bool> stop{false};
  std::thread heartbeats([&] {
    for (uint64_t seq = 1; !stop; ++seq) {
      v1::WorkerMessage hb;
      hb.mutable_heartbeat()->set_seq(seq);
      if (!stream->Write(hb)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  c.WaitForWorkers(1);

  // ~24 MB of assignments for it: far more than TCP and HTTP/2 buffer on loopback.
  std::string labels;
  for (int l = 0; l < 60; ++l)
    labels += (l ? ", l" : "l") + std::to_string(l) + ": " + std::string(240, 'x');
  for (int batch = 0; batch < 8; ++batch) {
    std::string yaml = "jobs:\n";
    for (int i = 0; i < 200; ++i) {
      yaml += "  - {name: big" + std::to_string(batch * 200 + i) + ", labels: {" + labels +
              "}, noop: {duration_ms: 1}}\n";
    }
    CliResult r = c.Cli({"--timeout", "20", "submit", "-f",
                         c.WriteFile("big" + std::to_string(batch) + ".yaml", yaml)});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  // (Listing 24 MB of jobs would pass the send limit: count them on /metrics.)
  auto assigned = [&] {
    std::string scrape = RunShell("curl -s http://" + c.metrics_address() + "/metrics");
    double n = 0;
    std::istringstream in(scrape);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("stemma_coordinator_jobs{", 0) == 0 &&
          line.find("state=\"ASSIGNED\"") != std::string::npos) {
        n += std::stod(line.substr(line.rfind(' ') + 1));
      }
    }
    return n;
  };
  ASSERT_TRUE(c.WaitUntil([&] { return assigned() >= 1500; }, 60)) << assigned();
  // Another client's submit, and a read, still answer within a short deadline.
  for (int i = 0; i < 3; ++i) {
    CliResult r = c.Cli(
        {"--timeout", "5", "submit", "-f", c.WriteFile("small.yaml", "noop: {duration_ms: 1}\n")});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(c.Cli({"--timeout", "5", "workers"}).exit_code, 0);
  }
  auto workers = c.Cli({"workers", "-o", "json"}).Json();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0]["state"], "ALIVE");
  stop = true;
  ctx.TryCancel();
  heartbeats.join();
}

// A submit that gets no answer says it may have been committed and names its key; sending
// again with that key gives one job whatever happened to the first. With no coordinator at
// all, it says so plainly (nothing can have been committed).
TEST(Fault, UnansweredSubmitNamesItsKeyAndTheRetryWithItMakesOneJob) {
  Cluster c;
  const std::string file = c.WriteFile("one.yaml", "name: once\nnoop: {duration_ms: 1}\n");
  CliResult nobody = c.Cli({"--timeout", "5", "submit", "-f", file});
  EXPECT_EQ(nobody.exit_code, 4);  // unreachable
  EXPECT_NE(nobody.err.find("cannot reach the coordinator"), std::string::npos) << nobody.err;
  EXPECT_EQ(nobody.err.find("may have been committed"), std::string::npos) << nobody.err;

  // The coordinator commits, then never answers.
  pid_t stalling = c.SpawnCoordinator({}, {"STEMMA_FAILPOINTS=submit_stall_after_commit"});
  ASSERT_TRUE(c.WaitUntil([&] { return c.Cli({"ls"}).exit_code == 0; }, 20));
  CliResult stalled = c.Cli({"--timeout", "2", "submit", "-f", file});
  ::kill(stalling, SIGKILL);
  c.WaitExit(stalling);
  c.StartCoordinator();
  EXPECT_EQ(stalled.exit_code, 4);
  const size_t at = stalled.err.find("--idempotency-key ");
  ASSERT_NE(at, std::string::npos) << stalled.err;
  EXPECT_NE(stalled.err.find("may have been committed"), std::string::npos) << stalled.err;
  std::string key = stalled.err.substr(at + 18);
  key = key.substr(0, key.find(' '));
  for (int i = 0; i < 2; ++i) {
    CliResult again = c.Cli({"submit", "-f", file, "--idempotency-key", key, "-o", "json"});
    EXPECT_EQ(again.exit_code, 0) << again.err;
    EXPECT_EQ(again.Json().value("existing", false), true) << again.out;  // committed before
  }
  EXPECT_EQ(c.Cli({"ls", "--all", "-o", "json"}).Json().size(), 1u);
}

// kill -9 of the coordinator at random moments while a client keeps submitting, then a
// history check over what the client was told and what the store holds (invariants of
// reliability_perf.md): I1 every acknowledged job exists and finishes; I2 it succeeds once
// (one SUCCEEDED record, outputs of its last attempt); I3 attempt numbers never exceed the
// count and ids follow "<job>.<n>"; I4 nothing stays allocated once all is done; I5 the
// attempt budget holds.
TEST(Fault, RandomCoordinatorKillsUnderSubmitLoadKeepTheInvariants) {
  Cluster c;
  c.lease_ms = 4000;
  c.StartCoordinator();
  Cluster::WorkerOptions o;
  o.cpus = 16;
  c.StartWorker("w0", o);
  c.WaitForWorkers(1);
  const std::string done = c.dir() + "/done.txt";
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<std::string> acked;  // the history: ids the client was told were accepted
  int refused = 0;
  std::thread client([&] {
    for (int batch = 0; !stop; ++batch) {
      std::string yaml = "jobs:\n";
      for (int i = 0; i < 10; ++i) {
        yaml += "  - {name: b" + std::to_string(batch) + "-" + std::to_string(i) +
                ", exec: {argv: [/bin/sh, -c, 'echo $STEMMA_JOB_ID >> " + done + "']}}\n";
      }
      CliResult r = c.Cli({"--timeout", "15", "submit", "-f",
                           c.WriteFile("b" + std::to_string(batch) + ".yaml", yaml)});
      std::lock_guard<std::mutex> lock(mu);
      if (r.exit_code != 0) {
        ++refused;
        continue;
      }
      std::istringstream in(r.out);
      for (std::string line; std::getline(in, line);) {
        if (!line.empty()) acked.push_back(line.substr(0, line.find(' ')));
      }
    }
  });
  const unsigned seed = static_cast<unsigned>(::getpid());
  std::mt19937 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (int kill = 0; kill < 3; ++kill) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300 + rng() % 700));
    c.KillCoordinator(SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 300));
    c.StartCoordinator();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  stop = true;
  client.join();
  ASSERT_GE(acked.size(), 30u) << "refused " << refused;
  std::fprintf(stderr, "history: %zu jobs acknowledged, %d submits refused, 3 kills\n",
               acked.size(), refused);

  // I1, I2: every acknowledged job ends SUCCEEDED.
  for (const auto& id : acked) {
    ASSERT_EQ(c.WaitFor(id, {"SUCCEEDED", "FAILED", "CANCELLED"}, 120), "SUCCEEDED") << id;
  }
  auto all = c.Cli({"ls", "--all", "-o", "json"}).Json();
  std::set<std::string> stored;
  for (const auto& j : all) {
    const std::string id = j["id"];
    EXPECT_TRUE(stored.insert(id).second) << "job listed twice: " << id;
    const int attempts = j["attempts"];
    const int budget = j["max_attempts"];
    EXPECT_LE(attempts, budget) << id;  // I5
    EXPECT_GE(attempts, 1) << id;
    const std::string current = j["attempt_id"];
    EXPECT_EQ(current, id + "." + std::to_string(attempts)) << id;  // I3
  }
  for (const auto& id : acked) EXPECT_TRUE(stored.count(id)) << "acknowledged, then lost: " << id;
  // Every acknowledged job ran at least once (at-least-once execution).
  std::set<std::string> ran;
  std::istringstream in(Cluster::ReadFile(done));
  for (std::string line; std::getline(in, line);) ran.insert(line);
  for (const auto& id : acked) EXPECT_TRUE(ran.count(id)) << id << " never ran";
  // I4: once everything is done, nothing is allocated.
  ASSERT_TRUE(c.WaitUntil(
      [&] {
        auto w = c.Cli({"workers", "-o", "json"}).Json();
        return w.size() == 1 && w[0].value("cpus_in_use", 0.0) == 0 &&
               w[0].value("attempts", nlohmann::json::array()).empty();
      },
      30))
      << c.Cli({"workers", "-o", "json"}).out;
  c.KillCoordinator(SIGTERM);
  EXPECT_EQ(RunCommand("sqlite3 " + c.coordinator_data() + "/stemma.db 'PRAGMA integrity_check'"),
            "ok\n");
}

// Jobs as large as the limits allow still list: a page that would pass gRPC's 4 MiB send
// limit is cut short and the CLI asks for the rest (the issue: `stemma ls` failed).
TEST(Fault, ListingMoreThanTheSendLimitOfJobsPages) {
  Cluster c;
  c.StartCoordinator();
  std::string labels;
  for (int l = 0; l < 60; ++l)
    labels += (l ? ", l" : "l") + std::to_string(l) + ": " + std::string(240, 'y');
  for (int batch = 0; batch < 2; ++batch) {
    std::string yaml = "jobs:\n";
    for (int i = 0; i < 200; ++i) {
      yaml += "  - {name: big" + std::to_string(batch * 200 + i) + ", labels: {" + labels +
              "}, noop: {duration_ms: 1}}\n";
    }
    ASSERT_EQ(
        c.Cli({"submit", "-f", c.WriteFile("b" + std::to_string(batch) + ".yaml", yaml)}).exit_code,
        0);
  }
  CliResult ls = c.Cli({"ls", "--all", "-o", "json"});
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  EXPECT_EQ(ls.Json().size(), 400u);
  CliResult page = c.Cli({"ls", "--limit", "1000", "-o", "json"});
  ASSERT_EQ(page.exit_code, 0) << page.err;
  EXPECT_EQ(page.Json().size(), 400u);  // the CLI follows short pages up to --limit
}

}  // namespace
}  // namespace stemma::testing
