// Experiments through real processes: `stemma sweep` sends the file, the coordinator expands
// it into jobs, the worker runs them, and a resubmission is a new revision whose unchanged
// engine jobs are served from the cache.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

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
  auto ls = c.Cli({"exp", "ls"});  // an aligned table: NAME REVISION JOBS STATES
  std::istringstream rows(ls.out);
  std::string header, row;
  std::getline(rows, header);
  EXPECT_EQ(header.rfind("NAME", 0), 0u) << ls.out;
  std::getline(rows, row);
  std::istringstream fields(row);
  std::vector<std::string> words{std::istream_iterator<std::string>(fields), {}};
  EXPECT_EQ(words, (std::vector<std::string>{"legs", "2", "7", "SUCCEEDED=7"})) << ls.out;
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
  EXPECT_NE(
      r.err.find("bad.yaml: line 8: stages.b.revert.model: stage 'a' (noop) has no output 'model'"),
      std::string::npos)
      << r.err;
  EXPECT_EQ(c.Cli({"ls", "-o", "json"}).Json().size(), 0u);
}

// A worker "w1" with `cpus` slots whose storage root is DIR/store (returned), running
// `engine` (empty: the stemma-engine beside stemma-worker).
std::string StartEngineWorker(Cluster& c, int cpus, const std::string& engine) {
  const std::string root = c.dir() + "/store";
  std::filesystem::create_directories(root);
  Cluster::WorkerOptions w;
  w.cpus = cpus;
  w.extra = {"--storage-root", root};
  if (!engine.empty()) w.extra.insert(w.extra.end(), {"--engine", engine});
  c.StartWorker("w1", w);
  c.WaitForWorkers(1);
  return root;
}

// The real engine's worker, with an English text (en.txt) in its store.
std::string StartRealEngineWorker(Cluster& c, int cpus) {
  std::filesystem::create_directories(c.dir() + "/store");
  {
    std::ofstream text(c.dir() + "/store/en.txt");
    for (int i = 0; i < 200; ++i)
      text << "the quick brown fox " << i << " jumps over the lazy dog\n";
  }
  return StartEngineWorker(c, cpus, "");
}

// With the engine built: a real study (init, tokenize, train, eval); an unchanged resubmission
// runs nothing, an edited eval reruns that eval only, and a deleted checkpoint is not served.
TEST(Experiments, EngineJobsAreMemoizedAndOnlyWhatChangedReruns) {
  if (!std::filesystem::exists(Cluster::BinDir() + "/stemma-engine")) {
    GTEST_SKIP() << "stemma-engine is not built (STEMMA_BUILD_ENGINE=OFF)";
  }
  Cluster c;
  c.StartCoordinator();
  const std::string root = StartRealEngineWorker(c, 2);
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
  EXPECT_TRUE(std::filesystem::exists(
      std::string(c.Get(fourth.at("cpt")["job_id"])["outputs"]["model"]) + "/stemma.json"));
}

// A stand-in for stemma-engine that follows its contract (common/engine_contract.h): step
// events with a planted loss (the optimizer.lr the spec was given: a lower lr is a better
// trial), the stop file checked after every step, `out` published with a stemma.json that
// notes stopped_at_step, an output event, exit 0. Steps taken go to <root>/steps.log. A spec
// with optimizer.weight_decay also reports held-out losses: heldout_loss/uk = lr and
// heldout_loss/en = weight_decay (two planted objectives).
constexpr const char* kFakeEngine = R"SH(#!/bin/bash
cmd=$1; spec=$3
out=$(grep -o '"out": *"[^"]*"' "$spec" | head -1 | sed 's/.*: *"\(.*\)"/\1/')
case "$out" in /*) ;; *) out="$STEMMA_STORAGE_ROOT/$out" ;; esac
mkdir -p "$(dirname "$out")"
if [ "$cmd" = eval ]; then
  echo '{"perplexity": 1}' > "$out"
  echo "{\"event\":\"output\",\"name\":\"results\",\"path\":\"$out\"}"
  exit 0
fi
if [ "$cmd" = train ]; then
  lr=$(grep -o '"lr": *[0-9.e+-]*' "$spec" | head -1 | sed 's/.*: *//')
  total=$(grep -o '"steps": *"*[0-9]*' "$spec" | head -1 | sed 's/[^0-9]//g')
  wd=$(grep -o '"weight_decay": *[0-9.e+-]*' "$spec" | head -1 | sed 's/.*: *//')
  stopped=0
  for ((s = 1; s <= total; s++)); do
    sleep 0.25
    echo "$STEMMA_JOB_ID $s" >> "$STEMMA_STORAGE_ROOT/steps.log"
    echo "{\"event\":\"step\",\"step\":$s,\"total_steps\":$total,\"loss\":$lr,\"tokens_per_s\":1000}"
    if [ -n "$wd" ]; then
      echo "{\"event\":\"metric\",\"name\":\"heldout_loss/uk\",\"value\":$lr,\"step\":$s}"
      echo "{\"event\":\"metric\",\"name\":\"heldout_loss/en\",\"value\":$wd,\"step\":$s}"
    fi
    if [ $s -lt $total ] && [ -e "$STEMMA_WORKDIR/stop" ]; then stopped=$s; break; fi
  done
  mkdir -p "$out"
  echo "{\"producer\": {\"command\": \"train\", \"params\": {\"stopped_at_step\": $stopped}}}" > "$out/stemma.json"
