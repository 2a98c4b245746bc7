#include "engine/model/causal_lm.h"

#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <utility>

#include "engine/model/loss.h"
#include "engine/model/weightless.h"

namespace stemma::engine::model {

// ---- DecoderModel ----

DecoderModelImpl::DecoderModelImpl(const ModelConfig& config)
    : config_(config),
      rope_(config.rope, config.head_dim),
      rope_local_(config.rope_local, config.head_dim) {
  embed_tokens =
      register_module("embed_tokens", NewEmbedding(config.vocab_size, config.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    layers->push_back(DecoderLayer(config, i));
  }
  norm =
      register_module("norm", RMSNorm(config.hidden_size, config.rms_norm_eps, config.gemma_norms));
}

torch::Tensor DecoderModelImpl::forward(const torch::Tensor& input_ids, KVCache* cache,
                                        std::vector<torch::Tensor>* router_logits) {
  const int64_t t = input_ids.size(1);
  const int64_t past = cache != nullptr ? cache->length() : 0;
  if (cache != nullptr) cache->layers.resize(layers->size());

  auto h = embed_tokens(input_ids);  // [B, T, H]
  if (config_.scale_embeddings) {
    // Gemma: times sqrt(hidden), rounded to the activation dtype as transformers does.
    const auto scale = static_cast<float>(std::sqrt(static_cast<double>(config_.hidden_size)));
    h = h * torch::scalar_tensor(scale, h.options());
  }
  auto positions =
      torch::arange(past, past + t, torch::TensorOptions().dtype(torch::kInt64).device(h.device()));
  auto [cos, sin] = rope_.Tables(positions, h.scalar_type());  // [1, 1, T, hd]
  auto [cos_local, sin_local] = rope_local_.Tables(positions, h.scalar_type());

  for (size_t i = 0; i < layers->size(); ++i) {
    if (layers[i]->as<DecoderLayerImpl>()->sliding()) {
      h = RunLayer(i, h, cos_local, sin_local, cache, router_logits);
    } else {
      h = RunLayer(i, h, cos, sin, cache, router_logits);
    }
    if (layer_output_hook) layer_output_hook(static_cast<int64_t>(i), h);
  }
  return norm(h);  // [B, T, H]
}

torch::Tensor DecoderModelImpl::RunLayer(size_t i, const torch::Tensor& h, const torch::Tensor& cos,
                                         const torch::Tensor& sin, KVCache* cache,
                                         std::vector<torch::Tensor>* router_logits) {
  const int index = static_cast<int>(i);
  const bool recorded = torch::GradMode::is_enabled() && cache == nullptr;
  const bool every_nth = checkpoint_every_ > 0 && index % checkpoint_every_ == 0;
  if (recorded && (hooks_ || every_nth)) {
    return CheckpointedLayer(layers->ptr<DecoderLayerImpl>(i), index, h, cos, sin, hooks_,
                             router_logits);
  }
  if (hooks_ && hooks_->gather) hooks_->gather(index);
  LayerKV* kv = cache != nullptr ? &cache->layers[i] : nullptr;
  auto out = layers[i]->as<DecoderLayerImpl>()->forward(h, cos, sin, kv, router_logits);
  if (hooks_ && hooks_->release) hooks_->release(index);
  return out;
}

// ---- CausalLM ----

CausalLMImpl::CausalLMImpl(ModelConfig config) : config_(std::move(config)) {
  model = register_module("model", DecoderModel(config_));
  if (!config_.tie_word_embeddings) {
    lm_head = register_module("lm_head",
                              NewLinear(config_.hidden_size, config_.vocab_size, /*bias=*/false));
  }
}

torch::Tensor CausalLMImpl::output_weight() {
  return lm_head ? lm_head->weight : model->embed_tokens->weight;
}

torch::Tensor CausalLMImpl::Hidden(const torch::Tensor& input_ids, KVCache* cache,
                                   ForwardOutput* out) {
  auto h = model(input_ids, cache, config_.is_moe() ? &out->router_logits : nullptr);  // [B,T,H]
  if (config_.is_moe()) {
    out->load_balancing_loss = LoadBalancingLoss(out->router_logits, config_.num_experts_per_tok);
    out->router_z_loss = RouterZLoss(out->router_logits);
  }
  return h;
}

ForwardOutput CausalLMImpl::forward(const torch::Tensor& input_ids, KVCache* cache) {
  ForwardOutput out;
  auto h = Hidden(input_ids, cache, &out);
  out.logits = OutputLogits(h, output_weight(), config_.final_logit_softcapping);  // [B,T,V]
  return out;
}

ForwardOutput CausalLMImpl::ForwardLoss(const torch::Tensor& input_ids,
                                        const torch::Tensor& targets, int64_t loss_chunk_tokens) {
  ForwardOutput out;
  auto h = Hidden(input_ids, /*cache=*/nullptr, &out);
  out.ce_sum = ChunkedCrossEntropy(h, output_weight(), targets, loss_chunk_tokens,
                                   config_.final_logit_softcapping);
  return out;
}

void CausalLMImpl::InitWeights(uint64_t seed) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  double std = 0.02;
  if (config_.raw.contains("initializer_range") && config_.raw["initializer_range"].is_number()) {
    std = config_.raw["initializer_range"].get<double>();
  }
  // Walk modules in registration order so a seed always gives the same weights.
  for (const auto& item : named_modules()) {
    torch::nn::Module* m = item.value().get();
    if (auto* linear = m->as<torch::nn::LinearImpl>()) {
      linear->weight.normal_(0.0, std);
      if (linear->bias.defined()) linear->bias.zero_();
    } else if (auto* embedding = m->as<torch::nn::EmbeddingImpl>()) {
      embedding->weight.normal_(0.0, std);
    } else if (auto* norm = m->as<RMSNormImpl>()) {
      norm->ResetToIdentity();
    }
  }
}

// ---- Generation ----

torch::Tensor GreedyGenerate(CausalLM& lm, const torch::Tensor& prompt, int64_t max_new_tokens) {
  torch::NoGradGuard no_grad;
  KVCache cache;
  auto tokens = prompt;                              // [1, T]
  auto logits = lm->forward(prompt, &cache).logits;  // [1, T, V]
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    auto next = logits.select(1, logits.size(1) - 1).argmax(-1, /*keepdim=*/true);  // [1, 1]
    tokens = torch::cat({tokens, next}, 1);
    if (step + 1 == max_new_tokens) break;
    logits = lm->forward(next, &cache).logits;  // [1, 1, V]
  }
  return tokens;
}

