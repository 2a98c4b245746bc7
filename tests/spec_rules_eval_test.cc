// The rules of the eval and analyze specs as `stemma submit` applies them to a job file
// (ReadAndCheckJobsFile: ParseJobsYaml, ApplyDefaults, the spec's defaults and rules,
// ValidateJobSpec): every bad field is one error naming the file, the line and the field
// path, and the examples under configs/eval and configs/analyze are valid specs.
// Torch-free: links stemma_common only.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/engine_cli.h"
#include "common/engine_spec.h"
#include "common/job_spec.h"
#include "stemma/v1/specs/eval.pb.h"

namespace stemma {
namespace {

namespace fs = std::filesystem;

fs::path TempDir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("spec_rules_eval_test_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

// A model directory whose config.json says `layers` layers (what layer ranges are checked
// against at submit).
std::string ModelWithLayers(int layers) {
  const fs::path dir = TempDir() / ("model" + std::to_string(layers));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json")
      << "{\"model_type\": \"olmoe\", \"num_hidden_layers\": " << layers << "}\n";
  return dir.string();
}

// Writes `text` as <name> and checks it as `stemma submit` does.
absl::StatusOr<std::vector<v1::JobSpec>> Submit(const std::string& name, const std::string& text) {
  const fs::path path = TempDir() / name;
  std::ofstream(path) << text;
  return ReadAndCheckJobsFile(path.string());
}

struct Case {
  std::string name;
  std::string yaml;
  // Each must appear in the error.
  std::vector<std::string> expected;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class RefusedAtSubmit : public ::testing::TestWithParam<Case> {};

TEST_P(RefusedAtSubmit, NamesFileLineAndField) {
  const Case& c = GetParam();
  const std::string file = c.name + ".yaml";
  std::string yaml = c.yaml;
  for (size_t p; (p = yaml.find("$MODEL16")) != std::string::npos;)
    yaml.replace(p, 8, ModelWithLayers(16));
  auto jobs = Submit(file, yaml);
  ASSERT_FALSE(jobs.ok()) << c.name << " was accepted";
  const std::string error(jobs.status().message());
  EXPECT_EQ(jobs.status().code(), absl::StatusCode::kInvalidArgument) << error;
  EXPECT_NE(error.find(file), std::string::npos) << error;
  for (const std::string& e : c.expected)
    EXPECT_NE(error.find(e), std::string::npos) << "want '" << e << "' in: " << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << "one line: " << error;
}

// Line numbers count from 1 at `name:`.
const char kEvalHead[] =
    "name: ev\n"           // 1
    "eval:\n"              // 2
    "  model: /ckpt/m\n";  // 3

INSTANTIATE_TEST_SUITE_P(
    Eval, RefusedAtSubmit,
    ::testing::Values(
        Case{"eval_typo",
             std::string(kEvalHead) +
                 "  batch_sise: 4\n"
                 "  tasks: [{type: perplexity, language: uk, data: /d, split: all}]\n",
             {"line 4", "eval.batch_sise", "unknown field"}},
        Case{"eval_task_typo",
             std::string(kEvalHead) +
                 "  tasks:\n"
                 "    - {type: choice, format: piqa, language: uk, data: /p.jsonl, shots: 2}\n",
             {"line 5", "eval.tasks[0].shots", "unknown field"}},
        Case{"eval_mistyped",
             std::string(kEvalHead) + "  tasks:\n"
                                      "    - type: perplexity\n"
                                      "      language: uk\n"
                                      "      data: /d\n"
                                      "      split: all\n"
                                      "      seq_len: long\n",
             {"line 9", "eval.tasks[0].seq_len", "must be an integer"}},
        Case{"eval_out_of_range",
             std::string(kEvalHead) +
                 "  tasks:\n"
                 "    - {type: perplexity, language: uk, data: /d, heldout_fraction: 1.5}\n",
             {"line 5", "eval.tasks[0].heldout_fraction", "1.5 must be < 1"}},
        Case{"eval_batch_zero",
             std::string(kEvalHead) +
                 "  batch_size: 0\n"
                 "  tasks: [{type: perplexity, language: uk, data: /d, split: all}]\n",
             {"line 4", "eval.batch_size", "0 must be >= 1"}},
        Case{"eval_missing_language",
             std::string(kEvalHead) + "  tasks:\n"
                                      "    - {type: perplexity, data: /d, split: all}\n",
             {"line 5", "eval.tasks[0].language", "is required"}},
        Case{"eval_missing_model",
             "name: ev\neval:\n  tasks: [{type: perplexity, language: uk, data: /d, split: all}]\n",
             {"line 2", "eval.model", "is required"}},
        Case{"eval_bad_device",
             std::string(kEvalHead) +
                 "  device: gpu\n"
                 "  tasks: [{type: perplexity, language: uk, data: /d, split: all}]\n",
             {"line 4", "eval.device", "'gpu' is not cpu, cuda or cuda:N"}},
        Case{"eval_cuda_without_gpus",
             std::string(kEvalHead) +
                 "  device: cuda\n"
                 "  tasks: [{type: perplexity, language: uk, data: /d, split: all}]\n",
             {"line 4", "eval.device", "resources.gpus is 0"}},
        Case{"eval_cuda_index_past_gpus",
             "name: ev\nresources: {gpus: 2}\neval:\n  model: /ckpt/m\n  device: cuda:2\n"
             "  tasks: [{type: perplexity, language: uk, data: /d, split: all}]\n",
             {"line 5", "eval.device", "resources.gpus is 2"}},
        Case{"analyze_cuda_without_gpus",
             "name: an\nanalyze:\n  model: /ckpt/m\n  out: /o\n  device: cuda:0\n"
             "  drift: {base: /b, trained: /t}\n",
             {"line 5", "analyze.device", "resources.gpus is 0"}},
        Case{"eval_no_tasks",
             std::string(kEvalHead) + "  tasks: []\n",
             {"eval.tasks", "at least one task"}},
        Case{"eval_bad_type",
             std::string(kEvalHead) + "  tasks: [{type: mmlu, language: uk, data: /d}]\n",
             {"line 4", "eval.tasks[0].type",
              "'mmlu' is not one of perplexity, choice, translation"}},
        Case{"eval_field_of_another_type",
             std::string(kEvalHead) + "  tasks:\n"
                                      "    - type: perplexity\n"
                                      "      language: uk\n"
                                      "      data: /d\n"
                                      "      split: all\n"
                                      "      format: belebele\n",
             {"line 9", "eval.tasks[0].format", "does not apply to a perplexity task"}},
        Case{"eval_heldout_without_fraction",
             std::string(kEvalHead) + "  tasks:\n"
                                      "    - {type: perplexity, language: uk, data: /d}\n",
             {"line 5", "eval.tasks[0].heldout_fraction", "is required with split: heldout"}},
        Case{"eval_fraction_with_split_all",
             std::string(kEvalHead) + "  tasks:\n"
                                      "    - {type: perplexity, language: uk, data: /d, split: "
                                      "all, heldout_fraction: 0.1}\n",
             {"line 5", "eval.tasks[0].heldout_fraction", "does not apply with split: all"}},
        Case{"eval_seed_with_last_split",
             std::string(kEvalHead) + "  tasks:\n"
                                      "    - type: perplexity\n"
                                      "      language: uk\n"
                                      "      data: /d\n"
                                      "      heldout_fraction: 0.1\n"
                                      "      heldout_split: last\n"
                                      "      split_seed: 3\n",
             {"line 10", "eval.tasks[0].split_seed", "does not apply to heldout_split: last"}},
        Case{"eval_bad_heldout_split",
             std::string(kEvalHead) + "  tasks:\n"
                                      "    - {type: perplexity, language: uk, data: /d, "
                                      "heldout_fraction: 0.1, heldout_split: tail}\n",
             {"line 5", "eval.tasks[0].heldout_split", "'tail' is not one of hash, last"}},
        Case{"eval_choice_without_format",
             std::string(kEvalHead) + "  tasks:\n"
                                      "    - {type: choice, language: uk, data: /b.jsonl, k: 2}\n",
             {"line 5", "eval.tasks[0].format", "is required for a choice task"}},
        Case{"eval_duplicate_names",
             std::string(kEvalHead) +
                 "  tasks:\n"
                 "    - {type: perplexity, language: uk, data: /a, split: all}\n"
                 "    - {type: perplexity, language: uk, data: /b, split: all}\n",
             {"line 6", "eval.tasks[1]", "'uk' is used by an earlier task"}},
        Case{"eval_threads_over_cpus",
             "name: ev\nresources: {cpus: 2}\neval:\n  model: /ckpt/m\n  threads: 4\n"
             "  tasks: [{type: perplexity, language: uk, data: /d, split: all}]\n",
             {"line 5", "eval.threads", "more than the job's 2 CPUs"}}),
    [](const auto& info) { return info.param.name; });

const char kAnalyzeHead[] =
    "name: an\n"                                // 1
    "analyze:\n"                                // 2
    "  model: /ckpt/m\n"                        // 3
    "  out: /analysis/m\n"                      // 4
    "  languages:\n"                            // 5
    "    - {language: en, text: /t/en.txt}\n"   // 6
    "    - {language: sw, text: /t/sw.txt}\n";  // 7

INSTANTIATE_TEST_SUITE_P(
    Analyze, RefusedAtSubmit,
    ::testing::Values(
        Case{"analyze_typo",
             std::string(kAnalyzeHead) + "  lape: {top_rat: 0.05}\n",
             {"line 8", "analyze.lape.top_rat", "unknown field"}},
        Case{"analyze_mistyped",
             std::string(kAnalyzeHead) + "  seq_len: [512]\n  lape: {}\n",
             {"line 8", "analyze.seq_len", "must be a single value"}},
        Case{"analyze_out_of_range",
             std::string(kAnalyzeHead) + "  lape:\n    top_rate: 2\n",
             {"line 9", "analyze.lape.top_rate", "2 must be <= 1"}},
        Case{"analyze_missing_out",
             "name: an\nanalyze:\n  model: /ckpt/m\n  drift: {base: /ckpt/b}\n",
             {"line 2", "analyze.out", "is required"}},
        Case{"analyze_missing_drift_base",
             std::string(kAnalyzeHead) + "  drift:\n    trained: /ckpt/t\n",
             {"line 8", "analyze.drift.base", "is required"}},
        Case{"analyze_layers_as_integer",
             std::string(kAnalyzeHead) + "  routing:\n    select:\n      layers: 14\n",
             {"line 10", "analyze.routing.select.layers", "write layer ranges as strings"}},
        Case{"analyze_layers_backwards",
             std::string(kAnalyzeHead) + "  routing:\n    select:\n      layers: \"15:14\"\n",
             {"line 10", "analyze.routing.select.layers"}},
        Case{"analyze_layers_past_the_model",
             "name: an\nanalyze:\n  model: $MODEL16\n  out: /a\n  languages:\n"
             "    - {language: en, text: /t/en.txt}\n    - {language: sw, text: /t/sw.txt}\n"
             "  routing:\n    select: {layers: \"14:18\"}\n",
             {"line 9", "analyze.routing.select.layers", "16"}},
        Case{"analyze_two_sources",
             std::string(kAnalyzeHead) +
                 "    - {language: yo, text: /t/yo.txt, dataset: /d/yo}\n  lape: {}\n",
             {"line 8", "analyze.languages[2]", "exactly one of dataset, text or jsonl"}},
        Case{"analyze_unknown_language",
             std::string(kAnalyzeHead) + "  lape: {languages: [en, zu]}\n",
             {"line 8", "analyze.lape.languages[1]", "'zu' is not under languages"}},
        Case{"analyze_nothing_to_do", std::string(kAnalyzeHead), {"analyze", "no analysis given"}},
        Case{"analyze_lape_without_model",
             "name: an\nanalyze:\n  out: /a\n  languages:\n"
             "    - {language: en, text: /t/en.txt}\n    - {language: sw, text: /t/sw.txt}\n  "
             "lape: {}\n",
             {"line 2", "analyze.model", "is required: lape runs the model"}},
        Case{"analyze_parent_not_anchor",
             std::string(kAnalyzeHead) + "    - {language: ca, text: /t/ca.txt}\n"
                                         "  routing:\n    select:\n      high_resource: [en, sw]\n"
                                         "      parents: {ca: es}\n",
             {"line 12", "analyze.routing.select.parents.ca",
              "'es' is not a high-resource language"}},
        Case{"analyze_single_anchor_without_target",
             std::string(kAnalyzeHead) + "  routing:\n    select:\n      parents: {sw: en}\n",
             {"line 10", "analyze.routing.select.parents", "only 'en' is an anchor", "targets"}},
        Case{"analyze_threads_over_cpus",
             "name: an\nresources: {cpus: 1}\nanalyze:\n  out: /a\n  threads: 2\n  drift: {base: "
             "/b, trained: /t}\n",
             {"line 5", "analyze.threads", "more than the job's 1 CPUs"}},
        Case{"analyze_alignment_both_forms",
             std::string(kAnalyzeHead) +
                 "  alignment:\n    file: /p.jsonl\n"
                 "    texts: [{language: en, path: /en.txt}, {language: sw, path: /sw.txt}]\n",
             {"line 8", "analyze.alignment", "exactly one of file"}}),
    [](const auto& info) { return info.param.name; });

// What the refusals above must not catch: the forms the docs show.
TEST(SpecRulesEval, AcceptsTheDocumentedForms) {
  auto jobs =
      Submit("ok.yaml",
             "name: ev\n"
             "resources: {cpus: 2}\n"
             "eval:\n"
             "  model: /ckpt/m\n"
             "  tasks:\n"
             "    - {type: perplexity, language: uk, data: /d, heldout_fraction: 0.01}\n"
             "    - {type: choice, format: belebele, language: uk, data: /b.jsonl, k: 2}\n"
             "    - {type: translation, source_language: en, language: uk, data: /f.jsonl, k: 1}\n"
             "---\n"
             "name: an\n"
             "analyze:\n"
             "  model: " +
                 ModelWithLayers(16) +
                 "\n"
                 "  out: /a\n"
                 "  languages:\n"
                 "    - {language: en, text: /t/en.txt}\n"
                 "    - {language: xx, jsonl: /t/xx.jsonl, field: body}\n"
                 "  routing:\n"
                 "    select: {layers: \"14:16\", targets: [xx]}\n"
                 "  drift: {base: /ckpt/base}\n");
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  // The job keeps what was written; defaults are filled on the copy that is checked.
  EXPECT_EQ((*jobs)[0].eval().tasks_size(), 3);
  EXPECT_EQ((*jobs)[1].analyze().routing().select().targets(0), "xx");
}

// A task is written flat (`type: choice` beside its fields) and held as the `kind` oneof;
// the worker hands the engine the proto's JSON, where the fields sit under the type's name.
// Both read into the same spec, and the flat form's errors name the fields as written.
TEST(SpecRulesEval, TasksReadFlatAndAsTheWorkersJson) {
  const fs::path flat = TempDir() / "flat.yaml";
  std::ofstream(flat)
      << "model: /ckpt/m\n"
         "tasks:\n"
         "  - {type: perplexity, language: uk, data: /d, heldout_fraction: 0.1, limit: 5}\n"
         "  - {type: choice, format: belebele, language: uk, data: /b.jsonl, k: 2}\n"
         "  - {type: translation, source_language: en, language: uk, data: /f}\n";
  auto read = [](const fs::path& path) {
    std::string file = path.string();
    std::vector<char*> argv = {const_cast<char*>("eval"), const_cast<char*>("--spec"), file.data()};
    return ParseEngineCommandLine("eval", 3, argv.data(), {});
  };
  auto from_flat = read(flat);
  ASSERT_TRUE(from_flat.ok()) << from_flat.status();
  const auto& spec = static_cast<const v1::EvalSpec&>(*from_flat->spec);
  ASSERT_EQ(spec.tasks_size(), 3);
  EXPECT_EQ(spec.tasks(0).perplexity().heldout_fraction(), 0.1);
  EXPECT_EQ(spec.tasks(0).limit(), 5);
  EXPECT_EQ(spec.tasks(1).choice().k(), 2);
  EXPECT_EQ(spec.tasks(1).choice().seed(), 1234u);  // the schema's default
  EXPECT_EQ(spec.tasks(2).translation().max_new_tokens(), 256);
  EXPECT_EQ(spec.tasks(2).language(), "uk");

  const fs::path json = TempDir() / "worker.json";
  std::ofstream(json) << SpecToJson(spec);
  auto from_json = read(json);
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  EXPECT_EQ(from_json->spec->SerializeAsString(), spec.SerializeAsString());

  const fs::path nested = TempDir() / "nested.yaml";
  std::ofstream(nested) << "model: /ckpt/m\n"
                           "tasks:\n"
                           "  - {language: uk, data: /d, perplexity: {split: all, k: 3}}\n";
  auto bad = read(nested);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tasks[0].k: unknown field"), std::string::npos)
      << bad.status();
  const fs::path untyped = TempDir() / "untyped.yaml";
  std::ofstream(untyped) << "model: /ckpt/m\ntasks:\n  - {language: uk, data: /d}\n";
  auto missing = read(untyped);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("tasks[0].type: is required"), std::string::npos)
      << missing.status();
}

// Every example spec under configs/ reads and passes the rules as `stemma-engine <command>
// --spec FILE` reads it.
TEST(SpecRulesEval, ExampleConfigsAreValidSpecs) {
  const fs::path configs = fs::path(__FILE__).parent_path().parent_path() / "configs";
  int checked = 0;
  for (const char* command : {"eval", "analyze"}) {
    for (const auto& entry : fs::directory_iterator(configs / command)) {
      if (entry.path().extension() != ".yaml") continue;
      std::string spec = entry.path().string();
      std::vector<char*> argv = {const_cast<char*>(command), const_cast<char*>("--spec"),
                                 spec.data()};
      auto parsed = ParseEngineCommandLine(command, static_cast<int>(argv.size()), argv.data(), {});
      EXPECT_TRUE(parsed.ok()) << spec << ": " << parsed.status();
      ++checked;
    }
  }
  EXPECT_GE(checked, 5);
}

}  // namespace
}  // namespace stemma