else
  mkdir -p "$out"
  grep -o '"path": *"[^"]*"' "$spec" > "$out/inputs.txt"
  echo '{"producer": {"command": "merge"}}' > "$out/stemma.json"
fi
echo "{\"event\":\"output\",\"name\":\"model\",\"path\":\"$out\"}"
exit 0
)SH";

// A worker "w1" with `cpus` slots that runs kFakeEngine, its storage root DIR/store (returned).
std::string StartFakeEngineWorker(Cluster& c, int cpus) {
  const std::string engine = c.WriteFile("fake-engine", kFakeEngine);
  ::chmod(engine.c_str(), 0755);
  return StartEngineWorker(c, cpus, engine);
}

// Trials run one at a time (one CPU) in matrix order, lr = loss: 1, 4, 2, 3. Rungs at steps
// 3 and 6, keep 0.5 (so a rung judges from its second trial on):
//   rung 1: lr=1 first (continues), lr=4 rank 2 of 2 (stopped), lr=2 rank 2 of 3 (kept:
//           top ceil(1.5) = 2), lr=3 rank 3 of 4 (stopped);
//   rung 2: lr=1 first (continues), lr=2 rank 2 of 2 (stopped).
// The coordinator is killed (-9) once lr=4 is stopped: lr=2's and lr=3's decisions need the
// values recorded before the restart.
constexpr const char* kAsha = R"(name: asha
stages:
  cpt:
    matrix: {lr: [1, 4, 2, 3]}
    resources: {cpus: 1}
    early_stop: {metric: loss, mode: min, rungs: [3, 6], keep: 0.5}
    train:
      model: base
      data: {datasets: [{path: data}], seq_len: 8}
      steps: 12
      optimizer: {lr: "${{ matrix.lr }}"}
  eval:
    needs: [cpt]
    matrix: {lr: [1, 4, 2, 3]}
    resources: {cpus: 1}
    eval: {model: "${{ needs.cpt.outputs.model }}", tasks: [{type: perplexity, language: en, data: data, split: all}]}
  soup:
    needs: [cpt]
    resources: {cpus: 1}
    merge: {method: linear, models: [{path: "${{ needs.cpt.outputs.model }}"}]}
)";

