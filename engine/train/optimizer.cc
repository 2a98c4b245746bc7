#include "engine/train/optimizer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"

namespace stemma::engine::train {
namespace {

// Decayed segments first, then plain ones grouped by λ, then masked ones: weight decay and
// L2-SP then cover contiguous ranges of the flat buffers.
int GroupOf(const ParamPlan& plan) {
  if (plan.mask != ParamPlan::Mask::kNone) return 2;
  return plan.weight_decay ? 0 : 1;
}

torch::Tensor BuildMask(const ParamPlan& plan, const torch::Tensor& param) {
  auto mask = torch::zeros_like(param);
  auto index = torch::tensor(plan.indices, torch::dtype(torch::kLong).device(param.device()));
  mask.index_fill_(plan.mask == ParamPlan::Mask::kRows ? 0 : 1, index, 1.0);
  return mask;
}

}  // namespace

FlatAdamW::FlatAdamW(const std::vector<ParamPlan>& plans, const std::vector<torch::Tensor>& params,
                     const v1::TrainOptimizer& options)
    : options_(options) {
  torch::NoGradGuard no_grad;
  std::vector<size_t> order;
  for (size_t i = 0; i < plans.size(); ++i) {
    if (plans[i].trainable) {
      order.push_back(i);
    } else {
      params[i].set_requires_grad(false);
    }
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::make_pair(GroupOf(plans[a]), plans[a].l2sp_lambda) <
           std::make_pair(GroupOf(plans[b]), plans[b].l2sp_lambda);
  });
  int64_t total = 0;
  for (size_t i : order) {
    TORCH_CHECK(params[i].scalar_type() == torch::kFloat32, "trainable parameter ", plans[i].name,
                " must be float32");
    Segment s;
    s.name = plans[i].name;
    s.param = params[i];
    s.offset = total;
    s.numel = params[i].numel();
    s.decay = plans[i].weight_decay && options.weight_decay() > 0;
    s.lambda = plans[i].l2sp_lambda;
    if (plans[i].mask != ParamPlan::Mask::kNone) s.mask = BuildMask(plans[i], params[i]);
    total += s.numel;
    segments_.push_back(std::move(s));
  }
  const auto opts =
      torch::TensorOptions()
          .dtype(torch::kFloat32)
          .device(segments_.empty() ? torch::Device(torch::kCPU) : segments_[0].param.device());
  values_ = torch::empty({total}, opts);
  exp_avg_ = torch::zeros({total}, opts);
  exp_avg_sq_ = torch::zeros({total}, opts);
  scratch_ = torch::empty({total}, opts);
  bool any_lambda = false;
  for (Segment& s : segments_) {
    auto value = values_.narrow(0, s.offset, s.numel).view(s.param.sizes());
    value.copy_(s.param);
    // The module keeps its parameter object (names, hooks) but now points into values_.
    s.param.set_data(value);
    s.param.set_requires_grad(true);
    any_lambda = any_lambda || s.lambda > 0;
  }
  for (size_t i = 0; i < segments_.size(); ++i) {
    const Segment& s = segments_[i];
    if (s.mask.defined()) continue;
    if (!ranges_.empty() && ranges_.back().end == s.offset && ranges_.back().decay == s.decay &&
        ranges_.back().lambda == s.lambda) {
      ranges_.back().end = s.offset + s.numel;
      ranges_.back().last = i + 1;
    } else {
      ranges_.push_back(Range{s.offset, s.offset + s.numel, i, i + 1, s.decay, s.lambda});
    }
  }
  if (any_lambda) anchor_ = values_.clone();
}

void FlatAdamW::ZeroGrad() {
  for (Segment& s : segments_) s.param.mutable_grad() = torch::Tensor();
}

