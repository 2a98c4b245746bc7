// The torch-free statistics of `stemma-engine analyze` on hand-made counts (entropy and
// Jensen–Shannon divergence, LAPE's selection, the activation-gap expert selection), and
// the same steps against tests/engine/analyze_golden.py, written from the reference code.
// The command itself on tiny rigged models is analyze_test.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/engine_spec.h"
#include "engine/analyze/lape.h"
#include "engine/analyze/routing.h"
#include "nlohmann/json.hpp"

namespace stemma::engine::analyze {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The lape section with the schema's defaults (the paper's).
v1::LapeOptions DefaultLape() {
  v1::LapeOptions lape;
  FillSpecDefaults(&lape);
  return lape;
}
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
  v1::LapeOptions params = DefaultLape();
  params.set_top_rate(0.02);  // round(100 · 0.02) = 2 neurons
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
  v1::LapeOptions params = DefaultLape();
  params.set_top_rate(0.03);  // 3 neurons: (1, 7), (0, 3), (0, 9)
  auto shared = IdentifyLapeNeurons({"sw", "yo"}, counts, layers, inter, params);
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ(shared->neurons["sw"], (std::vector<std::vector<int64_t>>{{9}, {7}}));
  EXPECT_EQ(shared->neurons["yo"], (std::vector<std::vector<int64_t>>{{3, 9}, {}}));
  params.set_exclusive(true);
  auto exclusive = IdentifyLapeNeurons({"sw", "yo"}, counts, layers, inter, params);
  ASSERT_TRUE(exclusive.ok());
  EXPECT_EQ(exclusive->neurons["sw"], (std::vector<std::vector<int64_t>>{{}, {7}}));
  EXPECT_EQ(exclusive->neurons["yo"], (std::vector<std::vector<int64_t>>{{3}, {}}));
  EXPECT_EQ(exclusive->num_shared, 1);

  json mask = NeuronMaskJson(*shared, DefaultLape(), counts, /*keep_profile=*/true);
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
  params.set_exclusive(false);
  auto again = IdentifyLapeNeurons(saved->languages, saved->counts, saved->num_layers,
                                   saved->intermediate_size, params);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->neurons, shared->neurons);
  json no_profile = NeuronMaskJson(*shared, DefaultLape(), counts, /*keep_profile=*/false);
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
  auto result = IdentifyLapeNeurons({"sw", "yo"}, counts, 2, 2, DefaultLape());
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("'yo' has no tokens"), std::string::npos);
  counts[1].tokens = 10;
  v1::LapeOptions bad = DefaultLape();
  bad.set_top_rate(1.5);
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
  v1::LapeOptions params = DefaultLape();
  params.set_top_rate(0.05);
  params.set_filter_rate(0.95);
  params.set_activation_bar_ratio(0.9);  // apart from the filter, so both percentiles are checked
  const std::vector<std::string> names = {"hi", "mr", "ur"};
  auto result = IdentifyLapeNeurons(names, counts, layers, inter, params);
  ASSERT_TRUE(result.ok()) << result.status();

  json input = {{"languages", names},
                {"tokens", tokens},
                {"top_rate", params.top_rate()},
                {"filter_rate", params.filter_rate()},
                {"activation_bar_ratio", params.activation_bar_ratio()}};
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

}  // namespace
}  // namespace stemma::engine::analyze
