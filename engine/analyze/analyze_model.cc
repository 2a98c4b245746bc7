#include "engine/analyze/analyze_model.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <algorithm>
#include <exception>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/eval/device.h"
#include "engine/model/checkpoint.h"
#include "engine/model/config.h"
#include "engine/model/guard.h"

namespace stemma::engine::analyze {
namespace {

using model::TorchGuard;

using model::CausalLM;
using model::DecoderLayerImpl;

absl::StatusOr<torch::ScalarType> ParseDtype(const std::string& name) {
  if (name == "float32") return torch::kFloat32;
  if (name == "bfloat16") return torch::kBFloat16;
  if (name == "float16") return torch::kFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat("dtype: '", name, "' is not one of float32, bfloat16, float16"));
}

// Sets per-layer hooks for the lifetime of the guard and clears them after, so the model is
// left as it was even when a forward throws.
class HookGuard {
 public:
  explicit HookGuard(CausalLM& lm) : lm_(lm) {}
  ~HookGuard() {
    lm_->model->layer_output_hook = nullptr;
    for (const auto& layer : *lm_->model->layers) {
      auto* decoder = layer->as<DecoderLayerImpl>();
      if (decoder->mlp) decoder->mlp->activation_hook = nullptr;
    }
  }

 private:
  CausalLM& lm_;
};

torch::Tensor ToIds(const std::vector<int32_t>& tokens, int64_t begin, int64_t rows,
                    int64_t seq_len, const torch::Device& device) {
  auto ids =
      torch::from_blob(const_cast<int32_t*>(tokens.data()) + begin, {rows, seq_len}, torch::kInt32);
  return ids.to(device, torch::kInt64);  // [rows, seq_len]
}

}  // namespace

struct ModelAnalyzer::State {
  CausalLM lm{nullptr};
  torch::Device device{torch::kCPU};
};

ModelAnalyzer::ModelAnalyzer(std::unique_ptr<State> state) : state_(std::move(state)) {}
ModelAnalyzer::~ModelAnalyzer() = default;

