// The grouped MoE path (tokens sorted by expert, one grouped product per projection) against
// the per-expert loop it replaced, which stays in modules.cc as the reference (STEMMA_MOE=loop
// selects it; read on every forward): outputs,
// router logits, the load-balancing loss and every gradient, with frozen experts (DeltaMoE)
// and with a router restricted to a subset of experts (SSFT).
//
// The device is STEMMA_TEST_DEVICE (default cpu), so tests/gpu/run runs the same cases on
// CUDA.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/torch.h>

#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "engine/model/causal_lm.h"
#include "engine/model/checkpoint.h"
#include "engine/model/config.h"
#include "engine/model/modules.h"

namespace stemma::engine::model {
namespace {

torch::Device TestDevice() {
  const char* env = std::getenv("STEMMA_TEST_DEVICE");
  return torch::Device(env != nullptr && *env != '\0' ? env : "cpu");
}

// Max |a - b| / (max |b| + tiny) over the elements; -inf (a router bias) in both counts as 0.
double RelErr(const torch::Tensor& a, const torch::Tensor& b) {
  auto fa = a.to(torch::kCPU, torch::kFloat64), fb = b.to(torch::kCPU, torch::kFloat64);
  auto both_inf = fa.isinf().logical_and(fb.isinf()).logical_and(fa == fb);
  fa = fa.masked_fill(both_inf, 0.0), fb = fb.masked_fill(both_inf, 0.0);
  return (fa - fb).abs().max().item<double>() / (fb.abs().max().item<double>() + 1e-30);
}

ModelConfig TinyOlmoe() {
  auto json = PresetConfigJson(Arch::kOlmoe, "tiny");
  EXPECT_TRUE(json.ok()) << json.status();
  auto config = ParseModelConfig(*json);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

void SetGrouped(bool grouped) { setenv("STEMMA_MOE", grouped ? "grouped" : "loop", 1); }

struct Pass {
  torch::Tensor logits, router_logits, balance_loss;
  std::map<std::string, torch::Tensor> grads;  // undefined for frozen parameters
};

// One forward and backward of loss = sum(logits * probe) + load-balancing loss.
Pass RunModel(CausalLM& lm, bool grouped, const torch::Tensor& ids, const torch::Tensor& probe) {
  SetGrouped(grouped);
  lm->zero_grad();
  auto out = lm->forward(ids);
  ((out.logits * probe).sum() + out.load_balancing_loss).backward();
  Pass pass{out.logits.detach(),
            torch::stack(out.router_logits).detach(),
            out.load_balancing_loss.detach(),
            {}};
  for (const auto& item : lm->named_parameters()) {
    pass.grads[item.key()] =
        item.value().grad().defined() ? item.value().grad().clone() : torch::Tensor();
  }
  return pass;
}

void ExpectSame(const Pass& grouped, const Pass& loop, double tolerance) {
  EXPECT_LT(RelErr(grouped.logits, loop.logits), tolerance) << "logits";
  EXPECT_LT(RelErr(grouped.router_logits, loop.router_logits), tolerance) << "router logits";
  EXPECT_NEAR(grouped.balance_loss.item<double>(), loop.balance_loss.item<double>(), tolerance);
  ASSERT_EQ(grouped.grads.size(), loop.grads.size());
  for (const auto& [name, grad] : loop.grads) {
    const auto& other = grouped.grads.at(name);
    // An expert no token chose has no gradient in the loop (it never ran) and a zero one in
    // the grouped product: the same to the optimizer (FlatAdamW reads none as zero).
    if (grad.defined() != other.defined()) {
      const auto& zero = grad.defined() ? grad : other;
      EXPECT_EQ(zero.abs().sum().item<double>(), 0.0) << name;
      continue;
    }
    if (grad.defined()) EXPECT_LT(RelErr(other, grad), 10 * tolerance) << name;
  }
}

TEST(GroupedMoeTest, EqualsLoopOutputsAndGradients) {
  torch::manual_seed(3);
  auto lm = *InitModel(TinyOlmoe(), 5);
  lm->to(TestDevice());
  auto ids = torch::randint(0, lm->config().vocab_size, {2, 24}, torch::kInt64).to(TestDevice());
  auto probe = torch::randn({2, 24, lm->config().vocab_size}).to(TestDevice());
  auto loop = RunModel(lm, false, ids, probe);
  auto grouped = RunModel(lm, true, ids, probe);
  ExpectSame(grouped, loop, 1e-5);
  // Every expert is used somewhere, so every expert weight has a nonzero gradient.
  EXPECT_GT(
      grouped.grads.at("model.layers.0.mlp.experts.3.down_proj.weight").abs().sum().item<double>(),
      0);
}

TEST(GroupedMoeTest, FrozenExpertsAndRestrictedRouter) {
  torch::manual_seed(4);
  auto lm = *InitModel(TinyOlmoe(), 6);
  lm->to(TestDevice());
  const int64_t experts = lm->config().num_experts;
  for (const auto& item : lm->named_parameters()) {  // DeltaMoE: expert 0 and shared frozen
    if (item.key().find("experts.0.") != std::string::npos ||
        item.key().find("self_attn") != std::string::npos) {
      item.value().requires_grad_(false);
    }
  }
  // SSFT: layer 1's router may pick experts 1 and 2 only (the trainer's -inf router bias).
  auto* last = lm->model->layers[1]->as<DecoderLayerImpl>();
  auto bias = torch::full({experts}, -std::numeric_limits<float>::infinity());
  bias.index_put_({torch::indexing::Slice(1, 3)}, 0.0);
  last->moe->gate->bias = bias.to(TestDevice());
  auto ids = torch::randint(0, lm->config().vocab_size, {3, 10}, torch::kInt64).to(TestDevice());
  auto probe = torch::randn({3, 10, lm->config().vocab_size}).to(TestDevice());
  auto loop = RunModel(lm, false, ids, probe);
  auto grouped = RunModel(lm, true, ids, probe);
  ExpectSame(grouped, loop, 1e-5);
  EXPECT_FALSE(grouped.grads.at("model.layers.0.mlp.experts.0.gate_proj.weight").defined());
  EXPECT_FALSE(grouped.grads.at("model.layers.1.self_attn.q_proj.weight").defined());
  // Layer 1's experts outside the subset get no tokens: no gradient (zero) in either path.
  const auto& unused = grouped.grads.at("model.layers.1.mlp.experts.3.up_proj.weight");
  EXPECT_TRUE(!unused.defined() || unused.abs().sum().item<double>() == 0.0);
}

// A block whose widths miss _grouped_mm's 16-byte alignment takes the per-segment products;
// bf16 takes the grouped kernel in bf16. Both against the loop on the same block.
class MoeBlockTest : public testing::TestWithParam<std::tuple<int64_t, torch::ScalarType>> {};

TEST_P(MoeBlockTest, GroupedEqualsLoop) {
  const auto [hidden, dtype] = GetParam();
  auto config = TinyOlmoe();
  config.hidden_size = hidden;
  config.intermediate_size = hidden + 4;
  torch::manual_seed(5);
  SparseMoe block(config);
  block->to(TestDevice(), dtype);
  auto x = torch::randn({2, 9, hidden}).to(TestDevice(), dtype);
  auto probe = torch::randn({2, 9, hidden}).to(TestDevice(), dtype);
  std::vector<torch::Tensor> outs, grads;
  for (bool grouped : {false, true}) {
    SetGrouped(grouped);
    block->zero_grad();
    auto input = x.clone().requires_grad_(true);
    auto [out, logits] = block(input);
    (out * probe).sum().backward();
    outs.push_back(out.detach());
    grads.push_back(input.grad());
    grads.push_back(block->experts[1]->as<MlpImpl>()->down_proj->weight.grad().clone());
  }
  const double tolerance = dtype == torch::kBFloat16 ? 2e-2 : 1e-5;
  EXPECT_LT(RelErr(outs[1], outs[0]), tolerance);
  EXPECT_LT(RelErr(grads[2], grads[0]), tolerance) << "d input";
  EXPECT_LT(RelErr(grads[3], grads[1]), tolerance) << "d down_proj of expert 1";
}

INSTANTIATE_TEST_SUITE_P(Widths, MoeBlockTest,
                         testing::Values(std::make_tuple(int64_t{6}, torch::kFloat32),
                                         std::make_tuple(int64_t{16}, torch::kFloat32),
                                         std::make_tuple(int64_t{16}, torch::kBFloat16)));

}  // namespace
}  // namespace stemma::engine::model
