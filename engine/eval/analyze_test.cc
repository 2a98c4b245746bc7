// stemma-engine analyze: the torch-free statistics on hand-made counts, then the real command
// on tiny models rigged so that the answer is known (a neuron that fires only on one
// language's tokens, a router that sends one language to one expert), weight drift of known
// size, alignment of identical sentences, and bad inputs that must fail with a clear error
// and leave no output behind.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/eval/lape.h"
#include "engine/eval/routing.h"
#include "engine/model/causal_lm.h"
#include "engine/model/checkpoint.h"
#include "engine/model/config.h"
#include "nlohmann/json.hpp"

namespace stemma::engine::eval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- Torch-free statistics ----

TEST(RoutingMath, EntropyAndJensenShannonHaveTheirKnownValues) {
  EXPECT_NEAR(Entropy({0.25, 0.25, 0.25, 0.25}), std::log(4.0), 1e-12);
  EXPECT_DOUBLE_EQ(Entropy({1.0, 0.0}), 0.0);
  EXPECT_NEAR(JensenShannon({1, 0}, {0, 1}), std::log(2.0), 1e-12);  // disjoint: ln 2
  EXPECT_NEAR(JensenShannon({0.3, 0.7}, {0.3, 0.7}), 0.0, 1e-15);
  // ½KL(p‖m) + ½KL(q‖m) by hand for p = (0.5, 0.5), q = (1, 0), m = (0.75, 0.25).
  const double by_hand = 0.5 * (0.5 * std::log(0.5 / 0.75) + 0.5 * std::log(0.5 / 0.25)) +
                         0.5 * (1.0 * std::log(1.0 / 0.75));
  EXPECT_NEAR(JensenShannon({0.5, 0.5}, {1, 0}), by_hand, 1e-12);
  EXPECT_DOUBLE_EQ(Jaccard({1, 2, 3}, {2, 3, 4, 5}), 2.0 / 5.0);
  std::vector<double> dist = UsageDistribution({0, 0});
  EXPECT_EQ(dist, (std::vector<double>{0, 0}));  // an empty layer divides by 1
  // Each expert used by one language only: the language is known from the expert.
  EXPECT_NEAR(SpecializationScore({{10, 0}, {0, 10}}), 1.0, 1e-12);
  EXPECT_NEAR(SpecializationScore({{5, 5}, {5, 5}}), 0.0, 1e-12);
}

TEST(Lape, KthValueIsOneIndexedWithPythonRounding) {
  std::vector<double> v = {5, 1, 4, 2, 3};
  EXPECT_EQ(KthValueByRatio(v, 0.5), 2);  // round(2.5) = 2 (half to even) -> 2nd smallest
  v = {5, 1, 4, 2, 3};
  EXPECT_EQ(KthValueByRatio(v, 0.95), 5);  // round(4.75) = 5
  v = {5, 1, 4, 2, 3};
  EXPECT_EQ(KthValueByRatio(v, 0.01), 1);  // round(0.05) = 0, clamped to the 1st
}

// Two layers of 50 neurons. Neuron (1, 7) fires on 90% of "sw" tokens and never on "yo"'s;
// neuron (0, 3) on 80% of "yo"'s only; neuron (0, 9) fires often on both; the rest fire at
// 30% on both (entropy ln 2, below the threshold).
TEST(Lape, SelectsPlantedNeuronsAndAssignsTheirLanguage) {
  const int64_t layers = 2, inter = 50, tokens = 1000;
  std::vector<LapeCounts> counts(2);
  for (auto& c : counts) {
    c.tokens = tokens;
    c.over_zero.assign(layers * inter, 300);
  }
  counts[0].over_zero[1 * inter + 7] = 900;
  counts[1].over_zero[1 * inter + 7] = 0;
  counts[0].over_zero[0 * inter + 3] = 0;
  counts[1].over_zero[0 * inter + 3] = 800;
  counts[0].over_zero[0 * inter + 9] = 950;
  counts[1].over_zero[0 * inter + 9] = 990;
  LapeParams params;
  params.top_rate = 0.02;  // round(100 · 0.02) = 2 neurons
  auto result = IdentifyLapeNeurons({"sw", "yo"}, counts, layers, inter, params);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->num_selected, 2);
  EXPECT_EQ(result->neurons["sw"], (std::vector<std::vector<int64_t>>{{}, {7}}));
  EXPECT_EQ(result->neurons["yo"], (std::vector<std::vector<int64_t>>{{3}, {}}));
  EXPECT_EQ(result->num_unassigned, 0);

  json mask = NeuronMaskJson(*result, params, counts, /*keep_profile=*/false);
  EXPECT_FALSE(mask.contains("profile"));
  EXPECT_EQ(mask["format"], "stemma.neuron_mask/1");
  EXPECT_EQ(mask["num_layers"], 2);
  EXPECT_EQ(mask["intermediate_size"], 50);
  EXPECT_EQ(mask["counts"]["sw"], json::parse("[0, 1]"));
  EXPECT_EQ(mask["languages"]["yo"], json::parse("[[3], []]"));
}