torch::Tensor FlatAdamW::GatherGrad(Segment& s) {
  // Allocated on first use: a single process whose gradients all arrive never needs it.
  if (!grads_.defined()) grads_ = torch::zeros({values_.numel()}, values_.options());
  auto view = grads_.narrow(0, s.offset, s.numel).view(s.param.sizes());
  const auto& g = s.param.grad();
  if (!g.defined()) {
    view.zero_();
  } else if (!g.is_same(view)) {
    view.copy_(g);
  }
  s.param.mutable_grad() = view;
  return view;
}

torch::Tensor& FlatAdamW::FlatGrads() {
  torch::NoGradGuard no_grad;
  for (Segment& s : segments_) GatherGrad(s);
  return grads_;
}

std::vector<torch::Tensor> FlatAdamW::SegmentGrads() {
  std::vector<torch::Tensor> grads;
  grads.reserve(segments_.size());
  for (Segment& s : segments_) {
    const auto& g = s.param.grad();
    const bool usable = g.defined() && g.is_contiguous() && g.sizes() == s.param.sizes();
    grads.push_back(usable ? g : GatherGrad(s));
  }
  return grads;
}

std::vector<torch::Tensor> FlatAdamW::parameters() const {
  std::vector<torch::Tensor> out;
  for (const Segment& s : segments_) out.push_back(s.param);
  return out;
}

FlatAdamW::StepStats FlatAdamW::Step(double lr, double max_norm) {
  torch::NoGradGuard no_grad;
  StepStats stats;
  std::vector<torch::Tensor> grads = SegmentGrads();
  // L2-SP: penalty and its gradient 2λ(θ − θ_base), over flat elements [begin, end).
  auto l2sp_diff = [&](int64_t begin, int64_t end, double lambda) {
    auto diff = scratch_.narrow(0, begin, end - begin);
    at::sub_out(diff, values_.narrow(0, begin, end - begin), anchor_.narrow(0, begin, end - begin));
    stats.l2sp += lambda * at::dot(diff, diff).item<double>();
    return diff;
  };
  for (const Range& r : ranges_) {
    if (r.lambda <= 0) continue;
    auto diff = l2sp_diff(r.begin, r.end, r.lambda);
    for (size_t i = r.first; i < r.last; ++i) {
      const Segment& s = segments_[i];
      grads[i].view(-1).add_(diff.narrow(0, s.offset - r.begin, s.numel), 2.0 * r.lambda);
    }
  }
  for (size_t i = 0; i < segments_.size(); ++i) {
    const Segment& s = segments_[i];
    if (!s.mask.defined()) continue;
    if (s.lambda > 0)
      grads[i].view(-1).add_(l2sp_diff(s.offset, s.offset + s.numel, s.lambda), 2.0 * s.lambda);
    grads[i].mul_(s.mask);
  }
  // The total norm as torch.nn.utils.clip_grad_norm_ takes it: per-tensor norms, then theirs.
  if (!grads.empty())
    stats.grad_norm = at::stack(at::_foreach_norm(grads, 2)).norm().item<double>();
  // torch's clip_grad_norm_ coefficient. The fused update divides the unmasked ranges'
  // gradients by 1/clip itself (its grad_scale), which saves a pass; masked segments are
  // scaled here.
  double clip = 1.0;
  if (max_norm > 0 && stats.grad_norm > max_norm) clip = max_norm / (stats.grad_norm + 1e-6);
  ++step_;
  std::optional<torch::Tensor> grad_scale;
  if (clip != 1.0) grad_scale = torch::full({}, 1.0 / clip, values_.options());
  for (const Range& r : ranges_) AdamRange(r, grads, lr, grad_scale);
  for (size_t i = 0; i < segments_.size(); ++i) {
    if (!segments_[i].mask.defined()) continue;
    if (clip != 1.0) grads[i].mul_(clip);
    AdamMasked(segments_[i], grads[i], lr);
  }
  return stats;
}

