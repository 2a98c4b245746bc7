// Declared outputs of exec jobs (issue 23) through the real executor: real children that
// write (or forget to write) what they declared, and the manifests the worker computes.
#include "worker/exec_outputs.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "common/manifest.h"
#include "common/sha256.h"
#include "worker/executor.h"

namespace stemma::worker {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kWaitMs = 30'000;

std::string Read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ExecOutputsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("exec_outputs_test." + std::to_string(getpid()) + "." +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "root/bob");
    config_.data_dir = (dir_ / "data").string();
    config_.storage_root = (dir_ / "root").string();
    config_.allow_exec = true;
    config_.kill_grace_ms = 300;
  }
  void TearDown() override {
    executor_.reset();
    fs::remove_all(dir_);
  }

  Executor& executor() {
    if (!executor_) executor_ = std::make_unique<Executor>(config_, nullptr);
    return *executor_;
  }

  // An exec attempt running `script` with /bin/sh, declaring `outputs` (name, path, type).
  static v1::Assignment Script(const std::string& id, const std::string& script,
                               std::vector<std::array<std::string, 3>> outputs) {
    v1::Assignment a;
    a.set_job_id("j-" + id);
    a.set_attempt_id(id);
    a.set_world_size(1);
    v1::ExecSpec& e = *a.mutable_spec()->mutable_exec();
    for (const char* arg : {"/bin/sh", "-c"}) e.add_argv(arg);
    e.add_argv(script);
    for (const auto& [name, path, type] : outputs) {
      (*e.mutable_outputs())[name].set_path(path);
      (*e.mutable_outputs())[name].set_type(type);
    }
    return a;
  }

  AttemptSnapshot Run(const v1::Assignment& a) {
    EXPECT_TRUE(executor().Launch(a).ok());
    EXPECT_TRUE(executor().WaitFinished(a.attempt_id(), kWaitMs));
    return executor().Get(a.attempt_id()).value_or(AttemptSnapshot{});
  }

  fs::path dir_;
  WorkerConfig config_;
  std::unique_ptr<Executor> executor_;
};

TEST_F(ExecOutputsTest, AMissingOutputFailsTheAttemptNamingItAndItsPath) {
  // The program exits 0 but writes only one of its two outputs.
  AttemptSnapshot s =
      Run(Script("miss", "echo hi > \"$STEMMA_OUTPUT_NOTES\"",
                 {{"notes", "bob/notes.txt", "file"}, {"model", "bob/model", "checkpoint"}}));
  ASSERT_TRUE(s.finished);
  EXPECT_NE(s.result.exit_code(), 0);
  const std::string path = (dir_ / "root/bob/model").string();
  EXPECT_EQ(s.result.reason(),
            "exit 0, but declared output 'model' (checkpoint) is missing: " + path);
  EXPECT_FALSE(s.result.retryable());
  EXPECT_EQ(s.result.artifacts_size(), 0);
  EXPECT_NE(Read(s.log_path).find("declared output 'model' (checkpoint) is missing"),
            std::string::npos);

  // A checkpoint directory without weights is not a checkpoint.
  s = Run(
      Script("noweights",
             "mkdir -p \"$STEMMA_OUTPUT_MODEL\" && echo {} > \"$STEMMA_OUTPUT_MODEL/config.json\"",
             {{"model", "bob/m2", "checkpoint"}}));
  EXPECT_NE(s.result.reason().find("declared output 'model' (checkpoint) has no model.safetensors"),
            std::string::npos)
      << s.result.reason();
  // A program that fails keeps its own reason: outputs are not looked at.
  s = Run(Script("fails", "exit 3", {{"model", "bob/m3", "checkpoint"}}));
  EXPECT_EQ(s.result.reason(), "exit 3");
  EXPECT_TRUE(s.result.retryable());
}