// The same counts with a third, shared neuron selected: exclusive drops it from both
// languages; the profile keeps every neuron's probabilities and entropy and re-selects
// exactly; the random mask has the selection's size per language and layer.
TEST(Lape, ExclusiveProfileAndRandomMask) {
  const int64_t layers = 2, inter = 50, tokens = 1000;
  std::vector<LapeCounts> counts(2);
  for (auto& c : counts) {
    c.tokens = tokens;
    c.over_zero.assign(layers * inter, 300);
  }
  counts[0].over_zero[1 * inter + 7] = 900;  // sw only
  counts[1].over_zero[1 * inter + 7] = 0;
  counts[0].over_zero[0 * inter + 3] = 0;  // yo only
  counts[1].over_zero[0 * inter + 3] = 800;
  counts[0].over_zero[0 * inter + 9] = 999;  // both, with a slight lean: entropy just under ln 2
  counts[1].over_zero[0 * inter + 9] = 950;
  LapeParams params;
  params.top_rate = 0.03;  // 3 neurons: (1, 7), (0, 3), (0, 9)
  auto shared = IdentifyLapeNeurons({"sw", "yo"}, counts, layers, inter, params);
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ(shared->neurons["sw"], (std::vector<std::vector<int64_t>>{{9}, {7}}));
  EXPECT_EQ(shared->neurons["yo"], (std::vector<std::vector<int64_t>>{{3, 9}, {}}));
  params.exclusive = true;
  auto exclusive = IdentifyLapeNeurons({"sw", "yo"}, counts, layers, inter, params);
  ASSERT_TRUE(exclusive.ok());
  EXPECT_EQ(exclusive->neurons["sw"], (std::vector<std::vector<int64_t>>{{}, {7}}));
  EXPECT_EQ(exclusive->neurons["yo"], (std::vector<std::vector<int64_t>>{{3}, {}}));
  EXPECT_EQ(exclusive->num_shared, 1);

  json mask = NeuronMaskJson(*shared, LapeParams{}, counts, /*keep_profile=*/true);
  const json& profile = mask["profile"];
  EXPECT_EQ(profile["tokens"]["sw"], tokens);
  EXPECT_DOUBLE_EQ(profile["probability"]["sw"][1][7].get<double>(), 0.9);
  EXPECT_DOUBLE_EQ(profile["probability"]["yo"][1][7].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(profile["entropy"][1][7].get<double>(), 0.0);  // one language only
  EXPECT_NEAR(profile["entropy"][1][0].get<double>(), std::log(2.0), 1e-12);
  // Through the file's text, as a later run reads it: the same counts, so the same selection.
  auto saved = LapeCountsFromMask(json::parse(mask.dump()), {}, "mask.json");
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->languages, (std::vector<std::string>{"sw", "yo"}));
  for (int k = 0; k < 2; ++k) EXPECT_EQ(saved->counts[k].over_zero, counts[k].over_zero);
  params.exclusive = false;
  auto again = IdentifyLapeNeurons(saved->languages, saved->counts, saved->num_layers,
                                   saved->intermediate_size, params);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->neurons, shared->neurons);
  json no_profile = NeuronMaskJson(*shared, LapeParams{}, counts, /*keep_profile=*/false);
  EXPECT_NE(LapeCountsFromMask(no_profile, {}, "old.json").status().message().find("keep_profile"),
            std::string::npos);

  json random = RandomMaskJson(*shared, /*seed=*/5);
  EXPECT_EQ(random["format"], "stemma.neuron_mask/1");
  EXPECT_EQ(random["params"]["method"], "random");
  EXPECT_EQ(random["counts"], mask["counts"]);
  for (const auto& [lang, per_layer] : random["languages"].items()) {
    for (const auto& list : per_layer) {
      EXPECT_TRUE(std::is_sorted(list.begin(), list.end()));
      for (const auto& j : list) EXPECT_LT(j.get<int64_t>(), inter);
      EXPECT_EQ(std::set<int64_t>(list.begin(), list.end()).size(), list.size());
    }
  }
  EXPECT_EQ(RandomMaskJson(*shared, 5), random);  // seeded: reproducible
  auto union_of = MaskUnion(random, {}, "random.json");
  ASSERT_TRUE(union_of.ok());
  EXPECT_EQ(union_of->size(), 2u);
}

TEST(Lape, RefusesBadCounts) {
  std::vector<LapeCounts> counts(2);
  counts[0] = {10, std::vector<int64_t>(4, 1)};
  counts[1] = {0, std::vector<int64_t>(4, 0)};
  auto result = IdentifyLapeNeurons({"sw", "yo"}, counts, 2, 2, {});
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("'yo' has no tokens"), std::string::npos);
  counts[1].tokens = 10;
  LapeParams bad;
  bad.top_rate = 1.5;
  result = IdentifyLapeNeurons({"sw", "yo"}, counts, 2, 2, bad);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("top_rate"), std::string::npos);
}

// HR languages en, es, fi over 4 experts in one layer (model layer 3); ca's parent is es.
TEST(Routing, ActivationGapSelectionAndSharedExperts) {
  RoutingInput input;
  input.languages = {"en", "es", "fi"};
  input.moe_layers = {3};
  input.num_experts = 4;
  input.top_k = 1;
  input.counts = {{100, {{70, 10, 10, 10}}}, {100, {{20, 60, 10, 10}}}, {100, {{25, 25, 25, 25}}}};
  input.vocab = {{1, 2}, {2, 3}, {4}};
  SelectionParams params;
  params.alpha = 0.1;
  params.shared_k = {2};
  params.parents = {{"ca", "es"}};
  auto sel = ExpertSelectionJson(input, params);
  ASSERT_TRUE(sel.ok()) << sel.status();
  // gaps: e0 0.70-0.25=0.45 (en), e1 0.60-0.25=0.35 (es), e2/e3 0.25-0.10=0.15 (fi).
  EXPECT_EQ((*sel)["en"]["seft"]["3"], json::parse("[0]"));
  EXPECT_EQ((*sel)["es"]["seft"]["3"], json::parse("[1]"));
  EXPECT_EQ((*sel)["fi"]["seft"]["3"], json::parse("[2, 3]"));
  // Shared by mean usage: e0 0.45, e1 0.3167 -> [0, 1]; ca = es's SEFT + shared.
  EXPECT_EQ((*sel)["shared_experts"]["k2"]["3"], json::parse("[0, 1]"));
  EXPECT_EQ((*sel)["ca"]["seft"]["3"], json::parse("[1]"));
  EXPECT_EQ((*sel)["ca"]["ssft_k2"]["3"], json::parse("[1, 0, 1]"));
  EXPECT_NEAR((*sel)["_meta"]["gaps"]["3"]["0"]["gap"].get<double>(), 0.45, 1e-12);
  // Baselines: a random subset of SSFT's size per layer (ca's ssft_k2 is {0, 1}: two experts),
  // seeded and so the same on a rerun, and every expert of the selected layers.
  const json random = (*sel)["ca"]["random_ssft_k2"]["3"];
  ASSERT_EQ(random.size(), 2u);
  EXPECT_NE(random[0], random[1]);
  for (const auto& id : random) EXPECT_LT(id.get<int64_t>(), 4);
  EXPECT_EQ((*ExpertSelectionJson(input, params))["ca"]["random_ssft_k2"]["3"], random);
  EXPECT_EQ((*sel)["fi"]["all"]["3"], json::parse("[0, 1, 2, 3]"));

  auto stats = RoutingStatsJson(input);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_NEAR((*stats)["layers"][0]["entropy"]["fi"].get<double>(), std::log(4.0), 1e-12);
  EXPECT_NEAR((*stats)["vocab_overlap"][0][1].get<double>(), 1.0 / 3.0, 1e-12);
  EXPECT_DOUBLE_EQ((*stats)["layers"][0]["jsd"][1][1].get<double>(), 0.0);

  params.layers = {2};
  auto bad = ExpertSelectionJson(input, params);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("layer 2 is not an MoE layer"), std::string::npos);
  params.layers = {};
  params.parents = {{"ca", "xx"}};
  bad = ExpertSelectionJson(input, params);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("parents.ca"), std::string::npos);
}

