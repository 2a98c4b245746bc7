// Eval results cached per task (engine/eval/task_cache.h), through the stemma-engine binary on
// a model it initialises itself: a second eval with one task more computes only that task
// and serves the others with the same numbers to the last digit (bits per byte included,
// and the bpb/all micro-average), naming where each came from; an eval of cached tasks only
// loads no model, and is answered by stemma-engine's torch-free front without starting
// LibTorch at all; a changed data file, dtype or `cache: false` computes again; an entry
// written after the attempt's spec file is not used (all ranks decide alike).
#include "engine/eval/task_cache.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/sha256.h"

namespace stemma::engine::eval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class TaskCacheTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(
        (fs::temp_directory_path() / ("stemma_task_cache_test_" + std::to_string(::getpid())))
            .string());
    fs::remove_all(*root_);
    fs::create_directories(*root_);
    ASSERT_EQ(Run("init --preset tiny --seed 3 --out " + *root_ + "/model"), 0);
    std::string text;
    for (int i = 0; i < 60; ++i) text += "Sentence number " + std::to_string(i) + " of the text.\n";
    for (const char* lang : {"aa", "bb", "cc"}) {
      const std::string raw = *root_ + "/" + lang + ".txt";
      std::ofstream(raw) << lang << ": " << text;
      ASSERT_EQ(
          Run(std::string("tokenize --tokenizer ") + *root_ + "/model --input " + raw +
              " --format text --line-docs --language " + lang + " --out " + *root_ + "/ds_" + lang),
          0);
    }
    std::ofstream choice(*root_ + "/piqa.jsonl");
    for (int i = 0; i < 6; ++i) {
      choice << json({{"goal", "Goal " + std::to_string(i)},
                      {"sol1", "first way"},
                      {"sol2", "second way " + std::to_string(i)},
                      {"label", i % 2}})
                    .dump()
             << "\n";
    }
  }
  static void TearDownTestSuite() { fs::remove_all(*root_); }

  static int Run(const std::string& args, const std::string& env = "",
                 const std::string& binary = STEMMA_ENGINE_BIN) {
    const std::string cmd =
        env + " " + binary + " " + args + " >" + *root_ + "/last.out 2>" + *root_ + "/last.err";
    const int status = std::system(cmd.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  static json Task(const std::string& lang) {
    return {{"type", "perplexity"},           {"name", "ppl_" + lang}, {"language", lang},
            {"data", *root_ + "/ds_" + lang}, {"split", "all"},        {"seq_len", 32}};
  }
  // Runs `binary` on an eval of `tasks` with the cache in <root>/cache, results in
  // <root>/<name>.json; returns the exit code.
  static int RunEval(const std::string& name, const json& tasks, const std::string& extra_env,
                     const json& extra = json::object(),
                     const std::string& binary = STEMMA_ENGINE_BIN) {
    json spec = {{"model", *root_ + "/model"},
                 {"tokenizer", *root_ + "/model"},
                 {"out", *root_ + "/" + name + ".json"},
                 {"tasks", tasks}};
    for (const auto& [k, v] : extra.items()) spec[k] = v;
    const std::string spec_path = *root_ + "/" + name + ".spec.json";
    std::ofstream(spec_path) << spec.dump();
    return Run("eval --spec " + spec_path,
               "STEMMA_EVAL_CACHE=" + *root_ + "/cache STEMMA_JOB_ID=j-" + name + " " + extra_env,
               binary);
  }
  // RunEval through stemma-engine, which must succeed; returns the results file.
  json Eval(const std::string& name, const json& tasks, const std::string& extra_env = "",
            const json& extra = json::object()) {
    EXPECT_EQ(RunEval(name, tasks, extra_env, extra), 0) << Read(*root_ + "/last.err");
    return json::parse(Read(*root_ + "/" + name + ".json"));
  }
  static const json& TaskOf(const json& results, const std::string& name) {
    for (const json& t : results["tasks"]) {
      if (t["name"] == name) return t;
    }
    static const json none;
    ADD_FAILURE() << "no task " << name;
    return none;
  }
  // Each line of `text` as JSON: events compared by content (a metric event's labels are a
  // protobuf map, written in an order that varies from process to process).
  static std::vector<json> EventLines(const std::string& text) {
    std::vector<json> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
    return lines;
  }
  static bool Served(const json& results, const std::string& name) {
    return TaskOf(results, name).contains("cache");
  }

  static std::string* root_;
};
std::string* TaskCacheTest::root_ = nullptr;

TEST_F(TaskCacheTest, ANewTaskIsComputedAndTheOthersServedToTheLastDigit) {
  const json choice = {{"type", "choice"},
                       {"name", "piqa"},
                       {"format", "piqa"},
                       {"language", "en"},
                       {"data", *root_ + "/piqa.jsonl"}};
  const json first = Eval("first", {Task("aa"), Task("bb"), choice});
  EXPECT_EQ(first["task_cache"]["computed"], 3);
  EXPECT_EQ(first["task_cache"]["served"], 0);
  EXPECT_FALSE(Served(first, "ppl_aa"));

  const json second = Eval("second", {Task("aa"), Task("bb"), Task("cc"), choice});
  EXPECT_EQ(second["task_cache"]["computed"], 1);
  EXPECT_EQ(second["task_cache"]["served"], 3);
  EXPECT_TRUE(Served(second, "ppl_aa"));
  EXPECT_TRUE(Served(second, "piqa"));
  EXPECT_FALSE(Served(second, "ppl_cc"));
  EXPECT_EQ(TaskOf(second, "ppl_aa")["cache"]["served_from"]["job"], "j-first");
  EXPECT_EQ(TaskOf(second, "ppl_aa")["cache"]["served_from"]["results"], *root_ + "/first.json");
  // The same numbers, digit for digit (compared as the JSON text writes them).
  for (const char* m : {"bpb/ppl_aa", "ppl/ppl_aa", "bpb/ppl_bb", "acc/piqa", "acc_norm/piqa"}) {
    EXPECT_EQ(second["metrics"][m].dump(), first["metrics"][m].dump()) << m;
  }
  // bpb/all over the served and the computed tasks equals a cold run of the same list.
  const json cold =
      Eval("cold", {Task("aa"), Task("bb"), Task("cc"), choice}, "STEMMA_EVAL_CACHE= ");
  EXPECT_FALSE(cold.contains("task_cache"));
  EXPECT_EQ(second["metrics"]["bpb/all"].dump(), cold["metrics"]["bpb/all"].dump());
  EXPECT_EQ(second["metrics"]["bpb/ppl_cc"].dump(), cold["metrics"]["bpb/ppl_cc"].dump());

  // Only cached tasks: served without loading the model (a model that is not loadable any
  // more but whose manifest is unchanged would fail to load: its weights are hidden here).
  const std::string weights = *root_ + "/model/model.safetensors";
  fs::rename(weights, weights + ".away");
  const json third = Eval("third", {Task("bb"), choice});
  fs::rename(weights + ".away", weights);
  EXPECT_EQ(third["task_cache"]["served"], 2);
  EXPECT_EQ(third["metrics"]["bpb/ppl_bb"].dump(), first["metrics"]["bpb/ppl_bb"].dump());
  EXPECT_NE(Read(*root_ + "/last.out").find("\"name\":\"bpb/ppl_bb\""), std::string::npos)
      << "served tasks still report their metrics as events";
}

// stemma-engine is a torch-free front that runs stemma-engine-torch (beside it, by execv) for
// whatever it does not answer itself (engine/front/main.cc, serve_cached.h). A copy of the
// front alone in a directory, where no LibTorch engine can be started, answers an eval whose
// tasks were all computed before — with the numbers of the cold run, with a results file byte
// for byte and events equal to what stemma-engine-torch writes for the same eval — and cannot
// answer one with a new task, which the real front hands on to be computed and merged.
TEST_F(TaskCacheTest, AFullyCachedEvalNeverStartsLibTorch) {
  const json piqa = {{"type", "choice"},
                     {"name", "piqa"},
                     {"format", "piqa"},
                     {"language", "en"},
                     {"data", *root_ + "/piqa.jsonl"}};
  // A batch size no other test uses: every task is new to the cache here.
  const json batch = {{"batch_size", 3}};
  const json cold = Eval("front_cold", {Task("aa"), Task("bb"), Task("cc"), piqa}, "", batch);
  ASSERT_EQ(cold["task_cache"]["computed"], 4);
  const fs::path bin = fs::path(STEMMA_ENGINE_BIN).parent_path();
  ASSERT_TRUE(fs::exists(bin / "stemma-engine-torch"));
  const std::string alone = *root_ + "/front_only/stemma-engine";
  fs::create_directories(fs::path(alone).parent_path());
  fs::copy_file(STEMMA_ENGINE_BIN, alone, fs::copy_options::overwrite_existing);

  // English dropped: every task left is served by the front alone (the cold run's keys used
  // the front's build too: it hands its build id to the LibTorch engine it starts).
  const json dropped = {Task("aa"), Task("bb"), piqa};
  ASSERT_EQ(RunEval("front_alone", dropped, "", batch, alone), 0) << Read(*root_ + "/last.err");
  const json served = json::parse(Read(*root_ + "/front_alone.json"));
  EXPECT_EQ(served["task_cache"]["served"], 3);
  EXPECT_EQ(served["task_cache"]["computed"], 0);
  for (const char* m : {"bpb/ppl_aa", "ppl/ppl_bb", "acc/piqa", "acc_norm/piqa"}) {
    EXPECT_EQ(served["metrics"][m].dump(), cold["metrics"][m].dump()) << m;
  }

  // The same eval through stemma-engine-torch directly and through the front alone: the same
  // bytes in the results file, the same events on stdout.
  absl::StatusOr<std::string> front_hash = Sha256File(STEMMA_ENGINE_BIN);
  ASSERT_TRUE(front_hash.ok());
  const std::string build = "STEMMA_ENGINE_BUILD_ID=sha256:" + front_hash->substr(0, 16);
  ASSERT_EQ(RunEval("same", dropped, build, batch, (bin / "stemma-engine-torch").string()), 0)
      << Read(*root_ + "/last.err");
  const std::string torch_results = Read(*root_ + "/same.json");
  const std::string torch_events = Read(*root_ + "/last.out");
  ASSERT_EQ(json::parse(torch_results)["task_cache"]["served"], 3);
  ASSERT_EQ(RunEval("same", dropped, build, batch, alone), 0) << Read(*root_ + "/last.err");
  EXPECT_EQ(Read(*root_ + "/same.json"), torch_results);
  EXPECT_EQ(EventLines(Read(*root_ + "/last.out")), EventLines(torch_events));

  // A new task: the front alone cannot compute it and says which binary it needed (and
  // writes no results); the real front computes it and serves the rest.
  const json added = {Task("aa"), Task("bb"), Task("cc"), piqa, Task("dd")};
  std::ofstream(*root_ + "/dd.txt") << "A language nobody evaluated before.\n";
  ASSERT_EQ(Run("tokenize --tokenizer " + *root_ + "/model --input " + *root_ +
                "/dd.txt --format text --line-docs --language dd --out " + *root_ + "/ds_dd"),
            0);
  EXPECT_EQ(RunEval("front_new", added, "", batch, alone), 1);
  EXPECT_NE(Read(*root_ + "/last.err").find("stemma-engine-torch"), std::string::npos)
      << Read(*root_ + "/last.err");
  EXPECT_FALSE(fs::exists(*root_ + "/front_new.json"));
  const json merged = Eval("front_new", added, "", batch);
  EXPECT_EQ(merged["task_cache"]["served"], 4);
  EXPECT_EQ(merged["task_cache"]["computed"], 1);
  EXPECT_FALSE(Served(merged, "ppl_dd"));
  EXPECT_EQ(merged["metrics"]["bpb/ppl_cc"].dump(), cold["metrics"]["bpb/ppl_cc"].dump());
}

// The front writes the results' tokenizer.kind from the entries, which record it (the
// tokenizer's files are in every key), without loading the tokenizer; entries written before
// they recorded it are still served, the tokenizer then loaded as before.
TEST_F(TaskCacheTest, AnAllHitEvalTakesTheTokenizerKindFromTheEntries) {
  const json batch = {{"batch_size", 5}};  // no other test's: its own entries
  const json cold = Eval("kind_cold", {Task("aa"), Task("bb")}, "", batch);
  ASSERT_EQ(cold["task_cache"]["computed"], 2);
  const std::string kind = cold["tokenizer"]["kind"];
  ASSERT_FALSE(kind.empty());
  const std::string alone = *root_ + "/kind_front/stemma-engine";
  fs::create_directories(fs::path(alone).parent_path());
  fs::copy_file(STEMMA_ENGINE_BIN, alone, fs::copy_options::overwrite_existing);
  // Copies of this test's entries: as written, with another recorded kind, without the kind.
  int entries = 0;
  for (const auto& file : fs::directory_iterator(*root_ + "/cache")) {
    json entry = json::parse(Read(file.path().string()));
    if (entry["identity"]["batch_size"] != 5) continue;
    ++entries;
    EXPECT_EQ(entry["tokenizer_kind"], kind) << file.path();
    for (const char* dir : {"kind_recorded", "kind_other", "kind_old"}) {
      fs::create_directories(*root_ + "/" + dir);
      if (std::string(dir) == "kind_other") entry["tokenizer_kind"] = "recorded-kind";
      if (std::string(dir) == "kind_old") entry.erase("tokenizer_kind");
      std::ofstream(*root_ + "/" + dir + "/" + file.path().filename().string()) << entry.dump(2);
    }
  }
  ASSERT_EQ(entries, 2);
  std::map<std::string, json> served;
  for (const char* dir : {"kind_recorded", "kind_other", "kind_old"}) {
    ASSERT_EQ(RunEval(dir, {Task("aa"), Task("bb")}, "STEMMA_EVAL_CACHE=" + *root_ + "/" + dir,
                      batch, alone),
              0)
        << dir << ": " << Read(*root_ + "/last.err");
    served[dir] = json::parse(Read(*root_ + "/" + dir + ".json"));
    EXPECT_EQ(served[dir]["task_cache"]["served"], 2) << dir;
    EXPECT_EQ(served[dir]["metrics"], cold["metrics"]) << dir;
  }
  EXPECT_EQ(served["kind_recorded"]["tokenizer"]["kind"], kind);
  // The kind the entries say, so the tokenizer was not what decided it.
  EXPECT_EQ(served["kind_other"]["tokenizer"]["kind"], "recorded-kind");
  EXPECT_EQ(served["kind_old"]["tokenizer"]["kind"], kind);
}

TEST_F(TaskCacheTest, WhatDecidesAResultIsInTheKey) {
  const json warm = Eval("warm", json::array({Task("aa")}));
  ASSERT_EQ(Eval("again", json::array({Task("aa")}))["task_cache"]["served"], 1);
  // Another dtype, another sequence length, another data content: computed again.
  EXPECT_EQ(Eval("bf16", json::array({Task("aa")}), "",
                 {{"dtype", "bfloat16"}})["task_cache"]["computed"],
            1);
  json longer = Task("aa");
  longer["seq_len"] = 16;
  EXPECT_EQ(Eval("seq16", json::array({longer}))["task_cache"]["computed"], 1);
  const std::string raw = *root_ + "/aa.txt";
  std::ofstream(raw, std::ios::app) << "One more line changes the dataset.\n";
  ASSERT_EQ(Run("tokenize --tokenizer " + *root_ + "/model --input " + raw +
                " --format text --line-docs --language aa --overwrite --out " + *root_ + "/ds_aa"),
            0);
  const json changed = Eval("changed", json::array({Task("aa")}));
  EXPECT_EQ(changed["task_cache"]["computed"], 1);
  EXPECT_NE(changed["metrics"]["bpb/ppl_aa"].dump(), warm["metrics"]["bpb/ppl_aa"].dump());
}

TEST_F(TaskCacheTest, AnEntryNewerThanTheAttemptsSpecFileIsNotUsed) {
  // The worker writes <workdir>/spec.json before any rank starts: an entry written after it
  // (by a job running beside this one) is ignored by every rank alike.
  Eval("seed", json::array({Task("bb")}));
  const std::string workdir = *root_ + "/attempt";
  fs::create_directories(workdir);
  std::ofstream(workdir + "/spec.json") << "{}";
  struct timespec past[2] = {{1000000000, 0}, {1000000000, 0}};  // 2001: before every entry
  ASSERT_EQ(::utimensat(AT_FDCWD, (workdir + "/spec.json").c_str(), past, 0), 0);
  EXPECT_EQ(
      Eval("late", json::array({Task("bb")}), "STEMMA_WORKDIR=" + workdir)["task_cache"]["served"],
      0);
  EXPECT_EQ(Eval("now", json::array({Task("bb")}))["task_cache"]["served"], 1);
}

TEST(TaskCacheUnit, DamagedOrForeignEntriesAreMisses) {
  const std::string dir =
      fs::temp_directory_path() / ("stemma_tc_unit_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  TaskCache cache(dir, 0, "build-1");
  const std::string key = cache.Key({{"task", "x"}});
  EXPECT_NE(key, TaskCache(dir, 0, "build-2").Key({{"task", "x"}}));  // the build is in the key
  EXPECT_FALSE(cache.Find(key).has_value());
  ASSERT_TRUE(cache.Store(key, {{"key", key}, {"result", {{"metrics", {{"acc", 0.5}}}}}}).ok());
  ASSERT_TRUE(cache.Find(key).has_value());
  std::ofstream(dir + "/" + key + ".json") << "{\"key\": \"other\", \"result\": {}}";
  EXPECT_FALSE(cache.Find(key).has_value());
  std::ofstream(dir + "/" + key + ".json") << "not json";
  EXPECT_FALSE(cache.Find(key).has_value());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace stemma::engine::eval
