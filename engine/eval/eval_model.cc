#include "engine/eval/eval_model.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/eval/device.h"
#include "engine/model/checkpoint.h"
#include "engine/model/guard.h"

namespace stemma::engine::eval {
namespace {

using model::TorchGuard;

// Upper bound on the float32 logits alive at once (32 MiB): positions are chunked so that
// batch × chunk × vocab stays below it.
constexpr int64_t kMaxLogitElements = int64_t{8} << 20;

// ids -> [len] int64 on `device`.
torch::Tensor IdsTensor(std::span<const int32_t> ids, const torch::Device& device) {
  std::vector<int64_t> wide(ids.begin(), ids.end());
  return torch::tensor(wide, torch::kInt64).to(device);
}

}  // namespace

struct EvalModel::Impl {
  model::CausalLM lm{nullptr};
  torch::Device device{torch::kCPU};

  // hidden [B, T, H] -> logits [B, T, V] in float32 (final softcapping applied).
  torch::Tensor Logits(const torch::Tensor& hidden) {
    auto logits = torch::nn::functional::linear(hidden, lm->output_weight()).to(torch::kFloat32);
    if (const auto cap = lm->config().final_logit_softcapping) {
      logits = torch::tanh(logits / *cap) * *cap;
    }
    return logits;
  }

  // Σ over positions of log p(target) for hidden [B, T, H] and targets [B, T] -> [B] float64,
  // in chunks of positions so only [B, chunk, V] logits exist at a time.
  torch::Tensor SumLogProbs(const torch::Tensor& hidden, const torch::Tensor& targets) {
    const int64_t b = hidden.size(0), t = hidden.size(1);
    const int64_t chunk = std::max<int64_t>(1, kMaxLogitElements / (b * lm->config().vocab_size));
    auto total = torch::zeros({b}, hidden.options().dtype(torch::kFloat64));
    for (int64_t start = 0; start < t; start += chunk) {
      const int64_t len = std::min(chunk, t - start);
      auto logits = Logits(hidden.narrow(1, start, len));         // [B, c, V]
      auto target = targets.narrow(1, start, len).unsqueeze(-1);  // [B, c, 1]
      auto picked = logits.gather(-1, target).squeeze(-1);        // [B, c]
      auto log_probs = picked - torch::logsumexp(logits, -1);     // [B, c]
      total += log_probs.to(torch::kFloat64).sum(1);
    }
    return total;
  }