// The defaults of the selection scale with the number of experts (the paper's are for 64).
TEST(Routing, DefaultsScaleWithTheNumberOfExperts) {
  EXPECT_EQ(DefaultSharedK(64), (std::vector<int64_t>{1, 3, 5}));
  EXPECT_EQ(DefaultSharedK(128), (std::vector<int64_t>{2, 6, 10}));
  EXPECT_EQ(DefaultSharedK(32), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(DefaultSharedK(8), (std::vector<int64_t>{1}));
  EXPECT_EQ(DefaultSharedK(4), (std::vector<int64_t>{1}));
  EXPECT_DOUBLE_EQ(DefaultAlpha(64), 0.01);
  EXPECT_DOUBLE_EQ(DefaultAlpha(4), 0.16);
}

// An upcycled 4-expert model after CPT on a new language xx, and English: experts 1..3 are
// xx's, expert 0 English's. xx has no high-resource parent: as a target it gets the experts it
// uses at least alpha more than English does; English (the one anchor) those it uses more
// than xx does. Defaults: alpha 0.16, shared_k [1].
TEST(Routing, ATargetWithoutAnAnchorIsRankedAgainstTheAnchors) {
  RoutingInput input;
  input.languages = {"en", "xx"};
  input.moe_layers = {0, 1};
  input.num_experts = 4;
  input.top_k = 2;
  input.counts = {{100, {{120, 40, 30, 10}, {110, 50, 20, 20}}},  // en
                  {100, {{20, 70, 64, 46}, {30, 30, 80, 60}}}};   // xx
  input.vocab = {{1}, {2}};
  SelectionParams params;
  params.targets = {"xx"};
  auto sel = ExpertSelectionJson(input, params);
  ASSERT_TRUE(sel.ok()) << sel.status();
  // layer 1 usage: en [.55 .25 .1 .1], xx [.15 .15 .4 .3]: en's e0 +0.40; xx's e2 +0.30, e3 +0.20.
  EXPECT_EQ((*sel)["en"]["seft"]["1"], json::parse("[0]"));
  EXPECT_EQ((*sel)["xx"]["seft"]["1"], json::parse("[2, 3]"));
  // layer 0: en [.6 .2 .15 .05], xx [.1 .35 .32 .23]: xx's e1 +0.15 < 0.16 stays out.
  EXPECT_EQ((*sel)["xx"]["seft"]["0"], json::parse("[2, 3]"));
  EXPECT_EQ((*sel)["_meta"]["alpha"], 0.16);
  EXPECT_EQ((*sel)["_meta"]["shared_k"], json::parse("[1]"));
  EXPECT_EQ((*sel)["shared_experts"]["k1"]["1"], json::parse("[0]"));  // the anchor's most used
  EXPECT_EQ((*sel)["xx"]["ssft_k1"]["1"], json::parse("[2, 3, 0]"));
  EXPECT_FALSE((*sel)["shared_experts"].contains("k3"));

  // A pool as large as the model's experts is every expert: refused, not clamped.
  params.shared_k = {1, 4};
  auto bad = ExpertSelectionJson(input, params);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("shared_k: 4 shared experts of the model's 4"),
            std::string::npos)
      << bad.status();
  // Without the target, one anchor has nothing to be compared with.
  params = SelectionParams();
  params.high_resource = {"en"};
  bad = ExpertSelectionJson(input, params);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("at least two languages"), std::string::npos)
      << bad.status();
}

// ---- Against tests/engine/analyze_golden.py (written from the reference code's steps) ----

json RunGolden(const std::string& mode, const json& input) {
  const fs::path dir = fs::path(testing::TempDir()) / absl::StrCat("analyze_golden_", getpid());
  fs::create_directories(dir);
  const fs::path in = dir / (mode + "_in.json"), out = dir / (mode + "_out.json");
  std::ofstream(in) << input.dump();
  const std::string cmd =
      absl::StrCat(STEMMA_PYTHON, " ", STEMMA_SOURCE_DIR, "/tests/engine/analyze_golden.py ", mode,
                   " ", in.string(), " ", out.string());
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream result(out);
  json parsed = json::parse(result, nullptr, false);
  fs::remove_all(dir);
  return parsed;
}

// The Python checks need the venv (scripts/setup --engine); without it they are skipped.
bool HavePython() { return std::string(STEMMA_PYTHON).size() > 0; }

TEST(Golden, LapeSelectionEqualsTheReferenceSteps) {
  if (!HavePython()) GTEST_SKIP() << "no STEMMA_PYTHON";
  const int64_t langs = 3, layers = 4, inter = 300;
  const std::vector<int64_t> tokens = {10000, 12000, 9000};
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<LapeCounts> counts(langs);
  for (int64_t k = 0; k < langs; ++k) {
    counts[k].tokens = tokens[k];
    counts[k].over_zero.assign(layers * inter, 0);
  }
  for (int64_t n = 0; n < layers * inter; ++n) {
    const double base = 0.6 * unit(rng);
    const int64_t special = unit(rng) < 0.1 ? static_cast<int64_t>(unit(rng) * langs) : -1;
    for (int64_t k = 0; k < langs; ++k) {
      double p = base * (0.5 + unit(rng));
      if (special >= 0) p = k == special ? 0.7 + 0.29 * unit(rng) : 0.1 * unit(rng);
      if (unit(rng) < 0.02) p = 0.0;  // some never fire
      counts[k].over_zero[n] = static_cast<int64_t>(std::llround(std::min(p, 1.0) * tokens[k]));
    }
  }
  LapeParams params;
  params.top_rate = 0.05;
  params.filter_rate = 0.95;
  params.activation_bar_ratio = 0.9;  // apart from the filter, so both percentiles are checked
  const std::vector<std::string> names = {"hi", "mr", "ur"};
  auto result = IdentifyLapeNeurons(names, counts, layers, inter, params);
  ASSERT_TRUE(result.ok()) << result.status();

  json input = {{"languages", names},
                {"tokens", tokens},
                {"top_rate", params.top_rate},
                {"filter_rate", params.filter_rate},
                {"activation_bar_ratio", params.activation_bar_ratio}};
  json over_zero = json::array();
  for (const auto& c : counts) {
    json per_layer = json::array();
    for (int64_t l = 0; l < layers; ++l) {
      per_layer.push_back(std::vector<int64_t>(c.over_zero.begin() + l * inter,
                                               c.over_zero.begin() + (l + 1) * inter));
    }
    over_zero.push_back(per_layer);
  }
  input["over_zero"] = over_zero;
  json golden = RunGolden("lape", input);
  ASSERT_FALSE(golden.is_discarded());
  EXPECT_DOUBLE_EQ(result->filter_threshold, golden["tau"].get<double>());
  EXPECT_DOUBLE_EQ(result->activation_bar, golden["bar"].get<double>());
  int64_t assigned = 0;
  for (const auto& lang : names) {
    EXPECT_EQ(json(result->neurons[lang]), golden["languages"][lang]) << lang;
    for (const auto& list : result->neurons[lang]) assigned += list.size();
  }
  EXPECT_GT(assigned, 20);  // the planted specific neurons are among them
}

