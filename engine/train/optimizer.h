// FlatAdamW: AdamW (decoupled weight decay, Loshchilov & Hutter) over one flat fp32 buffer
// that holds every trainable parameter, with the training strategies built into the update:
//
// - Flat storage. Trainable parameters are moved into one contiguous buffer (each module
//   parameter becomes a view of it), as are the Adam moments, so the L2-SP terms and the
//   checkpointed state are a few large tensor ops. Gradients stay the tensors autograd made
//   (no zeroing or accumulation pass) unless FlatGrads() gathers them into one buffer for
//   the data-parallel all-reduce; the update is LibTorch's fused AdamW over the tensor lists.
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
#include "stemma/v1/specs/train.pb.h"

namespace stemma::engine::train {

class FlatAdamW {
 public:
  // `params[i]` is the module parameter planned by `plans[i]`; only trainable ones are taken
  // (frozen ones get requires_grad = false and stay as they are). Trainable parameters must
  // be float32 on one device. Keeps a copy of the initial values as the L2-SP anchor when
  // any λ > 0. `options` has its defaults filled (two betas); its lr is Step's to give.
  FlatAdamW(const std::vector<ParamPlan>& plans, const std::vector<torch::Tensor>& params,
            const v1::TrainOptimizer& options);

  // Clears every gradient (.grad undefined) before a backward pass. Autograd then hands its
  // own gradient tensor over to each parameter instead of adding it to a zeroed buffer: that
  // saved a fill and an add pass over every trainable element per step (~3 % of a CPU step).
  void ZeroGrad();
  // Gathers the gradients into the flat buffer [n] (zeros where autograd produced none) and
  // points each .grad at its view of it; for the data-parallel all-reduce. Step() works on
  // the gathered or the handed-over gradients alike.
  torch::Tensor& FlatGrads();
  // Every trainable tensor (module parameters, views of the flat buffer), for broadcasts.
  std::vector<torch::Tensor> parameters() const;

  struct StepStats {
    double grad_norm = 0.0;  // of the masked gradient with the L2-SP term, before clipping
    double l2sp = 0.0;  // Σ λ‖θ − θ_base‖² at the parameters the gradient was taken at
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
  // A run of consecutive unmasked segments sharing (decay, λ): elements [begin, end) of the
  // flat buffers, segments [first, last).
  struct Range {
    int64_t begin = 0, end = 0;
    size_t first = 0, last = 0;
    bool decay = false;
    double lambda = 0.0;
  };
  // Each segment's gradient with the parameter's shape: the tensor autograd handed over, or
  // the zeroed flat view when there is none (a parameter the loss did not reach still gets
  // its moments decayed and its weight decay, as with a zero gradient).
  std::vector<torch::Tensor> SegmentGrads();
  // Copies the segment's gradient (zeros when there is none) into its view of the flat
  // buffer (allocated on first use), points .grad at that view and returns it.
  torch::Tensor GatherGrad(Segment& s);
  // One fused AdamW update of a range; `grad_scale` divides the gradients first (clipping).
  void AdamRange(const Range& range, const std::vector<torch::Tensor>& grads, double lr,
                 const std::optional<torch::Tensor>& grad_scale);
  // The reference (unfused) AdamW update of one masked segment: the whole update, decay
  // included, is zeroed outside the mask.
  void AdamMasked(const Segment& s, const torch::Tensor& grad, double lr);

  v1::TrainOptimizer options_;
  std::vector<Segment> segments_;
  std::vector<Range> ranges_;
  torch::Tensor values_, exp_avg_, exp_avg_sq_, scratch_;  // [n] fp32 each
  torch::Tensor grads_;   // [n], only once FlatGrads() or a missing gradient needed it
  torch::Tensor anchor_;  // [n] initial values, only with L2-SP
  int64_t step_ = 0;
};

}  // namespace stemma::engine::train
