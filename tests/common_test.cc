#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <tuple>

#include "absl/status/status.h"
#include "common/engine_cli.h"
#include "common/engine_contract.h"
#include "common/engine_spec.h"
#include "common/job_spec.h"
#include "common/json_line.h"
#include "common/layer_range.h"
#include "common/yaml_json.h"
#include "stemma/v1/spec_options.pb.h"

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
)",
                             "job.yaml");
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
           Case{"noop: {}\nresources: {gpus: two}\n",
                "job.yaml: line 2: resources.gpus: must be an integer, not 'two'"},
           Case{"noop: {}\nmax_attempts: 1.5\n", "max_attempts: must be an integer"},
           Case{"noop: {}\nresources: {cpus: [1]}\n", "resources.cpus: must be a single value"},
           Case{"noop: {}\nexec: {argv: [ls]}\n",
                "exec: only one of a kind may be given (noop is already)"},
           Case{"exec: {argv: ls}\n", "exec.argv: must be a list"},
           Case{"noop: {}\nlabels: [a]\n", "labels: must be a mapping"},
           Case{"noop: {durtion_ms: 5}\n",
                "noop.durtion_ms: unknown field (allowed: duration_ms, exit_code)"},
       }) {
    auto specs = ParseJobsYaml(c.yaml, "job.yaml");
    ASSERT_FALSE(specs.ok()) << c.yaml;
    EXPECT_TRUE(absl::IsInvalidArgument(specs.status()));
    EXPECT_NE(specs.status().message().find(c.expected), std::string::npos) << specs.status();
  }
}

TEST(JobYaml, NullKindIsAnEmptyOneAndNumbersTakeEitherSpelling) {
  auto specs =
      ParseJobsYaml("name: a\nnoop:\ntimeout_ms: 1e3\npriority: \"7\"\nmaxAttempts: 2\n", "j");
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
    ::testing::Values(
        BadCase{"noop: {}\nresources: {gpus: -1}", "resources.gpus"},
        BadCase{"noop: {}\nresources: {gpus: 100000}", "resources.gpus"},
        BadCase{"noop: {}\nresources: {cpus: -2}", "resources.cpus"},
        BadCase{"noop: {}\nresources: {memory_mb: 99999999999}", "resources.memory_mb"},
        BadCase{"noop: {}\nmax_attempts: 1000", "max_attempts"},
        BadCase{"noop: {}\nnodes: 5000", "nodes"},
        BadCase{"noop: {}\ntimeout_ms: -5", "timeout_ms"}, BadCase{"name: x", "kind"},
        BadCase{"exec: {argv: []}", "exec.argv"},
        BadCase{"exec: {argv: [ls], env: {'bad-name': x}}", "exec.env"},
        BadCase{"noop: {}\nlabels: {'a b': x}", "labels"},
        BadCase{"exec: {argv: [ls]}\nresources: {ranks_per_part: -1}", "resources.ranks_per_part"},
        BadCase{"exec: {argv: [ls]}\nresources: {gpus: 4, ranks_per_part: 3}",
                "resources.ranks_per_part: 3 must equal resources.gpus (4"},
        BadCase{"noop: {}\nresources: {ranks_per_part: 2}", "resources.ranks_per_part"},
        BadCase{
            "init: {arch: llama, preset: tiny, out: o}\nresources: {gpus: 2, ranks_per_part: 2}",
            "resources.ranks_per_part: init runs one process per part"},
        BadCase{"train: {model: m, out: o, data: {datasets: [{path: d}], seq_len: "
                "16}, steps: 2, batch_size: 3}\nresources: {ranks_per_part: 2}",
                "train.batch_size: 3 is not divisible by the job's 2 ranks"},
        BadCase{"train: {model: m, out: o, data: {datasets: [{path: d}], seq_len: "
                "16}, steps: 2, batch_size: 4}\nnodes: 2\nresources: {gpus: 4}",
                "train.batch_size: 4 is not divisible by the job's 8 ranks"}),
    [](const ::testing::TestParamInfo<BadCase>& info) {
      return "case" + std::to_string(info.index);
    });

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

TEST(JsonLine, OneObjectOrAnErrorNamingWhere) {
  auto ok = ParseJsonObject(R"({"text": "a", "n": 2})", "a.jsonl:1");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)["n"], 2);
  auto bad = ParseJsonObject("{\"text\": ", "a.jsonl:2");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_NE(bad.status().message().find("a.jsonl:2: bad JSON: "), std::string::npos);
  auto list = ParseJsonObject("[1, 2]", "a.jsonl:3");
  EXPECT_EQ(list.status().message(), "a.jsonl:3: expected a JSON object, got array");
}

}  // namespace
}  // namespace stemma