TEST(Golden, ActivationGapSelectionEqualsTheReferenceSteps) {
  if (!HavePython()) GTEST_SKIP() << "no STEMMA_PYTHON";
  RoutingInput input;
  input.languages = {"ar", "cs", "en", "es"};
  input.moe_layers = {0, 1, 2};
  input.num_experts = 16;
  input.top_k = 2;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> count(0, 400);
  json counts = json::object();
  for (const auto& lang : input.languages) {
    RoutingCounts c;
    c.tokens = 1000;
    for (int64_t m = 0; m < 3; ++m) {
      std::vector<int64_t> row(16);
      for (auto& x : row) x = count(rng) < 60 ? 0 : count(rng);  // some experts unused
      c.counts.push_back(row);
      counts[lang][std::to_string(m)] = row;
    }
    input.counts.push_back(c);
    input.vocab.push_back({1});
  }
  SelectionParams params;
  params.layers = {1, 2};
  params.alpha = 0.02;
  params.shared_k = {1, 3};
  auto sel = ExpertSelectionJson(input, params);
  ASSERT_TRUE(sel.ok()) << sel.status();
  json golden = RunGolden("select", {{"counts", counts},
                                     {"high_resource", input.languages},
                                     {"layers", {"1", "2"}},
                                     {"alpha", *params.alpha},
                                     {"shared_k", params.shared_k}});
  ASSERT_FALSE(golden.is_discarded());
  for (const auto& lang : input.languages) {
    EXPECT_EQ((*sel)[lang]["seft"], golden["seft"][lang]) << lang;
  }
  EXPECT_EQ((*sel)["shared_experts"], golden["shared"]);
}

// ---- The command on rigged tiny models ----

