#include "engine/model/loss.h"

#include <torch/autograd.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/functional/loss.h>

#include <algorithm>

#include "engine/model/checkpointing.h"

namespace stemma::engine::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Inputs: hidden [N, H], weight [V, H], targets [N] (no gradient). Output: the fp32 sum.
class ChunkedCrossEntropyFunction : public torch::autograd::Function<ChunkedCrossEntropyFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& targets,
                               int64_t chunk, std::optional<double> softcap) {
    const auto autocast = AutocastState::Current(hidden.device().type());
    ctx->save_for_backward({hidden, weight, targets});
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["softcap"] = softcap ? c10::IValue(*softcap) : c10::IValue();
    ctx->saved_data["autocast"] = autocast.enabled;
    ctx->saved_data["autocast_dtype"] = static_cast<int64_t>(autocast.dtype);
    const int64_t n = hidden.size(0);
    torch::Tensor total;
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t len = std::min(chunk, n - start);
      auto ce = SummedCrossEntropy(OutputLogits(hidden.narrow(0, start, len), weight, softcap),
                                   targets.narrow(0, start, len));
      total = total.defined() ? total + ce : ce;
    }
    return total;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& hidden = saved[0];
    const auto& weight = saved[1];
    const auto& targets = saved[2];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    std::optional<double> softcap;
    if (!ctx->saved_data["softcap"].isNone()) softcap = ctx->saved_data["softcap"].toDouble();
    AutocastState autocast;
    autocast.device = hidden.device().type();
    autocast.enabled = ctx->saved_data["autocast"].toBool();
    autocast.dtype = static_cast<at::ScalarType>(ctx->saved_data["autocast_dtype"].toInt());
    const bool hidden_grad = ctx->needs_input_grad(0), weight_grad = ctx->needs_input_grad(1);
    torch::Tensor d_hidden, d_weight;
    if (hidden_grad) d_hidden = torch::empty_like(hidden);
    const int64_t n = hidden.size(0);
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t len = std::min(chunk, n - start);
      torch::AutoGradMode grad_mode(true);
      auto h = hidden.narrow(0, start, len).detach().requires_grad_(hidden_grad);
      auto w = weight.detach().requires_grad_(weight_grad);
      torch::Tensor ce;
      {
        AutocastRestore restore(autocast);
        ce = SummedCrossEntropy(OutputLogits(h, w, softcap), targets.narrow(0, start, len));
      }
      variable_list inputs;
      if (hidden_grad) inputs.push_back(h);
      if (weight_grad) inputs.push_back(w);
      auto g = torch::autograd::grad({ce}, inputs, {grads[0]});
      size_t next = 0;
      if (hidden_grad) d_hidden.narrow(0, start, len).copy_(g[next++]);
      if (weight_grad) {
        if (d_weight.defined()) {
          d_weight.add_(g[next]);
        } else {
          d_weight = g[next];
        }
      }
    }
    return {d_hidden, d_weight, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor OutputLogits(const torch::Tensor& hidden, const torch::Tensor& weight,
                           std::optional<double> softcap) {
  auto logits = torch::nn::functional::linear(hidden, weight);  // [..., V]
  if (softcap) logits = torch::tanh(logits / *softcap) * *softcap;
  return logits;
}

torch::Tensor SummedCrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32), targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
}

torch::Tensor ChunkedCrossEntropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                  const torch::Tensor& targets, int64_t chunk_tokens,
                                  std::optional<double> softcap) {
  const int64_t rows = hidden.numel() / std::max<int64_t>(1, hidden.size(-1));
  if (chunk_tokens <= 0 || chunk_tokens >= rows) {
    return SummedCrossEntropy(OutputLogits(hidden, weight, softcap), targets);
  }
  return ChunkedCrossEntropyFunction::apply(hidden.reshape({rows, hidden.size(-1)}), weight,
                                            targets.reshape({-1}), chunk_tokens, softcap);
}

}  // namespace stemma::engine::model