namespace stemma {
namespace {

TEST(JobYaml, EngineJobsAreTypedAndTheEngineFormStillReads) {
  // `init: {...}` and `engine: {command: init, spec: {...}}` are the same job.
  for (const char* yaml : {"name: base\ninit: {arch: qwen2, out: /ckpt/base, hidden_size: 64}\n",
                           "name: base\nengine:\n  command: init\n  spec:\n    arch: qwen2\n"
                           "    out: /ckpt/base\n    hidden_size: 64\n"}) {
    auto specs = ParseJobsYaml(yaml, "job.yaml");
    ASSERT_TRUE(specs.ok()) << specs.status();
    ASSERT_EQ(specs->size(), 1u);
    const v1::JobSpec& job = (*specs)[0];
    EXPECT_EQ(JobKind(job), "init");
    EXPECT_TRUE(IsEngineJob(job));
    EXPECT_EQ(job.init().arch(), "qwen2");
    EXPECT_EQ(job.init().hidden_size(), 64);
    EXPECT_EQ(EngineSpecOf(job), &job.init());
  }
  auto unknown = ParseJobsYaml("engine: {command: trian, spec: {}}\n", "job.yaml");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find(
                "job.yaml: line 1: engine.command: unknown engine command 'trian'"),
            std::string::npos)
      << unknown.status();
  EXPECT_FALSE(IsEngineJob(v1::JobSpec()));
  EXPECT_EQ(EngineSpecOf(v1::JobSpec()), nullptr);
}

// What `stemma submit` refuses before anything is sent: one line naming file, line, field.
TEST(JobYaml, SubmitChecksRefuseBadEngineSpecsWithFileLineAndField) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("stemma-common-test-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "model");
  { std::ofstream(dir / "model" / "config.json") << "{\"num_hidden_layers\": 8}"; }
  struct Case {
    std::string yaml;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"name: a\ninit:\n  out: /x\n  hiden_size: 64\n",
       "line 4: init.hiden_size: unknown field (allowed: arch, preset"},
      {"name: a\ninit:\n  out: /x\n  hidden_size: wide\n",
       "line 4: init.hidden_size: must be an integer, not 'wide'"},
      {"name: a\ninit:\n  out: /x\n  hidden_size: 4\n", "line 4: init.hidden_size: 4 must be >= 8"},
      {"name: a\ninit:\n  arch: llama\n", "line 2: init.out: is required"},
      {"name: a\ninit:\n  out: /x\n  arch: gpt2\n",
       "line 4: init.arch: 'gpt2' is not one of llama, qwen2, gemma3, olmoe"},
      {"name: a\nresources: {cpus: -1}\ninit: {out: /x}\n", "line 2: resources.cpus"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string file = (dir / ("job" + std::to_string(i) + ".yaml")).string();
    std::ofstream(file) << cases[i].yaml;
    auto specs = ReadAndCheckJobsFile(file);
    ASSERT_FALSE(specs.ok()) << cases[i].yaml;
    EXPECT_TRUE(absl::IsInvalidArgument(specs.status()));
    EXPECT_NE(specs.status().message().find(file + ": " + cases[i].expected), std::string::npos)
        << specs.status() << "\nwanted: " << cases[i].expected;
  }
  std::ofstream(dir / "ok.yaml") << "name: a\ninit: {out: /x}\n";
  auto ok = ReadAndCheckJobsFile((dir / "ok.yaml").string());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_FALSE((*ok)[0].init().has_arch()) << "defaults are filled on a copy, not in what is sent";
  std::filesystem::remove_all(dir);
}

TEST(EngineSpec, DefaultsFillOnlyWhatIsUnset) {
  v1::InitSpec spec;
  spec.set_preset("small");
  FillSpecDefaults(&spec);
  EXPECT_EQ(spec.arch(), "llama");
  EXPECT_EQ(spec.preset(), "small");
  EXPECT_EQ(spec.tokenizer(), "bytes");
  EXPECT_TRUE(spec.has_seed());
  EXPECT_FALSE(spec.has_hidden_size()) << "no default: the preset decides";
}

TEST(EngineSpec, CommandsAndTheirSpecsComeFromTheJobKinds) {
  const std::vector<std::string> expected = {"init",   "tokenize",    "train",  "merge",
                                             "revert", "interpolate", "graft",  "upcycle",
                                             "eval",   "analyze",     "prepare"};
  EXPECT_EQ(EngineCommands(), expected);
  for (const std::string& c : expected) {
    ASSERT_NE(EngineSpecDescriptor(c), nullptr) << c;
    EXPECT_EQ(EngineSpecDescriptor(c)->options().GetExtension(v1::message_rules).command(), c)
        << c << ": its message_rules.command must name the command";
  }
  EXPECT_EQ(EngineSpecDescriptor("noop"), nullptr);
  EXPECT_EQ(EngineSpecDescriptor("nope"), nullptr);
}

// The schema's own rules: a default on a field without presence could never be filled.
TEST(EngineSpec, EveryDefaultedScalarHasPresenceAndEveryFieldADoc) {
  for (const std::string& c : EngineCommands()) {
    std::vector<const google::protobuf::Descriptor*> todo = {EngineSpecDescriptor(c)};
    for (size_t i = 0; i < todo.size(); ++i) {
      for (int k = 0; k < todo[i]->field_count(); ++k) {
        const auto* f = todo[i]->field(k);
        const auto& rules = f->options().GetExtension(v1::rules);
        if (!rules.default_value().empty() && !f->is_repeated()) {
          EXPECT_TRUE(f->has_presence())
              << f->full_name() << " has a default but is not `optional`";
        }
        const bool message_doc =
            f->message_type() != nullptr &&
            !f->message_type()->options().GetExtension(v1::message_rules).doc().empty();
        EXPECT_TRUE(!rules.doc().empty() || message_doc) << f->full_name() << " has no doc";
        if (!rules.default_value().empty()) {
          std::unique_ptr<google::protobuf::Message> m(
              google::protobuf::MessageFactory::generated_factory()->GetPrototype(todo[i])->New());
          FillSpecDefaults(m.get());
          EXPECT_TRUE(f->is_repeated() ? m->GetReflection()->FieldSize(*m, f) > 0
                                       : m->GetReflection()->HasField(*m, f))
              << f->full_name() << ": default '" << rules.default_value() << "' does not read";
        }
        if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE && !f->is_map()) {
          todo.push_back(f->message_type());
        }
      }
    }
  }
}