struct RunResult {
  int rc = -1;
  std::string out, err;
};

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteText(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

class AnalyzeCommand : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    dir_ =
        fs::path(testing::TempDir()) / absl::StrCat("analyze_test_", info->name(), "_", getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // `env` is prefixed to the command line ("STEMMA_CPUS=1 ").
  RunResult Run(const json& spec, const std::string& env = "") {
    const fs::path spec_path = dir_ / "spec.json";
    WriteText(spec_path, spec.dump(2));
    const fs::path out = dir_ / "stdout", err = dir_ / "stderr";
    const std::string cmd =
        absl::StrCat(env, STEMMA_ENGINE_BIN, " analyze --spec ", spec_path.string(), " >",
                     out.string(), " 2>", err.string());
    RunResult r;
    const int status = std::system(cmd.c_str());
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = ReadAll(out);
    r.err = ReadAll(err);
    return r;
  }

  // Every stdout line is a JSON event; returns them.
  static std::vector<json> Events(const RunResult& r) {
    std::vector<json> events;
    std::istringstream lines(r.out);
    std::string line;
    while (std::getline(lines, line)) {
      json e = json::parse(line, nullptr, false);
      EXPECT_FALSE(e.is_discarded()) << "not JSON on stdout: " << line;
      if (!e.is_discarded()) {
        EXPECT_TRUE(e.contains("event")) << line;
        events.push_back(e);
      }
    }
    return events;
  }

  json ReadJson(const fs::path& path) { return json::parse(ReadAll(path)); }

  // The spec's list forms from a mapping (sorted by language, as nlohmann iterates):
  // languages [{language, <source>...}] and alignment texts [{language, path}].
  static json Langs(const json& by_language) {
    json list = json::array();
    for (const auto& [lang, source] : by_language.items()) {
      json entry = source;
      entry["language"] = lang;
      list.push_back(entry);
    }
    return list;
  }
  static json Texts(const json& by_language) {
    json list = json::array();
    for (const auto& [lang, path] : by_language.items())
      list.push_back({{"language", lang}, {"path", path}});
    return list;
  }

  // A tiny model with the byte tokenizer (ids 0..255 are bytes), random weights for `seed`.
  model::CausalLM TinyModel(model::Arch arch, int64_t top_k = 0) {
    json config = model::PresetConfigJson(arch, "tiny").value();
    config["vocab_size"] = 259;
    config["bos_token_id"] = 256;
    config["eos_token_id"] = 257;
    config["pad_token_id"] = 258;
    config["stemma_tokenizer"] = {{"type", "bytes"}};
    if (top_k > 0) config["num_experts_per_tok"] = top_k;
    auto parsed = model::ParseModelConfig(config);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    return model::InitModel(*parsed, /*seed=*/11).value();
  }

  void Save(model::CausalLM& lm, const fs::path& path) {
    auto status = model::SaveModel(lm, path.string());
    ASSERT_TRUE(status.ok()) << status;
  }

  // Lines of random letters drawn from [first, last], about `chars` in all.
  std::string Letters(char first, char last, int chars, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> letter(first, last), len(3, 12);
    std::string text;
    while (static_cast<int>(text.size()) < chars) {
      const int n = len(rng);
      for (int i = 0; i < n; ++i) text += static_cast<char>(letter(rng));
      text += '\n';  // lines are tokenized apart: no newline token reaches the model
    }
    return text;
  }

  // Hidden dimension 0 carries the language: +4 in the embedding of the bytes in
  // [plus_first, plus_last], -4 for every other letter.
  static void MarkLanguage(model::CausalLM& lm, char plus_first, char plus_last) {
    torch::NoGradGuard no_grad;
    auto embed = lm->model->embed_tokens->weight;  // [V, H]
    for (int c = 'a'; c <= 'z'; ++c) {
      embed[c][0] = (c >= plus_first && c <= plus_last) ? 4.0f : -4.0f;
    }
  }

  fs::path dir_;
};

TEST_F(AnalyzeCommand, LapeFindsThePlantedNeuronOfEachLanguage) {
  model::CausalLM lm = TinyModel(model::Arch::kLlama);
  MarkLanguage(lm, 'a', 'm');  // "aa" letters a..m: +4, "bb" letters n..z: -4
  {
    torch::NoGradGuard no_grad;
    // Only the planted neurons read dim 0, and they write nothing back, so that no other
    // neuron can tell the languages apart (attention and up_proj would otherwise carry the
    // sign of dim 0 into every neuron's input).
    for (int64_t l = 0; l < 2; ++l) {
      auto* layer = lm->model->layers[l]->as<model::DecoderLayerImpl>();
      for (auto* proj : {&layer->self_attn->q_proj, &layer->self_attn->k_proj,
                         &layer->self_attn->v_proj, &layer->mlp->gate_proj, &layer->mlp->up_proj}) {
        (*proj)->weight.select(1, 0).zero_();
      }
    }
    auto plant = [&](int64_t l, int64_t neuron, float sign) {
      auto* mlp = lm->model->layers[l]->as<model::DecoderLayerImpl>()->mlp.get();
      mlp->gate_proj->weight[neuron].zero_();
      mlp->gate_proj->weight[neuron][0] = sign;
      mlp->down_proj->weight.select(1, neuron).zero_();
    };
    plant(1, 7, 1.0f);   // layer 1, neuron 7: fires where dim 0 > 0, i.e. on "aa"
    plant(0, 3, -1.0f);  // layer 0, neuron 3: fires on "bb"
  }
  Save(lm, dir_ / "model");
  WriteText(dir_ / "aa.txt", Letters('a', 'm', 4000, 1));
  // "bb" as JSONL records, to read that input kind too.
  std::string jsonl;
  std::istringstream lines(Letters('n', 'z', 4000, 2));
  for (std::string line; std::getline(lines, line);) jsonl += json{{"text", line}}.dump() + "\n";
  WriteText(dir_ / "bb.jsonl", jsonl);

  json spec = {
      {"model", (dir_ / "model").string()},
      {"out", (dir_ / "out").string()},
      {"seq_len", 64},
      {"batch_size", 4},
      {"languages", Langs({{"aa", {{"text", (dir_ / "aa.txt").string()}}},
                           {"bb", {{"jsonl", (dir_ / "bb.jsonl").string()}, {"field", "text"}}}})},
      {"lape", {{"top_rate", 0.01}}}};
  RunResult r = Run(spec);
  ASSERT_EQ(r.rc, 0) << r.err;
  std::vector<json> events = Events(r);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front()["event"], "start");
  EXPECT_EQ(events.back()["event"], "done");
  bool output_event = false;
  for (const auto& e : events) {
    output_event |= e["event"] == "output" && e["name"] == "mask" && e["type"] == "file" &&
                    e["operation"] == "analyze" &&
                    e["path"] == (dir_ / "out" / "neuron_mask.json").string();
  }
  EXPECT_TRUE(output_event);

  json mask = ReadJson(dir_ / "out" / "neuron_mask.json");
  EXPECT_EQ(mask["format"], "stemma.neuron_mask/1");
  EXPECT_EQ(mask["num_layers"], 2);
  EXPECT_EQ(mask["intermediate_size"], 128);
  auto has = [&](const std::string& lang, int layer, int neuron) {
    for (const auto& j : mask["languages"][lang][layer]) {
      if (j == neuron) return true;
    }
    return false;
  };
  EXPECT_TRUE(has("aa", 1, 7)) << mask["languages"].dump();
  EXPECT_FALSE(has("bb", 1, 7)) << mask["languages"].dump();
  EXPECT_TRUE(has("bb", 0, 3)) << mask["languages"].dump();
  EXPECT_FALSE(has("aa", 0, 3)) << mask["languages"].dump();
  // counts agree with the lists, and every list is sorted.
  for (const auto& lang : {"aa", "bb"}) {
    for (int l = 0; l < 2; ++l) {
      const json& list = mask["languages"][lang][l];
      EXPECT_EQ(mask["counts"][lang][l], list.size());
      EXPECT_TRUE(std::is_sorted(list.begin(), list.end()));
    }
  }
  EXPECT_EQ(mask["params"]["num_selected"], 3);  // round(2 · 128 · 0.01)

  // The profile: every neuron's activation probability per language and its entropy.
  const json& profile = mask["profile"];
  ASSERT_EQ(profile["probability"]["aa"].size(), 2u);
  ASSERT_EQ(profile["probability"]["aa"][1].size(), 128u);
  EXPECT_GT(profile["probability"]["aa"][1][7].get<double>(), 0.9);
  EXPECT_EQ(profile["probability"]["bb"][1][7].get<double>(), 0.0);
  EXPECT_EQ(profile["entropy"][1][7].get<double>(), 0.0);
  EXPECT_EQ(profile["tokens"], mask["params"]["tokens"]);

  // The random baseline: the same number of neurons per language and layer.
  json random = ReadJson(dir_ / "out" / "random_mask.json");
  EXPECT_EQ(random["params"]["method"], "random");
  EXPECT_EQ(random["counts"], mask["counts"]);
  bool random_output = false;
  for (const auto& e : events)
    random_output |= e["event"] == "output" && e["name"] == "random_mask";
  EXPECT_TRUE(random_output);

  // Re-selected from the saved profile, without the model: the same neurons; with a larger
  // top_rate, more, the planted ones among them.
  RunResult again = Run({{"out", (dir_ / "out_again").string()},
                         {"lape", {{"profile", (dir_ / "out" / "neuron_mask.json").string()}}}});
  ASSERT_EQ(again.rc, 0) << again.err;
  json same = ReadJson(dir_ / "out_again" / "neuron_mask.json");
  EXPECT_EQ(same["languages"], mask["languages"]);
  EXPECT_EQ(same["params"]["reselected_from"], (dir_ / "out" / "neuron_mask.json").string());
  RunResult wider = Run({{"out", (dir_ / "out_wider").string()},
                         {"lape",
                          {{"profile", (dir_ / "out" / "neuron_mask.json").string()},
                           {"top_rate", 0.05},
                           {"random_mask", false}}}});
  ASSERT_EQ(wider.rc, 0) << wider.err;
  json more = ReadJson(dir_ / "out_wider" / "neuron_mask.json");
  EXPECT_EQ(more["params"]["num_selected"], 13);  // round(256 · 0.05)
  EXPECT_FALSE(fs::exists(dir_ / "out_wider" / "random_mask.json"));
  bool found = false;
  for (const auto& j : more["languages"]["aa"][1]) found |= j == 7;
  EXPECT_TRUE(found) << more["languages"].dump();
}