// ---- MoE losses ----

namespace {

// [N, E] logits -> {probs [N, E] fp32, counts [E] fp32: tokens whose top-k includes expert i}
std::pair<torch::Tensor, torch::Tensor> RouterStats(const torch::Tensor& logits, int64_t top_k) {
  auto probs = torch::softmax(logits.to(torch::kFloat32), -1);
  auto indices = std::get<1>(torch::topk(probs, top_k, -1));  // [N, k]
  auto counts =
      torch::zeros({logits.size(-1)}, probs.options())
          .index_add_(0, indices.reshape({-1}), torch::ones({indices.numel()}, probs.options()));
  return {probs, counts};
}

}  // namespace

torch::Tensor LoadBalancingLoss(const std::vector<torch::Tensor>& router_logits, int64_t top_k) {
  TORCH_CHECK(!router_logits.empty(), "LoadBalancingLoss: no router logits");
  torch::Tensor total;
  for (const auto& logits : router_logits) {
    const int64_t n = logits.size(0), e = logits.size(1);
    auto [probs, counts] = RouterStats(logits, top_k);
    auto f = counts / static_cast<double>(n * top_k);  // [E], sums to 1
    auto p = probs.mean(0);                            // [E]
    auto layer_loss = (f * p).sum() * static_cast<double>(e);
    total = total.defined() ? total + layer_loss : layer_loss;
  }
  return total / static_cast<double>(router_logits.size());
}

torch::Tensor HfLoadBalancingLoss(const std::vector<torch::Tensor>& router_logits, int64_t top_k) {
  TORCH_CHECK(!router_logits.empty(), "HfLoadBalancingLoss: no router logits");
  auto all = torch::cat(router_logits, 0);  // [L*N, E]
  auto [probs, counts] = RouterStats(all, top_k);
  const double rows = static_cast<double>(all.size(0));
  return (counts / rows * probs.mean(0)).sum() * static_cast<double>(all.size(1));
}

torch::Tensor RouterZLoss(const std::vector<torch::Tensor>& router_logits) {
  TORCH_CHECK(!router_logits.empty(), "RouterZLoss: no router logits");
  torch::Tensor total;
  for (const auto& logits : router_logits) {
    auto z = torch::logsumexp(logits.to(torch::kFloat32), -1).pow(2).mean();
    total = total.defined() ? total + z : z;
  }
  return total / static_cast<double>(router_logits.size());
}

}  // namespace stemma::engine::model