TEST(LayerRange, OneConventionWithMiddle) {
  auto r = ParseLayerRange("2:6", "f");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->begin, 2);
  EXPECT_EQ(r->end, 6);
  auto one = ParseLayerRange("7", "f");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->end, 8);
  for (auto [layers, begin, end] : std::vector<std::tuple<int, int, int>>{
           {34, 9, 28}, {8, 2, 7}, {16, 4, 13}, {32, 8, 26}, {2, 1, 2}}) {
    auto m = ResolveLayerRange(*ParseLayerRange("middle", "f"), layers, "f");
    ASSERT_TRUE(m.ok()) << layers;
    EXPECT_EQ(m->begin, begin) << layers;
    EXPECT_EQ(m->end, end) << layers;
  }
  auto open = ResolveLayerRange(*ParseLayerRange("5:", "f"), 8, "f");
  ASSERT_TRUE(open.ok());
  EXPECT_EQ(open->end, 8);
  for (const char* bad : {"6:2", "a:b", "1:2:3", "-1", ":", "mid"}) {
    EXPECT_FALSE(ParseLayerRange(bad, "f").ok()) << bad;
  }
  auto past =
      ResolveLayerRange(*ParseLayerRange("4:12", "freeze.layers[0]"), 8, "freeze.layers[0]");
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.status().message().find("reach past the model's 8 layers"), std::string::npos)
      << past.status();
}

TEST(EngineCli, FlagsSetFieldsAndHelpListsThem) {
  std::vector<std::string> args = {
      "init", "--out", "/tmp/m", "--hidden-size", "96", "--tie-embeddings", "--arch=qwen2"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  auto inv = ParseEngineCommandLine("init", static_cast<int>(argv.size()), argv.data(), {});
  ASSERT_TRUE(inv.ok()) << inv.status();
  const auto& spec = dynamic_cast<const v1::InitSpec&>(*inv->spec);
  EXPECT_EQ(spec.out(), "/tmp/m");
  EXPECT_EQ(spec.hidden_size(), 96);
  EXPECT_TRUE(spec.tie_embeddings());
  EXPECT_EQ(spec.arch(), "qwen2");
  EXPECT_EQ(spec.preset(), "tiny");  // default filled

  std::vector<std::string> bad = {"init", "--out", "/tmp/m", "--hidden-sise", "96"};
  argv.clear();
  for (auto& a : bad) argv.push_back(a.data());
  auto refused = ParseEngineCommandLine("init", static_cast<int>(argv.size()), argv.data(), {});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("unknown flag --hidden-sise"), std::string::npos);

  std::vector<std::string> help = {"init", "--help"};
  argv.clear();
  for (auto& a : help) argv.push_back(a.data());
  auto h = ParseEngineCommandLine("init", 2, argv.data(), {});
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE(h->help);
  const std::string text = EngineHelp("init", "stemma-engine init [--spec FILE] [--FIELD VALUE]");
  EXPECT_NE(text.find("hidden_size"), std::string::npos);
  EXPECT_NE(text.find("default llama"), std::string::npos);
}

TEST(EngineCli, ExitCodesFollowTheContract) {
  EXPECT_EQ(ReportEngineFailure(absl::InvalidArgumentError("x")), engine_contract::kExitBadInput);
  EXPECT_EQ(ReportEngineFailure(absl::NotFoundError("x")), engine_contract::kExitBadInput);
  EXPECT_EQ(ReportEngineFailure(absl::InternalError("x")), engine_contract::kExitFailed);
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
