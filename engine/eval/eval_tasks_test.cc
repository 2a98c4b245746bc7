// Torch-free parts of `stemma-engine eval`: the few-shot sampler, lm-eval's pair encoding and
// choice metrics, perplexity windows, the translation stop rule, dataset readers and the
// spec's errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "common/spec_file.h"
#include "engine/eval/choice.h"
#include "engine/eval/eval_spec.h"
#include "engine/eval/eval_text.h"
#include "engine/eval/perplexity.h"
#include "engine/eval/translation.h"

namespace stemma::engine::eval {
namespace {

namespace fs = std::filesystem;

std::string TempFile(const std::string& name, const std::string& text) {
  const auto dir = fs::temp_directory_path() / ("eval_tasks_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto path = (dir / name).string();
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
  const auto path = TempFile("b.jsonl", R"({"flores_passage": "Text.", "question": " Why? ",)"
                                        R"( "mc_answer1": "1", "mc_answer2": "2", "mc_answer3": "3",)"
                                        R"( "mc_answer4": "4", "correct_answer_num": "3"})" "\n");
  auto docs = ReadChoiceDocs(path, ChoiceFormat::kBelebele);
  ASSERT_TRUE(docs.ok()) << docs.status();
  EXPECT_EQ((*docs)[0].query, "P: Text.\nQ: Why?\nA: 1\nB: 2\nC: 3\nD: 4\nAnswer:");
  EXPECT_EQ((*docs)[0].choices, (std::vector<std::string>{"A", "B", "C", "D"}));
  EXPECT_EQ((*docs)[0].gold, 2);
}

TEST(ChoiceReaders, GlobalPiqaTakesAllSolutions) {
  const auto path = TempFile("g.jsonl", R"({"prompt": "P", "solution0": "a", "solution1": "b",)"
                                        R"( "solution2": "c", "label": 2})" "\n");
  auto docs = ReadChoiceDocs(path, ChoiceFormat::kGlobalPiqa);
  ASSERT_TRUE(docs.ok()) << docs.status();
  EXPECT_EQ((*docs)[0].choices.size(), 3u);
  EXPECT_EQ((*docs)[0].gold, 2);
}

TEST(ChoiceReaders, ErrorsNameLineAndField) {
  const auto path = TempFile("p.jsonl", "{\"goal\": \"g\", \"sol1\": \"a\", \"sol2\": \"b\", \"label\": 0}\n"
                                        "{\"goal\": 3, \"sol1\": \"a\", \"sol2\": \"b\", \"label\": 0}\n");
  auto docs = ReadChoiceDocs(path, ChoiceFormat::kPiqa);
  ASSERT_FALSE(docs.ok());
  EXPECT_NE(docs.status().message().find("p.jsonl:2: field 'goal' is number, not a string"),
            std::string::npos) << docs.status();
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

TEST(EvalSpecTest, DefaultsAndRelativePaths) {
  auto spec = ParseEvalSpec(nlohmann::json::parse(R"({"model": "m", "tasks": [
      {"type": "perplexity", "language": "uk", "data": "d", "heldout_fraction": 0.1},
      {"type": "choice", "format": "belebele", "language": "uk", "data": "b.jsonl", "k": 2},
      {"type": "choice", "format": "piqa", "language": "uk", "data": "p.jsonl"},
      {"type": "translation", "source_language": "en", "language": "uk", "data": "f.jsonl"}]})"),
      "/specs/run.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model, "/specs/m");
  EXPECT_EQ(spec->tokenizer, "/specs/m");
  EXPECT_EQ(spec->out, "/specs/run.results.json");
  EXPECT_EQ(spec->tasks[0].name, "uk");
  EXPECT_EQ(spec->tasks[1].name, "belebele_uk");
  EXPECT_EQ(spec->tasks[1].sampler, "first_n");
  EXPECT_EQ(spec->tasks[2].sampler, "seeded");
  EXPECT_EQ(spec->tasks[3].name, "en-uk");
  EXPECT_EQ(spec->tasks[3].target_name, "uk");
}

TEST(EvalSpecTest, ErrorsNameTheField) {
  struct Case {
    const char* json;
    const char* expected;
  } cases[] = {
      {R"({"tasks": []})", "model: missing"},
      {R"({"model": "m", "tasks": []})", "tasks: must be a non-empty list"},
      {R"({"model": "m", "tasks": [{"type": "bleu", "language": "x", "data": "d"}]})",
       "tasks[0].type: 'bleu' is not one of"},
      {R"({"model": "m", "tasks": [{"type": "choice", "language": "x", "data": "d"}]})",
       "tasks[0].format: missing"},
      {R"({"model": "m", "tasks": [{"type": "choice", "format": "piqa", "language": "x", "data": "d", "k": -1}]})",
       "tasks[0].k: must be an integer >= 0"},
      {R"({"model": "m", "tasks": [{"type": "perplexity", "language": "x", "data": "d"}]})",
       "tasks[0].heldout_fraction: must be in (0, 1)"},
      {R"({"model": "m", "batch_size": 0, "tasks": [{"type": "perplexity", "language": "x", "data": "d", "split": "all"}]})",
       "batch_size: must be an integer >= 1"},
      {R"({"model": "m", "tasks": [{"type": "perplexity", "language": "x", "data": "d", "split": "all"},
                                   {"type": "perplexity", "language": "x", "data": "e", "split": "all"}]})",
       "tasks[1].name: 'x' is used by an earlier task"},
  };
  for (const auto& c : cases) {
    auto spec = ParseEvalSpec(nlohmann::json::parse(c.json), "eval.yaml");
    ASSERT_FALSE(spec.ok()) << c.json;
    EXPECT_NE(spec.status().message().find(c.expected), std::string::npos) << spec.status();
    EXPECT_EQ(spec.status().message().rfind("eval.yaml: ", 0), 0u) << spec.status();
  }
}

}  // namespace
}  // namespace stemma::engine::eval

namespace stemma::engine::eval {
namespace {

TEST(EvalSpecTest, ShippedExampleSpecParses) {
  const std::string path = std::string(STEMMA_SOURCE_DIR) + "/configs/eval/family-expert.yaml";
  auto raw = ReadSpecFile(path);
  ASSERT_TRUE(raw.ok()) << raw.status();
  auto spec = ParseEvalSpec(*raw, path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->tasks.size(), 5u);
  EXPECT_EQ(spec->tasks[4].name, "en-uk");
  EXPECT_EQ(spec->tasks[4].k, 1);
}

}  // namespace
}  // namespace stemma::engine::eval
