// Quotas, fair share and what one user's strings may do to another's terminal (issue 25),
// with real processes: a coordinator with TLS, tokens and a quota file, workers, and the CLI
// as each user. Ordering is asserted, never wall-clock times (tests/bench/fairness measures
// the shares).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "tests/integration/cluster.h"

namespace stemma::testing {
namespace {

std::string FirstWord(const std::string& out) { return out.substr(0, out.find_first_of(" \n")); }

class QuotaCluster : public ::testing::Test {
 protected:
  void Start(const std::string& quotas) {
    quotas_ = c_.WriteFile("quotas.yaml", quotas);
    c_.EnableTls();
    c_.EnableTokens();
    c_.StartCoordinator({"--quotas", quotas_});
    bob_ = c_.CreateToken("user", "bob");
    carol_ = c_.CreateToken("user", "carol");
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // token file reload
  }
  // Submits `n` noop jobs of `ms` each as `token`; their ids.
  std::vector<std::string> SubmitAs(const std::string& token, int n, int ms,
                                    const std::string& extra = "") {
    std::string yaml = "jobs:\n";
    for (int i = 0; i < n; ++i) {
      yaml += "  - {noop: {duration_ms: " + std::to_string(ms) + "}" + extra + "}\n";
    }
    const std::string file = c_.WriteFile("jobs-" + std::to_string(files_++) + ".yaml", yaml);
    CliResult r = c_.CliAs(token, {"submit", "-f", file, "-o", "json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<std::string> ids;
    if (r.exit_code != 0) return ids;
    const nlohmann::json j = r.Json();
    for (const auto& id : j["job_ids"]) ids.push_back(id);
    return ids;
  }
  CliResult SubmitOne(const std::string& token, const std::string& body) {
    const std::string file = c_.WriteFile("one-" + std::to_string(files_++) + ".yaml", body);
    return c_.CliAs(token, {"submit", "-f", file});
  }

  Cluster c_;
  std::string quotas_, bob_, carol_;
  int files_ = 0;
};

TEST_F(QuotaCluster, LimitsAreRefusedAtSubmitNamingTheLimitAndReloaded) {
  Start("default: {max_queued_jobs: 4, priority: [0, 100], max_running_gpus: 2}\n");
  // Medium #11: a priority nobody may set.
  CliResult top = SubmitOne(bob_, "noop: {}\npriority: 2147483647\n");
  EXPECT_EQ(top.exit_code, 3);  // refused by the coordinator
  EXPECT_NE(top.err.find("priority: 2147483647 is outside 0..100"), std::string::npos) << top.err;
  CliResult big = SubmitOne(bob_, "noop: {}\nresources: {gpus: 4}\n");
  EXPECT_EQ(big.exit_code, 3);
  EXPECT_NE(big.err.find("max_running_gpus 2"), std::string::npos) << big.err;

  // No worker: everything stays QUEUED.
  EXPECT_EQ(SubmitAs(bob_, 4, 0).size(), 4u);
  CliResult over = SubmitOne(bob_, "noop: {}\n");
  EXPECT_EQ(over.exit_code, 3);
  EXPECT_NE(over.err.find("max_queued_jobs 4"), std::string::npos) << over.err;
  EXPECT_NE(over.err.find("bob has 4 jobs waiting"), std::string::npos) << over.err;
  // carol has her own count.
  EXPECT_EQ(SubmitOne(carol_, "noop: {}\n").exit_code, 0);

  // The admin raises bob's limit: the file is read again without a restart.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // a new mtime
  c_.WriteFile("quotas.yaml",
               "default: {max_queued_jobs: 4, priority: [0, 100]}\n"
               "subjects: {bob: {max_queued_jobs: 8}}\n");
  EXPECT_TRUE(c_.WaitUntil([&] { return SubmitOne(bob_, "noop: {}\n").exit_code == 0; }, 20));
}

TEST_F(QuotaCluster, OneUsersBacklogDoesNotHoldBackAnothersJob) {
  Start("fair_share: {half_life: 1h}\n");
  Cluster::WorkerOptions one;
  one.cpus = 1;
  c_.StartWorker("w1", one);
  c_.WaitForWorkers(1);
  std::vector<std::string> bob = SubmitAs(bob_, 30, 100);
  ASSERT_EQ(bob.size(), 30u);
  std::vector<std::string> carol = SubmitAs(carol_, 1, 100);
  ASSERT_EQ(carol.size(), 1u);
  ASSERT_EQ(c_.WaitFor(carol[0], {"SUCCEEDED"}, 120), "SUCCEEDED");
  for (const auto& id : bob) ASSERT_EQ(c_.WaitFor(id, {"SUCCEEDED"}, 120), "SUCCEEDED");
  const int64_t carol_started = c_.Get(carol[0])["started_ms"];
  int after = 0;
  for (const auto& id : bob) after += c_.Get(id)["started_ms"].get<int64_t>() > carol_started;
  // In submission order carol's job would have run last; with fair share it runs as soon as
  // the one slot frees.
  EXPECT_GE(after, 25) << "bob's jobs that started after carol's";
}

TEST_F(QuotaCluster, RunningGpusStayWithinTheOwnersLimit) {
  Start("subjects: {bob: {max_running_gpus: 1}}\n");
  Cluster::WorkerOptions gpus;
  gpus.gpus = 4;
  c_.StartWorker("w1", gpus);
  c_.WaitForWorkers(1);
  std::vector<std::string> bob = SubmitAs(bob_, 4, 300, ", resources: {gpus: 1}");
  ASSERT_EQ(bob.size(), 4u);
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const auto& id : bob) {
    ASSERT_EQ(c_.WaitFor(id, {"SUCCEEDED"}, 120), "SUCCEEDED");
    nlohmann::json j = c_.Get(id);
    spans.emplace_back(j["started_ms"].get<int64_t>(), j["finished_ms"].get<int64_t>());
  }
  std::sort(spans.begin(), spans.end());
  // One at a time, although the worker had four GPUs free.
  for (size_t i = 1; i < spans.size(); ++i) {
    EXPECT_GE(spans[i].first, spans[i - 1].second) << "job " << i << " overlapped the one before";
  }
}

// Medium #9: strings from an engine (here an exec job speaking the engine's event protocol)
// with escape sequences and line breaks reach another user's `ls`, `get` and `metrics`.
TEST_F(QuotaCluster, EscapeSequencesFromAJobNeverReachATerminalRaw) {
  Start("");
  c_.StartWorker("w1");
  c_.WaitForWorkers(1);
  const std::string script = c_.WriteFile(
      "evil.sh",
      "#!/bin/sh\n"
      "printf '{\"event\":\"metric\",\"name\":\"ppl/\\\\u001b]0;pwned\\\\u0007uk\\\\nj-999   "
      "FORGED\",\"value\":1,\"step\":1}\\n'\n"
      "printf 'stemma-engine: error: bad \\033[31mred\\033[0m\\rj-998   FORGED\\n' >&2\n"
      "exit 4\n");
  RunShell("chmod +x " + script);
  CliResult sub = SubmitOne(bob_, "exec: {argv: [" + script + "]}\n");
  ASSERT_EQ(sub.exit_code, 0) << sub.err;
  const std::string id = FirstWord(sub.out);
  ASSERT_EQ(c_.WaitFor(id, {"FAILED", "SUCCEEDED"}, 60), "FAILED");
  bool escaped = false;
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"ls"}, {"ls", "-o", "wide"}, {"get", id}, {"metrics", id}, {"watch", id}}) {
    SCOPED_TRACE(args[0]);
    CliResult r = c_.CliAs(carol_, args);
    for (const std::string& text : {r.out, r.err}) {
      EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
      EXPECT_EQ(text.find('\x07'), std::string::npos) << text;
      EXPECT_EQ(text.find('\r'), std::string::npos) << text;
      // No line of its own: a forged row would start with the forged id.
      EXPECT_EQ(text.find("\nj-99"), std::string::npos) << text;
    }
    escaped |= r.out.find("\\u001b") != std::string::npos;
  }
  EXPECT_TRUE(escaped) << "the escape sequence should show, escaped";
}

// Low: /metrics names every user's experiments, stages and metrics. With --metrics-auth it
// answers only to the credentials in that file (mode 0600), as Prometheus's basic_auth sends.
TEST(MetricsAuth, MetricsAnswerOnlyWithTheCredentialsWhenGiven) {
  Cluster c;
  const std::string loose = c.WriteFile("metrics-loose", "prom:s3cret\n");
  RunShell("chmod 644 " + loose);
  EXPECT_EQ(c.WaitExit(c.SpawnCoordinator({"--metrics-auth", loose})), 2);
  const std::string creds = c.WriteFile("metrics-auth", "prom:s3cret\n");
  RunShell("chmod 600 " + creds);
  c.StartCoordinator({"--metrics-auth", creds});
  const std::string url = "http://" + c.metrics_address() + "/metrics";
  EXPECT_EQ(RunShell("curl -s -o /dev/null -w '%{http_code}' " + url), "401");
  EXPECT_EQ(RunShell("curl -s -o /dev/null -w '%{http_code}' -u prom:wrong " + url), "401");
  EXPECT_NE(RunShell("curl -s -u prom:s3cret " + url).find("stemma_coordinator_jobs"),
            std::string::npos);
}

}  // namespace
}  // namespace stemma::testing