TEST_F(ExecOutputsTest, ACheckpointGetsTheManifestTheRegistryReads) {
  // An input checkpoint with a manifest of its own: the parent.
  const fs::path base = dir_ / "root/base";
  fs::create_directories(base);
  std::ofstream(base / "stemma.json") << R"({"format": 1, "files": {}, "type": "checkpoint"})";
  v1::Assignment a =
      Script("ckpt",
             "set -e; d=\"$STEMMA_OUTPUT_MODEL\"; mkdir -p \"$d/tok\"; "
             "printf '{\"model_type\": \"llama\"}' > \"$d/config.json\"; "
             "printf 'weights' > \"$d/model.safetensors\"; "
             "printf 'vocab' > \"$d/tok/vocab.txt\"; "
             "printf 'a,b\\n' > \"$STEMMA_OUTPUT_TABLE\"",
             {{"model", "bob/expert", "checkpoint"}, {"table", "bob/t.csv", "file"}});
  a.mutable_spec()->mutable_exec()->add_inputs("base");
  AttemptSnapshot s = Run(a);
  ASSERT_EQ(s.result.exit_code(), 0) << s.result.reason();
  ASSERT_EQ(s.result.artifacts_size(), 2);
  const v1::OutputArtifact& model = s.result.artifacts(0);
  const fs::path out = dir_ / "root/bob/expert";
  EXPECT_EQ(model.name(), "model");
  EXPECT_EQ(model.type(), "checkpoint");
  EXPECT_EQ(model.path(), out.string());
  EXPECT_EQ(model.operation(), "exec");
  EXPECT_EQ(s.result.outputs().at("model"), out.string());
  // The manifest hash is the sha256 of the stemma.json written beside the files.
  const std::string text = Read(out / "stemma.json");
  EXPECT_EQ(model.manifest_sha256(), Sha256Hex(text));
  absl::StatusOr<manifest::Manifest> m = manifest::ParseManifest(text, "stemma.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->type, "checkpoint");
  EXPECT_EQ(m->producer.command, "exec");
  EXPECT_EQ(m->producer.job, "j-ckpt");
  ASSERT_EQ(m->files.size(), 3u);
  for (const char* f : {"config.json", "model.safetensors", "tok/vocab.txt"}) {
    SCOPED_TRACE(f);
    ASSERT_EQ(m->files.count(f), 1u);
    EXPECT_EQ(m->files.at(f).sha256, Sha256File((out / f).string()).value());
    EXPECT_EQ(m->files.at(f).bytes, fs::file_size(out / f));
  }
  EXPECT_EQ(model.bytes(), 23 + 7 + 5);
  ASSERT_EQ(m->parents.size(), 1u);
  EXPECT_EQ(m->parents[0].path, base.string());
  EXPECT_EQ(m->parents[0].manifest_sha256, Sha256File((base / "stemma.json").string()).value());
  ASSERT_EQ(model.parents_size(), 1);
  EXPECT_EQ(model.parents(0), base.string());
  // A file output: its own sha256.
  const v1::OutputArtifact& table = s.result.artifacts(1);
  EXPECT_EQ(table.name(), "table");
  EXPECT_EQ(table.type(), "file");
  EXPECT_EQ(table.manifest_sha256(), Sha256Hex("a,b\n"));
  EXPECT_EQ(table.bytes(), 4);

  // A stemma.json the program wrote itself is taken as it is.
  const std::string own =
      R"({"format": 1, "files": {"config.json": {"sha256": "00", "bytes": 2}}})";
  v1::Assignment b =
      Script("own",
             "set -e; d=\"$STEMMA_OUTPUT_MODEL\"; mkdir -p \"$d\"; "
             "printf '{}' > \"$d/config.json\"; printf w > \"$d/model.safetensors\"; "
             "printf '%s' '" +
                 own + "' > \"$d/stemma.json\"",
             {{"model", dir_.string() + "/abs-model", "checkpoint"}});
  s = Run(b);
  ASSERT_EQ(s.result.exit_code(), 0) << s.result.reason();
  EXPECT_EQ(s.result.artifacts(0).manifest_sha256(), Sha256Hex(own));
  EXPECT_EQ(s.result.artifacts(0).bytes(), 2);
}

TEST_F(ExecOutputsTest, AResultsFileBecomesMetricPoints) {
  const std::string results = R"({"format": "stemma-eval-v1", "tasks": [
      {"name": "continuation_ru", "type": "choice", "language": "ru",
       "metrics": {"acc": 0.25, "acc_norm": 0.5}}]})";
  AttemptSnapshot s = Run(Script("res", "printf '%s' '" + results + "' > \"$STEMMA_OUTPUT_SCORES\"",
                                 {{"scores", "bob/lmeval.json", "results"}}));
  ASSERT_EQ(s.result.exit_code(), 0) << s.result.reason();
  ASSERT_EQ(s.result.artifacts_size(), 1);
  EXPECT_EQ(s.result.artifacts(0).name(), "scores");
  EXPECT_EQ(s.result.artifacts(0).type(), "file");
  EXPECT_EQ(s.result.artifacts(0).manifest_sha256(), Sha256Hex(results));
  v1::AttemptEvent::MetricBatch batch;
  ASSERT_EQ(executor().MetricsSince("res", 0, 100, &batch), 2u);
  std::map<std::string, double> values;
  for (int i = 0; i < batch.steps_size(); ++i) {
    values[batch.names(batch.name_index(i))] = batch.values(i);
  }
  EXPECT_EQ(values, (std::map<std::string, double>{{"acc/continuation_ru", 0.25},
                                                   {"acc_norm/continuation_ru", 0.5}}));
  ASSERT_EQ(batch.label_index_size(), 2);
  for (int i = 0; i < 2; ++i) {  // each point with its task's labels
    ASSERT_GT(batch.label_index(i), 0u);
    const auto& labels = batch.label_sets(batch.label_index(i) - 1).labels();
    EXPECT_EQ(labels.at("task"), "continuation_ru");
    EXPECT_EQ(labels.at("type"), "choice");
    EXPECT_EQ(labels.at("language"), "ru");
  }

  // Not the results format: the attempt fails and says what the file lacks.
  s = Run(Script("badres", "echo '{\"acc\": 1}' > \"$STEMMA_OUTPUT_SCORES\"",
                 {{"scores", "bob/bad.json", "results"}}));
  EXPECT_NE(s.result.exit_code(), 0);
  EXPECT_NE(s.result.reason().find("declared output 'scores' (results) " +
                                   (dir_ / "root/bob/bad.json").string() +
                                   ": \"format\" is not \"stemma-eval-v1\""),
            std::string::npos)
      << s.result.reason();
}

}  // namespace
}  // namespace stemma::worker
