#include "engine/model/checkpointing.h"

#include <ATen/autocast_mode.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>

#include <utility>

#include "engine/model/modules.h"

namespace stemma::engine::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the backward needs besides the saved input: kept in the autograd context as a
// capsule (saved_data holds IValues only).
struct LayerCall : torch::CustomClassHolder {
  std::shared_ptr<DecoderLayerImpl> layer;
  int index = 0;
  torch::Tensor cos, sin;  // [1, 1, T, hd]; no gradient
  std::shared_ptr<const LayerHooks> hooks;
  AutocastState autocast;
  bool moe = false;

  void Gather() const {
    if (hooks && hooks->gather) hooks->gather(index);
  }
  void Release() const {
    if (hooks && hooks->release) hooks->release(index);
  }
  void GradsReady() const {
    if (hooks && hooks->grads_ready) hooks->grads_ready(index);
  }
  // h [B, T, H] -> {out [B, T, H]} or, for an MoE layer, {out, router logits [N, E]}.
  variable_list Run(const torch::Tensor& h) const {
    std::vector<torch::Tensor> logits;
    auto out = layer->forward(h, cos, sin, /*kv=*/nullptr, moe ? &logits : nullptr);
    variable_list outputs{out};
    if (moe) outputs.push_back(logits.at(0));
    return outputs;
  }
};

// Inputs: the hidden state and the layer's trainable parameters. The parameters are inputs
// only so that autograd knows the output needs a gradient when they do (a trained layer
// whose input needs none); their gradients reach .grad through the recomputed graph, so the
// function returns none for them.
class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& h, at::TensorList params,
                               c10::intrusive_ptr<LayerCall> call) {
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({h});
    ctx->saved_data["num_params"] = static_cast<int64_t>(params.size());
    call->Gather();
    variable_list outputs = call->Run(h);  // grad mode is off here (Function::apply)
    call->Release();
    ctx->saved_data["call"] =
        c10::IValue::make_capsule(c10::intrusive_ptr<torch::CustomClassHolder>(std::move(call)));
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto call = c10::static_intrusive_pointer_cast<LayerCall>(ctx->saved_data["call"].toCapsule());
    const torch::Tensor h = ctx->get_saved_variables().at(0);
    const auto num_params = static_cast<size_t>(ctx->saved_data["num_params"].toInt());
    const bool input_grad = ctx->needs_input_grad(0);
    auto x = h.detach();
    x.requires_grad_(input_grad);
    call->Gather();
    {
      torch::AutoGradMode grad_mode(true);
      variable_list outputs;
      {
        AutocastRestore autocast(call->autocast);
        outputs = call->Run(x);
      }
      // Backprop from the outputs that received a gradient and are part of the graph (the
      // router logits get none when no aux loss is used).
      variable_list roots, root_grads;
      for (size_t i = 0; i < outputs.size() && i < grads.size(); ++i) {
        if (grads[i].defined() && outputs[i].requires_grad()) {
          roots.push_back(outputs[i]);
          root_grads.push_back(grads[i]);
        }
      }
      if (!roots.empty()) torch::autograd::backward(roots, root_grads);
    }
    call->GradsReady();
    call->Release();
    variable_list result(2 + num_params);  // h, each parameter, the call
    if (input_grad) result[0] = x.grad();
    return result;
  }
};

}  // namespace

AutocastState AutocastState::Current(at::DeviceType device) {
  AutocastState state;
  state.device = device;
  state.enabled = at::autocast::is_autocast_enabled(device);
  state.dtype = at::autocast::get_autocast_dtype(device);
  return state;
}

AutocastRestore::AutocastRestore(const AutocastState& state)
    : state_(state), previous_(AutocastState::Current(state.device)) {
  at::autocast::set_autocast_dtype(state_.device, state_.dtype);
  at::autocast::set_autocast_enabled(state_.device, state_.enabled);
}

AutocastRestore::~AutocastRestore() {
  at::autocast::set_autocast_enabled(previous_.device, previous_.enabled);
  at::autocast::set_autocast_dtype(previous_.device, previous_.dtype);
  // bf16 copies of weights made by the recompute must not outlive it.
  if (state_.enabled && !previous_.enabled) at::autocast::clear_cache();
}

torch::Tensor CheckpointedLayer(const std::shared_ptr<DecoderLayerImpl>& layer, int index,
                                const torch::Tensor& h, const torch::Tensor& cos,
                                const torch::Tensor& sin, std::shared_ptr<const LayerHooks> hooks,
                                std::vector<torch::Tensor>* router_logits) {
  auto call = c10::make_intrusive<LayerCall>();
  call->layer = layer;
  call->index = index;
  call->cos = cos;
  call->sin = sin;
  call->hooks = std::move(hooks);
  call->autocast = AutocastState::Current(h.device().type());
  call->moe = static_cast<bool>(layer->moe);
  std::vector<torch::Tensor> params;
  for (const auto& p : layer->parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  auto outputs = CheckpointFunction::apply(h, at::TensorList(params), call);
  if (call->moe && router_logits != nullptr) router_logits->push_back(outputs.at(1));
  return outputs.at(0);
}

}  // namespace stemma::engine::model