TEST(Experiments, EarlyStoppingStopsThePlantedWorseTrialsAndKeepsItsDecisionsAcrossARestart) {
  Cluster c;
  c.StartCoordinator();
  StartFakeEngineWorker(c, 1);
  auto sweep = c.Cli({"sweep", "-f", c.WriteFile("asha.yaml", kAsha)});
  ASSERT_EQ(sweep.exit_code, 0) << sweep.err;
  auto cells = ByName(Cells(c, "asha"));
  const std::string lr4 = cells.at("cpt[lr=4]")["job_id"];
  // `exp watch` follows the experiment through the restart to its end.
  RunShell(c.CliCommand() + " exp watch asha --timeout 240 > " + c.dir() +
           "/watch.out 2>&1; echo $? > " + c.dir() + "/watch.rc &");
  ASSERT_TRUE(c.WaitUntil([&] { return c.Get(lr4).value("early_stop", "") != ""; }, 120))
      << "lr=4 is not stopped";
  c.KillCoordinator(SIGKILL);
  c.StartCoordinator();

  auto wait = c.Cli({"exp", "wait", "asha", "--timeout", "240"});
  EXPECT_EQ(wait.exit_code, 0) << "stopped trials succeed and skipped cells are not failures\n"
                               << wait.out << wait.err;
  cells = ByName(Cells(c, "asha"));
  auto reason = [&](const std::string& name) { return std::string(cells.at(name)["reason"]); };
  EXPECT_EQ(cells.at("cpt[lr=1]")["state"], "SUCCEEDED");
  EXPECT_EQ(reason("cpt[lr=1]"), "") << "the best trial runs to the end";
  for (const std::string name : {"cpt[lr=4]", "cpt[lr=2]", "cpt[lr=3]"}) {
    EXPECT_EQ(cells.at(name)["state"], "SUCCEEDED") << name;
  }
  EXPECT_EQ(reason("cpt[lr=4]")
                .rfind("stopped early at rung 1 (step 3): loss=4, not in the top 0.5 of 2", 0),
            0u)
      << reason("cpt[lr=4]");
  EXPECT_EQ(reason("cpt[lr=3]")
                .rfind("stopped early at rung 1 (step 3): loss=3, not in the top 0.5 of 4", 0),
            0u)
      << reason("cpt[lr=3]");
  EXPECT_EQ(reason("cpt[lr=2]")
                .rfind("stopped early at rung 2 (step 6): loss=2, not in the top 0.5 of 2", 0),
            0u)
      << reason("cpt[lr=2]");

  // A stopped trial's last model is its output, noting where it stopped.
  for (const std::string name : {"cpt[lr=4]", "cpt[lr=2]", "cpt[lr=3]"}) {
    const std::string model = c.Get(cells.at(name)["job_id"])["outputs"]["model"];
    auto manifest = nlohmann::json::parse(Cluster::ReadFile(model + "/stemma.json"));
    const int stopped = manifest["producer"]["params"]["stopped_at_step"];
    EXPECT_GE(stopped, name == "cpt[lr=2]" ? 6 : 3) << name;
    EXPECT_LT(stopped, 12) << name << " ran to the end";
  }
  // Dependents run on the survivors only: the one-to-one evals of stopped trials are
  // skipped, the soup reads lr=1's model alone.
  EXPECT_EQ(cells.at("eval[lr=1]")["state"], "SUCCEEDED");
  for (const std::string lr : {"4", "2", "3"}) {
    const std::string name = "eval[lr=" + lr + "]";
    EXPECT_EQ(cells.at(name)["state"], "CANCELLED") << name;
    EXPECT_EQ(reason(name), "upstream cpt[lr=" + lr + "] stopped early") << name;
    EXPECT_EQ(c.Get(cells.at(name)["job_id"])["attempts"], 0) << name << " ran";
  }
  EXPECT_EQ(cells.at("soup")["state"], "SUCCEEDED");
  auto soup = c.Get(cells.at("soup")["job_id"]);
  ASSERT_EQ(soup["spec"]["merge"]["models"].size(), 1u) << soup.dump();
  EXPECT_EQ(soup["spec"]["merge"]["models"][0]["path"],
            c.Get(cells.at("cpt[lr=1]")["job_id"])["outputs"]["model"]);

  ASSERT_TRUE(c.WaitUntil([&] { return std::filesystem::exists(c.dir() + "/watch.rc"); }, 60));
  const std::string watched = Cluster::ReadFile(c.dir() + "/watch.out");
  EXPECT_EQ(Cluster::ReadFile(c.dir() + "/watch.rc"), "0\n") << watched;
  EXPECT_NE(watched.find("SKIPPED 3, SUCCEEDED 6\n"), std::string::npos) << watched;
  EXPECT_NE(watched.find("loss "), std::string::npos) << "running trials show their loss\n"
                                                      << watched;

  // An unchanged resubmission runs nothing: stopped trials are served as stopped, and what
  // they skipped stays skipped.
  auto resubmit = c.Cli({"sweep", "-f", c.WriteFile("asha.yaml", kAsha)});
  ASSERT_EQ(resubmit.exit_code, 0);
  EXPECT_NE(
      resubmit.out.find(
          "0 of 9 jobs expected to run, 6 from the cache, 3 skipped (upstream stopped early)"),
      std::string::npos)
      << resubmit.out;
  ASSERT_EQ(c.Cli({"exp", "wait", "asha", "--timeout", "60"}).exit_code, 0);
  auto again = ByName(Cells(c, "asha"));
  EXPECT_EQ(std::string(again.at("cpt[lr=2]")["reason"])
                .rfind("memoized from " + std::string(cells.at("cpt[lr=2]")["job_id"]) +
                           " (stopped early at rung 2",
                       0),
            0u)
      << again.at("cpt[lr=2]")["reason"];
  EXPECT_EQ(again.at("eval[lr=2]")["state"], "CANCELLED");
  EXPECT_EQ(std::string(again.at("soup")["reason"]).rfind("memoized from", 0), 0u)
      << again.at("soup")["reason"];
}

