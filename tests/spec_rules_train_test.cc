// The rules of the train-area engine specs (init, tokenize, train) as `stemma submit` applies
// them: a job file goes through ParseJobsYaml, ApplyDefaults and the spec's rules, and a bad
// spec is refused with one line naming the file, the line and the field. Torch-free.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/engine_cli.h"
#include "common/engine_spec.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "stemma/v1/job.pb.h"
#include "stemma/v1/specs/train.pb.h"

namespace stemma {
namespace {

// What submit does with a job file: parse (unknown fields, types), defaults, then every
// rule; the engine spec's rules with the line of each field.
absl::Status Submit(const std::string& yaml) {
  std::vector<JobSource> sources;
  absl::StatusOr<std::vector<v1::JobSpec>> jobs = ParseJobsYaml(yaml, "jobs.yaml", &sources);
  if (!jobs.ok()) return jobs.status();
  for (size_t i = 0; i < jobs->size(); ++i) {
    v1::JobSpec& job = (*jobs)[i];
    ApplyDefaults(&job);
    absl::Status plain = ValidateJobSpec(job);
    if (IsEngineJob(job)) {
      SpecContext context;
      context.where = sources[i].where;
      context.path = JobKind(job);
      context.lines = &sources[i].lines;
      context.job_cpus = static_cast<int64_t>(job.resources().cpus() + 0.999);
      absl::Status lined = ValidateEngineSpec(*EngineSpecOf(job), context);
      // The same verdict with and without line numbers.
      EXPECT_EQ(plain.ok(), lined.ok()) << plain << " / " << lined;
      if (!lined.ok()) return lined;
    }
    if (!plain.ok()) return plain;
  }
  return absl::OkStatus();
}

// The error names the file, the line and the field path.
void ExpectRefused(const std::string& yaml, int line, const std::string& field,
                   const std::string& what = "") {
  absl::Status s = Submit(yaml);
  ASSERT_FALSE(s.ok()) << "accepted:\n" << yaml;
  const std::string m(s.message());
  EXPECT_TRUE(absl::StrContains(m, "jobs.yaml")) << m;
  EXPECT_TRUE(absl::StrContains(m, absl::StrCat("line ", line, ":")))
      << m << "\nwant line " << line;
  EXPECT_TRUE(absl::StrContains(m, field)) << m << "\nwant field " << field;
  if (!what.empty()) EXPECT_TRUE(absl::StrContains(m, what)) << m << "\nwant " << what;
}

// A complete train job; `extra` lines are added to the spec (indented by two).
std::string TrainJob(const std::string& extra = "", const std::string& data_extra = "") {
  return absl::StrCat(
      "name: cpt\n"                         // 1
      "resources: {cpus: 2}\n"              // 2
      "train:\n"                            // 3
      "  model: /ckpt/base\n"               // 4
      "  out: /ckpt/expert\n"               // 5
      "  data:\n"                           // 6
      "    datasets: [{path: /data/sw}]\n"  // 7
      "    seq_len: 128\n",                 // 8
      data_extra,
      "  steps: 10\n",  // 9 (+ data_extra lines)
      extra);
}

TEST(SpecRulesTrain, ACompleteTrainJobIsAccepted) {
  EXPECT_TRUE(Submit(TrainJob()).ok()) << Submit(TrainJob());
  EXPECT_TRUE(Submit(TrainJob("  strategy: {freeze: {layers: [\"middle\", \"0:2\"]}}\n")).ok());
  EXPECT_TRUE(Submit(TrainJob("  threads: 2\n")).ok());
}

TEST(SpecRulesTrain, TrainTypoMistypeRangeMissingAndLayers) {
  ExpectRefused(TrainJob("  stepz: 30\n"), 10, "train.stepz", "unknown field");
  ExpectRefused(TrainJob("  batch_size: many\n"), 10, "train.batch_size", "must be an integer");
  ExpectRefused(TrainJob("  batch_size: 0\n"), 10, "train.batch_size", ">= 1");
  ExpectRefused(TrainJob("  optimizer: {lr: -1}\n"), 10, "train.optimizer.lr", "> 0");
  ExpectRefused(TrainJob("  schedule: {type: step}\n"), 10, "train.schedule.type", "cosine");
  ExpectRefused(
      "train:\n  model: /ckpt/base\n  data: {datasets: [{path: /d}], seq_len: 8}\n  steps: 1\n", 1,
      "train.out", "is required");
  ExpectRefused(TrainJob("", "    heldout_fraction: 1.5\n"), 9, "train.data.heldout_fraction",
                "< 1");
  ExpectRefused(TrainJob("  strategy:\n    freeze: {layers: [\"5:3\"]}\n"), 11,
                "train.strategy.freeze.layers[0]");
  // A bare integer was an inclusive bound once; it is refused, naming the new form.
  ExpectRefused(TrainJob("  strategy:\n    l2sp: [{layers: [2], lambda: 0.1}]\n"), 11,
                "train.strategy.l2sp[0].layers[0]", "\"2:6\"");
  ExpectRefused(TrainJob("  strategy:\n    l2sp: [{layers: [\"2:4\"]}]\n"), 11,
                "train.strategy.l2sp[0].lambda", "is required");
}

TEST(SpecRulesTrain, TrainCrossFieldRules) {
  ExpectRefused(TrainJob("  max_tokens: 1000\n"), 10, "train.max_tokens", "exactly one");
  ExpectRefused(TrainJob("  schedule: {warmup_steps: 11}\n"), 10, "train.schedule.warmup_steps",
                "exceeds the 10");
  ExpectRefused(TrainJob("  optimizer: {betas: [0.9]}\n"), 10, "train.optimizer.betas",
                "two numbers");
  ExpectRefused(TrainJob("  device: tpu\n"), 10, "train.device", "cpu, cuda or cuda:N");
  EXPECT_TRUE(Submit(TrainJob("  device: cuda:1\n")).ok());
  ExpectRefused(TrainJob("  eval: {every: 5}\n"), 10, "train.eval.every", "heldout");
  EXPECT_TRUE(Submit(TrainJob("  eval: {every: 5}\n", "    heldout_fraction: 0.1\n")).ok());
  ExpectRefused(TrainJob("  strategy:\n    l2sp: [{lambda: 0.1}, {lambda: 0.2}]\n"), 11,
                "train.strategy.l2sp[1]", "only one rule without 'layers'");
  ExpectRefused(
      TrainJob("  strategy:\n    neuron_mask: {file: /m.json}\n    expert_subset: {file: /e.json, "
               "language: ca, set: seft}\n"),
      12, "train.strategy.expert_subset", "cannot be combined");
}

// Issue 16 point 2: one dataset, or several without weights, need no weight.
TEST(SpecRulesTrain, DatasetsWithoutWeightsGetEqualShares) {
  EXPECT_TRUE(Submit(TrainJob()).ok());
  const std::string two =
      "train:\n  model: /m\n  out: /o\n  steps: 1\n  data:\n    seq_len: 8\n"
      "    datasets:\n      - {path: /a}\n      - {path: /b}\n";
  EXPECT_TRUE(Submit(two).ok()) << Submit(two);
  const std::string mixed =
      "train:\n  model: /m\n  out: /o\n  steps: 1\n  data:\n    seq_len: 8\n"
      "    datasets:\n      - {path: /a, weight: 2}\n      - {path: /b}\n";
  ExpectRefused(mixed, 9, "train.data.datasets[1].weight", "give every dataset a weight, or none");
  const std::string with_temperature =
      "train:\n  model: /m\n  out: /o\n  steps: 1\n  data:\n    seq_len: 8\n    temperature: 3\n"
      "    datasets:\n      - {path: /a, weight: 2}\n";
  ExpectRefused(with_temperature, 9, "train.data.datasets[0].weight", "exclude each other");
  const std::string family =
      "train:\n  model: /m\n  out: /o\n  steps: 1\n  data:\n    seq_len: 8\n    temperature: 3\n"
      "    family_weights: {bantu: 0.9}\n    datasets:\n      - {path: /a, family: bantu}\n"
      "      - {path: /b, family: replay}\n";
  ExpectRefused(family, 11, "train.data.datasets[1].family", "'replay' has no weight");
}

// Issue 16 point 4: held out by position or by a separate dataset.
TEST(SpecRulesTrain, HeldOutByPositionOrSeparateDataset) {
  EXPECT_TRUE(Submit(TrainJob("  eval: {every: 5}\n",
                              "    heldout_fraction: 0.1\n    heldout_split: last\n"))
                  .ok());
  ExpectRefused(TrainJob("", "    heldout_split: tail\n"), 9, "train.data.heldout_split",
                "hash, last");
  const std::string separate =
      "train:\n  model: /m\n  out: /o\n  steps: 1\n  eval: {every: 1}\n  data:\n    seq_len: 8\n"
      "    datasets:\n      - {path: /a, heldout_path: /a-valid}\n";
  EXPECT_TRUE(Submit(separate).ok()) << Submit(separate);
}

// Issue 16 point 8: a job asking more threads than its CPUs is refused at submit.
TEST(SpecRulesTrain, ThreadsAboveTheJobsCpusAreRefused) {
  ExpectRefused(TrainJob("  threads: 3\n"), 10, "train.threads", "more than the job's 2 CPUs");
  EXPECT_TRUE(Submit(TrainJob("  threads: 0\n")).ok());
}

TEST(SpecRulesTrain, InitRules) {
  const std::string ok =
      "init:\n  out: /ckpt/base\n  arch: llama\n  hidden_size: 256\n  num_heads: 4\n";
  EXPECT_TRUE(Submit(ok).ok()) << Submit(ok);
  ExpectRefused("init:\n  out: /o\n  hidden_sise: 256\n", 3, "init.hidden_sise", "unknown field");
  ExpectRefused("init:\n  out: /o\n  num_layers: eight\n", 3, "init.num_layers",
                "must be an integer");
  ExpectRefused("init:\n  out: /o\n  num_layers: 0\n", 3, "init.num_layers", ">= 1");
  ExpectRefused("init:\n  arch: llama\n", 1, "init.out", "is required");
  ExpectRefused("init:\n  out: /o\n  preset: huge\n", 3, "init.preset", "tiny, small");
  ExpectRefused("init:\n  out: /o\n  hidden_size: 100\n  num_heads: 3\n", 4, "init.num_heads",
                "does not divide");
  ExpectRefused("init:\n  out: /o\n  num_heads: 4\n  num_kv_heads: 3\n", 4, "init.num_kv_heads",
                "does not divide");
  ExpectRefused("init:\n  out: /o\n  num_experts: 4\n", 3, "init.num_experts", "olmoe only");
  ExpectRefused("init:\n  out: /o\n  arch: olmoe\n  num_experts: 4\n  experts_per_token: 5\n", 5,
                "init.experts_per_token", "more than num_experts");
}

TEST(SpecRulesTrain, TokenizeRules) {
  const std::string ok =
      "tokenize:\n  tokenizer: /ckpt/base\n  input: [/raw/sw.txt]\n  format: text\n  line_docs: "
      "true\n"
      "  language: sw\n  out: /data/sw\n";
  EXPECT_TRUE(Submit(ok).ok()) << Submit(ok);
  ExpectRefused("tokenize:\n  tokenizer: /t\n  inputs: [/a]\n", 3, "tokenize.inputs",
                "unknown field");
  ExpectRefused("tokenize:\n  tokenizer: /t\n  input: /a\n", 3, "tokenize.input", "must be a list");
  ExpectRefused(
      "tokenize:\n  tokenizer: /t\n  input: [/a]\n  format: text\n  language: sw\n  out: /o\n"
      "  shard_tokens: 0\n",
      7, "tokenize.shard_tokens", ">= 1");
  ExpectRefused("tokenize:\n  tokenizer: /t\n  input: [/a]\n  format: text\n  out: /o\n", 1,
                "tokenize.language", "is required");
  ExpectRefused(
      "tokenize:\n  tokenizer: /t\n  input: [/a]\n  format: csv\n  language: sw\n  out: /o\n", 4,
      "tokenize.format", "text, jsonl");
  ExpectRefused(
      "tokenize:\n  tokenizer: /t\n  input: [/a]\n  format: jsonl\n  line_docs: true\n  language: "
      "sw\n"
      "  out: /o\n",
      5, "tokenize.line_docs", "format text only");
}

// Issue 16 point 3: every field has its meaning (and default where it has one) in the schema
// that docs/engine/train.md is generated from.
TEST(SpecRulesTrain, EveryFieldIsDocumented) {
  for (const char* command : {"init", "tokenize", "train"}) {
    const std::string reference = SpecReferenceMarkdown(command);
    EXPECT_FALSE(reference.empty()) << command;
    std::vector<const google::protobuf::Descriptor*> todo = {EngineSpecDescriptor(command)};
    for (size_t i = 0; i < todo.size(); ++i) {
      for (int k = 0; k < todo[i]->field_count(); ++k) {
        const google::protobuf::FieldDescriptor* f = todo[i]->field(k);
        if (f->message_type() != nullptr && !f->is_map()) {
          todo.push_back(f->message_type());
          continue;
        }
        EXPECT_TRUE(absl::StrContains(reference, absl::StrCat(f->name(), "`")))
            << command << " " << f->full_name();
      }
    }
  }
  const std::string train = SpecReferenceMarkdown("train");
  for (const char* needle :
       {"`0.0003`", "`[0.9, 0.95]`", "`1e-08`", "`cosine`", "min_lr_ratio", "`hash`"}) {
    EXPECT_TRUE(absl::StrContains(train, needle)) << needle;
  }
}

// What the worker does with a submitted train job: the typed spec as JSON (int64 as strings,
// proto field names) in spec.json, read back by the engine's command line with relative paths
// under $STEMMA_STORAGE_ROOT (issue 16 point 6) and threads from $STEMMA_CPUS (point 8).
TEST(SpecRulesTrain, TheWorkersSpecJsonReadsBackWithPathsUnderTheStorageRoot) {
  auto jobs = ParseJobsYaml(
      "train:\n  model: models/base\n  out: models/cpt\n  data:\n    datasets: [{path: data/sw, "
      "heldout_path: "
      "/abs/valid}]\n    seq_len: 64\n    family_weights: {}\n  steps: 30\n  seed: "
      "18446744073709551615\n"
      "  strategy: {freeze: {layers: [\"middle\"]}, l2sp: [{lambda: 0.01}]}\n",
      "jobs.yaml");
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  const std::string json = SpecToJson(*EngineSpecOf((*jobs)[0]));
  const std::string dir = ::testing::TempDir() + "/spec_rules_train";
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/spec.json";
  std::ofstream(file) << json;
  setenv("STEMMA_STORAGE_ROOT", "/srv/stemma", 1);
  setenv("STEMMA_CPUS", "3", 1);
  std::vector<std::string> args = {"train", "--spec", file};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  auto inv = ParseEngineCommandLine("train", static_cast<int>(argv.size()), argv.data(),
                                    {"stop-after-step"});
  unsetenv("STEMMA_STORAGE_ROOT");
  ASSERT_TRUE(inv.ok()) << inv.status() << "\n" << json;
  const auto& spec = static_cast<const v1::TrainSpec&>(*inv->spec);
  EXPECT_EQ(spec.model(), "/srv/stemma/models/base");
  EXPECT_EQ(spec.out(), "/srv/stemma/models/cpt");
  EXPECT_EQ(spec.data().datasets(0).path(), "/srv/stemma/data/sw");
  EXPECT_EQ(spec.data().datasets(0).heldout_path(), "/abs/valid");
  EXPECT_EQ(spec.steps(), 30);
  EXPECT_EQ(spec.seed(), 18446744073709551615ull);
  EXPECT_EQ(spec.strategy().freeze().layers(0), "middle");
  EXPECT_EQ(spec.batch_size(), 1);  // defaults filled
  EXPECT_EQ(EffectiveThreads(spec.threads()), 3);
  EXPECT_EQ(EffectiveThreads(2), 2);
  unsetenv("STEMMA_CPUS");
}

// Every example under configs/train reads and passes the rules as `stemma-engine train --spec
// FILE` reads it (the typed forms, the one layer-range convention).
TEST(SpecRulesTrain, ExampleConfigsAreValidSpecs) {
  // __FILE__ is relative to the build directory under ccache; from the source root, configs/.
  std::filesystem::path configs =
      std::filesystem::path(__FILE__).parent_path().parent_path() / "configs" / "train";
  if (!std::filesystem::is_directory(configs)) configs = "configs/train";
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(configs)) {
    if (entry.path().extension() != ".yaml") continue;
    std::string spec = entry.path().string();
    std::vector<char*> argv = {const_cast<char*>("train"), const_cast<char*>("--spec"),
                               spec.data()};
    auto parsed = ParseEngineCommandLine("train", static_cast<int>(argv.size()), argv.data(),
                                         {"stop-after-step"});
    EXPECT_TRUE(parsed.ok()) << spec << ": " << parsed.status();
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

}  // namespace
}  // namespace stemma
