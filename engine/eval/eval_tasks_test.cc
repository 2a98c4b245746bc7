// Torch-free parts of `stemma-engine eval`: the few-shot sampler, lm-eval's pair encoding and
// choice metrics, perplexity windows, the translation stop rule, dataset readers, the
// spec's defaults and errors, and the default sequence length (the training run's).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "common/engine_cli.h"
#include "common/status.h"
#include "engine/eval/choice.h"
#include "engine/eval/eval_text.h"
#include "engine/eval/perplexity.h"
#include "engine/eval/resolve.h"
#include "engine/eval/translation.h"

namespace stemma::engine::eval {
namespace {

namespace fs = std::filesystem;

std::string TempFile(const std::string& name, const std::string& text) {
  const auto dir = fs::temp_directory_path() / ("eval_tasks_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto path = (dir / name).string();
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
  return path;
}

TEST(FewShot, FirstNSkipsTheEvaluatedDoc) {
  EXPECT_EQ(FewShotIndices(10, 2, 5, 5, FewShotSampler::kFirstN, 1), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(FewShotIndices(10, 2, 0, 0, FewShotSampler::kFirstN, 1), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(FewShotIndices(10, 2, 1, 1, FewShotSampler::kFirstN, 1), (std::vector<int64_t>{0, 2}));
}

TEST(FewShot, SeededDrawsAreDistinctDeterministicAndVaryWithSeedAndDoc) {
  std::set<std::vector<int64_t>> seen;
  for (int64_t doc = 0; doc < 50; ++doc) {
    const auto shots = FewShotIndices(20, 3, doc, doc, FewShotSampler::kSeeded, 1234);
    ASSERT_EQ(shots.size(), 3u);
    EXPECT_EQ(std::set<int64_t>(shots.begin(), shots.end()).size(), 3u);
    for (int64_t s : shots) {
      EXPECT_NE(s, doc);
      EXPECT_GE(s, 0);
      EXPECT_LT(s, 20);
    }
    EXPECT_EQ(shots, FewShotIndices(20, 3, doc, doc, FewShotSampler::kSeeded, 1234));
    seen.insert(shots);
  }
  EXPECT_GT(seen.size(), 30u);
  EXPECT_NE(FewShotIndices(20, 3, 0, 0, FewShotSampler::kSeeded, 1),
            FewShotIndices(20, 3, 0, 0, FewShotSampler::kSeeded, 2));
  // A separate pool (exclude -1) may use every doc.
  EXPECT_EQ(FewShotIndices(2, 2, 0, -1, FewShotSampler::kSeeded, 5).size(), 2u);
}

TEST(ChoiceScoring, AccNormUsesCodePointsAndAccBytesUtf8Bytes) {
  // ll/chars: -4/2 = -2 vs -6/4 = -1.5 -> choice 1; ll/bytes: -4/4 = -1 vs -6/4 -> choice 0.
  const std::vector<std::string> choices = {"ні", "okay"};
  const auto outcome = ScoreChoices({-4.0, -6.0}, choices, 1);
  EXPECT_EQ(outcome.acc, 0.0);
  EXPECT_EQ(outcome.acc_norm, 1.0);
  EXPECT_EQ(outcome.acc_bytes, 0.0);
}

TEST(ChoiceScoring, TiesGoToTheFirstChoiceAsNumpyArgmax) {
  EXPECT_EQ(ScoreChoices({-1.0, -1.0}, {"a", "b"}, 0).acc, 1.0);
  EXPECT_EQ(ScoreChoices({-1.0, -1.0}, {"a", "b"}, 1).acc, 0.0);
}

// A tokenizer with one merge, so that joint encoding differs from separate encoding.
class PairTokenizer : public tokenizer::Tokenizer {
 public:
  std::vector<int32_t> Encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text.substr(i, 2) == ": ") {
        ids.push_back(300);  // ": " is one token
        ++i;
      } else {
        ids.push_back(static_cast<unsigned char>(text[i]));
      }
    }
    return ids;
  }
  std::string Decode(std::span<const int32_t>) const override { return ""; }
  int32_t vocab_size() const override { return 301; }
  std::optional<int32_t> TokenToId(std::string_view) const override { return std::nullopt; }
  bool IsSpecial(int32_t) const override { return false; }
  std::string_view kind() const override { return "test"; }
};

TEST(ChoiceEncoding, TrailingContextSpaceMovesToTheContinuationAndWholeIsSplit) {
  PairTokenizer tok;
  // Context "Q: ": its trailing space moves, so context "Q:" and continuation "  x";
  // whole "Q:  x" = [Q, ": ", ' ', x] with BOS 7 -> continuation whole[3:].
  auto pair = EncodePair(tok, "Q: ", " x", 7);
  EXPECT_EQ(pair.context, (std::vector<int32_t>{7, 'Q', ':'}));
  EXPECT_EQ(pair.continuation, (std::vector<int32_t>{' ', 'x'}));
  // No trailing space: whole "A: b" = [A, ": ", b] merges across the boundary, and the
  // continuation is still whole[len(context) = 2:], as lm-eval does.
  pair = EncodePair(tok, "A:", " b", std::nullopt);
  EXPECT_EQ(pair.context, (std::vector<int32_t>{'A', ':'}));
  EXPECT_EQ(pair.continuation, (std::vector<int32_t>{'b'}));
}

TEST(ChoiceContext, ShotsThenQueryWithLmEvalDelimiters) {
  ChoiceDoc a{"Question: a?\nAnswer:", {"x", "y"}, 1}, b{"Question: b?\nAnswer:", {"u", "v"}, 0};
  EXPECT_EQ(ChoiceContext({&a}, b), "Question: a?\nAnswer: y\n\nQuestion: b?\nAnswer:");
}

TEST(ChoiceReaders, BelebeleTemplateAndLabels) {
  const auto path =
      TempFile("b.jsonl", R"({"flores_passage": "Text.", "question": " Why? ",)"
                          R"( "mc_answer1": "1", "mc_answer2": "2", "mc_answer3": "3",)"
                          R"( "mc_answer4": "4", "correct_answer_num": "3"})"
                          "\n");
  auto docs = ReadChoiceDocs(path, ChoiceFormat::kBelebele);
  ASSERT_TRUE(docs.ok()) << docs.status();
  EXPECT_EQ((*docs)[0].query, "P: Text.\nQ: Why?\nA: 1\nB: 2\nC: 3\nD: 4\nAnswer:");
  EXPECT_EQ((*docs)[0].choices, (std::vector<std::string>{"A", "B", "C", "D"}));
  EXPECT_EQ((*docs)[0].gold, 2);
}

TEST(ChoiceReaders, GlobalPiqaTakesAllSolutions) {
  const auto path = TempFile("g.jsonl", R"({"prompt": "P", "solution0": "a", "solution1": "b",)"
                                        R"( "solution2": "c", "label": 2})"
                                        "\n");
  auto docs = ReadChoiceDocs(path, ChoiceFormat::kGlobalPiqa);
  ASSERT_TRUE(docs.ok()) << docs.status();
  EXPECT_EQ((*docs)[0].choices.size(), 3u);
  EXPECT_EQ((*docs)[0].gold, 2);
}

TEST(ChoiceReaders, ErrorsNameLineAndField) {
  const auto path = TempFile("p.jsonl",
                             "{\"goal\": \"g\", \"sol1\": \"a\", \"sol2\": \"b\", \"label\": 0}\n"
                             "{\"goal\": 3, \"sol1\": \"a\", \"sol2\": \"b\", \"label\": 0}\n");
  auto docs = ReadChoiceDocs(path, ChoiceFormat::kPiqa);
  ASSERT_FALSE(docs.ok());
  EXPECT_NE(docs.status().message().find("p.jsonl:2: field 'goal' is number, not a string"),
            std::string::npos)
      << docs.status();
  EXPECT_FALSE(ReadChoiceDocs(TempFile("e.jsonl", "\n\n"), ChoiceFormat::kPiqa).ok());
  EXPECT_EQ(ReadChoiceDocs("/nonexistent.jsonl", ChoiceFormat::kPiqa).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(PerplexityWindowsTest, EveryStreamTokenIsPredictedExactlyOnce) {
  for (bool context : {true, false}) {
    PerplexityStream stream;
    stream.tokens.resize(103);
    for (size_t i = 0; i < stream.tokens.size(); ++i) stream.tokens[i] = static_cast<int32_t>(i);
    if (context) stream.context_token = 500;
    stream.first_predicted = context ? 0 : 1;
    std::vector<int> predicted(stream.tokens.size(), 0);
    for (const auto& w : PerplexityWindows(stream, 10)) {
      const auto tokens = WindowTokens(stream, w);
      ASSERT_LE(tokens.size(), 10u);
      EXPECT_EQ(tokens[0], context ? 500 : stream.tokens[w.begin - 1]);
      for (int64_t i = 0; i < w.length; ++i) ++predicted[w.begin + i];
    }
    for (size_t i = 0; i < predicted.size(); ++i) {
      EXPECT_EQ(predicted[i], !context && i == 0 ? 0 : 1) << i;
    }
  }
}

TEST(Translation, PromptAndStopRule) {
  TranslationPair shot{"Hi.", "Привіт."}, pair{"Bye.", "Бувай."};
  EXPECT_EQ(TranslationPrompt({&shot}, pair, "English", "Ukrainian"),
            "English: Hi.\nUkrainian: Привіт.\n\nEnglish: Bye.\nUkrainian:");
  EXPECT_FALSE(TranslationComplete(" Бувай"));
  EXPECT_FALSE(TranslationComplete("\n "));  // only leading whitespace so far
  EXPECT_TRUE(TranslationComplete(" Бувай.\nEnglish"));
  EXPECT_EQ(TranslationHypothesis("\n Бувай.\u00a0\nEnglish: x"), "Бувай.");
  EXPECT_EQ(TranslationHypothesis("   "), "");
}

// The spec as `stemma-engine eval --spec FILE` reads it: ParseEngineCommandLine (the typed
// EvalSpec, its rules, defaults and paths), then FillRunDefaults.
absl::StatusOr<v1::EvalSpec> ReadSpec(const std::string& path) {
  std::string file = path;
  std::vector<char*> argv = {const_cast<char*>("eval"), const_cast<char*>("--spec"), file.data()};
  ASSIGN_OR_RETURN(EngineInvocation inv, ParseEngineCommandLine("eval", 3, argv.data(), {}));
  v1::EvalSpec spec = static_cast<const v1::EvalSpec&>(*inv.spec);
  FillRunDefaults(path, &spec);
  return spec;
}

TEST(EvalSpecTest, DefaultsAndRelativePaths) {
  const std::string path = TempFile("run.yaml", R"(model: m
tasks:
  - {type: perplexity, language: uk, data: d, heldout_fraction: 0.1}
  - {type: choice, format: belebele, language: uk, data: b.jsonl, k: 2}
  - {type: choice, format: piqa, language: uk, data: p.jsonl}
  - {type: translation, source_language: en, language: uk, data: f.jsonl}
)");
  const std::string dir = fs::path(path).parent_path().string();
  auto spec = ReadSpec(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model(), dir + "/m");
  EXPECT_EQ(spec->tokenizer(), dir + "/m");
  EXPECT_EQ(spec->out(), dir + "/run.results.json");
  EXPECT_EQ(spec->dtype(), "float32");
  EXPECT_EQ(spec->batch_size(), 8);
  EXPECT_EQ(spec->tasks(0).name(), "uk");
  EXPECT_EQ(spec->tasks(0).data(), dir + "/d");
  EXPECT_EQ(spec->tasks(0).perplexity().split(), "heldout");
  EXPECT_EQ(spec->tasks(0).perplexity().heldout_split(), "hash");
  EXPECT_FALSE(
      spec->tasks(0).perplexity().has_seq_len());  // from the model (ResolveSequenceLengths)
  EXPECT_EQ(spec->tasks(1).name(), "belebele_uk");
  EXPECT_EQ(spec->tasks(1).choice().sampler(), "first_n");
  EXPECT_EQ(spec->tasks(1).choice().seed(), 1234u);
  EXPECT_EQ(spec->tasks(2).choice().sampler(), "seeded");
  EXPECT_EQ(spec->tasks(3).name(), "en-uk");
  EXPECT_EQ(spec->tasks(3).translation().target_name(), "uk");
  EXPECT_EQ(spec->tasks(3).translation().source_field(), "src");
  EXPECT_EQ(spec->tasks(3).translation().max_new_tokens(), 256);
}

TEST(EvalSpecTest, ErrorsNameTheFileLineAndField) {
  struct Case {
    const char* yaml;
    const char* expected;
  } cases[] = {
      {"tasks: [{type: perplexity, language: x, data: d, split: all}]\n", "model: is required"},
      {"model: m\ntasks: []\n", "tasks: needs at least one task"},
      {"model: m\ntasks:\n  - {type: bleu, language: x, data: d}\n",
       "line 3: tasks[0].type: 'bleu' is not one of"},
      {"model: m\ntasks:\n  - {type: choice, language: x, data: d}\n",
       "line 3: tasks[0].format: is required for a choice task"},
      {"model: m\ntasks:\n  - {type: choice, format: piqa, language: x, data: d, k: -1}\n",
       "line 3: tasks[0].k: -1 must be >= 0"},
      {"model: m\ntasks:\n  - {type: perplexity, language: x, data: d}\n",
       "line 3: tasks[0].heldout_fraction: is required with split: heldout"},
      {"model: m\nbatch_size: 0\ntasks: [{type: perplexity, language: x, data: d, split: all}]\n",
       "line 2: batch_size: 0 must be >= 1"},
      {"model: m\ntasks:\n  - {type: perplexity, language: x, data: d, split: all}\n"
       "  - {type: perplexity, language: x, data: e, split: all}\n",
       "line 4: tasks[1].type: the task name 'x' is used by an earlier task"},
      {"model: m\ntasks:\n  - {type: perplexity, language: x, data: d, split: all, k: 2}\n",
       "line 3: tasks[0].k: does not apply to a perplexity task"},
  };
  for (const auto& c : cases) {
    const std::string path = TempFile("bad.yaml", c.yaml);
    auto spec = ReadSpec(path);
    ASSERT_FALSE(spec.ok()) << c.yaml;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(spec.status().message().find(c.expected), std::string::npos) << spec.status();
    EXPECT_EQ(spec.status().message().rfind(path + ": ", 0), 0u) << spec.status();
  }
}

TEST(EvalSpecTest, ThreadsDefaultToTheJobsCpus) {
  const std::string path = TempFile(
      "threads.yaml", "model: m\ntasks: [{type: perplexity, language: x, data: d, split: all}]\n");
  ::setenv("STEMMA_CPUS", "3", 1);
  auto spec = ReadSpec(path);
  ::unsetenv("STEMMA_CPUS");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->threads(), 3);
  auto by_hand = ReadSpec(path);
  ASSERT_TRUE(by_hand.ok());
  EXPECT_EQ(by_hand->threads(), 0);  // torch's default
}

// A checkpoint directory with config.json and, optionally, a stemma.json manifest.
std::string Checkpoint(const std::string& name, int64_t max_positions,
                       const std::string& manifest) {
  const auto dir =
      fs::path(TempFile(name + "/config.json",
                        "{\"max_position_embeddings\": " + std::to_string(max_positions) + "}"))
          .parent_path();
  if (!manifest.empty()) std::ofstream(dir / "stemma.json") << manifest;
  return dir.string();
}

std::string TrainManifest(const std::string& seq_len_json) {
  return R"({"format": 1, "files": {}, "parents": [], "producer": {"command": "train",
             "params": {"spec": {"data": {"seq_len": )" +
         seq_len_json + "}}}}}";
}

std::string MergeManifest(const std::vector<std::string>& parents) {
  std::string list;
  for (const auto& p : parents)
    list += (list.empty() ? "" : ", ") + std::string("{\"path\": \"") + p + "\"}";
  return R"({"format": 1, "files": {}, "parents": [)" + list +
         R"(], "producer": {"command": "merge"}})";
}

v1::EvalSpec OnePerplexityTask(int64_t seq_len) {
  v1::EvalSpec spec;
  v1::EvalTask* task = spec.add_tasks();
  task->set_name("uk");
  v1::PerplexityTask* p = task->mutable_perplexity();
  if (seq_len > 0) p->set_seq_len(seq_len);
  return spec;
}

// Where the first task's seq_len came from, after ResolveSequenceLengths.
std::string SourceOfFirst(const ModelFacts& facts, v1::EvalSpec* spec) {
  std::vector<std::string> sources;
  const absl::Status status = ResolveSequenceLengths(facts, spec, &sources);
  EXPECT_TRUE(status.ok()) << status;
  return sources.empty() ? "" : sources[0];
}

TEST(EvalSequenceLength, DefaultsToTheTrainingRunsSeqLen) {
  // A train output (the proto JSON writes int64 as a string; an older manifest a number).
  for (const std::string& v : {std::string("\"256\""), std::string("256")}) {
    const std::string ckpt =
        Checkpoint("trained" + std::to_string(v.size()), 4096, TrainManifest(v));
    auto facts = ReadModelFacts(ckpt);
    ASSERT_TRUE(facts.ok()) << facts.status();
    v1::EvalSpec spec = OnePerplexityTask(0);
    EXPECT_EQ(SourceOfFirst(*facts, &spec), "training run (" + ckpt + ")");
    EXPECT_EQ(spec.tasks(0).perplexity().seq_len(), 256);
  }
}

TEST(EvalSequenceLength, FollowsAMergesParentsWhenTheyAgree) {
  const std::string a = Checkpoint("expert_a", 4096, TrainManifest("512"));
  const std::string b = Checkpoint("expert_b", 4096, TrainManifest("512"));
  const std::string c = Checkpoint("expert_c", 4096, TrainManifest("1024"));
  auto soup = ReadModelFacts(Checkpoint("soup_ab", 4096, MergeManifest({a, b})));
  ASSERT_TRUE(soup.ok());
  EXPECT_EQ(soup->training_seq_len, 512);
  // Experts trained with different lengths: no training length, so the model maximum.
  auto mixed = ReadModelFacts(Checkpoint("soup_ac", 4096, MergeManifest({a, c})));
  ASSERT_TRUE(mixed.ok());
  EXPECT_FALSE(mixed->training_seq_len.has_value());
  v1::EvalSpec spec = OnePerplexityTask(0);
  EXPECT_NE(SourceOfFirst(*mixed, &spec).find("model maximum"), std::string::npos);
  EXPECT_EQ(spec.tasks(0).perplexity().seq_len(), 2048);
}

TEST(EvalSequenceLength, WithoutATrainingRunTheModelMaximumCappedAt2048) {
  auto small = ReadModelFacts(Checkpoint("hub_small", 512, ""));
  ASSERT_TRUE(small.ok());
  v1::EvalSpec spec = OnePerplexityTask(0);
  SourceOfFirst(*small, &spec);
  EXPECT_EQ(spec.tasks(0).perplexity().seq_len(), 512);
  // The spec's own value wins, and one past the model's maximum is refused.
  v1::EvalSpec own = OnePerplexityTask(128);
  EXPECT_EQ(SourceOfFirst(*small, &own), "spec");
  EXPECT_EQ(own.tasks(0).perplexity().seq_len(), 128);
  v1::EvalSpec too_long = OnePerplexityTask(513);
  std::vector<std::string> sources;
  const absl::Status status = ResolveSequenceLengths(*small, &too_long, &sources);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("seq_len 513 exceeds the model's max_position_embeddings 512"),
            std::string::npos)
      << status;
}

TEST(EvalSequenceLength, AModelWithoutConfigIsBadInput) {
  const auto dir = fs::path(TempFile("not_a_model/readme.txt", "x")).parent_path().string();
  auto facts = ReadModelFacts(dir);
  EXPECT_EQ(facts.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(facts.status().message().find("no readable config.json"), std::string::npos);
}

TEST(EvalSpecTest, ShippedExampleSpecParses) {
  const std::string path = std::string(STEMMA_SOURCE_DIR) + "/configs/eval/family-expert.yaml";
  auto spec = ReadSpec(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->tasks_size(), 5);
  EXPECT_EQ(spec->tasks(4).name(), "en-uk");
  EXPECT_EQ(spec->tasks(4).translation().k(), 1);
}

}  // namespace
}  // namespace stemma::engine::eval