// Pareto early stopping over two planted objectives (heldout_loss/uk = lr, heldout_loss/en =
// weight_decay), trials one at a time in matrix order, one rung at step 3, keep 0.5:
//   (1, 4) first: continues; (4, 1): a trade-off, front 0 with (1, 4), rank 1 of 2: continues
//   (a single-metric rule on uk would stop it); (5, 5): dominated by both, front 1, rank 3 of 3
//   > ceil(1.5): stopped. The coordinator is killed (-9) once (4, 1) has ended, so the third
//   decision needs the vectors recorded before the restart.
constexpr const char* kPareto = R"(name: pareto
stages:
  cpt:
    matrix: {include: [{uk: 1, en: 4}, {uk: 4, en: 1}, {uk: 5, en: 5}]}
    resources: {cpus: 1}
    early_stop:
      method: pareto
      objectives: [{metric: heldout_loss/uk, mode: min}, {metric: heldout_loss/en, mode: min}]
      rungs: [3]
      keep: 0.5
    train:
      model: base
      data: {datasets: [{path: data}], seq_len: 8, heldout_fraction: 0.1}
      steps: 10
      eval: {every: 1}
      optimizer: {lr: "${{ matrix.uk }}", weight_decay: "${{ matrix.en }}"}
)";

TEST(Experiments, ParetoRuleStopsTheDominatedTrialAndKeepsTheTradeOffAcrossARestart) {
  Cluster c;
  c.StartCoordinator();
  StartFakeEngineWorker(c, 1);
  auto sweep = c.Cli({"sweep", "-f", c.WriteFile("pareto.yaml", kPareto)});
  ASSERT_EQ(sweep.exit_code, 0) << sweep.err;
  auto cells = ByName(Cells(c, "pareto"));
  const std::string second = cells.at("cpt[uk=4,en=1]")["job_id"];
  ASSERT_TRUE(c.WaitUntil([&] { return c.Get(second).value("state", "") == "SUCCEEDED"; }, 120))
      << "the trade-off trial did not end";
  c.KillCoordinator(SIGKILL);
  c.StartCoordinator();
  auto wait = c.Cli({"exp", "wait", "pareto", "--timeout", "240"});
  EXPECT_EQ(wait.exit_code, 0) << wait.out << wait.err;
  cells = ByName(Cells(c, "pareto"));
  auto reason = [&](const std::string& name) { return std::string(cells.at(name)["reason"]); };
  EXPECT_EQ(reason("cpt[uk=1,en=4]"), "") << "front 0: runs to the end";
  EXPECT_EQ(reason("cpt[uk=4,en=1]"), "") << "worst on uk, best on en: not dominated";
  EXPECT_EQ(cells.at("cpt[uk=5,en=5]")["state"], "SUCCEEDED");
  // `stemma exp get` shows both objectives' values and the front.
  EXPECT_EQ(reason("cpt[uk=5,en=5]")
                .rfind("stopped early at rung 1 (step 3): heldout_loss/uk=5, heldout_loss/en=5 on "
                       "Pareto front 2 of 2, not in the best 0.5 of 3 (rank 3)",
                       0),
            0u)
      << reason("cpt[uk=5,en=5]");
  const std::string model = c.Get(cells.at("cpt[uk=5,en=5]")["job_id"])["outputs"]["model"];
  auto manifest = nlohmann::json::parse(Cluster::ReadFile(model + "/stemma.json"));
  EXPECT_LT(manifest["producer"]["params"]["stopped_at_step"], 10) << "ran to the end";
  auto text = c.Cli({"exp", "get", "pareto"});
  EXPECT_NE(text.out.find("heldout_loss/uk=5, heldout_loss/en=5"), std::string::npos) << text.out;
}