void FlatAdamW::AdamRange(const Range& range, const std::vector<torch::Tensor>& grads, double lr,
                          const std::optional<torch::Tensor>& grad_scale) {
  // torch.optim.AdamW(fused=True): one vectorised, parallel pass over p, g, m, v of each
  // tensor instead of eight elementwise passes (they were ~10 % of a CPU step, memory-bound).
  // It reads the step count from `state_steps` (already incremented, as the Python optimizer
  // does), one per tensor.
  std::vector<torch::Tensor> p, g, m, v, steps;
  auto step = torch::full({}, static_cast<double>(step_), values_.options());
  for (size_t i = range.first; i < range.last; ++i) {
    const Segment& s = segments_[i];
    p.push_back(s.param);
    g.push_back(grads[i]);
    m.push_back(exp_avg_.narrow(0, s.offset, s.numel).view(s.param.sizes()));
    v.push_back(exp_avg_sq_.narrow(0, s.offset, s.numel).view(s.param.sizes()));
    steps.push_back(step);
  }
  at::_fused_adamw_(p, g, m, v, {}, steps, lr, options_.betas(0), options_.betas(1),
                    range.decay ? options_.weight_decay() : 0.0, options_.eps(), /*amsgrad=*/false,
                    /*maximize=*/false, grad_scale);
}

void FlatAdamW::AdamMasked(const Segment& s, const torch::Tensor& grad, double lr) {
  auto p = values_.narrow(0, s.offset, s.numel), g = grad.view(-1);
  auto m = exp_avg_.narrow(0, s.offset, s.numel), v = exp_avg_sq_.narrow(0, s.offset, s.numel);
  auto tmp = scratch_.narrow(0, s.offset, s.numel);
  auto mask = s.mask.view(-1);
  const double beta1 = options_.betas(0), beta2 = options_.betas(1);
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step_));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(step_));
  const double step_size = lr / bias_correction1;
  const double decay_factor = s.decay ? lr * options_.weight_decay() : 0.0;
  // The reference formulation of torch.optim.AdamW, single tensor: moments, denom =
  // sqrt(v)/sqrt(bc2) + eps.
  m.lerp_(g, 1.0 - beta1);
  v.mul_(beta2).addcmul_(g, g, 1.0 - beta2);
  at::sqrt_out(tmp, v);
  tmp.div_(std::sqrt(bias_correction2)).add_(options_.eps());
  // Build the whole update, decay included, and zero it outside the mask, so those elements
  // are left exactly as they were (their moments are 0 because the gradient was).
  at::div_out(tmp, m, tmp);
  tmp.mul_(step_size);
  if (decay_factor > 0) tmp.add_(p, decay_factor);
  tmp.mul_(mask);
  p.sub_(tmp);
}

std::vector<std::pair<std::string, torch::Tensor>> FlatAdamW::StateTensors() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const Segment& s : segments_) {
    out.emplace_back("exp_avg." + s.name,
                     exp_avg_.narrow(0, s.offset, s.numel).view(s.param.sizes()));
    out.emplace_back("exp_avg_sq." + s.name,
                     exp_avg_sq_.narrow(0, s.offset, s.numel).view(s.param.sizes()));
  }
  return out;
}

absl::Status FlatAdamW::RestoreState(
    const std::vector<std::pair<std::string, torch::Tensor>>& tensors, int64_t step) {
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> by_name(tensors.begin(), tensors.end());
  if (by_name.size() != 2 * segments_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer state has ", by_name.size(), " tensors, this run trains ",
                     segments_.size(), " parameters (", 2 * segments_.size(),
                     " expected): was the checkpoint written with another strategy?"));
  }
  for (const auto& [name, target] : StateTensors()) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer state lacks tensor '", name, "'"));
    }
    if (it->second.sizes() != target.sizes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer state tensor '", name, "' has the wrong shape"));
    }
    target.copy_(it->second);
  }
  step_ = step;
  return absl::OkStatus();
}

}  // namespace stemma::engine::train