  torch::Tensor Hidden(const torch::Tensor& ids, model::KVCache* cache) {
    return lm->model(ids, cache, nullptr);  // [B, T, H]
  }
};

EvalModel::EvalModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EvalModel::~EvalModel() = default;

absl::StatusOr<std::unique_ptr<EvalModel>> EvalModel::Load(const std::string& dir,
                                                           const EvalModelOptions& options) {
  model::LoadOptions load;
  if (options.dtype == "bfloat16") {
    load.dtype = torch::kBFloat16;
  } else if (options.dtype != "float32") {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype: '", options.dtype, "' is not float32 or bfloat16"));
  }
  if (options.threads > 0) at::set_num_threads(options.threads);
  auto impl = std::make_unique<Impl>();
  ASSIGN_OR_RETURN(impl->device, ResolveDevice(options.device));
  load.device = impl->device;
  ASSIGN_OR_RETURN(impl->lm,
                   TorchGuard("loading the model", [&] { return model::LoadModel(dir, load); }));
  impl->lm->eval();
  return std::unique_ptr<EvalModel>(new EvalModel(std::move(impl)));
}

absl::Status EvalModel::CheckDevice(const std::string& device) {
  return ResolveDevice(device).status();
}

int64_t EvalModel::vocab_size() const { return impl_->lm->config().vocab_size; }
int64_t EvalModel::max_positions() const { return impl_->lm->config().max_position_embeddings; }
std::string EvalModel::device() const { return impl_->device.str(); }

absl::StatusOr<std::vector<WindowLoss>> EvalModel::WindowLosses(
    const std::vector<std::vector<int32_t>>& windows) {
  if (windows.empty()) return std::vector<WindowLoss>{};
  const int64_t t = static_cast<int64_t>(windows[0].size());
  for (const auto& w : windows) {
    if (static_cast<int64_t>(w.size()) != t || t < 2) {
      return absl::InvalidArgumentError("perplexity windows must share one length >= 2");
    }
  }
  return TorchGuard("perplexity forward", [&]() -> absl::StatusOr<std::vector<WindowLoss>> {
    torch::InferenceMode inference;
    std::vector<int64_t> flat;
    flat.reserve(windows.size() * t);
    for (const auto& w : windows) flat.insert(flat.end(), w.begin(), w.end());
    auto ids = torch::tensor(flat, torch::kInt64)
                   .view({static_cast<int64_t>(windows.size()), t})
                   .to(impl_->device);
    auto hidden = impl_->Hidden(ids, nullptr).narrow(1, 0, t - 1);  // [B, T-1, H]
    auto log_probs = impl_->SumLogProbs(hidden, ids.narrow(1, 1, t - 1)).cpu();
    std::vector<WindowLoss> out(windows.size());
    auto accessor = log_probs.accessor<double, 1>();
    for (size_t i = 0; i < windows.size(); ++i) out[i] = {-accessor[i], t - 1};
    return out;
  });
}

absl::StatusOr<std::vector<double>> EvalModel::ContinuationLogLikelihoods(
    std::span<const int32_t> context, const std::vector<std::vector<int32_t>>& continuations,
    int64_t max_length) {
  if (max_length <= 0) max_length = max_positions();
  // Each row: (context + continuation)[:-1], left-truncated; the continuation's tokens are
  // predicted by its last len(continuation) positions.
  std::vector<std::vector<int32_t>> rows;
  int64_t longest = 0;
  for (const auto& cont : continuations) {
    if (cont.empty()) return absl::InvalidArgumentError("a choice encodes to no tokens");
    std::vector<int32_t> row(context.begin(), context.end());
    row.insert(row.end(), cont.begin(), cont.end() - 1);
    if (static_cast<int64_t>(row.size()) > max_length) {
      row.erase(row.begin(), row.end() - max_length);
    }
    if (row.size() < cont.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a choice of ", cont.size(), " tokens does not fit max_length ", max_length));
    }
    longest = std::max<int64_t>(longest, row.size());
    rows.push_back(std::move(row));
  }
  return TorchGuard("multiple-choice forward", [&]() -> absl::StatusOr<std::vector<double>> {
    torch::InferenceMode inference;
    const int64_t b = static_cast<int64_t>(rows.size());
    // Right padding is invisible to the real positions under the causal mask.
    auto ids = torch::zeros({b, longest}, torch::kInt64);
    for (int64_t i = 0; i < b; ++i) {
      ids[i].narrow(0, 0, rows[i].size()).copy_(IdsTensor(rows[i], torch::kCPU));
    }
    auto hidden = impl_->Hidden(ids.to(impl_->device), nullptr);  // [B, T, H]
    std::vector<torch::Tensor> sums;                              // [1] each, on the device
    for (int64_t i = 0; i < b; ++i) {
      const int64_t n = static_cast<int64_t>(continuations[i].size());
      const int64_t start = static_cast<int64_t>(rows[i].size()) - n;
      auto h = hidden[i].narrow(0, start, n).unsqueeze(0);                     // [1, n, H]
      auto targets = IdsTensor(continuations[i], impl_->device).unsqueeze(0);  // [1, n]
      sums.push_back(impl_->SumLogProbs(h, targets));
    }
    auto all = torch::cat(sums).cpu();  // [B] float64: one copy to the host
    return std::vector<double>(all.data_ptr<double>(), all.data_ptr<double>() + b);
  });
}

absl::StatusOr<std::vector<int32_t>> EvalModel::Generate(
    std::span<const int32_t> prompt, int64_t max_new_tokens,
    const std::function<bool(std::span<const int32_t>)>& stop) {
  if (prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  return TorchGuard("generation", [&]() -> absl::StatusOr<std::vector<int32_t>> {
    torch::InferenceMode inference;
    model::KVCache cache;
    std::vector<int32_t> generated;
    auto hidden =
        impl_->Hidden(IdsTensor(prompt, impl_->device).unsqueeze(0), &cache);  // [1, T, H]
    while (static_cast<int64_t>(generated.size()) < max_new_tokens) {
      auto last = hidden.narrow(1, hidden.size(1) - 1, 1);  // [1, 1, H]
      const auto next = impl_->Logits(last).argmax(-1).item<int64_t>();
      generated.push_back(static_cast<int32_t>(next));
      if (stop(generated) || static_cast<int64_t>(generated.size()) == max_new_tokens) break;
      hidden = impl_->Hidden(
          torch::full({1, 1}, next, torch::TensorOptions(torch::kInt64).device(impl_->device)),
          &cache);
    }
    return generated;
  });
}

}  // namespace stemma::engine::eval