// `stemma plan` predicts from the cache the submit consults (the same key), not from the
// last revision: a new experiment that shares cells with an old one, and an old file revision
// submitted again, are predicted "cached" and are then served from the cache.
TEST(Experiments, PlanPredictsFromTheCacheNotFromTheLastRevision) {
  Cluster c;
  c.StartCoordinator();
  StartFakeEngineWorker(c, 1);
  auto study = [](const std::string& name, const std::string& lrs) {
    return "name: " + name + R"(
stages:
  cpt:
    matrix: {lr: )" +
           lrs + R"(}
    resources: {cpus: 1}
    train:
      model: base
      data: {datasets: [{path: data}], seq_len: 8}
      steps: 2
      optimizer: {lr: "${{ matrix.lr }}"}
  soup:
    needs: [cpt]
    resources: {cpus: 1}
    merge: {method: linear, models: [{path: "${{ needs.cpt.outputs.model }}"}]}
)";
  };
  const std::string first = c.WriteFile("a.yaml", study("memo-a", "[1, 2]"));
  ASSERT_EQ(c.Cli({"sweep", "-f", first}).exit_code, 0);
  ASSERT_EQ(c.Cli({"exp", "wait", "memo-a", "--timeout", "120"}).exit_code, 0);
  auto ran = ByName(Cells(c, "memo-a"));

  // A new experiment with the same cells: every one, the soup included (its inputs are the
  // cached trials' outputs), is predicted from the cache.
  auto other = c.Cli({"plan", "-f", c.WriteFile("b.yaml", study("memo-b", "[1, 2]"))});
  ASSERT_EQ(other.exit_code, 0) << other.err;
  EXPECT_NE(other.out.find("0 of 3 jobs expected to run, 3 from the cache"), std::string::npos)
      << other.out;
  EXPECT_NE(other.out.find("cpt[lr=2]  cached: the same job ran as " +
                           std::string(ran.at("cpt[lr=2]")["job_id"]) +
                           " (memo-a revision 1, cpt[lr=2])"),
            std::string::npos)
      << other.out;
  EXPECT_EQ(other.out.find("new experiment"), std::string::npos) << other.out;

  // Revision 2 changes the sweep; back on the first file, revision 3 is served from revision
  // 1's jobs, and the plan says so.
  ASSERT_EQ(c.Cli({"sweep", "-f", c.WriteFile("a2.yaml", study("memo-a", "[1, 3]"))}).exit_code, 0);
  ASSERT_EQ(c.Cli({"exp", "wait", "memo-a", "--timeout", "120"}).exit_code, 0);
  auto back = c.Cli({"plan", "-f", first});
  ASSERT_EQ(back.exit_code, 0) << back.err;
  EXPECT_NE(back.out.find("0 of 3 jobs expected to run, 3 from the cache"), std::string::npos)
      << back.out;
  EXPECT_NE(
      back.out.find("soup  cached: the same job ran as " + std::string(ran.at("soup")["job_id"])),
      std::string::npos)
      << back.out;
  ASSERT_EQ(c.Cli({"sweep", "-f", first}).exit_code, 0);
  ASSERT_EQ(c.Cli({"exp", "wait", "memo-a", "--timeout", "60"}).exit_code, 0);
  for (const auto& [name, cell] : ByName(Cells(c, "memo-a"))) {
    EXPECT_EQ(cell["reason"], "memoized from " + std::string(ran.at(name)["job_id"])) << name;
  }
}

