// CausalLM: a decoder-only language model (Llama, Qwen2, Gemma3 text, OLMoE) built from a
// ModelConfig, with parameter names equal to the Hugging Face checkpoint keys:
//   model.embed_tokens.weight, model.layers.{i}.…, model.norm.weight, lm_head.weight
// (lm_head absent when tie_word_embeddings). Device-agnostic: move it with ->to(device).
// Not thread-safe: one forward at a time.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/model/checkpointing.h"
#include "engine/model/config.h"
#include "engine/model/modules.h"

namespace stemma::engine::model {

// K/V of every layer for the tokens seen so far, for incremental decoding. Empty at first;
// each forward with the cache appends its tokens, which take the next positions.
struct KVCache {
  std::vector<LayerKV> layers;
  int64_t length() const {
    return layers.empty() || !layers[0].k.defined() ? 0 : layers[0].k.size(2);
  }
  void Clear() { layers.clear(); }
};

struct ForwardOutput {
  torch::Tensor logits;  // [B, T, V], after final logit softcapping where configured
  torch::Tensor ce_sum;  // ForwardLoss only (logits undefined then): summed CE, fp32 scalar
  // MoE only (undefined for dense models):
  std::vector<torch::Tensor> router_logits;  // one per layer, [B*T, E], before softmax
  torch::Tensor load_balancing_loss;         // scalar, LoadBalancingLoss(router_logits)
  torch::Tensor router_z_loss;               // scalar, RouterZLoss(router_logits)
};

class DecoderModelImpl : public torch::nn::Module {
 public:
  explicit DecoderModelImpl(const ModelConfig& config);
  // input_ids [B, T] (int64) -> final hidden states [B, T, H].
  torch::Tensor forward(const torch::Tensor& input_ids, KVCache* cache,
                        std::vector<torch::Tensor>* router_logits);

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};

  // Analysis hook (stemma-engine analyze, cross-lingual alignment): when set, called with
  // (layer index, residual stream after that layer [B, T, H], before the final norm).
  // Unset by default.
  std::function<void(int64_t layer, const torch::Tensor& hidden)> layer_output_hook;

  // Training memory (checkpointing.h): while grad mode is on and no KV cache is used, layers
  // 0, n, 2n, ... (every = n) are recomputed in backward instead of keeping their
  // activations. 0 (the default) turns it off.
  void SetActivationCheckpointing(int64_t every) { checkpoint_every_ = every; }
  // Sharded weights (ZeRO-3): `hooks` run around every layer as checkpointing.h describes;
  // while set, training checkpoints every layer. Null unsets them.
  void SetLayerHooks(std::shared_ptr<const LayerHooks> hooks) { hooks_ = std::move(hooks); }

 private:
  // Runs layer i on h, checkpointed or plainly, between the hooks.
  torch::Tensor RunLayer(size_t i, const torch::Tensor& h, const torch::Tensor& cos,
                         const torch::Tensor& sin, KVCache* cache,
                         std::vector<torch::Tensor>* router_logits);

  ModelConfig config_;
  Rope rope_, rope_local_;
  int64_t checkpoint_every_ = 0;
  std::shared_ptr<const LayerHooks> hooks_;
};
TORCH_MODULE(DecoderModel);

class CausalLMImpl : public torch::nn::Module {
 public:
  explicit CausalLMImpl(ModelConfig config);
  // input_ids [B, T] (int64). With `cache`, the tokens continue the cached sequence.
  ForwardOutput forward(const torch::Tensor& input_ids, KVCache* cache = nullptr);
  // Training and held-out loss: the forward without [B, T, V] logits. ce_sum is the summed
  // next-token cross-entropy against targets [B, T] (int64, -100 ignored), computed over
  // chunks of `loss_chunk_tokens` tokens (loss.h; 0: one chunk, the plain head and loss);
  // the MoE fields as in forward().
  ForwardOutput ForwardLoss(const torch::Tensor& input_ids, const torch::Tensor& targets,
                            int64_t loss_chunk_tokens);

  // HF-style random initialisation, deterministic for a seed on CPU: every Linear and the
  // embedding ~ N(0, initializer_range (0.02)), biases 0, norms at identity (1, or 0 for
  // Gemma's (1 + w) norms).
  void InitWeights(uint64_t seed);

  const ModelConfig& config() const { return config_; }
  // The weight that projects hidden states to logits: lm_head.weight, or the embedding when tied.
  torch::Tensor output_weight();

  DecoderModel model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tie_word_embeddings

 private:
  // The decoder and the MoE losses; out->logits is left for the caller. Returns [B, T, H].
  torch::Tensor Hidden(const torch::Tensor& input_ids, KVCache* cache, ForwardOutput* out);

  ModelConfig config_;
};
TORCH_MODULE(CausalLM);

// Greedy decoding with a KV cache: prompt [1, T] -> the prompt followed by `max_new_tokens`
// argmax tokens, [1, T + max_new_tokens].
torch::Tensor GreedyGenerate(CausalLM& lm, const torch::Tensor& prompt, int64_t max_new_tokens);

// MoE auxiliary losses over the router logits of all MoE layers (each [N, E]).
//
// LoadBalancingLoss: the per-layer average with the dispatch fraction normalised by k
// (algorithms.md §3.2, [DESIGN]): (1/L)·Σ_l E·Σ_i (c_{l,i}/(N·k))·P_{l,i}, where c counts the
// tokens whose top-k includes expert i and P is the mean router probability. 1.0 for uniform
// routing, whatever k.
torch::Tensor LoadBalancingLoss(const std::vector<torch::Tensor>& router_logits, int64_t top_k);
// transformers' load_balancing_loss_func (no padding mask): layers concatenated along the
// token axis first, then E·Σ_{k,i} f_{k,i}·P_i; k for uniform routing.
torch::Tensor HfLoadBalancingLoss(const std::vector<torch::Tensor>& router_logits, int64_t top_k);
// Router z-loss (ST-MoE): mean over layers of mean over tokens of logsumexp(logits)^2.
torch::Tensor RouterZLoss(const std::vector<torch::Tensor>& router_logits);

}  // namespace stemma::engine::model
