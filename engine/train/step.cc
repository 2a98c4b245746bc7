// One optimizer step of `stemma-engine train`, the held-out evaluation, and the SSFT router
// restriction (run.h).
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/train/run.h"
#include "engine/train/spec.h"

namespace stemma::engine::train {
namespace {

// Forward and backward of one micro-batch under bf16 autocast when asked: the matrix
// products run in bf16, autocast keeps losses and reductions in fp32, and the fp32 master
// weights receive fp32 gradients.
class AutocastScope {
 public:
  explicit AutocastScope(const Run& run) : type_(run.device.type()), on_(run.autocast_bf16) {
    if (!on_) return;
    was_enabled_ = at::autocast::is_autocast_enabled(type_);
    previous_dtype_ = at::autocast::get_autocast_dtype(type_);
    at::autocast::set_autocast_dtype(type_, at::kBFloat16);
    at::autocast::set_autocast_enabled(type_, true);
  }
  ~AutocastScope() {
    if (!on_) return;
    at::autocast::set_autocast_enabled(type_, was_enabled_);
    at::autocast::set_autocast_dtype(type_, previous_dtype_);
    at::autocast::clear_cache();  // bf16 copies of the weights change every step
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  at::DeviceType type_;
  bool on_;
  bool was_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kBFloat16;
};

}  // namespace

// SSFT (algorithms.md §4.5): the router of each listed layer may only pick the listed
// experts while training. The model's router is a bias-free Linear; giving it an
// (unregistered, so never saved) bias of 0 / -inf makes softmax and top-k see the target
// experts only — the C++ counterpart of the reference code's forward hook.
void RestrictRouters(Run& run) {
  const int64_t experts = run.lm->config().num_experts;
  for (const auto& [layer, ids] : run.plan.router_experts) {
    auto* decoder = run.lm->model->layers[layer]->as<model::DecoderLayerImpl>();
    auto bias = torch::full({experts}, -std::numeric_limits<float>::infinity());
    for (int64_t id : ids) bias[id] = 0.0f;
    decoder->moe->gate->bias = bias.to(decoder->moe->gate->weight.device());
  }
}

void ClearRouterRestriction(Run& run) {
  for (const auto& [layer, ids] : run.plan.router_experts) {
    run.lm->model->layers[layer]->as<model::DecoderLayerImpl>()->moe->gate->bias = torch::Tensor();
  }
}

absl::StatusOr<StepResult> TrainStep(Run& run, int64_t step) {
  const v1::TrainSpec& spec = *run.spec;
  const int64_t world = run.ranks->world_size(), rank = run.ranks->rank();
  const int64_t batch_size = spec.batch_size(), grad_accum = spec.grad_accum();
  const int64_t rows = batch_size / world, seq = spec.data().seq_len();
  const int64_t vocab = run.lm->config().vocab_size;
  const double global_tokens = static_cast<double>(run.tokens_per_step);
  const bool moe = run.lm->config().is_moe();
  const double load_balancing = spec.strategy().aux_loss().load_balancing();
  const double router_z = spec.strategy().aux_loss().router_z();
  StepResult result;
  double ce_sum = 0.0, lb_sum = 0.0, z_sum = 0.0;
  if (run.full) {
    run.full->ZeroGrad();
    run.full->GatherOuter();  // the embedding runs first, the head last: kept for the step
  } else if (run.sharded) {
    run.sharded->ZeroGrad();
  } else {
    run.optimizer->ZeroGrad();
  }
  for (int64_t micro = 0; micro < grad_accum; ++micro) {
    std::vector<int32_t> batch = run.loader->NextBatch(batch_size);  // [B, seq + 1]
    auto tokens = torch::from_blob(batch.data(), {batch_size, seq + 1}, torch::kInt32)
                      .narrow(0, rank * rows, rows)
                      .to(torch::kLong);  // [rows, seq + 1], this rank's share
    const int64_t max_id = tokens.max().item<int64_t>();
    if (max_id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("data: token id ", max_id, " at step ", step,
                                                     " is outside the model's vocabulary of ",
                                                     vocab));
    }
    if (run.device != torch::kCPU) tokens = tokens.to(run.device);
    auto inputs = tokens.narrow(1, 0, seq), targets = tokens.narrow(1, 1, seq);
    torch::Tensor ce, loss;
    {
      AutocastScope autocast(run);  // forward only; backward follows the recorded dtypes
      // Summed CE, fp32 logits for loss_chunk_tokens tokens at a time (model/loss.h).
      auto out = run.lm->ForwardLoss(inputs, targets, spec.loss_chunk_tokens());
      ce = out.ce_sum;
      // Scaled so that the mean over ranks of the summed gradients is d(mean CE)/dθ.
      loss = ce * (static_cast<double>(world) / global_tokens);
      if (moe) {
        if (load_balancing > 0)
          loss = loss + out.load_balancing_loss * (load_balancing / grad_accum);
        if (router_z > 0) loss = loss + out.router_z_loss * (router_z / grad_accum);
        lb_sum += out.load_balancing_loss.item<double>();
        z_sum += out.router_z_loss.item<double>();
      }
    }
    if (run.overlap && micro + 1 == grad_accum) run.overlap->Arm();
    if (run.sharded) run.sharded->BeforeBackward(micro + 1 == grad_accum);
    loss.backward();
    ce_sum += ce.item<double>();
    if (run.sharded) run.sharded->AfterBackward(micro + 1 == grad_accum);
    if (run.full) run.full->AfterBackward();
  }
  if (run.full) run.full->ReleaseOuter();
  if (run.overlap) {
    run.overlap->Finish();
  } else if (world > 1 && run.optimizer) {
    run.ranks->AllReduceMeanGradients({run.optimizer->FlatGrads()});
  }
  result.loss = run.ranks->AllReduceSum(ce_sum) / global_tokens;
  if (moe) {
    const double micro_batches = static_cast<double>(grad_accum * world);
    result.load_balancing = run.ranks->AllReduceSum(lb_sum) / micro_batches;
    result.router_z = run.ranks->AllReduceSum(z_sum) / micro_batches;
  }
  if (!std::isfinite(result.loss)) {
    return absl::InternalError(absl::StrCat("training diverged at step ", step, ": loss is ",
                                            result.loss,
                                            " (lower optimizer.lr or check the data); "
                                            "no checkpoint written for this step"));
  }
  result.lr = LearningRate(spec.optimizer(), spec.schedule(), step, run.total_steps);
  result.stats = run.full      ? run.full->Step(result.lr, spec.clip_grad_norm())
                 : run.sharded ? run.sharded->Step(result.lr, spec.clip_grad_norm())
                               : run.optimizer->Step(result.lr, spec.clip_grad_norm());
  if (!std::isfinite(result.stats.grad_norm)) {
    return absl::InternalError(absl::StrCat("training diverged at step ", step,
                                            ": gradient norm is ", result.stats.grad_norm,
                                            " (lower optimizer.lr or check the data); "
                                            "no checkpoint written for this step"));
  }
  return result;
}

// Mean cross-entropy per predicted token on each held-out set, emitted as `metric` events
// (`heldout_loss/<name>`, and `heldout_loss` over all sets' tokens) at `step`. Rows are
// shared among the data-parallel ranks; every rank takes part (the sums are collective).
void EvaluateHeldOut(Run& run, int64_t step, const EventWriter& events) {
  const int64_t seq = run.spec->data().seq_len(), batch_size = EvalBatchSize(*run.spec);
  const int64_t world = run.ranks->world_size(), rank = run.ranks->rank();
  torch::NoGradGuard no_grad;
  run.lm->eval();
  ClearRouterRestriction(run);            // the model as it will be saved: the whole router
  if (run.full) run.full->GatherOuter();  // the decoder layers are gathered by the hooks
  double total_ce = 0.0, total_tokens = 0.0;
  for (auto& set : run.heldout) {
    double ce_sum = 0.0;
    for (int64_t first = 0; first < set.rows; first += batch_size) {
      const int64_t rows = std::min(batch_size, set.rows - first);
      // This rank's share of the chunk: rows [begin, end).
      const int64_t begin = first + rows * rank / world, end = first + rows * (rank + 1) / world;
      if (end <= begin) continue;
      auto tokens = torch::from_blob(set.tokens.data() + begin * (seq + 1), {end - begin, seq + 1},
                                     torch::kInt32)
                        .to(torch::kLong);
      if (run.device != torch::kCPU) tokens = tokens.to(run.device);
      AutocastScope autocast(run);
      auto out = run.lm->ForwardLoss(tokens.narrow(1, 0, seq), tokens.narrow(1, 1, seq),
                                     run.spec->loss_chunk_tokens());
      ce_sum += out.ce_sum.item<double>();
    }
    ce_sum = run.ranks->AllReduceSum(ce_sum);
    const double tokens = static_cast<double>(set.rows * seq);
    total_ce += ce_sum;
    total_tokens += tokens;
    events.Emit(MetricEvent("heldout_loss/" + set.name, ce_sum / tokens, step));
  }
  events.Emit(MetricEvent("heldout_loss", total_ce / total_tokens, step));
  if (run.full) run.full->ReleaseOuter();
  RestrictRouters(run);
  run.lm->train();
}

}  // namespace stemma::engine::train
