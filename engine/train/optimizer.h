// FlatAdamW: AdamW (decoupled weight decay, Loshchilov & Hutter) over one flat fp32 buffer
// that holds every trainable parameter, with the training strategies built into the update:
//
// - Flat storage. Trainable parameters are moved into one contiguous buffer (each module
//   parameter becomes a view of it) and their .grad into another, so zeroing, the gradient
//   norm, clipping, the data-parallel all-reduce and the Adam update are a few large tensor
//   ops instead of a loop over hundreds of tensors.
// - Layout. Segments are ordered (decayed, plain, masked), so weight decay and L2-SP apply to
//   contiguous ranges. L2-SP adds its gradient analytically, grad += 2λ(θ − θ_base)
//   (algorithms.md §1.2: the penalty is λ·‖θ − θ_base‖², summed, no ½).
// - Masks (LAPE sub-networks, algorithms.md §2.4): the gradient is masked before the norm
//   and clipping, so Adam's moments stay exactly 0 outside the mask, and the whole update,
//   weight decay included, is multiplied by the 0/1 mask: masked-out elements keep their
//   bits.
//
// The update equals torch.optim.AdamW's single-tensor path op for op (see optimizer_test).
// Thread-safety: none; one training loop drives it.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/train/plan.h"
#include "engine/train/spec.h"

namespace stemma::engine::train {

class FlatAdamW {
 public:
  // `params[i]` is the module parameter planned by `plans[i]`; only trainable ones are taken
  // (frozen ones get requires_grad = false and stay as they are). Trainable parameters must
  // be float32 on one device. Keeps a copy of the initial values as the L2-SP anchor when
  // any λ > 0.
  FlatAdamW(const std::vector<ParamPlan>& plans, const std::vector<torch::Tensor>& params,
            const OptimizerSpec& options);

  // Sets every gradient to 0 (in place: the .grad views must stay views).
  void ZeroGrad();
  // The flat gradient buffer [n], for the data-parallel all-reduce.
  const torch::Tensor& flat_grads() const { return grads_; }
  // Every trainable tensor (module parameters, views of the flat buffer), for broadcasts.
  std::vector<torch::Tensor> parameters() const;

  struct StepStats {
    double grad_norm = 0.0;  // of the masked gradient with the L2-SP term, before clipping
    double l2sp = 0.0;       // Σ λ‖θ − θ_base‖² at the parameters the gradient was taken at
  };
  // Adds the L2-SP gradient, masks, measures and clips (max_norm > 0) the gradient, then
  // applies one AdamW step with learning rate `lr`.
  StepStats Step(double lr, double max_norm);

  int64_t step_count() const { return step_; }
  int64_t num_elements() const { return values_.numel(); }

  // Optimizer state as named tensors ("exp_avg.<param>", "exp_avg_sq.<param>"), views into
  // the state buffers, and its inverse. Restore checks every name and shape: InvalidArgument
  // naming the tensor otherwise.
  std::vector<std::pair<std::string, torch::Tensor>> StateTensors() const;
  absl::Status RestoreState(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                            int64_t step);

 private:
  struct Segment {
    std::string name;
    torch::Tensor param;  // the module parameter (a view of values_ after construction)
    int64_t offset = 0;
    int64_t numel = 0;
    bool decay = false;
    double lambda = 0.0;
    torch::Tensor mask;  // 0/1 of the param's shape; undefined when unmasked
  };
  // A run of consecutive unmasked segments sharing (decay, λ).
  struct Range {
    int64_t begin = 0, end = 0;
    bool decay = false;
    double lambda = 0.0;
  };
  // One AdamW update of [begin, end); `mask` (masked segments) zeroes the whole update
  // outside it; `grad_scale` (unmasked ranges) divides the gradients first (clipping).
  void AdamRange(int64_t begin, int64_t end, bool decay, const torch::Tensor& mask, double lr,
                 const std::optional<torch::Tensor>& grad_scale);

  OptimizerSpec options_;
  std::vector<Segment> segments_;
  std::vector<Range> ranges_;
  torch::Tensor values_, grads_, exp_avg_, exp_avg_sq_, scratch_;  // [n] fp32 each
  torch::Tensor anchor_;  // [n] initial values, only with L2-SP
  int64_t step_ = 0;
};

}  // namespace stemma::engine::train