TEST_F(AnalyzeCommand, RoutingGivesTheRiggedLanguageLowestEntropyAndItsExpertTheLargestGap) {
  model::CausalLM lm = TinyModel(model::Arch::kOlmoe, /*top_k=*/1);
  MarkLanguage(lm, 'a', 'h');  // "aa": a..h at +4; "bb" (i..q) and "cc" (r..z) at -4
  {
    torch::NoGradGuard no_grad;
    for (int64_t l = 0; l < 2; ++l) {
      auto router = lm->model->layers[l]->as<model::DecoderLayerImpl>()->moe->gate->weight;
      router.select(1, 0).zero_();
      router[0][0] = 2.0f;  // expert 0 wins by far on "aa" and is never chosen otherwise
    }
  }
  Save(lm, dir_ / "moe");
  WriteText(dir_ / "aa.txt", Letters('a', 'h', 3000, 3));
  WriteText(dir_ / "bb.txt", Letters('i', 'q', 3000, 4));
  WriteText(dir_ / "cc.txt", Letters('r', 'z', 3000, 5));
  // "cc" as a token dataset (one document per line: the same stream as a text source).
  const std::string tokenize =
      absl::StrCat(STEMMA_ENGINE_BIN, " tokenize --tokenizer ", (dir_ / "moe").string(),
                   " --input ", (dir_ / "cc.txt").string(), " --format text --line-docs",
                   " --language cc --out ", (dir_ / "cc_tokens").string(), " >/dev/null");
  ASSERT_EQ(std::system(tokenize.c_str()), 0) << tokenize;
  json spec = {{"model", (dir_ / "moe").string()},
               {"out", (dir_ / "out").string()},
               {"seq_len", 64},
               {"languages", Langs({{"aa", {{"text", (dir_ / "aa.txt").string()}}},
                                    {"bb", {{"text", (dir_ / "bb.txt").string()}}},
                                    {"cc", {{"dataset", (dir_ / "cc_tokens").string()}}}})},
               {"routing", {{"select", {{"alpha", 0.05}, {"shared_k", {1, 2}}}}}}};
  RunResult r = Run(spec, "STEMMA_CPUS=1 ");
  ASSERT_EQ(r.rc, 0) << r.err;
  const json start = Events(r).front();
  EXPECT_EQ(start["threads"], 1);  // no threads in the spec: the job's CPUs
  EXPECT_EQ(start["select_layers"], "the last two MoE layers of 2");
  json stats = ReadJson(dir_ / "out" / "routing.json");
  ASSERT_EQ(stats["layers"].size(), 2u);
  for (const auto& layer : stats["layers"]) {
    const json& h = layer["entropy"];
    EXPECT_LT(h["aa"].get<double>(), h["bb"].get<double>()) << h.dump();
    EXPECT_LT(h["aa"].get<double>(), h["cc"].get<double>()) << h.dump();
    EXPECT_NEAR(layer["usage"]["aa"][0].get<double>(), 1.0, 1e-12);
    // aa's distribution is disjoint from the others': JSD ln 2.
    EXPECT_NEAR(layer["jsd"][0][1].get<double>(), std::log(2.0), 1e-9);
  }
  // Disjoint letters: no shared token ids between languages.
  EXPECT_EQ(stats["vocab_overlap"][0][1], 0.0);
  EXPECT_EQ(stats["vocab_overlap"][1][1], 1.0);

  json sel = ReadJson(dir_ / "out" / "expert_selection.json");
  for (const std::string layer : {"0", "1"}) {
    const json& gaps = sel["_meta"]["gaps"][layer];
    const double gap0 = gaps["0"]["gap"].get<double>();
    EXPECT_EQ(gaps["0"]["language"], "aa");
    for (const auto& [expert, g] : gaps.items()) {
      if (expert != "0") EXPECT_LT(g["gap"].get<double>(), gap0) << gaps.dump();
    }
    EXPECT_EQ(sel["aa"]["seft"][layer][0], 0) << sel.dump();
    ASSERT_TRUE(sel["shared_experts"]["k2"][layer].is_array());
    EXPECT_EQ(sel["shared_experts"]["k2"][layer].size(), 2u);
    EXPECT_TRUE(sel["aa"]["ssft_k1"][layer].is_array());
  }
  bool entropy_metric = false;
  for (const auto& e : Events(r)) {
    entropy_metric |= e["event"] == "metric" && e["name"] == "routing/entropy";
  }
  EXPECT_TRUE(entropy_metric);

  // One layer by the layer-range convention; aa as the target of the other two (anchors).
  spec["out"] = (dir_ / "out_layer1").string();
  spec["routing"]["select"] = {{"layers", "1:"}, {"targets", {"aa"}}};
  r = Run(spec);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(Events(r).front()["select_layers"],
            "1");  // one layer, written as the convention writes it
  sel = ReadJson(dir_ / "out_layer1" / "expert_selection.json");
  EXPECT_EQ(sel["_meta"]["layers"], json::parse("[1]"));
  EXPECT_EQ(sel["_meta"]["high_resource"], json::parse(R"(["bb", "cc"])"));
  EXPECT_EQ(sel["aa"]["seft"]["1"][0], 0) << sel.dump();  // aa's expert, against bb and cc
  // The model's experts (tiny olmoe) set the defaults.
  const int64_t experts = sel["_meta"]["num_experts"];
  EXPECT_EQ(sel["_meta"]["shared_k"], json(DefaultSharedK(experts)));
  EXPECT_DOUBLE_EQ(sel["_meta"]["alpha"].get<double>(), DefaultAlpha(experts));
}

TEST_F(AnalyzeCommand, HelpListsEveryFieldAndExitsZero) {
  const std::string cmd =
      absl::StrCat(STEMMA_ENGINE_BIN, " analyze --help >", (dir_ / "help").string());
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  const std::string text = ReadAll(dir_ / "help");
  for (const char* field : {"usage: stemma-engine analyze", "languages[].dataset", "lape.profile",
                            "lape.exclusive", "routing.select.targets", "drift.mask", "threads"}) {
    EXPECT_NE(text.find(field), std::string::npos) << field;
  }
}

