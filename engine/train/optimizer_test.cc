// FlatAdamW against LibTorch's own AdamW, and the masked update's guarantees.
#include "engine/train/optimizer.h"

#include <torch/torch.h>

#include "common/engine_spec.h"
#include "gtest/gtest.h"

namespace stemma::engine::train {
namespace {

ParamPlan Plan(const std::string& name, const torch::Tensor& t, bool decay, double lambda = 0.0) {
  ParamPlan p;
  p.name = name;
  p.shape = t.sizes().vec();
  p.trainable = true;
  p.weight_decay = decay;
  p.l2sp_lambda = lambda;
  return p;
}

// The schema's AdamW settings (train.proto's defaults).
v1::TrainOptimizer Defaults() {
  v1::TrainOptimizer o;
  FillSpecDefaults(&o);
  return o;
}

// The same parameters trained by FlatAdamW and by torch::optim::AdamW with equal gradients
// stay equal (to float rounding: LibTorch's C++ AdamW uses mul+add where Python uses lerp).
TEST(FlatAdamWTest, MatchesTorchAdamW) {
  torch::manual_seed(0);
  std::vector<torch::Tensor> ours = {torch::randn({8, 5}), torch::randn({5}),
                                     torch::randn({3, 4, 2})};
  std::vector<torch::Tensor> theirs;
  for (auto& t : ours) theirs.push_back(t.clone().set_requires_grad(true));
  std::vector<ParamPlan> plans = {Plan("a", ours[0], true), Plan("b", ours[1], false),
                                  Plan("c", ours[2], true)};
  v1::TrainOptimizer spec = Defaults();
  spec.set_lr(1e-2);
  spec.set_weight_decay(0.1);
  FlatAdamW flat(plans, ours, spec);
  const double beta1 = spec.betas(0), beta2 = spec.betas(1), eps = spec.eps();
  // LibTorch's AdamW decays every parameter of a group, so "b" goes in a group without decay.
  torch::optim::AdamW reference(
      {torch::optim::OptimizerParamGroup(
           {theirs[0], theirs[2]},
           std::make_unique<torch::optim::AdamWOptions>(
               torch::optim::AdamWOptions(1e-2).betas({beta1, beta2}).eps(eps).weight_decay(0.1))),
       torch::optim::OptimizerParamGroup({theirs[1]}, std::make_unique<torch::optim::AdamWOptions>(
                                                          torch::optim::AdamWOptions(1e-2)
                                                              .betas({beta1, beta2})
                                                              .eps(eps)
                                                              .weight_decay(0.0)))});
  for (int step = 0; step < 6; ++step) {
    flat.ZeroGrad();
    reference.zero_grad();
    for (size_t i = 0; i < ours.size(); ++i) {
      auto g = torch::randn(ours[i].sizes());
      ours[i].mutable_grad() = g;  // as autograd hands it over after ZeroGrad
      theirs[i].mutable_grad() = g.clone();
    }
    auto stats = flat.Step(1e-2, /*max_norm=*/0.0);
    EXPECT_GT(stats.grad_norm, 0.0);
    reference.step();
    for (size_t i = 0; i < ours.size(); ++i) {
      EXPECT_TRUE(torch::allclose(ours[i], theirs[i], 1e-5, 1e-6))
          << "param " << i << " step " << step;
    }
  }
}

TEST(FlatAdamWTest, ClippingScalesTheGradientToMaxNorm) {
  auto w = torch::zeros({10});
  std::vector<ParamPlan> plans = {Plan("w", w, false)};
  v1::TrainOptimizer spec = Defaults();
  // β1 0: the update is then lr * g / (|g| + eps): shows the clipped gradient's sign only,
  spec.set_betas(0, 0.0);
  FlatAdamW flat(plans, {w}, spec);
  flat.ZeroGrad();
  w.mutable_grad() = torch::full({10}, 3.0);  // norm sqrt(90)
  auto stats = flat.Step(1e-3, 1.0);
  EXPECT_NEAR(stats.grad_norm, std::sqrt(90.0), 1e-4);
  // ... so read the clipped gradient from the second moment: v = (1 - beta2) g².
  auto state = flat.StateTensors();
  const double v = state[1].second[0].item<double>();
  const double clipped = std::sqrt(v / (1 - spec.betas(1)));
  EXPECT_NEAR(clipped * std::sqrt(10.0), 1.0, 1e-4);
}

TEST(FlatAdamWTest, MaskedUpdateLeavesMaskedOutElementsBitIdentical) {
  torch::manual_seed(1);
  auto w = torch::randn({6, 4}), d = torch::randn({4, 6});
  auto w0 = w.clone(), d0 = d.clone();
  ParamPlan pw = Plan("gate", w, true), pd = Plan("down", d, true);
  pw.mask = ParamPlan::Mask::kRows;
  pw.indices = {1, 4};
  pd.mask = ParamPlan::Mask::kColumns;
  pd.indices = {1, 4};
  v1::TrainOptimizer spec = Defaults();
  spec.set_weight_decay(0.5);  // decoupled decay would move every element without the mask
  FlatAdamW flat({pw, pd}, {w, d}, spec);
  for (int step = 0; step < 3; ++step) {
    flat.ZeroGrad();
    w.mutable_grad() = torch::randn({6, 4});
    d.mutable_grad() = torch::randn({4, 6});
    flat.Step(1e-2, 1.0);
  }
  for (int64_t r = 0; r < 6; ++r) {
    const bool listed = r == 1 || r == 4;
    EXPECT_EQ(torch::equal(w[r], w0[r]), !listed) << "row " << r;
    EXPECT_EQ(torch::equal(d.select(1, r), d0.select(1, r)), !listed) << "column " << r;
  }
  // Adam moments stay exactly 0 outside the mask.
  for (const auto& [name, t] : flat.StateTensors()) {
    if (name == "exp_avg.gate") EXPECT_EQ(t[0].abs().sum().item<double>(), 0.0);
  }
}

TEST(FlatAdamWTest, L2spPullsTowardTheInitialValues) {
  auto w = torch::ones({4});
  FlatAdamW flat({Plan("w", w, false, /*lambda=*/0.5)}, {w}, Defaults());
  flat.ZeroGrad();
  flat.Step(0.1, 0.0);  // zero task gradient at the anchor: nothing moves, penalty 0
  EXPECT_TRUE(torch::equal(w, torch::ones({4})));
  {
    torch::NoGradGuard g;
    w.add_(1.0);
  }  // move away from the anchor
  flat.ZeroGrad();
  auto stats = flat.Step(0.1, 0.0);
  EXPECT_NEAR(stats.l2sp, 0.5 * 4.0, 1e-6);           // λ‖θ − θ0‖² = 0.5 · 4 · 1²
  EXPECT_NEAR(stats.grad_norm, 2 * 0.5 * 2.0, 1e-6);  // ‖2λ(θ − θ0)‖ = 1 · √4
  EXPECT_TRUE((w < 2.0).all().item<bool>());          // pulled back toward 1
}

TEST(FlatAdamWTest, ParameterWithoutGradientIsSteppedAsWithZeroGradient) {
  auto w = torch::ones({4}), u = torch::ones({3});
  v1::TrainOptimizer spec = Defaults();
  spec.set_weight_decay(0.5);
  FlatAdamW flat({Plan("w", w, true), Plan("u", u, true)}, {w, u}, spec);
  flat.ZeroGrad();
  EXPECT_FALSE(w.grad().defined());  // cleared, for autograd to hand its tensor over
  u.mutable_grad() = torch::ones({3});
  flat.Step(0.1, 0.0);
  // Decoupled decay only: 1 - lr * wd; the moments stay 0.
  EXPECT_TRUE(torch::allclose(w, torch::full({4}, 1.0 - 0.1 * 0.5)));
  for (const auto& [name, t] : flat.StateTensors()) {
    if (name == "exp_avg.w" || name == "exp_avg_sq.w") EXPECT_EQ(t.abs().sum().item<double>(), 0.0);
    if (name == "exp_avg.u") EXPECT_GT(t.abs().sum().item<double>(), 0.0);
  }
}

TEST(FlatAdamWTest, FlatGradsGathersTheGradientsInSegmentOrder) {
  auto a = torch::zeros({2, 2}), b = torch::zeros({3}), c = torch::zeros({2});
  // "b" has no decay: segments go decayed first, so the flat order is a, c, b.
  FlatAdamW flat({Plan("a", a, true), Plan("b", b, false), Plan("c", c, true)}, {a, b, c},
                 Defaults());
  flat.ZeroGrad();
  a.mutable_grad() = torch::arange(4, torch::kFloat32).view({2, 2});
  b.mutable_grad() = torch::full({3}, 7.0);  // c gets none: zeros
  torch::Tensor& grads = flat.FlatGrads();
  EXPECT_TRUE(torch::equal(grads, torch::tensor({0.f, 1.f, 2.f, 3.f, 0.f, 0.f, 7.f, 7.f, 7.f})));
  grads.mul_(2.0);  // an all-reduce works in place: the parameters' gradients see it
  EXPECT_EQ(b.grad()[0].item<float>(), 14.0f);
  EXPECT_EQ(a.grad()[1][1].item<float>(), 6.0f);
}

}  // namespace
}  // namespace stemma::engine::train
