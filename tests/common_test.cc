#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "common/job_spec.h"
#include "common/spec_file.h"
#include "common/yaml_json.h"

namespace stemma {
namespace {

TEST(JobYaml, ParsesSeveralDocumentsWithTheProtoFieldNames) {
  auto specs = ParseJobsYaml(R"(
name: a
resources: {gpus: 2, cpus: 1.5, memory_mb: 1024}
noop: {duration_ms: 10, exit_code: 3}
---
name: b
depends_on: [a]
labels: {team: lang}
exec: {argv: [/bin/echo, "hello; rm -rf /"]}
)", "job.yaml");
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 2u);
  EXPECT_EQ((*specs)[0].resources().gpus(), 2);
  EXPECT_DOUBLE_EQ((*specs)[0].resources().cpus(), 1.5);
  EXPECT_EQ((*specs)[0].noop().exit_code(), 3);
  EXPECT_EQ((*specs)[1].depends_on(0), "a");
  EXPECT_EQ((*specs)[1].exec().argv(1), "hello; rm -rf /");
  EXPECT_EQ((*specs)[1].labels().at("team"), "lang");
}

TEST(JobYaml, JobsListForm) {
  auto specs = ParseJobsYaml("jobs:\n  - {name: x, noop: {}}\n  - {name: y, noop: {}}\n", "f");
  ASSERT_TRUE(specs.ok()) << specs.status();
  EXPECT_EQ(specs->size(), 2u);
}

TEST(JobYaml, UnknownFieldIsNamed) {
  auto specs = ParseJobsYaml("name: a\nresorces: {gpus: 1}\nnoop: {}\n", "job.yaml");
  ASSERT_FALSE(specs.ok());
  EXPECT_NE(specs.status().message().find("resorces"), std::string::npos) << specs.status();
  EXPECT_NE(specs.status().message().find("job.yaml"), std::string::npos) << specs.status();
}

TEST(JobYaml, WrongTypesAndTwoKindsNameTheFieldPath) {
  struct Case {
    const char* yaml;
    const char* expected;
  };
  for (const Case& c : {
           Case{"noop: {}\nresources: {gpus: two}\n", "job.yaml: resources.gpus: must be an integer, not 'two'"},
           Case{"noop: {}\nmax_attempts: 1.5\n", "max_attempts: must be an integer"},
           Case{"noop: {}\nresources: {cpus: [1]}\n", "resources.cpus: must be a single value"},
           Case{"noop: {}\nexec: {argv: [ls]}\n", "exec: only one of a kind may be given (noop is already)"},
           Case{"exec: {argv: ls}\n", "exec.argv: must be a list"},
           Case{"noop: {}\nlabels: [a]\n", "labels: must be a mapping"},
           Case{"noop: {durtion_ms: 5}\n", "noop.durtion_ms: unknown field (allowed: duration_ms, exit_code)"},
       }) {
    auto specs = ParseJobsYaml(c.yaml, "job.yaml");
    ASSERT_FALSE(specs.ok()) << c.yaml;
    EXPECT_TRUE(absl::IsInvalidArgument(specs.status()));
    EXPECT_NE(specs.status().message().find(c.expected), std::string::npos) << specs.status();
  }
}

TEST(JobYaml, NullKindIsAnEmptyOneAndNumbersTakeEitherSpelling) {
  auto specs = ParseJobsYaml("name: a\nnoop:\ntimeout_ms: 1e3\npriority: \"7\"\nmaxAttempts: 2\n", "j");
  ASSERT_TRUE(specs.ok()) << specs.status();
  EXPECT_TRUE((*specs)[0].has_noop());
  EXPECT_EQ((*specs)[0].timeout_ms(), 1000);
  EXPECT_EQ((*specs)[0].priority(), 7);
  EXPECT_EQ((*specs)[0].max_attempts(), 2);  // the JSON (camelCase) name works too
}

TEST(JobYaml, SyntaxErrorNamesTheFile) {
  auto specs = ParseJobsYaml("name: [a\n", "broken.yaml");
  ASSERT_FALSE(specs.ok());
  EXPECT_NE(specs.status().message().find("broken.yaml"), std::string::npos);
}

struct BadCase {
  const char* yaml;
  const char* field;
};
void PrintTo(const BadCase& c, std::ostream* os) { *os << c.field; }

class ValidateTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(ValidateTest, RefusesNamingTheField) {
  auto specs = ParseJobsYaml(GetParam().yaml, "t");
  ASSERT_TRUE(specs.ok()) << specs.status();
  v1::JobSpec spec = (*specs)[0];
  ApplyDefaults(&spec);
  absl::Status st = ValidateJobSpec(spec);
  ASSERT_FALSE(st.ok()) << GetParam().yaml;
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(GetParam().field), std::string::npos) << st;
}