TEST_F(AnalyzeCommand, DriftMeasuresKnownChangesPerModuleAndTheAsymmetry) {
  model::CausalLM lm = TinyModel(model::Arch::kLlama);
  Save(lm, dir_ / "base");
  {
    torch::NoGradGuard no_grad;
    auto* layer = lm->model->layers[1]->as<model::DecoderLayerImpl>();
    layer->mlp->gate_proj->weight.mul_(1.01);  // relative change 0.01
    layer->mlp->up_proj->weight.mul_(1.03);    // 0.03
    layer->mlp->down_proj->weight.mul_(1.2);   // 0.2 -> asymmetry 0.2 / 0.02 = 10
  }
  Save(lm, dir_ / "trained");
  json spec = {
      {"out", (dir_ / "out").string()},
      {"drift", {{"base", (dir_ / "base").string()}, {"trained", (dir_ / "trained").string()}}}};
  RunResult r = Run(spec);
  ASSERT_EQ(r.rc, 0) << r.err;
  json drift = ReadJson(dir_ / "out" / "drift.json");
  ASSERT_EQ(drift["layers"].size(), 2u);
  const json& l0 = drift["layers"][0];
  const json& l1 = drift["layers"][1];
  EXPECT_EQ(l0["all"], 0.0);
  EXPECT_TRUE(l0["asymmetry"].is_null());  // nothing moved: no ratio
  EXPECT_NEAR(l1["modules"]["mlp.gate_proj"].get<double>(), 0.01, 1e-6);
  EXPECT_NEAR(l1["modules"]["mlp.up_proj"].get<double>(), 0.03, 1e-6);
  EXPECT_NEAR(l1["down"].get<double>(), 0.2, 1e-6);
  EXPECT_NEAR(l1["asymmetry"].get<double>(), 10.0, 1e-4);
  EXPECT_EQ(l1["attention"], 0.0);
  EXPECT_EQ(drift["other"]["model.embed_tokens"], 0.0);

  // A sparse change: only neurons 5 and 9 of layer 1 (rows of gate/up, columns of down),
  // each by 10%. Over the whole tensors that is diluted; over the mask it is 0.1 exactly.
  model::CausalLM sparse = TinyModel(model::Arch::kLlama);
  {
    torch::NoGradGuard no_grad;
    auto* mlp = sparse->model->layers[1]->as<model::DecoderLayerImpl>()->mlp.get();
    for (int64_t j : {5, 9}) {
      mlp->gate_proj->weight[j].mul_(1.1);
      mlp->up_proj->weight[j].mul_(1.1);
      mlp->down_proj->weight.select(1, j).mul_(1.1);
    }
  }
  Save(sparse, dir_ / "sparse");
  WriteText(dir_ / "mask.json",
            json{{"format", "stemma.neuron_mask/1"},
                 {"num_layers", 2},
                 {"intermediate_size", 128},
                 {"languages", {{"sw", {json::array(), {5, 9}}}, {"yo", {json::array(), {9}}}}}}
                .dump());
  spec = {{"out", (dir_ / "out_sparse").string()},
          {"drift",
           {{"base", (dir_ / "base").string()},
            {"trained", (dir_ / "sparse").string()},
            {"mask", (dir_ / "mask.json").string()},
            {"mask_languages", {"sw"}}}}};
  r = Run(spec);
  ASSERT_EQ(r.rc, 0) << r.err;
  json sd = ReadJson(dir_ / "out_sparse" / "drift.json");
  const json& masked = sd["layers"][1]["masked"];
  EXPECT_EQ(masked["neurons"], 2);
  for (const char* g : {"gate", "up", "down", "all"})
    EXPECT_NEAR(masked[g].get<double>(), 0.1, 1e-6) << g;
  EXPECT_NEAR(masked["asymmetry"].get<double>(), 1.0, 1e-5);
  EXPECT_LT(sd["layers"][1]["mlp"].get<double>(), 0.05);  // diluted by the 126 untouched neurons
  EXPECT_NEAR(sd["masked_total"].get<double>(), 0.1, 1e-6);
  EXPECT_FALSE(sd["layers"][0].contains("masked"));  // no masked neurons in layer 0

  // A checkpoint of another shape: the error names the tensor.
  json config = model::PresetConfigJson(model::Arch::kLlama, "tiny").value();
  config["intermediate_size"] = 96;
  model::CausalLM other = model::InitModel(model::ParseModelConfig(config).value(), 1).value();
  Save(other, dir_ / "other");
  spec["drift"]["trained"] = (dir_ / "other").string();
  spec["out"] = (dir_ / "out2").string();
  r = Run(spec);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("stemma-engine: error: drift: tensor lm_head.weight has shape [256, 64]"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "out2" / "drift.json"));
}

TEST_F(AnalyzeCommand, AlignmentOfIdenticalSentencesIsOne) {
  model::CausalLM lm = TinyModel(model::Arch::kLlama);
  Save(lm, dir_ / "model");
  std::string parallel;
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"the cat sleeps", "paka analala"},
      {"good morning", "habari za asubuhi"},
      {"water is cold", "maji ni baridi"}};
  for (const auto& [en, sw] : pairs) {
    parallel += json{{"en", en}, {"copy", en}, {"sw", sw}}.dump() + "\n";
  }
  WriteText(dir_ / "parallel.jsonl", parallel);
  json spec = {{"model", (dir_ / "model").string()},
               {"out", (dir_ / "out").string()},
               {"alignment", {{"file", (dir_ / "parallel.jsonl").string()}, {"batch_size", 2}}}};
  RunResult r = Run(spec);
  ASSERT_EQ(r.rc, 0) << r.err;
  json a = ReadJson(dir_ / "out" / "alignment.json");
  EXPECT_EQ(a["languages"], json::parse(R"(["copy", "en", "sw"])"));
  EXPECT_EQ(a["sentences"], 3);
  EXPECT_EQ(a["add_bos"], true);  // the byte tokenizer has a BOS
  ASSERT_EQ(a["pairs"].size(), 3u);
  for (const auto& pair : a["pairs"]) {
    ASSERT_EQ(pair["cosine"].size(), 2u);
    for (const auto& c : pair["cosine"]) {
      if (pair["languages"] == json::parse(R"(["copy", "en"])")) {
        EXPECT_NEAR(c.get<double>(), 1.0, 1e-5);  // same text, same activations
      } else {
        EXPECT_LT(c.get<double>(), 0.9999);
        EXPECT_GT(c.get<double>(), -1.0);
      }
    }
  }

  // The same sentences as line-aligned text files give the same numbers.
  std::string en_text, sw_text;
  for (const auto& [en, sw] : pairs) {
    en_text += en + "\n";
    sw_text += sw + "\n";
  }
  WriteText(dir_ / "en.txt", en_text);
  WriteText(dir_ / "sw.txt", sw_text);
  spec["out"] = (dir_ / "out_texts").string();
  spec["alignment"] = {{"texts", Texts({{"en", (dir_ / "en.txt").string()},
                                        {"copy", (dir_ / "en.txt").string()},
                                        {"sw", (dir_ / "sw.txt").string()}})},
                       {"batch_size", 3}};
  r = Run(spec);
  ASSERT_EQ(r.rc, 0) << r.err;
  json t = ReadJson(dir_ / "out_texts" / "alignment.json");
  ASSERT_EQ(t["pairs"].size(), a["pairs"].size());
  for (size_t p = 0; p < a["pairs"].size(); ++p) {
    EXPECT_EQ(t["pairs"][p]["languages"], a["pairs"][p]["languages"]);
    for (size_t l = 0; l < 2; ++l) {
      EXPECT_NEAR(t["pairs"][p]["cosine"][l].get<double>(),
                  a["pairs"][p]["cosine"][l].get<double>(), 1e-5);
    }
  }

  // Files of different lengths are refused, naming both.
  WriteText(dir_ / "sw.txt", sw_text + "moja zaidi\n");
  spec["out"] = (dir_ / "out_bad").string();
  r = Run(spec);
  EXPECT_EQ(r.rc, 4);  // bad input: kExitBadInput
  EXPECT_NE(r.err.find("has 4 lines but"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "out_bad"));
}

