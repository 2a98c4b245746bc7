// The building blocks of the decoder-only models: RMSNorm, rotary embeddings, attention, the
// gated MLP and the sparse MoE block. Each module registers its parameters under the names
// the Hugging Face checkpoints use, so a parent's named_parameters() yields the checkpoint
// keys (model.layers.3.self_attn.q_proj.weight, ...).
//
// Shapes: B batch, T new tokens, S attended tokens (cache + new), H hidden size, N = B*T,
// nh/nkv query/key-value heads, hd head_dim, I intermediate size, E experts, k experts per
// token. Modules are not thread-safe; a forward pass from one thread at a time.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/model/config.h"

namespace stemma::engine::model {

// RMSNorm in fp32: x * rsqrt(mean(x^2) + eps), times `weight` (Llama, Qwen2, OLMoE: cast back
// to the input dtype first) or times (1 + weight) (Gemma: in fp32, cast back last).
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps, bool one_plus);
  torch::Tensor forward(const torch::Tensor& x);  // [..., dim] -> [..., dim]
  // The value a freshly initialised norm has: 1, or 0 for (1 + w) norms.
  void ResetToIdentity();

  torch::Tensor weight;  // [dim]

 private:
  double eps_;
  bool one_plus_;
};
TORCH_MODULE(RMSNorm);

// Rotary position embedding tables for one RoPE parameter set and head_dim.
class Rope {
 public:
  Rope() = default;
  Rope(const RopeConfig& config, int64_t head_dim);
  // positions [T] (int64) -> {cos, sin}, each [1, 1, T, hd] in `dtype` on positions' device.
  std::pair<torch::Tensor, torch::Tensor> Tables(const torch::Tensor& positions,
                                                 torch::ScalarType dtype) const;
  const torch::Tensor& inv_freq() const { return inv_freq_; }  // [hd/2] fp32

 private:
  torch::Tensor inv_freq_;
};

// The K and V of one attention layer for all tokens seen so far (empty before the first step).
struct LayerKV {
  torch::Tensor k;  // [B, nkv, S, hd] after RoPE
  torch::Tensor v;  // [B, nkv, S, hd]
};

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const ModelConfig& config, bool sliding);
  // x [B, T, H]; cos/sin [1, 1, T, hd]; `kv` (may be null) is extended by the T new tokens,
  // whose positions follow the cached ones. Returns [B, T, H].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        LayerKV* kv);

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // only with qk-norm

 private:
  // q [B, nh, T, hd], k/v [B, nkv, S, hd] -> [B, nh, T, hd]
  torch::Tensor Attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);

  int64_t num_heads_, num_kv_heads_, head_dim_;
  double scale_;
  bool sliding_;
  int64_t window_;
  ModelConfig::QkNorm qk_norm_;
  std::optional<double> clip_qkv_, softcap_;
};
TORCH_MODULE(Attention);

// down_proj(act(gate_proj(x)) * up_proj(x)); x [..., H] -> [..., H].
class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(int64_t hidden, int64_t intermediate, bool bias, Activation activation);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

  // Analysis hook (stemma-engine analyze, LAPE): when set, called on every forward with
  // act(gate_proj(x)) [..., I] before the multiply with up_proj. Unset by default, so
  // inference and training pay one branch.
  std::function<void(const torch::Tensor&)> activation_hook;

 private:
  Activation activation_;
};
TORCH_MODULE(Mlp);

// OLMoE sparse MoE block: p = softmax(gate(x)) in fp32, top-k of p, renormalised only with
// norm_topk_prob, out = sum over the chosen experts of w_e * expert_e(x).
class SparseMoeImpl : public torch::nn::Module {
 public:
  explicit SparseMoeImpl(const ModelConfig& config);
  // x [B, T, H] -> {out [B, T, H], router_logits [N, E]}
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x);

  torch::nn::Linear gate{nullptr};         // [E, H], no bias: `mlp.gate.weight`
  torch::nn::ModuleList experts{nullptr};  // E x Mlp: `mlp.experts.{e}.gate_proj.weight`

 private:
  int64_t top_k_;
  bool norm_topk_prob_;
};
TORCH_MODULE(SparseMoe);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const ModelConfig& config, int64_t index);
  // h [B, T, H] -> [B, T, H]. For an MoE layer the router logits [N, E] are appended to
  // `router_logits`.
  torch::Tensor forward(const torch::Tensor& h, const torch::Tensor& cos, const torch::Tensor& sin,
                        LayerKV* kv, std::vector<torch::Tensor>* router_logits);
  bool sliding() const { return sliding_; }

  Attention self_attn{nullptr};
  Mlp mlp{nullptr};        // dense families
  SparseMoe moe{nullptr};  // OLMoE; registered as "mlp" too
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  RMSNorm pre_feedforward_layernorm{nullptr}, post_feedforward_layernorm{nullptr};  // Gemma3

 private:
  bool sliding_;
  bool sandwich_norms_;
};
TORCH_MODULE(DecoderLayer);

}  // namespace stemma::engine::model