INSTANTIATE_TEST_SUITE_P(
    BadSpecs, ValidateTest,
    ::testing::Values(BadCase{"noop: {}\nresources: {gpus: -1}", "resources.gpus"},
                      BadCase{"noop: {}\nresources: {gpus: 100000}", "resources.gpus"},
                      BadCase{"noop: {}\nresources: {cpus: -2}", "resources.cpus"},
                      BadCase{"noop: {}\nresources: {memory_mb: 99999999999}", "resources.memory_mb"},
                      BadCase{"noop: {}\nmax_attempts: 1000", "max_attempts"},
                      BadCase{"noop: {}\nnodes: 5000", "nodes"},
                      BadCase{"noop: {}\ntimeout_ms: -5", "timeout_ms"},
                      BadCase{"name: x", "kind"},
                      BadCase{"exec: {argv: []}", "exec.argv"},
                      BadCase{"exec: {argv: [ls], env: {'bad-name': x}}", "exec.env"},
                      BadCase{"noop: {}\nlabels: {'a b': x}", "labels"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return "case" + std::to_string(info.index); });

TEST(Validate, DefaultsAreValid) {
  v1::JobSpec spec;
  spec.mutable_noop();
  ApplyDefaults(&spec);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
  EXPECT_EQ(spec.max_attempts(), 3);
  EXPECT_EQ(spec.nodes(), 1);
}

TEST(Backoff, GrowsAndCaps) {
  v1::JobSpec spec;
  spec.mutable_backoff()->set_initial_ms(100);
  spec.mutable_backoff()->set_multiplier(2);
  spec.mutable_backoff()->set_max_ms(350);
  EXPECT_EQ(BackoffMs(spec, 2), 100);
  EXPECT_EQ(BackoffMs(spec, 3), 200);
  EXPECT_EQ(BackoffMs(spec, 4), 350);
  EXPECT_EQ(BackoffMs(spec, 10), 350);
}

}  // namespace
}  // namespace stemma

namespace stemma {
namespace {

TEST(SpecFile, YamlBecomesJsonWithTypedScalars) {
  auto spec = ParseSpecText("steps: 10\nlr: 3.0e-4\nname: \"10\"\nfreeze: [\"9:28\"]\nddp: false\n",
                            "train.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ((*spec)["steps"], 10);
  EXPECT_DOUBLE_EQ((*spec)["lr"].get<double>(), 3.0e-4);
  EXPECT_EQ((*spec)["name"], "10");  // quoted stays a string
  EXPECT_EQ((*spec)["freeze"][0], "9:28");
  EXPECT_EQ((*spec)["ddp"], false);
}

TEST(SpecFile, ErrorsNameTheFileAndField) {
  auto bad = ParseSpecText("a: [1, 2\n", "bad.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad.yaml: line"), std::string::npos) << bad.status();
  auto list = ParseSpecText("- 1\n- 2\n", "list.yaml");
  ASSERT_FALSE(list.ok());
  EXPECT_NE(list.status().message().find("mapping"), std::string::npos);
  auto missing = ReadSpecFile("/nonexistent/spec.yaml");
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  EXPECT_NE(missing.status().message().find("/nonexistent/spec.yaml"), std::string::npos);

  nlohmann::json obj = {{"lr", 1}, {"lrr", 2}};
  absl::Status keys = CheckKeys(obj, {"lr", "betas"}, "train.yaml: optimizer");
  EXPECT_TRUE(absl::IsInvalidArgument(keys));
  EXPECT_NE(keys.message().find("train.yaml: optimizer: unknown field 'lrr' (allowed: lr, betas)"),
            std::string::npos)
      << keys;
}

}  // namespace
}  // namespace stemma