// `exp retry` re-queues the failed cells of the latest revision, and what failed because of
// them waits for them again.
TEST(Experiments, RetryRequeuesFailedCellsAndTheirDependents) {
  Cluster c;
  c.StartCoordinator();
  c.StartWorker("w1");
  c.WaitForWorkers(1);
  const std::string marker = c.dir() + "/ready";
  const std::string file = c.WriteFile("rt.yaml",
                                       "name: rt\nstages:\n  flaky:\n    max_attempts: 1\n"
                                       "    exec: {argv: [sh, -c, \"test -e " +
                                           marker +
                                           "\"]}\n"
                                           "  after:\n    needs: [flaky]\n    noop: {}\n");
  ASSERT_EQ(c.Cli({"sweep", "-f", file}).exit_code, 0);
  EXPECT_EQ(c.Cli({"exp", "wait", "rt", "--timeout", "60"}).exit_code, 1);
  auto cells = ByName(Cells(c, "rt"));
  EXPECT_EQ(cells.at("flaky")["state"], "FAILED");
  EXPECT_EQ(cells.at("after")["state"], "FAILED");
  c.WriteFile("ready", "");
  auto retry = c.Cli({"exp", "retry", "rt"});
  EXPECT_EQ(retry.exit_code, 0) << retry.out << retry.err;
  EXPECT_NE(retry.out.find("retried 2 jobs of rt revision 1"), std::string::npos) << retry.out;
  auto watch = c.Cli({"exp", "watch", "rt", "--timeout", "60"});
  EXPECT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  EXPECT_NE(watch.out.find("SUCCEEDED 2"), std::string::npos) << watch.out;
  EXPECT_EQ(c.Get(cells.at("flaky")["job_id"])["attempts"], 2);
}

// A cache hit needs the engine build that produced the result: a worker reporting another
// build id runs the job again; back on the first build, the first result is served.
TEST(Experiments, CacheHitsRequireTheSameEngineBuild) {
  Cluster c;
  c.StartCoordinator();
  const std::string root = c.dir() + "/store";
  std::filesystem::create_directories(root);
  const std::string engine = c.WriteFile("fake-engine", kFakeEngine);
  ::chmod(engine.c_str(), 0755);
  auto worker = [&](const std::string& name, const std::string& build) {
    Cluster::WorkerOptions w;
    w.extra = {"--storage-root", root, "--engine", engine};
    if (!build.empty()) w.extra.insert(w.extra.end(), {"--engine-build-id", build});
    c.StartWorker(name, w);
  };
  worker("w1", "");
  c.WaitForWorkers(1);
  const std::string file =
      c.WriteFile("b.yaml",
                  "name: b\nstages:\n  t:\n    train:\n      model: base\n"
                  "      data: {datasets: [{path: data}], seq_len: 8}\n      steps: 2\n");
  auto run = [&] {
    EXPECT_EQ(c.Cli({"sweep", "-f", file}).exit_code, 0);
    EXPECT_EQ(c.Cli({"exp", "wait", "b", "--timeout", "60"}).exit_code, 0);
    return ByName(Cells(c, "b")).at("t");
  };
  auto first = run();
  auto job = c.Get(first["job_id"]);
  const std::string hashed = job.value("engine_build_id", "");
  EXPECT_EQ(hashed.rfind("sha256:", 0), 0u) << "the binary's hash: " << job.dump();
  EXPECT_EQ(std::string(run()["reason"]), "memoized from " + std::string(first["job_id"]));

  c.KillWorker("w1", SIGTERM);
  worker("w2", "redeployed-7");
  ASSERT_TRUE(c.WaitUntil([&] {
    auto ws = c.Cli({"workers", "-o", "json"}).Json();
    for (const auto& w : ws) {
      if (w.value("id", "") == "w2" && w.value("state", "") == "ALIVE") return true;
    }
    return false;
  }));
  auto other = run();
  EXPECT_EQ(std::string(other["reason"]), "") << "another engine build runs it again";
  EXPECT_EQ(c.Get(other["job_id"]).value("engine_build_id", ""), "redeployed-7");

  c.KillWorker("w2", SIGTERM);
  worker("w3", hashed);
  ASSERT_TRUE(c.WaitUntil([&] {
    for (const auto& w : c.Cli({"workers", "-o", "json"}).Json()) {
      if (w.value("id", "") == "w3" && w.value("state", "") == "ALIVE") return true;
    }
    return false;
  }));
  EXPECT_EQ(std::string(run()["reason"]), "memoized from " + std::string(first["job_id"]));
}

