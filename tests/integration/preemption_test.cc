// Priority preemption with checkpoint-aware resume (issue 24), on a real coordinator, worker
// and stemma-engine: a low-priority training run on a full worker is preempted mid-training
// by a high-priority job, which starts; the run saves its checkpoint at once, is requeued
// without spending an attempt, resumes from that checkpoint, and ends with the same losses
// and the same weights as a run that was never interrupted.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tests/integration/cluster.h"

namespace stemma::testing {
namespace {

// `keep`: checkpoints kept; it changes nothing in the run but its cache key (an equal spec
// would be served from the other job's result).
std::string TrainJob(const std::string& name, const std::string& model, const std::string& data,
                     const std::string& out, int keep) {
  return "name: " + name + R"(
priority: 0
resources: {cpus: 1}
train:
  model: )" +
         model + R"(
  data: {datasets: [{path: )" +
         data + R"(}], seq_len: 16}
  out: )" +
         out + R"(
  batch_size: 2
  steps: 300
  log_every: 1
  checkpoint: {every: 100, keep: )" +
         std::to_string(keep) + R"(}
)";
}

// One worker with one CPU, so that a second job can only start by preempting the first.
void StartOneCpuWorker(Cluster& c, std::vector<std::string> extra = {}) {
  Cluster::WorkerOptions w;
  w.cpus = 1;
  w.extra = std::move(extra);
  c.StartWorker("w1", w);
  c.WaitForWorkers(1);
}

// A low-priority exec job that holds the worker's one CPU for 3 s (`extra`: more spec
// lines). Returns its id.
std::string SubmitLow(Cluster& c, const std::string& extra = "") {
  return c.Submit("name: low\n" + extra + R"(resources: {cpus: 1}
exec: {argv: [/bin/sh, -c, "sleep 3"]}
)")[0];
}

// The high-priority job that preempts: one CPU, done at once. Returns its id.
std::string SubmitHigh(Cluster& c) {
  return c.Submit(R"(name: high
priority: 10
resources: {cpus: 1}
exec: {argv: [/bin/true]}
)",
                  "high.yaml")[0];
}

// step -> loss, over every attempt of the job.
std::map<int64_t, double> Losses(const Cluster& c, const std::string& id,
                                 std::map<int64_t, int>* counts = nullptr) {
  const CliResult m = c.Cli({"metrics", id, "--name", "loss", "-o", "json"});
  EXPECT_EQ(m.exit_code, 0) << m.err;
  std::map<int64_t, double> out;
  for (const auto& p : m.Json()) {
    const int64_t step = p["step"].get<int64_t>();
    out[step] = p["value"].get<double>();
    if (counts != nullptr) ++(*counts)[step];
  }
  return out;
}