namespace stemma {
namespace {

TEST(JobYaml, EngineSpecMayBeAMappingAndTravelsAsJson) {
  auto specs = ParseJobsYaml(
      "name: cpt\n"
      "engine:\n"
      "  command: train\n"
      "  spec:\n"
      "    model: /ckpt/base\n"
      "    steps: 10\n"
      "    strategy: {freeze: {layers: [\"9:28\"]}}\n",
      "job.yaml");
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 1u);
  const v1::EngineSpec& engine = (*specs)[0].engine();
  EXPECT_EQ(engine.command(), "train");
  nlohmann::json spec = nlohmann::json::parse(engine.spec());
  EXPECT_EQ(spec["model"], "/ckpt/base");
  EXPECT_EQ(spec["steps"], 10);
  EXPECT_EQ(spec["strategy"]["freeze"]["layers"][0], "9:28");

  // A spec given as text stays as written.
  auto text = ParseJobsYaml("name: t\nengine: {command: eval, spec: \"model: /m\\n\"}\n", "t.yaml");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ((*text)[0].engine().spec(), "model: /m\n");
}

TEST(YamlTree, ScalarsNullsAnchorsAndBlockText) {
  auto docs = LoadYamlDocuments(
      "a: 1e3\nb: 0x10\nc: .5\nd: \"10\"\ne: !!str 7\nf: ~\ng:\nh: null\n"
      "base: &base {lr: 0.1, betas: [0.9, 0.95]}\nrun: *base\n"
      "text: |\n  line one\n  line two\n---\n- x\n",
      "t.yaml");
  ASSERT_TRUE(docs.ok()) << docs.status();
  ASSERT_EQ(docs->size(), 2u);
  std::string json;
  AppendYamlAsJson((*docs)[0], &json);
  nlohmann::json j = nlohmann::json::parse(json);
  EXPECT_EQ(j["a"], 1000.0);
  EXPECT_EQ(j["b"], "0x10");  // not a JSON number: stays text
  EXPECT_EQ(j["c"], ".5");
  EXPECT_EQ(j["d"], "10");
  EXPECT_EQ(j["e"], "7");
  EXPECT_TRUE(j["f"].is_null());
  EXPECT_TRUE(j["g"].is_null());
  EXPECT_TRUE(j["h"].is_null());
  EXPECT_EQ(j["run"]["betas"][1], 0.95);  // the alias is a copy of the anchored mapping
  EXPECT_EQ(j["text"], "line one\nline two\n");
  EXPECT_TRUE((*docs)[1].IsSequence());
  EXPECT_EQ((*docs)[0].Find("run")->line, 10);
}

TEST(YamlTree, ErrorsNameLineAndColumn) {
  auto bad = LoadYamlDocuments("a: 1\nb: [1, 2\n", "bad.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_NE(bad.status().message().find("bad.yaml: line 3"), std::string::npos) << bad.status();
  auto alias = LoadYamlDocuments("a: *nowhere\n", "alias.yaml");
  ASSERT_FALSE(alias.ok());
  EXPECT_NE(alias.status().message().find("alias.yaml"), std::string::npos) << alias.status();
}

}  // namespace
}  // namespace stemma
