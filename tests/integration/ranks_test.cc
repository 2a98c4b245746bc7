// A process per GPU (issue 26): a job whose parts run several ranks, through a real
// coordinator, worker and CLI. On fake GPUs (`--gpus 4`) an exec job of 4 ranks prints what
// each rank got; one rank's crash ends the attempt and the others; cancel ends every rank, and
// so does the worker's death;
// `stemma logs --rank N` reads rank N's log. With the engine built, a CPU train of 2 ranks
// per part follows the loss of the same run in one process.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "tests/integration/cluster.h"

namespace stemma::testing {
namespace {

// The pid a rank printed first ("pid=N"), read back with `stemma logs --rank`; 0 if none yet.
pid_t RankPid(const Cluster& c, const std::string& job, int rank) {
  const CliResult r = c.Cli({"logs", job, "--rank", std::to_string(rank)});
  if (r.exit_code != 0 || r.out.rfind("pid=", 0) != 0) return 0;
  return static_cast<pid_t>(std::atoi(r.out.c_str() + 4));
}

std::vector<pid_t> WaitForRankPids(const Cluster& c, const std::string& job, int ranks) {
  std::vector<pid_t> pids(ranks, 0);
  c.WaitUntil([&] {
    for (int r = 0; r < ranks; ++r) {
      if (pids[r] == 0) pids[r] = RankPid(c, job, r);
    }
    return std::find(pids.begin(), pids.end(), 0) == pids.end();
  });
  return pids;
}

bool AllGone(const Cluster& c, const std::vector<pid_t>& pids) {
  return c.WaitUntil(
      [&] {
        for (pid_t pid : pids) {
          if (pid <= 0 || ProcessAlive(pid)) return false;
        }
        return true;
      },
      30);
}

// An exec job of 4 ranks on the worker's 4 (fake) GPUs running `script`.
std::string FourRanks(const std::string& name, const std::string& script) {
  return "name: " + name +
         "\nmax_attempts: 1\nresources: {gpus: 4, ranks_per_part: 4}\nexec: {argv: [/bin/sh, "
         "-c, \"" +
         script + "\"]}\n";
}

TEST(Ranks, FourRanksOnFakeGpusStartCrashAndCancelTogether) {
  Cluster c;
  c.StartCoordinator();
  Cluster::WorkerOptions w;
  w.gpus = 4;
  c.StartWorker("w1", w);
  c.WaitForWorkers(1);

  // Each rank prints what it got; the job's log is rank 0's, the others' are kept apart.
  const std::string env = c.Submit(
      FourRanks("env",
                "echo RANK=$RANK LOCAL_RANK=$LOCAL_RANK LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE "
                "WORLD_SIZE=$WORLD_SIZE CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"))[0];
  ASSERT_EQ(c.WaitFor(env, {"SUCCEEDED", "FAILED"}), "SUCCEEDED") << c.Get(env).dump();
  for (int r = 0; r < 4; ++r) {
    const CliResult log = c.Cli({"logs", env, "--rank", std::to_string(r)});
    ASSERT_EQ(log.exit_code, 0) << log.err;
    EXPECT_EQ(log.out, "RANK=" + std::to_string(r) + " LOCAL_RANK=" + std::to_string(r) +
                           " LOCAL_WORLD_SIZE=4 WORLD_SIZE=4 CUDA_VISIBLE_DEVICES=0,1,2,3\n");
  }
  EXPECT_EQ(c.Cli({"logs", env}).out, c.Cli({"logs", env, "--rank", "0"}).out);
  const CliResult past = c.Cli({"logs", env, "--rank", "4"});
  EXPECT_NE(past.exit_code, 0);
  EXPECT_NE(past.err.find("rank: job " + env + " has 4 ranks (0..3)"), std::string::npos)
      << past.err;

  // Rank 2 fails once every rank runs: the attempt fails with its exit, and no rank is left.
  const std::string crash = c.Submit(FourRanks(
      "crash",
      "echo pid=$$; if [ $LOCAL_RANK = 2 ]; then while [ ! -s log ] || [ ! -s log.1 ] || "
      "[ ! -s log.3 ]; do sleep 0.05; done; echo rank 2 gives up; exit 1; fi; exec sleep 1000"))[0];
  ASSERT_EQ(c.WaitFor(crash, {"SUCCEEDED", "FAILED"}), "FAILED");
  EXPECT_NE(std::string(c.Get(crash)["reason"]).find("rank 2: exit 1"), std::string::npos)
      << c.Get(crash).dump();
  const std::vector<pid_t> crashed = WaitForRankPids(c, crash, 4);
  EXPECT_TRUE(AllGone(c, crashed));
  EXPECT_NE(c.Cli({"logs", crash, "--rank", "2"}).out.find("rank 2 gives up"), std::string::npos);

  // Cancel reaches every rank.
  const std::string cancel = c.Submit(FourRanks("cancel", "echo pid=$$; exec sleep 1000"))[0];
  const std::vector<pid_t> running = WaitForRankPids(c, cancel, 4);
  for (pid_t pid : running) ASSERT_TRUE(ProcessAlive(pid)) << pid;
  ASSERT_EQ(c.Cli({"cancel", cancel}).exit_code, 0);
  EXPECT_EQ(c.WaitFor(cancel, {"CANCELLED"}), "CANCELLED");
  EXPECT_TRUE(AllGone(c, running));

  // A worker killed with its ranks running leaves none behind (each dies with the worker).
  const std::string orphan = c.Submit(FourRanks("orphan", "echo pid=$$; exec sleep 1000"))[0];
  const std::vector<pid_t> orphans = WaitForRankPids(c, orphan, 4);
  for (pid_t pid : orphans) ASSERT_TRUE(ProcessAlive(pid)) << pid;
  c.KillWorker("w1", SIGKILL);
  EXPECT_TRUE(AllGone(c, orphans));

  // ranks_per_part must match the GPUs: refused at submit, naming the field.
  const std::string file = c.WriteFile(
      "bad.yaml",
      "name: bad\nresources: {gpus: 4, ranks_per_part: 3}\nexec: {argv: [/bin/true]}\n");
  const CliResult bad = c.Cli({"submit", "-f", file});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("resources.ranks_per_part: 3 must equal resources.gpus (4"),
            std::string::npos)
      << bad.err;
}

// Every rank's log goes on where it was after a coordinator restart (the worker reports its
// offsets per rank, the coordinator answers with what it has): nothing lost, nothing twice.
TEST(Ranks, EveryRanksLogSurvivesACoordinatorRestart) {
  Cluster c;
  c.StartCoordinator();
  c.StartWorker("w1");
  c.WaitForWorkers(1);
  const std::string go = c.dir() + "/go";
  const std::string id = c.Submit(
      "name: restart\nresources: {ranks_per_part: 3}\nexec: {argv: [/bin/sh, -c, \"echo before "
      "$RANK; while [ ! -e " +
      go + " ]; do sleep 0.05; done; echo after $RANK\"]}\n")[0];
  ASSERT_TRUE(c.WaitUntil([&] {
    for (int r = 0; r < 3; ++r) {
      if (c.Cli({"logs", id, "--rank", std::to_string(r)}).out.empty()) return false;
    }
    return true;
  }));
  c.KillCoordinator(SIGKILL);
  c.StartCoordinator();
  std::ofstream(go) << "go\n";
  ASSERT_EQ(c.WaitFor(id, {"SUCCEEDED", "FAILED"}), "SUCCEEDED") << c.Get(id).dump();
  for (int r = 0; r < 3; ++r) {
    const std::string n = std::to_string(r);
    EXPECT_EQ(c.Cli({"logs", id, "--rank", n}).out, "before " + n + "\nafter " + n + "\n");
  }
}

// The engine's data parallel over the CPU collectives, started by the worker as 2 ranks of
// one part: the same losses as one process with the same global batch.
TEST(Ranks, CpuEngineTrainOfTwoRanksPerPartMatchesOneProcess) {
  if (!std::filesystem::exists(Cluster::BinDir() + "/stemma-engine")) {
    GTEST_SKIP() << "stemma-engine is not built (STEMMA_BUILD_ENGINE=OFF)";
  }
  Cluster c;
  c.StartCoordinator();
  const std::string root = c.dir() + "/store";
  std::filesystem::create_directories(root);
  {
    std::ofstream text(root + "/en.txt");
    for (int i = 0; i < 200; ++i)
      text << "the quick brown fox " << i << " jumps over the lazy dog\n";
  }
  Cluster::WorkerOptions w;
  w.cpus = 2;
  w.extra = {"--storage-root", root};
  c.StartWorker("w1", w);
  c.WaitForWorkers(1);
  const std::string study = R"(name: ranks
stages:
  base:
    init: {arch: llama, preset: tiny, seed: 3}
  tok:
    needs: [base]
    tokenize: {tokenizer: "${{ needs.base.outputs.model }}", input: [en.txt], format: text, line_docs: true, language: en}
  one:
    needs: [base, tok]
    resources: {cpus: 1}
    train:
      model: "${{ needs.base.outputs.model }}"
      data: {datasets: [{path: "${{ needs.tok.outputs.dataset }}"}], seq_len: 16}
      batch_size: 4
      steps: 3
      log_every: 1
  two:
    needs: [base, tok]
    cache: false                      # the same spec as one: it would be served from its result
    resources: {cpus: 2, ranks_per_part: 2}
    train:
      model: "${{ needs.base.outputs.model }}"
      data: {datasets: [{path: "${{ needs.tok.outputs.dataset }}"}], seq_len: 16}
      batch_size: 4
      steps: 3
      log_every: 1
)";
  ASSERT_EQ(c.Cli({"sweep", "-f", c.WriteFile("ranks.yaml", study)}).exit_code, 0);
  const CliResult done = c.Cli({"exp", "wait", "ranks", "--timeout", "400"});
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  std::map<std::string, std::string> ids;  // stage -> job id
  const CliResult cells = c.Cli({"exp", "get", "ranks", "-o", "json"});
  const nlohmann::json exp = cells.Json();
  for (const auto& cell : exp["cells"]) {
    ids[cell["job_name"].get<std::string>()] = cell["job_id"].get<std::string>();
  }
  ASSERT_EQ(ids.count("one") + ids.count("two"), 2u) << cells.out;
  auto losses = [&](const std::string& stage) {
    const CliResult m = c.Cli({"metrics", ids[stage], "--name", "loss", "-o", "json"});
    EXPECT_EQ(m.exit_code, 0) << m.err;
    std::vector<double> out;
    for (const auto& p : m.Json()) out.push_back(p["value"].get<double>());
    return out;
  };
  const std::vector<double> one = losses("one");
  const std::vector<double> two = losses("two");
  ASSERT_EQ(one.size(), 3u);
  ASSERT_EQ(two.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_NEAR(two[i], one[i], 1e-4 * one[i]) << i;
    std::cout << "step " << i + 1 << " loss: one process " << one[i] << ", two ranks " << two[i]
              << "\n";
  }
  // The second rank's log is kept too (the events came from rank 0 only).
  const std::string two_id = ids["two"];
  EXPECT_EQ(c.Cli({"logs", two_id, "--rank", "1"}).exit_code, 0);
  const std::string rank0 = c.Cli({"logs", two_id, "--rank", "0"}).out;
  EXPECT_NE(rank0.find("\"world_size\":2"), std::string::npos) << rank0;
  EXPECT_EQ(c.Cli({"logs", two_id, "--rank", "1"}).out.find("\"event\":\"step\""),
            std::string::npos);
}

}  // namespace
}  // namespace stemma::testing