// The same counting done by transformers with forward hooks (tests/engine/analyze_hf.py) on a
// checkpoint that transformers wrote: the LAPE selection, τ, and every routing count agree.
TEST_F(AnalyzeCommand, MatchesTransformersOnTheSameWindows) {
  if (!HavePython()) GTEST_SKIP() << "no STEMMA_PYTHON";
  const std::string script = absl::StrCat(STEMMA_SOURCE_DIR, "/tests/engine/analyze_hf.py");
  auto python = [&](const std::string& args) {
    const std::string cmd = absl::StrCat(STEMMA_PYTHON, " ", script, " ", args, " >",
                                         (dir_ / "python.log").string(), " 2>&1");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << ReadAll(dir_ / "python.log");
  };
  WriteText(dir_ / "aa.txt", Letters('a', 'm', 3000, 1));
  WriteText(dir_ / "bb.txt", Letters('e', 'z', 3000, 2));  // overlapping alphabets
  const std::string sources =
      absl::StrCat("aa=", (dir_ / "aa.txt").string(), " bb=", (dir_ / "bb.txt").string());
  const json languages = Langs({{"aa", {{"text", (dir_ / "aa.txt").string()}}},
                                {"bb", {{"text", (dir_ / "bb.txt").string()}}}});

  // Creates dir_/llama and dir_/olmoe and counts with transformers, in one Python process.
  python(absl::StrCat("parity --seq-len 64 --batch 4 --out ", dir_.string(), " ", sources));
  RunResult r = Run({{"model", (dir_ / "llama").string()},
                     {"out", (dir_ / "out_lape").string()},
                     {"seq_len", 64},
                     {"batch_size", 4},
                     {"languages", languages},
                     {"lape", json::object()}});
  ASSERT_EQ(r.rc, 0) << r.err;
  json hf = ReadJson(dir_ / "hf_lape.json");
  json mask = ReadJson(dir_ / "out_lape" / "neuron_mask.json");
  EXPECT_EQ(mask["languages"], hf["languages"]);
  EXPECT_DOUBLE_EQ(mask["params"]["filter_threshold"].get<double>(), hf["tau"].get<double>());
  EXPECT_EQ(mask["params"]["tokens"], hf["tokens"]);

  r = Run({{"model", (dir_ / "olmoe").string()},
           {"out", (dir_ / "out_routing").string()},
           {"seq_len", 64},
           {"batch_size", 4},
           {"languages", languages},
           {"routing", json::object()}});
  ASSERT_EQ(r.rc, 0) << r.err;
  hf = ReadJson(dir_ / "hf_routing.json");
  json stats = ReadJson(dir_ / "out_routing" / "routing.json");
  ASSERT_EQ(stats["layers"].size(), 2u);
  for (const auto& layer : stats["layers"]) {
    const int64_t l = layer["layer"].get<int64_t>();
    for (const std::string lang : {"aa", "bb"}) {
      EXPECT_EQ(layer["counts"][lang], hf["counts"][lang][l]) << lang << " layer " << l;
    }
  }
  EXPECT_GT(stats["vocab_overlap"][0][1].get<double>(), 0.0);  // shared letters e..m
  EXPECT_LT(stats["vocab_overlap"][0][1].get<double>(), 1.0);
}

TEST_F(AnalyzeCommand, BadInputsFailWithAClearErrorAndNoOutput) {
  model::CausalLM dense = TinyModel(model::Arch::kLlama);
  Save(dense, dir_ / "dense");
  model::CausalLM moe = TinyModel(model::Arch::kOlmoe);
  Save(moe, dir_ / "moe");
  WriteText(dir_ / "aa.txt", Letters('a', 'm', 500, 1));
  WriteText(dir_ / "empty.txt", "\n\n");
  WriteText(dir_ / "bb.jsonl", "{\"text\": \"abc\"}\n{\"body\": \"no text field\"}\n");
  const std::string out = (dir_ / "out").string();
  auto languages = [&](const json& second) {
    return Langs(json{{"aa", {{"text", (dir_ / "aa.txt").string()}}}, {"bb", second}});
  };
  struct Case {
    const char* what;
    json spec;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"JSONL record without its field",
       {{"model", (dir_ / "dense").string()},
        {"out", out},
        {"languages", languages({{"jsonl", (dir_ / "bb.jsonl").string()}})},
        {"lape", json::object()}},
       absl::StrCat((dir_ / "bb.jsonl").string(), ":2: field 'text' missing")},
      {"an empty language",
       {{"model", (dir_ / "dense").string()},
        {"out", out},
        {"languages", languages({{"text", (dir_ / "empty.txt").string()}})},
        {"lape", json::object()}},
       "languages.bb: no tokens"},
      {"routing on a dense checkpoint",
       {{"model", (dir_ / "dense").string()},
        {"out", out},
        {"languages", languages({{"text", (dir_ / "aa.txt").string()}})},
        {"routing", json::object()}},
       "routing: " + (dir_ / "dense").string() + " (model_type llama) has no MoE layers"},
      {"LAPE on an MoE checkpoint",
       {{"model", (dir_ / "moe").string()},
        {"out", out},
        {"languages", languages({{"text", (dir_ / "aa.txt").string()}})},
        {"lape", json::object()}},
       "has MoE layers; LAPE profiles the neurons of dense FFN layers"},
      {"a language source without a file",
       {{"model", (dir_ / "dense").string()},
        {"out", out},
        {"languages", languages({{"field", "text"}})},
        {"lape", json::object()}},
       "languages[1]: give exactly one of dataset, text or jsonl for 'bb'"},
      {"an unknown field",
       {{"model", (dir_ / "dense").string()},
        {"out", out},
        {"languages", languages({{"text", (dir_ / "aa.txt").string()}})},
        {"lape", {{"top_rat", 0.1}}}},
       "lape.top_rat: unknown field"},
      {"a missing model",
       {{"model", (dir_ / "nope").string()},
        {"out", out},
        {"languages", languages({{"text", (dir_ / "aa.txt").string()}})},
        {"lape", json::object()}},
       (dir_ / "nope").string()},
      {"a language file that is not there",
       {{"model", (dir_ / "dense").string()},
        {"out", out},
        {"languages", languages({{"text", (dir_ / "missing.txt").string()}})},
        {"lape", json::object()}},
       "languages.bb.text: " + (dir_ / "missing.txt").string() + ": no such file"},
      {"a selection layer range past the model",
       {{"model", (dir_ / "moe").string()},
        {"out", out},
        {"languages", languages({{"text", (dir_ / "aa.txt").string()}})},
        {"routing", {{"select", {{"layers", "1:5"}}}}}},
       "routing.select.layers"},
      {"a parallel line without a language",
       {{"model", (dir_ / "dense").string()},
        {"out", out},
        {"alignment", {{"file", (dir_ / "bb.jsonl").string()}, {"languages", {"text", "x"}}}}},
       absl::StrCat((dir_ / "bb.jsonl").string(), ":1: field 'x' missing")},
  };
  for (const Case& c : cases) {
    RunResult r = Run(c.spec);
    EXPECT_EQ(r.rc, 4) << c.what << " (kExitBadInput: the worker does not retry it)";
    EXPECT_NE(r.err.find("stemma-engine: error: "), std::string::npos) << c.what << ": " << r.err;
    EXPECT_NE(r.err.find(c.error), std::string::npos) << c.what << ": " << r.err;
    for (const auto& e : Events(r)) EXPECT_NE(e["event"], "done") << c.what;
    EXPECT_FALSE(fs::exists(out)) << c.what << ": output written";
  }
}

}  // namespace
}  // namespace stemma::engine::eval
