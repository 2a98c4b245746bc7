// Your own code as a stage (issue 23), through real processes: exec stages that declare typed
// outputs, inputs and code; the worker checks and manifests the outputs, the coordinator
// registers them (lineage, `ckpt show`, `stemma report`) and serves an unchanged stage from the
// cache; `cache: false` and a change of code run it again. Then lm-evaluation-harness as such a
// stage beside Stemma's own eval of the same items (needs the engine and the lm-eval venv).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "tests/integration/cluster.h"

namespace stemma::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::map<std::string, json> CellsByName(const Cluster& c, const std::string& experiment) {
  auto r = c.Cli({"exp", "get", experiment, "-o", "json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::map<std::string, json> out;
  const json parsed = r.Json();
  for (json cell : parsed["cells"]) {
    for (const char* key : {"reason", "state", "job_id"}) {
      if (!cell.contains(key)) cell[key] = "";
    }
    out[cell["job_name"]] = cell;
  }
  return out;
}

// The registered artifacts of an experiment, by "<job name>/<output name>".
std::map<std::string, json> Artifacts(const Cluster& c, const std::string& experiment,
                                      const std::map<std::string, json>& cells) {
  std::map<std::string, std::string> names;  // job id -> job name
  for (const auto& [name, cell] : cells) names[cell["job_id"]] = name;
  auto r = c.Cli({"ckpt", "ls", "--experiment", experiment, "-o", "json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::map<std::string, json> out;
  const json parsed = r.Json();
  for (const json& a : parsed) {
    if (a.value("state", "") == "ARTIFACT_DELETED") continue;
    const std::string job = a.value("job_id", "");
    if (names.count(job)) out[names[job] + "/" + a.value("name", "")] = a;
  }
  return out;
}

int Lines(const std::string& path) {
  std::ifstream in(path);
  int n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

// `make` writes a checkpoint with its own code (a shell script, whose content is in the key);
// `derive` reads it (an input) and writes a checkpoint and a results file; each run of either
// adds a line to a counter file.
std::string Study(const std::string& dir, bool cache_make) {
  return "name: execs\nstages:\n"
         "  make:\n"
         "    exec:\n"
         "      argv: [/bin/sh, " +
         dir + "/make.sh]\n" + "      code: [" + dir + "/make.sh]\n" +
         (cache_make ? "" : "      cache: false\n") +
         "      outputs: {model: {path: execs/make/model, type: checkpoint}}\n"
         "  derive:\n"
         "    needs: [make]\n"
         "    labels: {report.row: mine}\n"
         "    exec:\n"
         "      argv: [/bin/sh, " +
         dir + "/derive.sh, \"${{ needs.make.outputs.model }}\"]\n" +
         "      inputs: [\"${{ needs.make.outputs.model }}\"]\n"
         "      code: [" +
         dir + "/derive.sh]\n" +
         "      outputs:\n"
         "        model: {path: execs/derive/model, type: checkpoint}\n"
         "        results: {path: execs/derive/results.json, type: results}\n";
}

void WriteScripts(const Cluster& c, const std::string& version) {
  c.WriteFile("make.sh", "# " + version + "\nset -e\necho run >> " + c.dir() +
                             "/make.runs\nd=\"$STEMMA_OUTPUT_MODEL\"\nmkdir -p \"$d\"\n"
                             "printf '{\"model_type\": \"llama\"}' > \"$d/config.json\"\n"
                             "printf 'weights' > \"$d/model.safetensors\"\n");
  c.WriteFile("derive.sh",
              "set -e\necho run >> " + c.dir() +
                  "/derive.runs\nd=\"$STEMMA_OUTPUT_MODEL\"\nmkdir -p \"$d\"\n"
                  "cp \"$1/config.json\" \"$1/model.safetensors\" \"$d/\"\n"
                  "printf '{\"format\": \"stemma-eval-v1\", \"tasks\": [{\"name\": \"mine_ru\", "
                  "\"type\": \"choice\", \"language\": \"ru\", \"metrics\": {\"acc\": 0.75}}]}' "
                  "> \"$STEMMA_OUTPUT_RESULTS\"\n");
}

// A coordinator and one worker whose storage root is <dir>/store; returns the root.
std::string StartWithStorageRoot(Cluster& c) {
  c.StartCoordinator();
  const std::string root = c.dir() + "/store";
  fs::create_directories(root);
  Cluster::WorkerOptions w;
  w.extra = {"--storage-root", root};
  c.StartWorker("w1", w);
  c.WaitForWorkers(1);
  return root;
}

// `stemma sweep -f file`, then `stemma exp wait execs`: both succeed, or what they said.
::testing::AssertionResult SweepAndWait(const Cluster& c, const std::string& file) {
  const CliResult sweep = c.Cli({"sweep", "-f", file});
  if (sweep.exit_code != 0) {
    return ::testing::AssertionFailure() << "sweep: " << sweep.out << sweep.err;
  }
  const CliResult wait = c.Cli({"exp", "wait", "execs", "--timeout", "60"});
  if (wait.exit_code != 0) {
    return ::testing::AssertionFailure() << "exp wait: " << wait.out << wait.err;
  }
  return ::testing::AssertionSuccess();
}

TEST(ExecStage, OutputsRegisteredWithLineageServedFromCacheAndRerunOnChange) {
  Cluster c;
  const std::string root = StartWithStorageRoot(c);
  WriteScripts(c, "v1");
  const std::string file = c.WriteFile("execs.yaml", Study(c.dir(), true));
  ASSERT_TRUE(SweepAndWait(c, file));
  auto cells = CellsByName(c, "execs");
  ASSERT_EQ(cells.at("derive")["state"], "SUCCEEDED") << cells.at("derive").dump();

  // Registered like an engine job's outputs: a checkpoint with its manifest, its parent the
  // registered checkpoint among the inputs; the results as a file.
  auto arts = Artifacts(c, "execs", cells);
  ASSERT_TRUE(arts.count("make/model") && arts.count("derive/model") &&
              arts.count("derive/results"))
      << c.Cli({"ckpt", "ls", "-o", "json"}).out;
  const json& made = arts.at("make/model");
  const json& derived = arts.at("derive/model");
  EXPECT_EQ(made["type"], "checkpoint");
  EXPECT_EQ(made["path"], root + "/execs/make/model");
  EXPECT_EQ(made["operation"], "exec");
  EXPECT_TRUE(fs::exists(root + "/execs/make/model/stemma.json"));
  EXPECT_EQ(arts.at("derive/results")["type"], "file");
  ASSERT_EQ(derived["parents"].size(), 1u) << derived.dump();
  EXPECT_EQ(derived["parents"][0], made["id"]);
  EXPECT_FALSE(made.contains("parents") && !made["parents"].empty()) << "make reads nothing";
  auto verify = c.Cli({"ckpt", "verify", derived["id"]});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
  auto show = c.Cli({"ckpt", "show", derived["id"], "-o", "json"});
  ASSERT_EQ(show.exit_code, 0) << show.err;
  EXPECT_NE(show.out.find(made["id"].get<std::string>()), std::string::npos) << show.out;
  // The results file's metrics are the job's metric points, and the report's row.
  auto report = c.Cli({"report", "execs", "--format", "json", "--metric", "acc"});
  ASSERT_EQ(report.exit_code, 0) << report.err;
  const json rep = report.Json();
  ASSERT_EQ(rep["rows"].size(), 1u) << rep.dump();
  EXPECT_EQ(rep["rows"][0]["title"], "mine");
  EXPECT_DOUBLE_EQ(rep["rows"][0]["cells"]["acc/mine_ru"]["value"].get<double>(), 0.75);
  EXPECT_EQ(Lines(c.dir() + "/make.runs"), 1);
  EXPECT_EQ(Lines(c.dir() + "/derive.runs"), 1);

  // Unchanged: a new revision, both served from the cache (no run).
  ASSERT_TRUE(SweepAndWait(c, file));
  cells = CellsByName(c, "execs");
  for (const char* name : {"make", "derive"}) {
    EXPECT_EQ(cells.at(name)["state"], "SUCCEEDED") << name;
    EXPECT_NE(cells.at(name)["reason"].get<std::string>().find("memoized from"), std::string::npos)
        << name << ": " << cells.at(name).dump();
  }
  EXPECT_EQ(Lines(c.dir() + "/make.runs"), 1);
  EXPECT_EQ(Lines(c.dir() + "/derive.runs"), 1);

  // A change of make's code (a comment): it runs again, and so does derive (its input's
  // manifest is a new one: the worker wrote it for another job).
  WriteScripts(c, "v2");
  ASSERT_TRUE(SweepAndWait(c, file));
  EXPECT_EQ(Lines(c.dir() + "/make.runs"), 2);
  EXPECT_EQ(Lines(c.dir() + "/derive.runs"), 2);
  // Unchanged again: cached again.
  ASSERT_TRUE(SweepAndWait(c, file));
  EXPECT_EQ(Lines(c.dir() + "/make.runs"), 2);
  // cache: false runs make although nothing changed.
  ASSERT_TRUE(SweepAndWait(c, c.WriteFile("execs.yaml", Study(c.dir(), false))));
  EXPECT_EQ(Lines(c.dir() + "/make.runs"), 3);
  EXPECT_EQ(CellsByName(c, "execs").at("make")["state"], "SUCCEEDED");
}

TEST(ExecStage, AMissingDeclaredOutputFailsTheJobNamingIt) {
  Cluster c;
  const std::string root = StartWithStorageRoot(c);
  auto ids = c.Submit(
      "exec:\n  argv: [/bin/true]\n  outputs: {model: {path: out/model, type: checkpoint}}\n"
      "max_attempts: 3\n");
  ASSERT_EQ(ids.size(), 1u);
  ASSERT_EQ(c.WaitFor(ids[0], {"FAILED", "SUCCEEDED"}), "FAILED");
  const json job = c.Get(ids[0]);
  EXPECT_NE(job.value("reason", "")
                .find("declared output 'model' (checkpoint) is missing: " + root + "/out/model"),
            std::string::npos)
      << job.dump();
  EXPECT_EQ(job.value("attempts", 0), 1) << "the same every time: not retried";
}

// --- lm-evaluation-harness beside Stemma's eval ---------------------------------------------

std::string EngineBinary() {
  if (fs::exists(Cluster::BinDir() + "/stemma-engine")) return Cluster::BinDir() + "/stemma-engine";
  if (const char* e = std::getenv("STEMMA_ENGINE"); e != nullptr && fs::exists(e)) return e;
  return "";
}

std::string LmEvalVenv() {
  if (const char* v = std::getenv("STEMMA_LMEVAL_VENV"); v != nullptr) return v;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/root") + "/.cache/stemma/venv-lmeval";
}

TEST(LmEval, AgreesWithStemmaEvalOnTheSameItemsAndJoinsTheReport) {
  const std::string engine = EngineBinary();
  if (engine.empty()) {
    GTEST_SKIP() << "stemma-engine is not built here (STEMMA_BUILD_ENGINE=OFF); STEMMA_ENGINE=PATH "
                    "points at one";
  }
  const std::string venv = LmEvalVenv();
  if (!fs::exists(venv + "/bin/python") || !fs::exists(venv + "/.stemma-setup-stamp")) {
    GTEST_SKIP() << "no lm-eval venv at " << venv
                 << " (scripts/setup --engine makes it; STEMMA_LMEVAL_VENV=DIR points at one)";
  }
  if (!fs::exists("/usr/share/locale/ru/LC_MESSAGES")) {
    GTEST_SKIP() << "no gettext catalogues under /usr/share/locale (scripts/setup --engine)";
  }
  const std::string source = STEMMA_SOURCE_DIR;
  Cluster c;
  c.StartCoordinator();
  // The storage root holds what the study's relative paths name: the stage's script.
  const std::string root = c.dir() + "/store";
  fs::create_directories(root + "/configs/experiments/lm-eval");
  fs::copy_file(source + "/configs/experiments/lm-eval/lm_eval_stage.py",
                root + "/configs/experiments/lm-eval/lm_eval_stage.py");
  Cluster::WorkerOptions w;
  w.cpus = 2;
  w.extra = {"--storage-root", root, "--read-root", "/usr/share/locale"};
  // The engine beside the worker or on PATH; lm_eval's python first on PATH.
  w.env = {"PATH=" + venv + "/bin:" + fs::path(engine).parent_path().string() + ":" +
           (std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin")};
  c.StartWorker("w1", w);
  c.WaitForWorkers(1);
  // The example study, with fewer training steps and items.
  std::string study = Cluster::ReadFile(source + "/configs/experiments/lm-eval.yaml");
  study = std::regex_replace(study, std::regex("steps: 20"), "steps: 4");
  study = std::regex_replace(study, std::regex("items: 40"), "items: 24");
  auto sweep = c.Cli({"sweep", "-f", c.WriteFile("lm-eval.yaml", study)});
  ASSERT_EQ(sweep.exit_code, 0) << sweep.out << sweep.err;
  auto wait = c.Cli({"exp", "wait", "lm-eval", "--timeout", "900"});
  auto cells = CellsByName(c, "lm-eval");
  ASSERT_EQ(wait.exit_code, 0) << wait.out << wait.err << "\n"
                               << Cluster::ReadFile(c.dir() + "/worker-w1.log");

  // Per checkpoint, lm_eval's results file and Stemma's eval results: the same documents,
  // and acc / acc_norm equal (the same log-likelihood argmax, a few float differences apart
  // at most, which these numbers do not show).
  for (const auto& [stemma, lmeval] :
       {std::pair{"eval-base", "lmeval-base"}, std::pair{"eval-cpt", "lmeval-cpt"}}) {
    SCOPED_TRACE(lmeval);
    const json s =
        json::parse(Cluster::ReadFile(c.Get(cells.at(stemma)["job_id"])["outputs"]["results"]));
    const json l =
        json::parse(Cluster::ReadFile(c.Get(cells.at(lmeval)["job_id"])["outputs"]["results"]));
    ASSERT_EQ(l["format"], "stemma-eval-v1");
    ASSERT_EQ(s["tasks"].size(), 1u);
    ASSERT_EQ(l["tasks"].size(), 1u);
    EXPECT_EQ(l["tasks"][0]["name"], s["tasks"][0]["name"]);
    EXPECT_EQ(l["tasks"][0]["docs"], 24);
    for (const char* m : {"acc", "acc_norm"}) {
      const double sv = s["metrics"][std::string(m) + "/continuation_ru"].get<double>();
      const double lv = l["metrics"][std::string(m) + "/continuation_ru"].get<double>();
      EXPECT_NEAR(sv, lv, 1e-9) << m << ": stemma " << sv << ", lm-eval " << lv;
    }
    // lm_eval evaluated the checkpoint Stemma evaluated (the same manifest).
    EXPECT_EQ(l["checkpoint"]["sha256"], s["checkpoint"]["sha256"]);
  }
  // Both in the report, lm-eval's rows beside Stemma's, in the same column.
  auto report =
      c.Cli({"report", "lm-eval", "--format", "json", "--metric", "acc", "--metric", "acc_norm"});
  ASSERT_EQ(report.exit_code, 0) << report.err;
  const json rep = report.Json();
  std::map<std::string, json> rows;
  for (const json& r : rep["rows"]) rows[r["title"]] = r;
  for (const char* title :
       {"base (stemma eval)", "ru expert (stemma eval)", "base (lm-eval)", "ru expert (lm-eval)"}) {
    ASSERT_TRUE(rows.count(title)) << title << "\n" << rep.dump();
    EXPECT_TRUE(rows[title]["cells"].contains("acc/continuation_ru")) << rows[title].dump();
  }
  EXPECT_DOUBLE_EQ(
      rows["base (lm-eval)"]["cells"]["acc/continuation_ru"]["value"].get<double>(),
      rows["base (stemma eval)"]["cells"]["acc/continuation_ru"]["value"].get<double>());
  // The lm-eval results are registered, and measured the checkpoint they read.
  auto arts = Artifacts(c, "lm-eval", cells);
  ASSERT_TRUE(arts.count("lmeval-cpt/results")) << c.Cli({"ckpt", "ls", "-o", "json"}).out;
}

}  // namespace
}  // namespace stemma::testing
