// The fused kernels against the composite LibTorch ops they replace (the path modules.cc
// still takes for bf16, CUDA and strided inputs): values and gradients, including the
// weight gradient of RMSNorm, and thread-count independence of that gradient.
#include "engine/model/fused.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/nn/functional/linear.h>
#include <torch/types.h>

#include <tuple>
#include <vector>

namespace stemma::engine::model {
namespace {

using torch::indexing::Slice;

torch::Tensor CompositeRmsNorm(const torch::Tensor& x, const torch::Tensor& w, double eps,
                               bool one_plus) {
  auto normed = x * torch::rsqrt(x.pow(2).mean(-1, true) + eps);
  return one_plus ? normed * (1.0 + w) : w * normed;
}

torch::Tensor CompositeRope(const torch::Tensor& x, const torch::Tensor& cos,
                            const torch::Tensor& sin) {  // x [B, T, n, hd], cos/sin [T, hd]
  const int64_t h = x.size(-1) / 2;
  auto rotated = torch::cat(
      {-x.index({"...", Slice(h, torch::indexing::None)}), x.index({"...", Slice(0, h)})}, -1);
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

// Max |a - b| / (max |b| + tiny): a relative error that ignores near-zero elements' noise.
double RelErr(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / (b.abs().max().item<double>() + 1e-30);
}

// Runs `fn` on leaf copies of `inputs` and returns {output, grads of every input} for the
// loss sum(output * probe).
std::pair<torch::Tensor, std::vector<torch::Tensor>> ValueAndGrads(
    const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& fn,
    const std::vector<torch::Tensor>& inputs, const torch::Tensor& probe) {
  std::vector<torch::Tensor> leaves;
  for (const auto& t : inputs) leaves.push_back(t.detach().clone().requires_grad_(true));
  auto out = fn(leaves);
  (out * probe).sum().backward();
  std::vector<torch::Tensor> grads;
  for (const auto& leaf : leaves) grads.push_back(leaf.grad());
  return {out.detach(), grads};
}

class RmsNormTest : public testing::TestWithParam<bool> {};

TEST_P(RmsNormTest, MatchesCompositeValuesAndGradients) {
  const bool one_plus = GetParam();
  torch::manual_seed(1);
  auto x = torch::randn({3, 70, 96}) * 3.0;  // rows not a multiple of the block count
  auto w = torch::randn({96}) * 0.5 + (one_plus ? 0.0 : 1.0);
  auto probe = torch::randn({3, 70, 96});
  auto [fused_out, fused_grads] = ValueAndGrads(
      [&](const auto& in) { return fused::RmsNorm(in[0], in[1], 1e-6, one_plus); }, {x, w}, probe);
  auto [ref_out, ref_grads] =
      ValueAndGrads([&](const auto& in) { return CompositeRmsNorm(in[0], in[1], 1e-6, one_plus); },
                    {x, w}, probe);
  EXPECT_LT(RelErr(fused_out, ref_out), 1e-6);
  EXPECT_LT(RelErr(fused_grads[0], ref_grads[0]), 1e-5) << "dx";
  EXPECT_LT(RelErr(fused_grads[1], ref_grads[1]), 1e-5) << "dw";
}

INSTANTIATE_TEST_SUITE_P(Fused, RmsNormTest, testing::Bool(),
                         [](const auto& info) { return info.param ? "OnePlus" : "Plain"; });

TEST(FusedTest, RmsNormFrozenWeightGetsNoGradient) {
  auto x = torch::randn({4, 32}).requires_grad_(true);
  auto w = torch::ones({32});  // frozen: requires_grad false
  fused::RmsNorm(x, w, 1e-5, false).sum().backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
}

TEST(FusedTest, RmsNormWeightGradientDoesNotDependOnThreads) {
  torch::manual_seed(2);
  auto x = torch::randn({512, 256});
  auto w = torch::randn({256});
  auto probe = torch::randn({512, 256});
  const int before = at::get_num_threads();
  std::vector<torch::Tensor> dws;
  for (int threads : {1, 2, 3}) {
    at::set_num_threads(threads);
    auto [out, grads] = ValueAndGrads(
        [&](const auto& in) { return fused::RmsNorm(in[0], in[1], 1e-5, false); }, {x, w}, probe);
    dws.push_back(grads[1]);
  }
  at::set_num_threads(before);
  EXPECT_TRUE(torch::equal(dws[0], dws[1]));
  EXPECT_TRUE(torch::equal(dws[0], dws[2]));
}

TEST(FusedTest, RopeMatchesComposite) {
  torch::manual_seed(3);
  const int64_t b = 2, t = 9, n = 3, hd = 16;
  auto x = torch::randn({b, t, n, hd});
  auto angles = torch::randn({t, hd / 2});
  auto cos = torch::cat({angles.cos(), angles.cos()}, -1),
       sin = torch::cat({angles.sin(), angles.sin()}, -1);
  auto probe = torch::randn({b, t, n, hd});
  auto [fused_out, fused_grads] =
      ValueAndGrads([&](const auto& in) { return fused::Rope(in[0], cos, sin); }, {x}, probe);
  auto [ref_out, ref_grads] =
      ValueAndGrads([&](const auto& in) { return CompositeRope(in[0], cos, sin); }, {x}, probe);
  EXPECT_LT(RelErr(fused_out, ref_out), 1e-6);
  EXPECT_LT(RelErr(fused_grads[0], ref_grads[0]), 1e-6);
}

TEST(FusedTest, RopeTakesStridedInput) {
  auto base = torch::randn({2, 5, 4, 8});
  auto strided = base.transpose(1, 2).contiguous().transpose(1, 2);  // same values, other strides
  auto cos = torch::rand({5, 8}), sin = torch::rand({5, 8});
  EXPECT_TRUE(torch::allclose(fused::Rope(strided, cos, sin), fused::Rope(base, cos, sin)));
}

TEST(FusedTest, SiluMulMatchesComposite) {
  torch::manual_seed(4);
  auto g = torch::randn({5, 77}) * 4.0, u = torch::randn({5, 77});
  auto probe = torch::randn({5, 77});
  auto [fused_out, fused_grads] =
      ValueAndGrads([&](const auto& in) { return fused::SiluMul(in[0], in[1]); }, {g, u}, probe);
  auto [ref_out, ref_grads] =
      ValueAndGrads([&](const auto& in) { return torch::silu(in[0]) * in[1]; }, {g, u}, probe);
  EXPECT_LT(RelErr(fused_out, ref_out), 1e-6);
  EXPECT_LT(RelErr(fused_grads[0], ref_grads[0]), 1e-5) << "dg";
  EXPECT_LT(RelErr(fused_grads[1], ref_grads[1]), 1e-6) << "du";
}

TEST(FusedTest, AppliesOnlyToFloat32Cpu) {
  EXPECT_TRUE(fused::Applies(torch::zeros({2})));
  EXPECT_FALSE(fused::Applies(torch::zeros({2}, torch::kBFloat16)));
  EXPECT_FALSE(fused::Applies(torch::zeros({2}, torch::kFloat64)));
  EXPECT_FALSE(fused::Applies(torch::Tensor()));
}

// Weights laid back to back in one buffer, as FlatAdamW lays out a layer's weights: leaf
// views of it that require gradients.
std::vector<torch::Tensor> BackToBack(const std::vector<std::vector<int64_t>>& shapes,
                                      torch::Tensor* buffer) {
  int64_t total = 0;
  for (const auto& shape : shapes) total += shape[0] * shape[1];
  *buffer = torch::randn({total}) * 0.2;
  std::vector<torch::Tensor> out;
  int64_t offset = 0;
  for (const auto& shape : shapes) {
    auto w = torch::empty(shape);
    w.set_data(buffer->narrow(0, offset, shape[0] * shape[1]).view(shape));
    w.set_requires_grad(true);
    out.push_back(w);
    offset += shape[0] * shape[1];
  }
  return out;
}

class GroupedLinearTest : public testing::TestWithParam<bool> {};

TEST_P(GroupedLinearTest, MatchesSeparateLinearsValuesAndGradients) {
  const bool bias = GetParam();
  torch::manual_seed(5);
  torch::Tensor buffer;
  auto weights = BackToBack({{12, 16}, {4, 16}, {4, 16}}, &buffer);  // q, k, v of GQA
  std::vector<torch::Tensor> biases;
  for (const auto& w : weights) {
    biases.push_back(bias ? torch::randn({w.size(0)}).requires_grad_(true) : torch::Tensor());
  }
  auto x = torch::randn({2, 7, 16}).requires_grad_(true);
  auto outs = fused::GroupedLinear(x, weights, biases);
  ASSERT_EQ(outs.size(), 3u);
  auto x_ref = x.detach().clone().requires_grad_(true);
  std::vector<torch::Tensor> w_ref, b_ref, refs;
  for (size_t i = 0; i < 3; ++i) {
    w_ref.push_back(weights[i].detach().clone().requires_grad_(true));
    b_ref.push_back(bias ? biases[i].detach().clone().requires_grad_(true) : torch::Tensor());
    refs.push_back(torch::nn::functional::linear(x_ref, w_ref[i], b_ref[i]));
  }
  torch::Tensor loss = torch::zeros({}), loss_ref = torch::zeros({});
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(outs[i].sizes(), refs[i].sizes());
    EXPECT_LT(RelErr(outs[i], refs[i]), 1e-6) << "output " << i;
    auto probe = torch::randn(refs[i].sizes());
    loss = loss + (outs[i] * probe).sum();
    loss_ref = loss_ref + (refs[i] * probe).sum();
  }
  loss.backward();
  loss_ref.backward();
  EXPECT_LT(RelErr(x.grad(), x_ref.grad()), 1e-5) << "dx";
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_LT(RelErr(weights[i].grad(), w_ref[i].grad()), 1e-5) << "dW " << i;
    if (bias) EXPECT_LT(RelErr(biases[i].grad(), b_ref[i].grad()), 1e-5) << "db " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Fused, GroupedLinearTest, testing::Bool(),
                         [](const auto& info) { return info.param ? "Bias" : "NoBias"; });

TEST(FusedTest, GroupedLinearUnusedOutputAndFrozenWeight) {
  torch::Tensor buffer;
  auto weights = BackToBack({{6, 8}, {6, 8}}, &buffer);
  weights[0].set_requires_grad(false);  // frozen
  auto x = torch::randn({3, 8}).requires_grad_(true);
  auto outs = fused::GroupedLinear(x, weights, {torch::Tensor(), torch::Tensor()});
  ASSERT_EQ(outs.size(), 2u);
  outs[1].sum().backward();  // outs[0] unused
  EXPECT_FALSE(weights[0].grad().defined());
  EXPECT_TRUE(torch::allclose(weights[1].grad(), x.sum(0).expand({6, 8})));
  EXPECT_TRUE(torch::allclose(x.grad(), weights[1].detach().sum(0).expand({3, 8})));
}

TEST(FusedTest, GroupedLinearDeclinesWeightsNotBackToBack) {
  auto a = torch::randn({4, 8}), b = torch::randn({4, 8});  // separate allocations
  auto x = torch::randn({2, 8});
  EXPECT_TRUE(fused::GroupedLinear(x, {a, b}, {}).empty());
  torch::Tensor buffer;
  auto weights = BackToBack({{4, 8}, {4, 8}}, &buffer);
  EXPECT_TRUE(fused::GroupedLinear(x, {weights[1], weights[0]}, {}).empty());  // wrong order
  EXPECT_FALSE(fused::GatedUp(x, a, b).defined());
}

TEST(FusedTest, GatedUpMatchesComposite) {
  torch::manual_seed(6);
  torch::Tensor buffer;
  auto weights = BackToBack({{24, 16}, {24, 16}}, &buffer);
  auto x = torch::randn({2, 5, 16}).requires_grad_(true);
  auto out = fused::GatedUp(x, weights[0], weights[1]);
  ASSERT_TRUE(out.defined());
  auto x_ref = x.detach().clone().requires_grad_(true);
  auto g_ref = weights[0].detach().clone().requires_grad_(true);
  auto u_ref = weights[1].detach().clone().requires_grad_(true);
  namespace F = torch::nn::functional;
  auto ref = torch::silu(F::linear(x_ref, g_ref)) * F::linear(x_ref, u_ref);
  EXPECT_EQ(out.sizes(), ref.sizes());
  EXPECT_LT(RelErr(out, ref), 1e-6);
  auto probe = torch::randn(ref.sizes());
  (out * probe).sum().backward();
  (ref * probe).sum().backward();
  EXPECT_LT(RelErr(x.grad(), x_ref.grad()), 1e-5) << "dx";
  EXPECT_LT(RelErr(weights[0].grad(), g_ref.grad()), 1e-5) << "d gate";
  EXPECT_LT(RelErr(weights[1].grad(), u_ref.grad()), 1e-5) << "d up";
}

TEST(FusedTest, RopeReadsColumnBlocksInPlace) {
  auto y = torch::randn({2, 5, 3 * 16});  // a q|k|v product: q = columns 0..15
  auto q = y.narrow(2, 0, 16).view({2, 5, 2, 8});
  auto cos = torch::rand({5, 8}), sin = torch::rand({5, 8});
  EXPECT_TRUE(torch::allclose(fused::Rope(q, cos, sin), fused::Rope(q.contiguous(), cos, sin)));
}

}  // namespace
}  // namespace stemma::engine::model
