// Experiments through real processes: `stemma sweep` sends the file, the coordinator expands
// it into jobs, the worker runs them, and a resubmission is a new revision whose unchanged
// engine jobs are served from the cache.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "tests/integration/cluster.h"

namespace stemma::testing {
namespace {

nlohmann::json Cells(const Cluster& c, const std::string& experiment) {
  auto r = c.Cli({"exp", "get", experiment, "-o", "json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.Json()["cells"];
}

// Cells by job name; proto JSON leaves empty strings out, so they are filled in here.
std::map<std::string, nlohmann::json> ByName(const nlohmann::json& cells) {
  std::map<std::string, nlohmann::json> out;
  for (auto c : cells) {
    for (const char* key : {"reason", "state", "job_id"}) {
      if (!c.contains(key)) c[key] = "";
    }
    out[c["job_name"]] = c;
  }
  return out;
}

constexpr const char* kNoopStudy = R"(name: legs
vars: {ms: 20}
stages:
  a:
    matrix: {x: [1, 2, 3]}
    noop: {duration_ms: "${{ vars.ms }}"}
  b:
    needs: [a]
    matrix: {x: [1, 2]}
    noop: {}
  c:
    needs: [b]
    noop: {}
)";

TEST(Experiments, SweepExpandsPerLegRunsAndResubmitIsARevision) {
  Cluster c;
  c.StartCoordinator();
  c.StartWorker("w1");
  c.WaitForWorkers(1);
  const std::string file = c.WriteFile("legs.yaml", kNoopStudy);
  auto plan = c.Cli({"plan", "-f", file});
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_NE(plan.out.find("3 stages, 6 jobs, 4 edges"), std::string::npos) << plan.out;
  EXPECT_EQ(c.Cli({"ls", "-o", "json"}).Json().size(), 0u) << "a plan submits nothing";

  auto sweep = c.Cli({"sweep", "-f", file});
  ASSERT_EQ(sweep.exit_code, 0) << sweep.err;
  auto wait = c.Cli({"exp", "wait", "legs", "--timeout", "60"});
  ASSERT_EQ(wait.exit_code, 0) << wait.out << wait.err;
  auto cells = ByName(Cells(c, "legs"));
  ASSERT_EQ(cells.size(), 6u);
  for (const auto& [name, cell] : cells) EXPECT_EQ(cell["state"], "SUCCEEDED") << name;
  // b[x=2] waited for a[x=2] only, not for the whole stage a.
  const std::string a2 = cells.at("a[x=2]")["job_id"];
  ASSERT_EQ(cells.at("b[x=2]")["needs"].size(), 1u);
  EXPECT_EQ(cells.at("b[x=2]")["needs"][0], a2);
  auto job = c.Get(cells.at("b[x=1]")["job_id"]);
  EXPECT_EQ(job["spec"]["experiment"], "legs");
  EXPECT_EQ(job["spec"]["labels"]["stage"], "b");
  EXPECT_EQ(job["spec"]["labels"]["x"], "1");
  EXPECT_EQ(c.Cli({"ls", "--experiment", "legs", "-o", "json"}).Json().size(), 6u);
  // A job's name works where an id does (the most recent job of that name).
  auto by_name = c.Cli({"get", "b[x=1]", "-o", "json"});
  ASSERT_EQ(by_name.exit_code, 0) << by_name.err;
  EXPECT_EQ(by_name.Json()["id"], cells.at("b[x=1]")["job_id"]);
  EXPECT_EQ(c.Cli({"wait", "c"}).exit_code, 0);
  EXPECT_EQ(c.Cli({"logs", "a[x=3]"}).exit_code, 0);
  auto unknown = c.Cli({"get", "no-such-job"});
  EXPECT_NE(unknown.err.find("neither an id nor a job name"), std::string::npos) << unknown.err;

  // An edited file is revision 2, and the CLI says what changed.
  std::string edited = kNoopStudy;
  edited.replace(edited.find("x: [1, 2]}"), 10, "x: [1, 2, 3]}");
  auto again = c.Cli({"sweep", "-f", c.WriteFile("legs.yaml", edited)});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find("revision 2"), std::string::npos) << again.out;
  EXPECT_NE(again.out.find("+ b[x=3]"), std::string::npos) << again.out;
  ASSERT_EQ(c.Cli({"exp", "wait", "legs", "--timeout", "60"}).exit_code, 0);
  auto ls = c.Cli({"exp", "ls"});
  EXPECT_NE(ls.out.find("legs\t2\t7\tSUCCEEDED=7"), std::string::npos) << ls.out;
}

TEST(Experiments, ABadFileIsRefusedWithFileLineAndFieldAndSubmitsNothing) {
  Cluster c;
  c.StartCoordinator();
  const std::string file = c.WriteFile("bad.yaml", R"(name: bad
stages:
  a:
    matrix: {x: [1, 2]}
    noop: {}
  b:
    needs: [a]
    revert: {base: /m, model: "${{ needs.a.outputs.model }}"}
)");
  auto r = c.Cli({"sweep", "-f", file});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("bad.yaml: line 8: stages.b.revert.model: stage 'a' (noop) has no output 'model'"),
            std::string::npos) << r.err;
  EXPECT_EQ(c.Cli({"ls", "-o", "json"}).Json().size(), 0u);
}

// With the engine built: a real study (init, tokenize, train, eval); an unchanged resubmission
// runs nothing, an edited eval reruns that eval only, and a deleted checkpoint is not served.
TEST(Experiments, EngineJobsAreMemoizedAndOnlyWhatChangedReruns) {
  if (!std::filesystem::exists(Cluster::BinDir() + "/stemma-engine")) {
    GTEST_SKIP() << "stemma-engine is not built (STEMMA_BUILD_ENGINE=OFF)";
  }
  Cluster c;
  c.StartCoordinator();
  const std::string root = c.dir() + "/store";
  std::filesystem::create_directories(root);
  {
    std::ofstream text(root + "/en.txt");
    for (int i = 0; i < 200; ++i) text << "the quick brown fox " << i << " jumps over the lazy dog\n";
  }
  Cluster::WorkerOptions w;
  w.cpus = 2;
  w.extra = {"--storage-root", root};
  c.StartWorker("w1", w);
  c.WaitForWorkers(1);
  auto study = [](int limit) {
    return std::string(R"(name: memo
stages:
  base:
    init: {arch: llama, preset: tiny, seed: 3}
  tok:
    needs: [base]
    tokenize: {tokenizer: "${{ needs.base.outputs.model }}", input: [en.txt], format: text, line_docs: true, language: en}
  cpt:
    needs: [base, tok]
    train:
      model: "${{ needs.base.outputs.model }}"
      data: {datasets: [{path: "${{ needs.tok.outputs.dataset }}"}], seq_len: 16, heldout_fraction: 0.2}
      batch_size: 2
      steps: 2
  eval:
    needs: [cpt, tok]
    eval:
      model: "${{ needs.cpt.outputs.model }}"
      tasks: [{type: perplexity, language: en, data: "${{ needs.tok.outputs.dataset }}", heldout_fraction: 0.2, limit: )") +
           std::to_string(limit) + "}]\n";
  };
  const std::string file = c.WriteFile("memo.yaml", study(4));
  ASSERT_EQ(c.Cli({"sweep", "-f", file}).exit_code, 0);
  auto cold = c.Cli({"exp", "wait", "memo", "--timeout", "300"});
  ASSERT_EQ(cold.exit_code, 0) << cold.out << cold.err;
  auto first = ByName(Cells(c, "memo"));
  for (const auto& [name, cell] : first) {
    EXPECT_EQ(cell["state"], "SUCCEEDED") << name;
    EXPECT_EQ(cell["reason"], "") << name;
  }
  const std::string model = c.Get(first.at("cpt")["job_id"])["outputs"]["model"];
  EXPECT_EQ(model.rfind(root + "/experiments/memo/cpt/", 0), 0u) << model;
  EXPECT_TRUE(std::filesystem::exists(model + "/stemma.json"));

  // Unchanged: every job ends at once from the cache.
  auto plan = c.Cli({"sweep", "-f", file});
  EXPECT_NE(plan.out.find("0 of 4 jobs expected to run"), std::string::npos) << plan.out;
  ASSERT_EQ(c.Cli({"exp", "wait", "memo", "--timeout", "60"}).exit_code, 0);
  for (const auto& [name, cell] : ByName(Cells(c, "memo"))) {
    EXPECT_EQ(cell["reason"], "memoized from " + std::string(first.at(name)["job_id"])) << name;
  }

  // One eval field changed: that eval alone runs.
  auto edited = c.Cli({"sweep", "-f", c.WriteFile("memo.yaml", study(3))});
  EXPECT_NE(edited.out.find("run: changed (eval.tasks)"), std::string::npos) << edited.out;
  ASSERT_EQ(c.Cli({"exp", "wait", "memo", "--timeout", "120"}).exit_code, 0);
  auto third = ByName(Cells(c, "memo"));
  EXPECT_EQ(third.at("eval")["reason"], "");
  EXPECT_NE(std::string(third.at("cpt")["reason"]).find("memoized"), std::string::npos);

  // The trained checkpoint deleted: a miss, so cpt (and what reads it) runs again.
  std::filesystem::remove_all(model);
  ASSERT_EQ(c.Cli({"sweep", "-f", file}).exit_code, 0);
  ASSERT_EQ(c.Cli({"exp", "wait", "memo", "--timeout", "300"}).exit_code, 0);
  auto fourth = ByName(Cells(c, "memo"));
  EXPECT_EQ(fourth.at("cpt")["reason"], "") << "a hit whose outputs are gone must not be served";
  EXPECT_NE(std::string(fourth.at("base")["reason"]).find("memoized"), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(std::string(c.Get(fourth.at("cpt")["job_id"])["outputs"]["model"]) + "/stemma.json"));
}

}  // namespace
}  // namespace stemma::testing

namespace stemma::testing {
namespace {

// Issue 11's promise: a typo is refused by `stemma submit` with file, line and field and
// nothing is queued; bad input only the engine can see fails after one attempt (exit 4, not
// retried) with the engine's own message as the job's reason.
TEST(EngineContract, TyposAreRefusedAtSubmitAndBadInputIsNotRetried) {
  Cluster c;
  c.StartCoordinator();
  auto typo = c.Cli({"submit", "-f", c.WriteFile("typo.yaml",
                                                "name: cpt\ntrain:\n  model: /m\n  out: /o\n  stepz: 30\n")});
  EXPECT_NE(typo.exit_code, 0);
  EXPECT_NE(typo.err.find("typo.yaml: line 5: train.stepz: unknown field"), std::string::npos) << typo.err;
  auto range = c.Cli({"submit", "-f", c.WriteFile("range.yaml",
                                                 "name: cpt\ntrain:\n  model: /m\n  out: /o\n  steps: 3\n"
                                                 "  data: {datasets: [{path: /d}], seq_len: 8}\n"
                                                 "  optimizer: {lr: -1}\n")});
  EXPECT_NE(range.exit_code, 0);
  EXPECT_NE(range.err.find("range.yaml: line 7: train.optimizer.lr: -1 must be > 0"), std::string::npos) << range.err;
  EXPECT_EQ(c.Cli({"ls", "-o", "json"}).Json().size(), 0u) << "nothing is queued";

  if (!std::filesystem::exists(Cluster::BinDir() + "/stemma-engine")) {
    GTEST_SKIP() << "stemma-engine is not built (STEMMA_BUILD_ENGINE=OFF)";
  }
  c.StartWorker("w1");
  c.WaitForWorkers(1);
  auto ids = c.Submit("name: cpt\nmax_attempts: 3\ntrain:\n  model: " + c.dir() +
                      "/no-such-model\n  out: " + c.dir() + "/out\n  steps: 3\n"
                      "  data: {datasets: [{path: " + c.dir() + "/no-such-data}], seq_len: 8}\n");
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(c.WaitFor(ids[0], {"FAILED", "SUCCEEDED"}), "FAILED");
  auto job = c.Get(ids[0]);
  EXPECT_EQ(job["attempts"], 1) << "bad input is not retried";
  EXPECT_EQ(job["exit_code"], 4);
  const std::string reason = job["reason"];
  EXPECT_NE(reason.find("bad input: "), std::string::npos) << reason;
  EXPECT_NE(reason.find("no-such-data: cannot open index.json"), std::string::npos) << reason;
}

}  // namespace
}  // namespace stemma::testing
