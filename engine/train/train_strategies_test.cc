// End-to-end tests of the training strategies of `stemma-engine train` (docs/train.md,
// "Strategies"): which tensors a freeze, L2-SP, a LAPE neuron mask, an SSFT expert subset or
// DeltaMoE's frozen experts let train, checked on the tensors the run wrote.
#include <string>

#include "engine/train/train_test_fixture.h"

namespace stemma::engine::train {
namespace {

TEST_F(TrainTest, FrozenLayersEmbeddingsStayBitIdentical) {
  json spec = BaseSpec("llama", "frozen");
  spec["optimizer"]["weight_decay"] = 0.1;  // decay must not touch frozen tensors either
  spec["strategy"] = {{"freeze", {{"layers", {"0:1"}}, {"embeddings", true}}}};
  Result r = Run(spec, "frozen");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  Tensors base = ReadTensors(root_ / "llama"), trained = ReadTensors(root_ / "frozen");
  int64_t expect_trainable = 0, total = 0;
  for (const auto& [name, t] : base) {
    total += t.numel();
    const bool frozen =
        absl::StartsWith(name, "model.layers.0.") || name == "model.embed_tokens.weight";
    if (frozen) {
      EXPECT_TRUE(Same(t, trained[name])) << name << " changed although frozen";
    } else {
      EXPECT_FALSE(Same(t, trained[name])) << name << " did not train";
      expect_trainable += t.numel();
    }
  }
  const json& done = r.events.back();
  EXPECT_EQ(done["trainable_params"], expect_trainable);
  EXPECT_EQ(done["total_params"], total);
  EXPECT_DOUBLE_EQ(done["trainable_fraction"].get<double>(),
                   static_cast<double>(expect_trainable) / total);
}

double DistanceToBase(const Tensors& base, const Tensors& trained, const std::string& prefix) {
  double sum = 0;
  for (const auto& [name, t] : base) {
    if (absl::StartsWith(name, prefix)) sum += (trained.at(name) - t).pow(2).sum().item<double>();
  }
  return std::sqrt(sum);
}

TEST_F(TrainTest, L2spWithLargeLambdaKeepsLayersNearBase) {
  json plain = BaseSpec("llama", "l2sp_off");
  plain["steps"] = 8;
  Result off = Run(plain, "l2sp_off");
  ASSERT_EQ(off.exit_code, 0) << off.stderr_text;
  json spec = plain;
  spec["out"] = (root_ / "l2sp_on").string();
  // λ large on layer 1 only, tiny elsewhere: layer 1 stays near the base, layer 0 moves.
  spec["strategy"] = {{"l2sp", {{{"layers", {"1:2"}}, {"lambda", 1000.0}}, {{"lambda", 1e-6}}}}};
  Result on = Run(spec, "l2sp_on");
  ASSERT_EQ(on.exit_code, 0) << on.stderr_text;
  for (const json& e : on.Of("step")) EXPECT_TRUE(e.contains("l2sp"));
  EXPECT_GT(on.Of("step").back()["l2sp"].get<double>(), 0.0);
  Tensors base = ReadTensors(root_ / "llama");
  const double d_off = DistanceToBase(base, ReadTensors(root_ / "l2sp_off"), "model.layers.1.");
  const double d_on = DistanceToBase(base, ReadTensors(root_ / "l2sp_on"), "model.layers.1.");
  const double d0_on = DistanceToBase(base, ReadTensors(root_ / "l2sp_on"), "model.layers.0.");
  EXPECT_GT(d_off, 0.0);
  EXPECT_LT(d_on, 0.2 * d_off) << "off " << d_off << " on " << d_on;
  EXPECT_GT(d0_on, 3 * d_on);
}

TEST_F(TrainTest, NeuronMaskChangesOnlyMaskedRowsAndColumns) {
  const std::map<int, std::vector<int64_t>> sw = {{0, {1, 5, 7}}, {1, {0, 2}}};
  json mask = {{"format", "stemma.neuron_mask/1"},
               {"num_layers", 2},
               {"intermediate_size", 128},
               {"languages", {{"sw", {sw.at(0), sw.at(1)}}, {"yo", {{9}, json::array()}}}},
               {"params", json::object()},
               {"counts", {{"sw", {3, 2}}, {"yo", {1, 0}}}}};
  std::ofstream(root_ / "mask.json") << mask.dump();
  json spec = BaseSpec("llama", "masked");
  spec["optimizer"]["weight_decay"] = 0.1;  // decay and moments must be masked too
  spec["strategy"] = {
      {"neuron_mask", {{"file", (root_ / "mask.json").string()}, {"languages", {"sw"}}}}};
  Result r = Run(spec, "masked");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  Tensors base = ReadTensors(root_ / "llama"), trained = ReadTensors(root_ / "masked");
  int64_t changed_elements = 0;
  for (const auto& [name, t] : base) {
    auto diff = (trained[name] != t);  // bool, elementwise
    changed_elements += diff.sum().item<int64_t>();
    const int layer = absl::StartsWith(name, "model.layers.0.")   ? 0
                      : absl::StartsWith(name, "model.layers.1.") ? 1
                                                                  : -1;
    const bool rows = absl::StrContains(name, "gate_proj") || absl::StrContains(name, "up_proj");
    const bool cols = absl::StrContains(name, "down_proj");
    if (layer < 0 || (!rows && !cols)) {
      EXPECT_TRUE(Same(t, trained[name])) << name;
      continue;
    }
    const auto& listed = sw.at(layer);
    const int64_t n = rows ? t.size(0) : t.size(1);
    for (int64_t j = 0; j < n; ++j) {
      auto slice = rows ? diff.select(0, j) : diff.select(1, j);
      const bool in_mask = std::count(listed.begin(), listed.end(), j) > 0;
      if (in_mask) {
        EXPECT_GT(slice.sum().item<int64_t>(), slice.numel() / 2) << name << " neuron " << j;
      } else {
        EXPECT_EQ(slice.sum().item<int64_t>(), 0) << name << " neuron " << j << " changed";
      }
    }
  }
  // Σ_l |S_l| · 3 · H trainable parameters, reported.
  const int64_t expected = (3 + 2) * 3 * 64;
  EXPECT_EQ(r.events.front()["trainable_params"], expected);
  EXPECT_EQ(r.events.back()["trainable_params"], expected);
  EXPECT_LE(changed_elements, expected);
  EXPECT_GT(changed_elements, expected * 9 / 10);
  EXPECT_NEAR(r.events.back()["trainable_fraction"].get<double>(),
              static_cast<double>(expected) / r.events.back()["total_params"].get<double>(), 1e-12);
}

TEST_F(TrainTest, ExpertSubsetTrainsOnlyListedExpertsAndRestrictsTheRouter) {
  json selection = {{"_meta", json::object()},
                    {"shared_experts", {{"k1", {{"1", {3}}}}}},
                    {"ca", {{"seft", {{"1", {2}}}}, {"ssft_k1", {{"1", {2, 3, 3}}}}}}};
  std::ofstream(root_ / "experts.json") << selection.dump();
  json spec = BaseSpec("olmoe", "ssft");
  spec["strategy"] = {
      {"expert_subset",
       {{"file", (root_ / "experts.json").string()}, {"language", "ca"}, {"set", "ssft_k1"}}}};
  Result r = Run(spec, "ssft");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  Tensors base = ReadTensors(root_ / "olmoe"), trained = ReadTensors(root_ / "ssft");
  int64_t expected = 0;
  for (const auto& [name, t] : base) {
    const bool listed = absl::StartsWith(name, "model.layers.1.mlp.experts.2.") ||
                        absl::StartsWith(name, "model.layers.1.mlp.experts.3.");
    if (listed) {
      EXPECT_FALSE(Same(t, trained[name])) << name;
      expected += t.numel();
    } else if (name == "model.layers.1.mlp.gate.weight") {
      expected += t.numel();
      // The router trains, but only the rows of the experts it may pick get a gradient:
      // the others see -inf logits, probability 0, so Adam moves them by exactly 0.
      EXPECT_FALSE(Same(t.narrow(0, 2, 2), trained[name].narrow(0, 2, 2)));
      EXPECT_TRUE(Same(t.narrow(0, 0, 2), trained[name].narrow(0, 0, 2)))
          << "router rows of non-target experts changed: routing was not restricted";
    } else {
      EXPECT_TRUE(Same(t, trained[name])) << name;
    }
  }
  EXPECT_EQ(r.events.back()["trainable_params"], expected);
  EXPECT_FALSE(trained.count("model.layers.1.mlp.gate.bias"))
      << "the routing mask leaked into the output";
}

TEST_F(TrainTest, FrozenExpertStaysBitIdenticalWithLoadBalancingLoss) {
  json spec = BaseSpec("olmoe", "deltamoe");
  spec["optimizer"]["weight_decay"] = 0.1;
  spec["strategy"] = {{"frozen_experts", {0}}, {"aux_loss", {{"load_balancing", 0.01}}}};
  Result r = Run(spec, "deltamoe");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  for (const json& e : r.Of("step")) {
    ASSERT_TRUE(e.contains("load_balancing"));
    EXPECT_GT(e["load_balancing"].get<double>(), 0.5);  // 1.0 at uniform routing
  }
  Tensors base = ReadTensors(root_ / "olmoe"), trained = ReadTensors(root_ / "deltamoe");
  int frozen = 0;
  for (const auto& [name, t] : base) {
    if (absl::StrContains(name, ".mlp.experts.0.")) {
      EXPECT_TRUE(Same(t, trained[name])) << name;
      ++frozen;
    } else if (absl::StrContains(name, ".mlp.experts.") || absl::StrContains(name, "mlp.gate.")) {
      EXPECT_FALSE(Same(t, trained[name])) << name;
    }
  }
  EXPECT_EQ(frozen, 2 * 3);  // two layers, three projections
}

// FFN-only (the LAPE study's baseline): attention, norms, embeddings and head frozen, every
// MLP tensor trains.
TEST_F(TrainTest, FfnOnlyTrainsEveryMlpTensorAndNothingElse) {
  json spec = BaseSpec("llama", "ffn_only");
  spec["strategy"] = {
      {"freeze", {{"attention", true}, {"norms", true}, {"embeddings", true}, {"head", true}}}};
  Result r = Run(spec, "ffn_only");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  Tensors base = ReadTensors(root_ / "llama"), trained = ReadTensors(root_ / "ffn_only");
  int64_t mlp = 0;
  for (const auto& [name, t] : base) {
    if (absl::StrContains(name, ".mlp.")) {
      EXPECT_FALSE(Same(t, trained[name])) << name << " should train";
      mlp += t.numel();
    } else {
      EXPECT_TRUE(Same(t, trained[name])) << name << " should keep the base's bits";
    }
  }
  EXPECT_EQ(r.events.back()["trainable_params"], mlp);
}

// DeltaMoE's new-language phase as the seed specifies it: expert 0 AND every shared tensor
// (attention, norms, embeddings, head) keep the base's bits; only the other experts and the
// routers move.
TEST_F(TrainTest, FreezeSharedTrainsOnlyNewExpertsAndRouters) {
  json spec = BaseSpec("olmoe", "deltamoe_shared");
  spec["strategy"] = {{"frozen_experts", {0}},
                      {"freeze", {{"shared", true}}},
                      {"aux_loss", {{"load_balancing", 0.01}}}};
  Result r = Run(spec, "deltamoe_shared");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  Tensors base = ReadTensors(root_ / "olmoe"), trained = ReadTensors(root_ / "deltamoe_shared");
  int64_t moved = 0, kept = 0;
  for (const auto& [name, t] : base) {
    const bool new_expert =
        absl::StrContains(name, ".mlp.experts.") && !absl::StrContains(name, ".mlp.experts.0.");
    const bool router = absl::StrContains(name, "mlp.gate.");
    if (new_expert || router) {
      EXPECT_FALSE(Same(t, trained[name])) << name << " should train";
      moved += t.numel();
    } else {
      EXPECT_TRUE(Same(t, trained[name])) << name << " should keep the base's bits";
      ++kept;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_EQ(r.events.back()["trainable_params"], moved);

  json dense = BaseSpec("llama", "dense_shared");
  dense["strategy"] = {{"freeze", {{"shared", true}}}};
  Result refused = Run(dense, "dense_shared");
  EXPECT_EQ(refused.exit_code, 4) << refused.stderr_text;
  EXPECT_TRUE(absl::StrContains(refused.stderr_text, "freeze.shared: needs an MoE model"))
      << refused.stderr_text;
}

}  // namespace
}  // namespace stemma::engine::train
