// Spec parsing and the per-tensor training plan of every strategy, without a model.
#include "engine/train/plan.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/engine_spec.h"
#include "engine/train/spec.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace stemma::engine::train {
namespace {

using json = nlohmann::json;

// The one convention of common/layer_range.h, as the planner sees it.
TEST(LayerRangeTest, HalfOpenLikePythonSlicesAndMiddle) {
  auto r = ParseLayerRange("9:28", "x");
  ASSERT_TRUE(r.ok());
  auto resolved = ResolveLayerRange(*r, 34, "x");
  ASSERT_TRUE(resolved.ok());
  EXPECT_EQ(resolved->begin, 9);
  EXPECT_EQ(resolved->end, 28);  // layers 9..27: the 19 middle layers of Gemma-3-4B
  EXPECT_EQ(ResolveLayerRange(*ParseLayerRange("28:", "x"), 34, "x")->end, 34);
  EXPECT_EQ(ResolveLayerRange(*ParseLayerRange(":9", "x"), 34, "x")->begin, 0);
  EXPECT_EQ(ResolveLayerRange(*ParseLayerRange("7", "x"), 34, "x")->end, 8);
  EXPECT_EQ(FormatLayerRange(*ResolveLayerRange(*ParseLayerRange("middle", "x"), 34, "x")), "9:28");
  EXPECT_EQ(FormatLayerRange(*ResolveLayerRange(*ParseLayerRange("middle", "x"), 8, "x")), "2:7");
  for (const char* bad : {"", "a:b", "5:5", "6:2", "-1:3", "1:2:3", "x"}) {
    auto p = ParseLayerRange(bad, "spec.yaml: strategy.freeze.layers[0]");
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_TRUE(absl::StrContains(p.status().message(), "strategy.freeze.layers[0]"));
  }
  auto outside = ResolveLayerRange(*ParseLayerRange("30:40", "x"), 34, "where");
  ASSERT_FALSE(outside.ok());
  EXPECT_TRUE(absl::StrContains(outside.status().message(), "'30:40'"));
}

TEST(ScheduleTest, WarmupThenCosineToTheFloor) {
  v1::TrainOptimizer o;
  v1::TrainSchedule s;  // the schema's: cosine
  FillSpecDefaults(&o);
  FillSpecDefaults(&s);
  o.set_lr(1.0);
  s.set_warmup_steps(4);
  s.set_min_lr_ratio(0.1);
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 1, 14), 0.25);
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 4, 14), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 5, 14), 1.0);     // decay starts at the peak
  EXPECT_NEAR(LearningRate(o, s, 14, 14), 0.1, 1e-12);  // and ends at the floor
  const double mid = LearningRate(o, s, 9, 14);         // halfway through 5..14 (progress 4/9)
  EXPECT_GT(mid, 0.55);
  EXPECT_LT(mid, 0.7);
  s.set_type("constant");
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 14, 14), 1.0);
}

std::vector<ParamInfo> DenseParams(int layers, int64_t hidden, int64_t inter) {
  std::vector<ParamInfo> p = {{"model.embed_tokens.weight", {100, hidden}}};
  for (int l = 0; l < layers; ++l) {
    const std::string pre = absl::StrCat("model.layers.", l, ".");
    p.push_back({pre + "self_attn.q_proj.weight", {hidden, hidden}});
    p.push_back({pre + "input_layernorm.weight", {hidden}});
    p.push_back({pre + "mlp.gate_proj.weight", {inter, hidden}});
    p.push_back({pre + "mlp.up_proj.weight", {inter, hidden}});
    p.push_back({pre + "mlp.down_proj.weight", {hidden, inter}});
  }
  p.push_back({"model.norm.weight", {hidden}});
  p.push_back({"lm_head.weight", {100, hidden}});
  return p;
}

const ParamPlan& Find(const TrainPlan& plan, const std::string& name) {
  for (const auto& p : plan.params) {
    if (p.name == name) return p;
  }
  ADD_FAILURE() << "no " << name;
  return plan.params.front();
}