// Resubmitting while revision 1 still runs: its changed cell is superseded (cancelled, with
// the reason), its unchanged one goes on running and revision 2's copy waits for it and is
// served from it; nothing runs twice.
TEST(Experiments, ANewRevisionSupersedesChangedCellsAndWaitsForUnchangedRunningOnes) {
  Cluster c;
  c.StartCoordinator();
  const std::string root = StartFakeEngineWorker(c, 2);
  auto file = [&](const std::string& lr) {
    return c.WriteFile(
        "sup.yaml",
        "name: sup\nstages:\n"
        "  keep:\n    resources: {cpus: 1}\n    train: {model: base, data: {datasets: [{path: "
        "data}], seq_len: 8}, steps: 24, optimizer: {lr: 0.001}}\n"
        "  change:\n    resources: {cpus: 1}\n    train: {model: base, data: {datasets: [{path: "
        "data}], seq_len: 8}, steps: 24, optimizer: {lr: " +
            lr + "}}\n");
  };
  ASSERT_EQ(c.Cli({"sweep", "-f", file("0.002")}).exit_code, 0);
  auto first = ByName(Cells(c, "sup"));
  const std::string keep1 = first.at("keep")["job_id"], change1 = first.at("change")["job_id"];
  ASSERT_TRUE(c.WaitUntil(
      [&] { return c.State(keep1) == "RUNNING" && c.State(change1) == "RUNNING"; }, 60));

  auto again = c.Cli({"sweep", "-f", file("0.003")});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find("waits: revision 1's " + keep1 + " is RUNNING"), std::string::npos)
      << again.out;
  EXPECT_NE(again.out.find("; cancels revision 1's " + change1 + " (RUNNING)"), std::string::npos)
      << again.out;
  EXPECT_NE(again.out.find("1 unfinished jobs of the last revision superseded"), std::string::npos)
      << again.out;
  EXPECT_EQ(c.WaitFor(change1, {"CANCELLED"}, 30), "CANCELLED");
  EXPECT_EQ(c.Get(change1).value("reason", ""), "cancelled: superseded by revision 2");
  auto second = ByName(Cells(c, "sup"));
  const std::string keep2 = second.at("keep")["job_id"];
  EXPECT_EQ(c.State(keep2), "PENDING");
  EXPECT_EQ(c.Get(keep2).value("reason", "").rfind("waiting for " + keep1 + " (keep)", 0), 0u)
      << c.Get(keep2).dump();

  ASSERT_EQ(c.Cli({"exp", "wait", "sup", "--timeout", "120"}).exit_code, 0);
  EXPECT_EQ(c.State(keep1), "SUCCEEDED");
  EXPECT_EQ(c.State(keep2), "SUCCEEDED");
  EXPECT_EQ(c.Get(keep2).value("reason", ""), "memoized from " + keep1);
  EXPECT_EQ(c.State(second.at("change")["job_id"]), "SUCCEEDED");
  const std::string steps = Cluster::ReadFile(root + "/steps.log");
  EXPECT_EQ(steps.find(keep2 + " "), std::string::npos) << "the unchanged cell ran twice";
}

// `exp cancel` also cancels the earlier revision's running job that the latest one waits for
// (it would otherwise run on for nobody).
TEST(Experiments, CancelReachesTheEarlierRevisionsJobTheLatestWaitsFor) {
  Cluster c;
  c.StartCoordinator();
  StartFakeEngineWorker(c, 1);
  const std::string file = c.WriteFile(
      "w.yaml",
      "name: w\nstages:\n  t:\n    resources: {cpus: 1}\n"
      "    train: {model: base, data: {datasets: [{path: data}], seq_len: 8}, steps: 200}\n");
  ASSERT_EQ(c.Cli({"sweep", "-f", file}).exit_code, 0);
  const std::string first = ByName(Cells(c, "w")).at("t")["job_id"];
  ASSERT_TRUE(c.WaitUntil([&] { return c.State(first) == "RUNNING"; }, 30));
  ASSERT_EQ(c.Cli({"sweep", "-f", file}).exit_code, 0);  // revision 2: the same job, waiting
  const std::string second = ByName(Cells(c, "w")).at("t")["job_id"];
  ASSERT_EQ(c.State(second), "PENDING");
  auto cancel = c.Cli({"exp", "cancel", "w"});
  ASSERT_EQ(cancel.exit_code, 0) << cancel.err;
  EXPECT_NE(cancel.out.find(
                "cancelled 2 jobs of w (1 of earlier revisions that the latest one waited for)"),
            std::string::npos)
      << cancel.out;
  EXPECT_EQ(c.WaitFor(first, {"CANCELLED"}, 30), "CANCELLED");
  EXPECT_EQ(c.State(second), "CANCELLED");
}