TEST(Preemption, ALowPriorityRunIsPreemptedResumesFromItsCheckpointAndEndsTheSame) {
  if (!std::filesystem::exists(Cluster::BinDir() + "/stemma-engine")) {
    GTEST_SKIP() << "stemma-engine is not built (STEMMA_BUILD_ENGINE=OFF)";
  }
  Cluster c;
  c.StartCoordinator({"--preemption-grace-s", "300"});
  const std::string root = c.dir() + "/store";
  std::filesystem::create_directories(root);
  {
    std::ofstream text(root + "/en.txt");
    for (int i = 0; i < 200; ++i)
      text << "the quick brown fox " << i << " jumps over the lazy dog\n";
  }
  StartOneCpuWorker(c, {"--storage-root", root});
  ASSERT_EQ(c.Cli({"sweep", "-f", c.WriteFile("prep.yaml", R"(name: prep
stages:
  base:
    init: {arch: llama, preset: tiny, seed: 3}
  tok:
    needs: [base]
    tokenize: {tokenizer: "${{ needs.base.outputs.model }}", input: [en.txt], format: text, line_docs: true, language: en}
)")})
                .exit_code,
            0);
  const CliResult prep = c.Cli({"exp", "wait", "prep", "--timeout", "300"});
  ASSERT_EQ(prep.exit_code, 0) << prep.out << prep.err;
  std::string model, data;
  const nlohmann::json exp = c.Cli({"exp", "get", "prep", "-o", "json"}).Json();
  for (const auto& cell : exp["cells"]) {  // bound first: a temporary's cells would dangle
    const nlohmann::json job = c.Get(cell["job_id"]);
    if (job["outputs"].contains("model")) model = job["outputs"]["model"];
    if (job["outputs"].contains("dataset")) data = job["outputs"]["dataset"];
  }
  ASSERT_FALSE(model.empty() || data.empty());

  // The low-priority run, then a high-priority job once it is well into its steps (and
  // between its periodic checkpoints).
  const std::string victim =
      c.Submit(TrainJob("victim", model, data, root + "/victim", 2), "victim.yaml")[0];
  ASSERT_TRUE(
      c.WaitUntil([&] { return c.Get(victim)["progress"]["step"].get<int64_t>() >= 30; }, 300))
      << c.Cli({"get", victim}).out;
  const std::string high = c.Submit(R"(name: urgent
priority: 10
resources: {cpus: 1}
exec: {argv: [/bin/sh, -c, "sleep 1"]}
)",
                                    "urgent.yaml")[0];
  EXPECT_EQ(c.WaitFor(high, {"SUCCEEDED", "FAILED"}, 300), "SUCCEEDED");
  ASSERT_EQ(c.WaitFor(victim, {"SUCCEEDED", "FAILED"}, 600), "SUCCEEDED")
      << c.Cli({"get", victim}).out;

  // Requeued once, without spending an attempt; `stemma get` says by whom.
  const nlohmann::json job = c.Get(victim);
  EXPECT_EQ(job["preemptions"], 1) << job.dump();
  EXPECT_EQ(job["preempted_by"], high);
  EXPECT_EQ(job["attempts"], 2);
  EXPECT_EQ(job["max_attempts"].get<int>() - job["attempts"].get<int>(),
            c.Get(high)["max_attempts"].get<int>() - 1)
      << "the preempted attempt is not counted: as many attempts left as after one";
  const std::string details = c.Cli({"get", victim}).out;
  EXPECT_NE(details.find("preempted:"), std::string::npos) << details;
  EXPECT_NE(details.find("last by " + high), std::string::npos) << details;

  // The first attempt saved the checkpoint of its last step at once; the second resumed
  // there, so no step ran twice.
  const std::string first_log = c.Cli({"logs", victim, "--attempt", "1"}).out;
  const std::string second_log = c.Cli({"logs", victim, "--attempt", "2"}).out;
  EXPECT_NE(first_log.find("preempted after step"), std::string::npos) << first_log;
  const size_t at = second_log.find("\"resumed_from_step\":");
  ASSERT_NE(at, std::string::npos) << second_log;
  const int64_t resumed = std::stoll(second_log.substr(at + 20));
  EXPECT_GE(resumed, 30);
  EXPECT_LT(resumed, 300);
  // Resumed exactly where the preemption stopped it. (A step that is also a multiple of
  // checkpoint.every is fine: a slow periodic save widens the window in which the preemption
  // lands there, so under load the two often coincide.)
  const size_t said = first_log.find("preempted after step ");
  ASSERT_NE(said, std::string::npos) << first_log;
  EXPECT_EQ(resumed, std::stoll(first_log.substr(said + 20)))
      << "the next attempt resumes from the preemption's step";
  std::map<int64_t, int> counts;
  const std::map<int64_t, double> preempted = Losses(c, victim, &counts);
  int redone = 0;
  for (const auto& [step, n] : counts) redone += n - 1;
  EXPECT_EQ(redone, 0) << "steps logged by both attempts";

  // An uninterrupted run of the same spec: the same loss at every step, the same weights.
  const std::string straight =
      c.Submit(TrainJob("straight", model, data, root + "/straight", 3), "straight.yaml")[0];
  ASSERT_EQ(c.WaitFor(straight, {"SUCCEEDED", "FAILED"}, 600), "SUCCEEDED");
  EXPECT_EQ(c.Get(straight)["preemptions"], 0);
  const std::map<int64_t, double> expected = Losses(c, straight);
  ASSERT_EQ(expected.size(), 300u);
  EXPECT_EQ(preempted, expected);
  const std::string a = Cluster::ReadFile(root + "/victim/model.safetensors");
  const std::string b = Cluster::ReadFile(root + "/straight/model.safetensors");
  EXPECT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the published weights differ from the uninterrupted run's";

  // The coordinator counted it.
  const std::string scrape = RunShell("curl -s http://" + c.metrics_address() + "/metrics");
  EXPECT_NE(scrape.find("stemma_scheduler_preemptions_total{outcome=\"stopped\"} 1"),
            std::string::npos)
      << scrape.substr(0, 2000);
}

// A job that is not an engine trainer (here exec) is terminated when preempted, requeued at
// once, and runs again to its end; its attempt budget grows by the preempted attempt.
TEST(Preemption, AnExecJobIsTerminatedAndRequeuedWithoutSpendingAnAttempt) {
  Cluster c;
  c.StartCoordinator();
  StartOneCpuWorker(c);
  const std::string low = SubmitLow(c, "max_attempts: 1\n");
  ASSERT_EQ(c.WaitFor(low, {"RUNNING"}, 60), "RUNNING");
  const std::string high = SubmitHigh(c);
  EXPECT_EQ(c.WaitFor(high, {"SUCCEEDED"}, 60), "SUCCEEDED");
  EXPECT_EQ(c.WaitFor(low, {"SUCCEEDED", "FAILED"}, 60), "SUCCEEDED");
  const nlohmann::json job = c.Get(low);
  EXPECT_EQ(job["preemptions"], 1);
  EXPECT_EQ(job["preempted_by"], high);
  EXPECT_EQ(job["attempts"], 2);
  EXPECT_EQ(job["max_attempts"], 2) << "max_attempts 1 and one preempted attempt";
}

// Without preemption (`--no-preemption`) the high-priority job waits for the run to end.
TEST(Preemption, NoPreemptionFlagLetsTheRunningJobFinish) {
  Cluster c;
  c.StartCoordinator({"--no-preemption"});
  StartOneCpuWorker(c);
  const std::string low = SubmitLow(c);
  ASSERT_EQ(c.WaitFor(low, {"RUNNING"}, 60), "RUNNING");
  const std::string high = SubmitHigh(c);
  EXPECT_EQ(c.WaitFor(high, {"SUCCEEDED"}, 60), "SUCCEEDED");
  const nlohmann::json job = c.Get(low);
  EXPECT_EQ(job["state"], "SUCCEEDED") << "it ended before the high-priority job started";
  EXPECT_EQ(job["preemptions"], 0);
  EXPECT_EQ(job["attempts"], 1);
}

// A stand-in trainer that never looks at the preempt file: it steps until it is killed.
constexpr const char* kStubbornEngine = R"SH(#!/bin/bash
for ((s = 1; ; s++)); do
  sleep 0.2
  echo "{\"event\":\"step\",\"step\":$s,\"total_steps\":1000000,\"loss\":1}"
done
)SH";