v1::TrainStrategy Strategy(const json& j) {
  json doc = {{"model", "/m"},
              {"out", "/o"},
              {"steps", 1},
              {"data", {{"datasets", {{{"path", "/d"}}}}, {"seq_len", 4}}},
              {"strategy", j}};
  auto spec = ParseTrainSpecText(doc.dump(), "spec.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? spec->strategy() : v1::TrainStrategy{};
}

TEST(PlanTest, FreezeRangesAndL2spLambdas) {
  ModelShape shape{4, 8, 0, false};
  auto plan =
      BuildPlan(Strategy({{"freeze", {{"layers", {"1:3"}}, {"head", true}}},
                          {"l2sp", {{{"layers", {"3"}}, {"lambda", 0.05}}, {{"lambda", 0.001}}}}}),
                shape, DenseParams(4, 4, 8));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(Find(*plan, "model.layers.0.mlp.up_proj.weight").trainable);
  EXPECT_FALSE(Find(*plan, "model.layers.1.mlp.up_proj.weight").trainable);
  EXPECT_FALSE(Find(*plan, "model.layers.2.input_layernorm.weight").trainable);
  EXPECT_FALSE(Find(*plan, "lm_head.weight").trainable);
  EXPECT_EQ(Find(*plan, "model.layers.3.self_attn.q_proj.weight").l2sp_lambda, 0.05);
  EXPECT_EQ(Find(*plan, "model.layers.0.self_attn.q_proj.weight").l2sp_lambda, 0.001);
  EXPECT_EQ(Find(*plan, "model.embed_tokens.weight").l2sp_lambda, 0.001);
  EXPECT_FALSE(
      Find(*plan, "model.layers.0.self_attn.q_proj.weight").weight_decay);  // L2-SP instead
  const int64_t per_layer = 16 + 4 + 3 * 32;
  EXPECT_EQ(plan->trainable_params, 400 + 2 * per_layer + 4);
  EXPECT_EQ(plan->total_params, 800 + 4 * per_layer + 4);
}

TEST(PlanTest, WeightDecayOnMatricesOnly) {
  auto plan = BuildPlan(v1::TrainStrategy{}, ModelShape{1, 8, 0, false}, DenseParams(1, 4, 8));
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(Find(*plan, "model.layers.0.mlp.up_proj.weight").weight_decay);
  EXPECT_FALSE(Find(*plan, "model.layers.0.input_layernorm.weight").weight_decay);
}

TEST(PlanTest, NeuronMaskSelectsRowsAndColumnsOfUnionOfLanguages) {
  const std::string path = testing::TempDir() + "/mask.json";
  std::ofstream(path) << json{{"format", "stemma.neuron_mask/1"},
                              {"num_layers", 2},
                              {"intermediate_size", 8},
                              {"languages",
                               {{"sw", {{1, 3}, json::array()}}, {"yo", {{3, 5}, {0}}}}}}
                             .dump();
  v1::TrainStrategy s = Strategy({{"neuron_mask", {{"file", path}}}});
  auto plan = BuildPlan(s, ModelShape{2, 8, 0, false}, DenseParams(2, 4, 8));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const auto& gate = Find(*plan, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(gate.mask, ParamPlan::Mask::kRows);
  EXPECT_EQ(gate.indices, (std::vector<int64_t>{1, 3, 5}));
  EXPECT_EQ(Find(*plan, "model.layers.1.mlp.down_proj.weight").mask, ParamPlan::Mask::kColumns);
  EXPECT_FALSE(Find(*plan, "model.layers.0.self_attn.q_proj.weight").trainable);
  EXPECT_FALSE(Find(*plan, "model.embed_tokens.weight").trainable);
  EXPECT_EQ(plan->trainable_params, (3 + 1) * 3 * 4);
  // One language only, and errors naming the file's field.
  s.mutable_neuron_mask()->clear_languages();
  s.mutable_neuron_mask()->add_languages("sw");
  EXPECT_EQ(BuildPlan(s, ModelShape{2, 8, 0, false}, DenseParams(2, 4, 8))->trainable_params,
            2 * 3 * 4);
  auto wrong = BuildPlan(s, ModelShape{3, 8, 0, false}, DenseParams(3, 4, 8));
  ASSERT_FALSE(wrong.ok());
  EXPECT_TRUE(absl::StrContains(wrong.status().message(), "num_layers")) << wrong.status();
}

TEST(PlanTest, SpecErrorsNameTheField) {
  json doc = {{"model", "/m"},
              {"out", "/o"},
              {"steps", 1},
              {"data", {{"datasets", {{{"path", "/d"}}}}, {"seq_len", 4}}}};
  struct Case {
    json patch;
    std::string message;
  } cases[] = {
      {{{"optimizer", {{"lr", -1}}}}, "spec.yaml: line 1: optimizer.lr: -1 must be > 0"},
      {{{"strategy", {{"freze", 1}}}}, "strategy.freze: unknown field"},
      {{{"batch_size", 0}}, "spec.yaml: line 1: batch_size: 0 must be >= 1"},
      {{{"strategy", {{"l2sp", {{{"layers", {"0:2"}}}}}}}}, "strategy.l2sp[0].lambda: is required"},
      {{{"strategy", {{"freeze", {{"layers", {"middle", "1:"}}}}}}}, ""},  // accepted
      {{{"schedule", {{"type", "step"}}}},
       "schedule.type: 'step' is not one of cosine, linear, constant"},
      {{{"data", {{"seq_len", 0}}}}, "data.seq_len: 0 must be >= 1"},
  };
  for (const Case& c : cases) {
    json d = doc;
    d.merge_patch(c.patch);
    auto spec = ParseTrainSpecText(d.dump(), "spec.yaml");
    if (c.message.empty()) {
      EXPECT_TRUE(spec.ok()) << c.patch << " " << spec.status();
      continue;
    }
    ASSERT_FALSE(spec.ok()) << c.patch;
    EXPECT_TRUE(absl::StrContains(spec.status().message(), c.message)) << spec.status();
  }
}

}  // namespace
}  // namespace stemma::engine::train
