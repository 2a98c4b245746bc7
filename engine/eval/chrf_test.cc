// chrF / chrF++ against sacrebleu 2.x on several hundred generated sentence pairs in many
// scripts (tests/engine/eval_chrf.py makes the pairs and the golden scores).
#include "engine/eval/chrf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace stemma::engine::eval {
namespace {

struct Golden {
  std::vector<std::string> hyps, refs1, refs2;
  nlohmann::json scores;
};

// Runs the generator once: ctest runs each test in its own process, so the golden file is
// kept in the temp directory under a name that changes with the generator script.
const Golden& LoadGolden() {
  static const Golden golden = [] {
    const std::string script = std::string(STEMMA_SOURCE_DIR) + "/tests/engine/eval_chrf.py";
    const auto stamp = std::filesystem::last_write_time(script).time_since_epoch().count();
    const auto out = (std::filesystem::temp_directory_path() /
                      ("stemma_chrf_golden_n400_s7_" + std::to_string(stamp) + "_" +
                       std::to_string(std::filesystem::file_size(script)) + ".json"))
                         .string();
    if (!std::filesystem::exists(out)) {
      // Written aside and renamed, so a concurrent test process never reads half a file.
      const std::string staging = out + ".tmp" + std::to_string(::getpid());
      const std::string command =
          std::string(STEMMA_PYTHON) + " " + script + " --n 400 --seed 7 --out " + staging;
      EXPECT_EQ(std::system(command.c_str()), 0) << command;
      std::filesystem::rename(staging, out);
    }
    std::ifstream in(out);
    const auto j = nlohmann::json::parse(in);
    Golden g;
    for (const auto& pair : j["pairs"]) {
      g.hyps.push_back(pair["hyp"]);
      g.refs1.push_back(pair["refs"][0]);
      g.refs2.push_back(pair["refs"][1]);
    }
    g.scores = j["scores"];
    return g;
  }();
  return golden;
}

ChrfOptions Variant(const std::string& name) {
  ChrfOptions options;
  if (name == "chrF++" || name == "chrF++_eps") options.word_order = 2;
  if (name == "chrF_ws") options.whitespace = true;
  if (name == "chrF++_eps") options.eps_smoothing = true;
  return options;
}

class ChrfVsSacrebleu : public ::testing::TestWithParam<std::string> {};

TEST_P(ChrfVsSacrebleu, CorpusScoreEqualsSacrebleu) {
  const Golden& g = LoadGolden();
  ASSERT_EQ(g.hyps.size(), 400u);
  const auto options = Variant(GetParam());
  const auto& expected = g.scores[GetParam()];
  EXPECT_NEAR(CorpusChrf(g.hyps, g.refs1, options), expected["corpus"].get<double>(), 1e-9);
}

TEST_P(ChrfVsSacrebleu, TwoReferenceStreamsPickTheBestPerSegment) {
  const Golden& g = LoadGolden();
  const auto options = Variant(GetParam());
  std::vector<int64_t> total;
  for (size_t i = 0; i < g.hyps.size(); ++i) {
    const std::vector<std::string> refs = {g.refs1[i], g.refs2[i]};
    const auto stats = ChrfSegmentStatistics(g.hyps[i], refs, options);
    if (total.empty()) total.assign(stats.size(), 0);
    for (size_t k = 0; k < stats.size(); ++k) total[k] += stats[k];
  }
  EXPECT_NEAR(ChrfScoreFromStatistics(total, options),
              g.scores[GetParam()]["corpus2"].get<double>(), 1e-9);
}

TEST_P(ChrfVsSacrebleu, EverySentenceScoreEqualsSacrebleu) {
  const Golden& g = LoadGolden();
  const auto options = Variant(GetParam());
  const auto& expected = g.scores[GetParam()]["sentence"];
  int mismatches = 0;
  for (size_t i = 0; i < g.hyps.size(); ++i) {
    const double got = SentenceChrf(g.hyps[i], g.refs1[i], options);
    if (std::abs(got - expected[i].get<double>()) > 1e-9 && ++mismatches <= 5) {
      ADD_FAILURE() << "pair " << i << ": " << got << " vs sacrebleu " << expected[i]
                    << "\nhyp: " << g.hyps[i] << "\nref: " << g.refs1[i];
    }
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(Variants, ChrfVsSacrebleu,
                         ::testing::Values("chrF", "chrF++", "chrF_ws", "chrF++_eps"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '+') c = 'P';
                             if (c == '_') c = 'x';
                           }
                           return name;
                         });

TEST(Chrf, CorpusScoreIsNotTheMeanOfSentenceScores) {
  const std::vector<std::string> hyps = {"the cat sat", "a"};
  const std::vector<std::string> refs = {"the cat sat", "completely different words here"};
  const ChrfOptions options;
  const double mean =
      (SentenceChrf(hyps[0], refs[0], options) + SentenceChrf(hyps[1], refs[1], options)) / 2;
  EXPECT_DOUBLE_EQ(SentenceChrf(hyps[0], refs[0], options), 100.0);
  EXPECT_GT(std::abs(CorpusChrf(hyps, refs, options) - mean), 1.0);
}

TEST(Chrf, EmptyHypothesisScoresZeroAndWhitespaceIsIgnored) {
  const ChrfOptions options;
  EXPECT_EQ(SentenceChrf("", "some reference", options), 0.0);
  EXPECT_DOUBLE_EQ(SentenceChrf("a b\u00a0c", "abc", options), 100.0);
  EXPECT_LT(SentenceChrf("a b c", "abc", ChrfPlusPlusOptions()), 100.0);  // words differ
}

}  // namespace
}  // namespace stemma::engine::eval