absl::StatusOr<std::unique_ptr<ModelAnalyzer>> ModelAnalyzer::Load(const std::string& dir,
                                                                   const v1::AnalyzeSpec& spec) {
  auto state = std::make_unique<State>();
  ASSIGN_OR_RETURN(torch::ScalarType dtype, ParseDtype(spec.dtype()));
  if (spec.threads() > 0) at::set_num_threads(static_cast<int>(spec.threads()));
  ASSIGN_OR_RETURN(state->device, eval::ResolveDevice(spec.device()));
  model::LoadOptions load;
  load.dtype = dtype;
  load.device = state->device;
  absl::Status status = TorchGuard("loading the model", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(state->lm, model::LoadModel(dir, load));
    state->lm->eval();
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return std::unique_ptr<ModelAnalyzer>(new ModelAnalyzer(std::move(state)));
}

int64_t ModelAnalyzer::num_layers() const { return state_->lm->config().num_hidden_layers; }
int64_t ModelAnalyzer::intermediate_size() const { return state_->lm->config().intermediate_size; }
int64_t ModelAnalyzer::vocab_size() const { return state_->lm->config().vocab_size; }
bool ModelAnalyzer::is_moe() const { return !moe_layers().empty(); }
int64_t ModelAnalyzer::num_experts() const { return state_->lm->config().num_experts; }
int64_t ModelAnalyzer::top_k() const { return state_->lm->config().num_experts_per_tok; }
std::string ModelAnalyzer::model_type() const {
  return std::string(model::ArchName(state_->lm->config().arch));
}

std::vector<int64_t> ModelAnalyzer::moe_layers() const {
  std::vector<int64_t> layers;
  int64_t i = 0;
  for (const auto& layer : *state_->lm->model->layers) {
    if (layer->as<DecoderLayerImpl>()->moe) layers.push_back(i);
    ++i;
  }
  return layers;
}

absl::Status ModelAnalyzer::Profile(const std::vector<int32_t>& tokens,
                                    const ProfileOptions& options, LapeCounts* lape,
                                    RoutingCounts* routing) {
  const std::vector<int64_t> moe = moe_layers();
  if (options.lape && !moe.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("lape: the model (model_type ", model_type(),
                     ") has MoE layers; LAPE profiles the neurons of dense FFN layers"));
  }
  if (options.routing && moe.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "routing: the model (model_type ", model_type(), ") has no MoE layers to analyse"));
  }
  if (tokens.empty()) return absl::InvalidArgumentError("no tokens to profile");
  const int64_t seq_len = std::min<int64_t>(options.seq_len, tokens.size());
  const int64_t windows = static_cast<int64_t>(tokens.size()) / seq_len;
  const int64_t layers = num_layers(), inter = intermediate_size();
  CausalLM& lm = state_->lm;
  return TorchGuard("profiling", [&]() -> absl::Status {
    torch::InferenceMode inference;
    auto count_opts = torch::TensorOptions().dtype(torch::kInt64).device(state_->device);
    torch::Tensor over_zero = torch::zeros({layers, inter}, count_opts);  // [L, I]
    torch::Tensor expert_counts =
        torch::zeros({static_cast<int64_t>(moe.size()), num_experts()}, count_opts);  // [M, E]
    HookGuard guard(lm);
    if (options.lape) {
      int64_t i = 0;
      for (const auto& layer : *lm->model->layers) {
        const int64_t index = i++;
        layer->as<DecoderLayerImpl>()->mlp->activation_hook = [&, index](const torch::Tensor& g) {
          // g [B, T, I] in the compute dtype, compared there (algorithms.md §2.1).
          over_zero[index] += g.gt(options.activation_threshold).reshape({-1, inter}).sum(0);
        };
      }
    }
    for (int64_t done = 0; done < windows; done += options.batch_size) {
      const int64_t rows = std::min(options.batch_size, windows - done);
      auto ids = ToIds(tokens, done * seq_len, rows, seq_len, state_->device);  // [rows, T]
      std::vector<torch::Tensor> router_logits;  // per MoE layer [rows*T, E]
      lm->model->forward(ids, nullptr, options.routing ? &router_logits : nullptr);
      for (size_t m = 0; m < router_logits.size() && options.routing; ++m) {
        // Top-k of the logits is the top-k of the softmax (§4.2).
        // index_add_, not bincount: bincount asks the host for the largest id on a GPU.
        auto chosen = std::get<1>(router_logits[m].topk(top_k(), -1)).reshape({-1});
        expert_counts[m].index_add_(0, chosen, torch::ones_like(chosen));
      }
      if (options.progress) options.progress(done + rows, windows);
    }
    const int64_t used = windows * seq_len;
    if (options.lape && lape != nullptr) {
      auto cpu = over_zero.cpu().contiguous();
      lape->tokens = used;
      lape->over_zero.assign(cpu.data_ptr<int64_t>(), cpu.data_ptr<int64_t>() + cpu.numel());
    }
    if (options.routing && routing != nullptr) {
      auto cpu = expert_counts.cpu().contiguous();
      routing->tokens = used;
      routing->counts.assign(moe.size(), {});
      for (size_t m = 0; m < moe.size(); ++m) {
        const int64_t* row = cpu.data_ptr<int64_t>() + m * num_experts();
        routing->counts[m].assign(row, row + num_experts());
      }
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<AlignmentResult> ModelAnalyzer::Align(
    const std::vector<std::vector<std::vector<int32_t>>>& sentences, int64_t batch_size,
    int64_t skip_first) {
  AlignmentResult result;
  if (sentences.empty()) return absl::InvalidArgumentError("alignment: no sentences");
  const int64_t langs = static_cast<int64_t>(sentences[0].size());
  const int64_t layers = num_layers();
  for (int64_t a = 0; a < langs; ++a) {
    for (int64_t b = a + 1; b < langs; ++b) result.pairs.emplace_back(a, b);
  }
  result.cosine.assign(result.pairs.size(), std::vector<double>(layers, 0.0));
  result.sentences = static_cast<int64_t>(sentences.size());
  CausalLM& lm = state_->lm;
  absl::Status status = TorchGuard("alignment", [&]() -> absl::Status {
    torch::InferenceMode inference;
    HookGuard guard(lm);
    // [pair, layer] float64 sums of the cosines, on the device; copied to the host once.
    auto sums = torch::zeros({static_cast<int64_t>(result.pairs.size()), layers},
                             torch::TensorOptions(torch::kFloat64).device(state_->device));
    const int64_t n = static_cast<int64_t>(sentences.size());
    for (int64_t start = 0; start < n; start += batch_size) {
      const int64_t rows = std::min(batch_size, n - start);
      // means[k][l]: [rows, H] fp32, the mean residual of each sentence in language k.
      std::vector<std::vector<torch::Tensor>> means(langs, std::vector<torch::Tensor>(layers));
      for (int64_t k = 0; k < langs; ++k) {
        int64_t longest = 0;
        for (int64_t r = 0; r < rows; ++r) {
          longest = std::max<int64_t>(longest, sentences[start + r][k].size());
        }
        auto ids = torch::zeros({rows, longest}, torch::kInt64);     // right-padded with 0
        auto mask = torch::zeros({rows, longest}, torch::kFloat32);  // 1 where averaged
        auto id_at = ids.accessor<int64_t, 2>();
        auto mask_at = mask.accessor<float, 2>();
        for (int64_t r = 0; r < rows; ++r) {
          const auto& s = sentences[start + r][k];
          for (int64_t t = 0; t < static_cast<int64_t>(s.size()); ++t) {
            id_at[r][t] = s[t];
            if (t >= skip_first) mask_at[r][t] = 1.0f;
          }
        }
        ids = ids.to(state_->device);
        mask = mask.to(state_->device).unsqueeze(-1);  // [rows, T, 1]
        auto counts = mask.sum(1).clamp_min(1.0);      // [rows, 1]
        lm->model->layer_output_hook = [&, k](int64_t l, const torch::Tensor& h) {
          means[k][l] = (h.to(torch::kFloat32) * mask).sum(1) / counts;  // [rows, H]
        };
        lm->model->forward(ids, nullptr, nullptr);
      }
      for (size_t p = 0; p < result.pairs.size(); ++p) {
        const auto [a, b] = result.pairs[p];
        for (int64_t l = 0; l < layers; ++l) {
          auto cos = torch::nn::functional::cosine_similarity(
              means[a][l], means[b][l],
              torch::nn::functional::CosineSimilarityFuncOptions().dim(1));
          sums[p][l] += cos.sum().to(torch::kFloat64);  // as before: a float32 sum
        }
      }
    }
    auto host = sums.cpu();
    for (size_t p = 0; p < result.pairs.size(); ++p) {
      for (int64_t l = 0; l < layers; ++l) result.cosine[p][l] = host[p][l].item<double>();
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  for (auto& per_layer : result.cosine) {
    for (double& c : per_layer) c /= static_cast<double>(result.sentences);
  }
  return result;
}

}  // namespace stemma::engine::analyze
