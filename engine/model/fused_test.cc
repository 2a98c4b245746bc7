// The fused kernels against the composite LibTorch ops they replace (the path modules.cc
// still takes for bf16, CUDA and strided inputs): values and gradients, including the
// weight gradient of RMSNorm, and thread-count independence of that gradient.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/types.h>

#include <tuple>
#include <vector>

#include "engine/model/fused.h"

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
  auto rotated = torch::cat({-x.index({"...", Slice(h, torch::indexing::None)}),
                             x.index({"...", Slice(0, h)})},
                            -1);
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
  auto [ref_out, ref_grads] = ValueAndGrads(
      [&](const auto& in) { return CompositeRmsNorm(in[0], in[1], 1e-6, one_plus); }, {x, w},
      probe);
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
  auto cos = torch::cat({angles.cos(), angles.cos()}, -1), sin = torch::cat({angles.sin(), angles.sin()}, -1);
  auto probe = torch::randn({b, t, n, hd});
  auto [fused_out, fused_grads] = ValueAndGrads(
      [&](const auto& in) { return fused::Rope(in[0], cos, sin); }, {x}, probe);
  auto [ref_out, ref_grads] = ValueAndGrads(
      [&](const auto& in) { return CompositeRope(in[0], cos, sin); }, {x}, probe);
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
  auto [fused_out, fused_grads] = ValueAndGrads(
      [&](const auto& in) { return fused::SiluMul(in[0], in[1]); }, {g, u}, probe);
  auto [ref_out, ref_grads] = ValueAndGrads(
      [&](const auto& in) { return torch::silu(in[0]) * in[1]; }, {g, u}, probe);
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

}  // namespace
}  // namespace stemma::engine::model