// With the engine built: a real trainer stopped through the worker's stop file. lr 1e-2 learns
// the tiny corpus, lr 1e-7 barely moves; run one at a time, the second is stopped at the
// rung and publishes the model of the step it stopped at.
TEST(Experiments, RealTrainerStopsAtTheRungAndPublishesItsModel) {
  if (!std::filesystem::exists(Cluster::BinDir() + "/stemma-engine")) {
    GTEST_SKIP() << "stemma-engine is not built (STEMMA_BUILD_ENGINE=OFF)";
  }
  Cluster c;
  c.StartCoordinator();
  StartRealEngineWorker(c, 1);
  const std::string file = c.WriteFile("real.yaml", R"(name: real
stages:
  base:
    init: {arch: llama, preset: tiny, seed: 3}
  tok:
    needs: [base]
    tokenize: {tokenizer: "${{ needs.base.outputs.model }}", input: [en.txt], format: text, line_docs: true, language: en}
  cpt:
    needs: [base, tok]
    matrix: {lr: [0.01, 0.0000001]}
    resources: {cpus: 1}
    early_stop: {metric: heldout_loss, rungs: [10], keep: 0.5}
    train:
      model: "${{ needs.base.outputs.model }}"
      data: {datasets: [{path: "${{ needs.tok.outputs.dataset }}"}], seq_len: 16, heldout_fraction: 0.2}
      batch_size: 2
      steps: 400
      eval: {every: 10, batches: 1}
      optimizer: {lr: "${{ matrix.lr }}"}
)");
  ASSERT_EQ(c.Cli({"sweep", "-f", file}).exit_code, 0);
  auto wait = c.Cli({"exp", "wait", "real", "--timeout", "600"});
  ASSERT_EQ(wait.exit_code, 0) << wait.out << wait.err;
  auto cells = ByName(Cells(c, "real"));
  EXPECT_EQ(cells.at("cpt[lr=0.01]")["reason"], "");
  const std::string slow = cells.at("cpt[lr=0.0000001]")["reason"];
  EXPECT_EQ(slow.rfind("stopped early at rung 1 (step 10): heldout_loss=", 0), 0u) << slow;
  const std::string model = c.Get(cells.at("cpt[lr=0.0000001]")["job_id"])["outputs"]["model"];
  auto manifest = nlohmann::json::parse(Cluster::ReadFile(model + "/stemma.json"));
  const int stopped = manifest["producer"]["params"]["stopped_at_step"];
  EXPECT_GE(stopped, 10);
  EXPECT_LT(stopped, 400);
  EXPECT_TRUE(std::filesystem::exists(model + "/config.json"));
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
  auto typo =
      c.Cli({"submit", "-f",
             c.WriteFile("typo.yaml", "name: cpt\ntrain:\n  model: /m\n  out: /o\n  stepz: 30\n")});
  EXPECT_NE(typo.exit_code, 0);
  EXPECT_NE(typo.err.find("typo.yaml: line 5: train.stepz: unknown field"), std::string::npos)
      << typo.err;
  auto range = c.Cli({"submit", "-f",
                      c.WriteFile("range.yaml",
                                  "name: cpt\ntrain:\n  model: /m\n  out: /o\n  steps: 3\n"
                                  "  data: {datasets: [{path: /d}], seq_len: 8}\n"
                                  "  optimizer: {lr: -1}\n")});
  EXPECT_NE(range.exit_code, 0);
  EXPECT_NE(range.err.find("range.yaml: line 7: train.optimizer.lr: -1 must be > 0"),
            std::string::npos)
      << range.err;
  EXPECT_EQ(c.Cli({"ls", "-o", "json"}).Json().size(), 0u) << "nothing is queued";

  if (!std::filesystem::exists(Cluster::BinDir() + "/stemma-engine")) {
    GTEST_SKIP() << "stemma-engine is not built (STEMMA_BUILD_ENGINE=OFF)";
  }
  Cluster::WorkerOptions in_dir;
  in_dir.extra = {"--storage-root", c.dir()};  // the job's paths lie in the test's directory
  c.StartWorker("w1", in_dir);
  c.WaitForWorkers(1);
  auto ids = c.Submit("name: cpt\nmax_attempts: 3\ntrain:\n  model: " + c.dir() +
                      "/no-such-model\n  out: " + c.dir() +
                      "/out\n  steps: 3\n"
                      "  data: {datasets: [{path: " +
                      c.dir() + "/no-such-data}], seq_len: 8}\n");
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
