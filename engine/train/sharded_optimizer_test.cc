// ShardedAdamW against FlatAdamW in one process (one rank owns the whole slice): the same
// updates for decayed, plain, L2-SP and masked parameters, with clipping, through both
// gradient paths, and with buckets much smaller than a tensor (pieces cut tensors apart).
// Several ranks: sharded_train_test.
#include "engine/train/sharded_optimizer.h"

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

std::vector<ParamPlan> Plans(const std::vector<torch::Tensor>& t) {
  std::vector<ParamPlan> plans = {Plan("a", t[0], true, 0.3), Plan("b", t[1], false),
                                  Plan("rows", t[2], true), Plan("cols", t[3], true, 0.2),
                                  Plan("frozen", t[4], true)};
  plans[2].mask = ParamPlan::Mask::kRows;
  plans[2].indices = {1, 4};
  plans[3].mask = ParamPlan::Mask::kColumns;
  plans[3].indices = {0, 5};
  plans[4].trainable = false;
  return plans;
}

std::vector<torch::Tensor> Params() {
  torch::manual_seed(1);
  return {torch::randn({8, 5}), torch::randn({5}), torch::randn({6, 4}), torch::randn({4, 6}),
          torch::randn({3})};
}

class ShardedAdamWTest : public ::testing::TestWithParam<ShardedAdamW::Level> {};

TEST_P(ShardedAdamWTest, EqualsFlatAdamW) {
  auto group = DataParallel::FromEnv();  // no RANK/WORLD_SIZE: one rank
  ASSERT_TRUE(group.ok()) << group.status();
  std::vector<torch::Tensor> flat_params = Params(), sharded_params = Params();
  const std::vector<torch::Tensor> initial = Params();
  const std::vector<ParamPlan> plans = Plans(flat_params);
  v1::TrainOptimizer spec;
  FillSpecDefaults(&spec);
  spec.set_weight_decay(0.1);
  FlatAdamW flat(plans, flat_params, spec);
  // 40-byte buckets: ten elements per reduce-scatter, so tensors span several buckets.
  ShardedAdamW sharded(plans, sharded_params, spec, **group, GetParam(), /*bucket_bytes=*/40);
  EXPECT_EQ(sharded.num_elements(), flat.num_elements());
  for (int step = 0; step < 5; ++step) {
    flat.ZeroGrad();
    sharded.ZeroGrad();
    // Two micro-batches, accumulated (flat: by autograd's rule, added into .grad).
    for (int micro = 0; micro < 2; ++micro) {
      for (size_t i = 0; i + 1 < flat_params.size(); ++i) {
        auto g = torch::randn(flat_params[i].sizes());
        for (auto* p : {&flat_params[i], &sharded_params[i]}) {
          if (p->grad().defined()) {
            p->mutable_grad() = p->grad() + g;
          } else {
            p->mutable_grad() = g.clone();
          }
        }
      }
      sharded.AfterBackward(micro == 1);
      if (GetParam() == ShardedAdamW::Level::kGradients) {
        for (size_t i = 0; i + 1 < flat_params.size(); ++i) {
          EXPECT_FALSE(sharded_params[i].grad().defined()) << "gradient " << i << " kept";
        }
      }
    }
    const auto a = flat.Step(1e-2, /*max_norm=*/0.5);
    const auto b = sharded.Step(1e-2, /*max_norm=*/0.5);
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-5 * a.grad_norm) << "step " << step;
    EXPECT_NEAR(a.l2sp, b.l2sp, 1e-6 * a.l2sp + 1e-12) << "step " << step;
    for (size_t i = 0; i < flat_params.size(); ++i) {
      EXPECT_TRUE(torch::allclose(flat_params[i], sharded_params[i], 1e-5, 1e-6))
          << "param " << i << " step " << step;
    }
  }
  // Masked-out rows and columns, and the frozen tensor, keep their bits.
  auto kept_rows = torch::tensor({0, 2, 3, 5}), kept_cols = torch::tensor({1, 2, 3, 4});
  EXPECT_TRUE(torch::equal(sharded_params[2].index_select(0, kept_rows),
                           initial[2].index_select(0, kept_rows)));
  EXPECT_TRUE(torch::equal(sharded_params[3].index_select(1, kept_cols),
                           initial[3].index_select(1, kept_cols)));
  EXPECT_TRUE(torch::equal(sharded_params[4], initial[4]));
  EXPECT_FALSE(torch::equal(sharded_params[2], initial[2]));
}

// The slice's state, restored into a fresh optimizer, continues identically.
TEST_P(ShardedAdamWTest, SliceStateRoundTrips) {
  auto group = DataParallel::FromEnv();
  ASSERT_TRUE(group.ok()) << group.status();
  std::vector<torch::Tensor> first = Params(), second = Params();
  const std::vector<ParamPlan> plans = Plans(first);
  v1::TrainOptimizer spec;
  FillSpecDefaults(&spec);
  ShardedAdamW a(plans, first, spec, **group, GetParam(), 1 << 20);
  ShardedAdamW b(plans, second, spec, **group, GetParam(), 1 << 20);
  auto train = [&](ShardedAdamW& opt, std::vector<torch::Tensor>& params, int seed) {
    torch::manual_seed(seed);
    opt.ZeroGrad();
    for (size_t i = 0; i + 1 < params.size(); ++i) {
      params[i].mutable_grad() = torch::randn(params[i].sizes());
    }
    opt.AfterBackward(true);
    opt.Step(1e-2, 0.0);
  };
  train(a, first, 10);
  for (const auto& [name, tensor] : a.SliceTensors()) {
    // In two pieces, as written by two ranks.
    const int64_t half = tensor.numel() / 2;
    b.RestoreRange(name, 0, tensor.narrow(0, 0, half).clone());
    b.RestoreRange(name, half, tensor.narrow(0, half, tensor.numel() - half).clone());
  }
  b.FinishRestore(a.step_count());
  train(a, first, 11);
  train(b, second, 11);
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_TRUE(torch::equal(first[i], second[i])) << "param " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, ShardedAdamWTest,
                         ::testing::Values(ShardedAdamW::Level::kOptimizer,
                                           ShardedAdamW::Level::kGradients));

}  // namespace
}  // namespace stemma::engine::train