// A victim that does not stop within the grace period is cancelled on its worker and requeued
// anyway, without spending an attempt; the high-priority job starts.
TEST(Preemption, AVictimThatDoesNotStopInTimeIsKilledAndRequeued) {
  Cluster c;
  c.StartCoordinator({"--preemption-grace-s", "2"});
  const std::string root = c.dir() + "/store";
  std::filesystem::create_directories(root);
  const std::string engine = c.WriteFile("stubborn-engine", kStubbornEngine);
  ::chmod(engine.c_str(), 0755);
  StartOneCpuWorker(c, {"--storage-root", root, "--engine", engine});
  const std::string low = c.Submit(R"(name: stubborn
max_attempts: 1
resources: {cpus: 1}
train: {model: base, data: {datasets: [{path: data}], seq_len: 8}, out: out, steps: 1000000}
)")[0];
  ASSERT_TRUE(c.WaitUntil([&] { return c.Get(low)["progress"]["step"].get<int64_t>() >= 2; }, 60));
  const std::string high = SubmitHigh(c);
  EXPECT_EQ(c.WaitFor(high, {"SUCCEEDED"}, 60), "SUCCEEDED");
  const nlohmann::json job = c.Get(low);
  EXPECT_EQ(job["preemptions"], 1);
  EXPECT_EQ(job["preempted_by"], high);
  EXPECT_NE(job["state"], "FAILED") << "max_attempts 1, yet the killed attempt is not counted";
  const std::string scrape = RunShell("curl -s http://" + c.metrics_address() + "/metrics");
  EXPECT_NE(scrape.find("stemma_scheduler_preemptions_total{outcome=\"killed\"} 1"),
            std::string::npos);
  EXPECT_EQ(c.Cli({"cancel", low}).exit_code, 0);
}

}  // namespace
}  // namespace stemma::testing
