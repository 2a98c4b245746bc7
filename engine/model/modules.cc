#include "engine/model/modules.h"

#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/linear.h>
#include <torch/types.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/model/fused.h"
#include "engine/model/weightless.h"

namespace stemma::engine::model {
namespace {

namespace F = torch::nn::functional;
using torch::indexing::Slice;

torch::nn::Linear MakeLinear(int64_t in, int64_t out, bool bias) {
  return NewLinear(in, out, bias);
}

// [..., hd] -> [..., hd]: (-x2, x1) for the halves x1, x2.
torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  auto x1 = x.index({"...", Slice(0, half)});
  auto x2 = x.index({"...", Slice(half, torch::indexing::None)});
  return torch::cat({-x2, x1}, -1);
}

torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
  return x * cos + RotateHalf(x) * sin;
}

// [B, nkv, S, hd] -> [B, nkv * rep, S, hd], each kv head repeated for its query group.
torch::Tensor RepeatKv(const torch::Tensor& x, int64_t rep) {
  if (rep == 1) return x;
  const auto b = x.size(0), nkv = x.size(1), s = x.size(2), hd = x.size(3);
  return x.unsqueeze(2).expand({b, nkv, rep, s, hd}).reshape({b, nkv * rep, s, hd});
}

torch::Tensor Softcap(const torch::Tensor& x, double cap) { return torch::tanh(x / cap) * cap; }

// Set once _grouped_mm has refused a call (a device or dtype this LibTorch has no kernel for):
// every later call takes the per-expert products.
std::atomic<bool> grouped_mm_refused{false};

// rows [M, K] sorted by expert, w [E, N, K], ends [E] (int32, running row ends), counts [E]
// -> [M, N]: each expert's segment of rows times w[e]^T. One at::_grouped_mm when the rows'
// stride is 16-byte aligned (its requirement); otherwise one product per expert over
// segments read from a host copy of `counts` (free on the CPU; one sync per call elsewhere).
torch::Tensor GroupedProduct(const torch::Tensor& rows, const torch::Tensor& w,
                             const torch::Tensor& ends, const torch::Tensor& counts) {
  const auto dtype = rows.scalar_type();
  const bool supported =
      dtype == torch::kFloat32 || dtype == torch::kBFloat16 || dtype == torch::kFloat16;
  if (supported && (rows.size(1) * rows.element_size()) % 16 == 0 && !grouped_mm_refused) {
    try {
      return at::_grouped_mm(rows, w.transpose(1, 2), ends);
    } catch (const c10::Error&) {
      grouped_mm_refused = true;
    }
  }
  auto host = counts.to(torch::kCPU, torch::kInt64);
  const auto per_expert = host.accessor<int64_t, 1>();
  std::vector<torch::Tensor> parts;
  int64_t start = 0;
  for (int64_t e = 0; e < w.size(0); ++e) {
    const int64_t n = per_expert[e];
    if (n > 0) parts.push_back(rows.narrow(0, start, n).mm(w[e].t()));
    start += n;
  }
  if (parts.empty()) return rows.new_zeros({0, w.size(1)});
  return torch::cat(parts);
}

}  // namespace

// ---- RMSNorm ----

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, bool one_plus) : eps_(eps), one_plus_(one_plus) {
  if (const std::optional<torch::TensorOptions> weightless = WeightlessOptions()) {
    weight = register_parameter("weight", UnallocatedTensor({dim}, *weightless));
    return;
  }
  weight = register_parameter("weight", torch::empty({dim}));
  ResetToIdentity();
}

void RMSNormImpl::ResetToIdentity() {
  torch::NoGradGuard no_grad;
  if (one_plus_) {
    weight.zero_();
  } else {
    weight.fill_(1.0);
  }
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  if (fused::Applies(x) && fused::Applies(weight))
    return fused::RmsNorm(x, weight, eps_, one_plus_);
  auto xf = x.to(torch::kFloat32);
  auto normed = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  if (one_plus_) return (normed * (1.0 + weight.to(torch::kFloat32))).to(x.scalar_type());
  return weight * normed.to(x.scalar_type());
}

// ---- Rope ----

Rope::Rope(const RopeConfig& config, int64_t head_dim) {
  // transformers: 1 / base^(arange(0, dim, 2) / dim), in fp32.
  auto exponents = torch::arange(0, head_dim, 2, torch::kInt64).to(torch::kFloat32) / head_dim;
  auto inv_freq = 1.0 / torch::pow(config.theta, exponents);  // [hd/2]
  switch (config.type) {
    case RopeConfig::Type::kDefault:
      break;
    case RopeConfig::Type::kLinear:
      inv_freq = inv_freq / config.factor;
      break;
    case RopeConfig::Type::kLlama3: {
      // modeling_rope_utils._compute_llama3_parameters: keep high frequencies, divide low
      // ones by `factor`, and blend in between.
      const double old_len = static_cast<double>(config.original_max_position_embeddings);
      const double low_freq_wavelen = old_len / config.low_freq_factor;
      const double high_freq_wavelen = old_len / config.high_freq_factor;
      auto wavelen = 2 * M_PI / inv_freq;
      auto scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / config.factor, inv_freq);
      auto smooth = (old_len / wavelen - config.low_freq_factor) /
                    (config.high_freq_factor - config.low_freq_factor);
      auto smoothed = (1 - smooth) * scaled / config.factor + smooth * scaled;
      auto medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
      inv_freq = torch::where(medium, smoothed, scaled);
      break;
    }
  }
  inv_freq_ = inv_freq.contiguous();
}

std::pair<torch::Tensor, torch::Tensor> Rope::Tables(const torch::Tensor& positions,
                                                     torch::ScalarType dtype) const {
  auto inv_freq = inv_freq_.to(positions.device());
  auto freqs = positions.to(torch::kFloat32).unsqueeze(-1) * inv_freq.unsqueeze(0);  // [T, hd/2]
  auto emb = torch::cat({freqs, freqs}, -1);                                         // [T, hd]
  auto cos = emb.cos().to(dtype).unsqueeze(0).unsqueeze(0);                          // [1,1,T,hd]
  auto sin = emb.sin().to(dtype).unsqueeze(0).unsqueeze(0);
  return {cos, sin};
}

// ---- Attention ----

AttentionImpl::AttentionImpl(const ModelConfig& c, bool sliding)
    : num_heads_(c.num_attention_heads),
      num_kv_heads_(c.num_key_value_heads),
      head_dim_(c.head_dim),
      scale_(c.attn_scale),
      sliding_(sliding),
      window_(c.sliding_window),
      qk_norm_(c.qk_norm),
      clip_qkv_(c.clip_qkv),
      softcap_(c.attn_logit_softcapping) {
  const int64_t q_dim = num_heads_ * head_dim_, kv_dim = num_kv_heads_ * head_dim_;
  q_proj = register_module("q_proj", MakeLinear(c.hidden_size, q_dim, c.qkv_bias));
  k_proj = register_module("k_proj", MakeLinear(c.hidden_size, kv_dim, c.qkv_bias));
  v_proj = register_module("v_proj", MakeLinear(c.hidden_size, kv_dim, c.qkv_bias));
  o_proj = register_module("o_proj", MakeLinear(q_dim, c.hidden_size, c.o_bias));
  if (qk_norm_ == ModelConfig::QkNorm::kPerHead) {
    q_norm = register_module("q_norm", RMSNorm(head_dim_, c.rms_norm_eps, c.gemma_norms));
    k_norm = register_module("k_norm", RMSNorm(head_dim_, c.rms_norm_eps, c.gemma_norms));
  } else if (qk_norm_ == ModelConfig::QkNorm::kFull) {
    q_norm = register_module("q_norm", RMSNorm(q_dim, c.rms_norm_eps, c.gemma_norms));
    k_norm = register_module("k_norm", RMSNorm(kv_dim, c.rms_norm_eps, c.gemma_norms));
  }
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                     const torch::Tensor& sin, LayerKV* kv) {
  const int64_t b = x.size(0), t = x.size(1);
  torch::Tensor q, k, v;  // [B, T, nh*hd], [B, T, nkv*hd] x 2
  auto qkv = fused::GroupedLinear(x, {q_proj->weight, k_proj->weight, v_proj->weight},
                                  {q_proj->bias, k_proj->bias, v_proj->bias});
  if (!qkv.empty()) {
    q = qkv[0], k = qkv[1], v = qkv[2];
  } else {
    q = q_proj(x), k = k_proj(x), v = v_proj(x);
  }
  if (qk_norm_ == ModelConfig::QkNorm::kFull) {  // OLMoE: over the whole projection
    q = q_norm(q);
    k = k_norm(k);
  }
  if (clip_qkv_) {
    q = q.clamp(-*clip_qkv_, *clip_qkv_);
    k = k.clamp(-*clip_qkv_, *clip_qkv_);
    v = v.clamp(-*clip_qkv_, *clip_qkv_);
  }
  q = q.view({b, t, num_heads_, head_dim_});                     // [B, T, nh, hd]
  k = k.view({b, t, num_kv_heads_, head_dim_});                  // [B, T, nkv, hd]
  v = v.view({b, t, num_kv_heads_, head_dim_}).transpose(1, 2);  // [B, nkv, T, hd]
  if (qk_norm_ == ModelConfig::QkNorm::kPerHead) {               // Gemma3: per head, before RoPE
    q = q_norm(q);
    k = k_norm(k);
  }
  if (fused::Applies(q) && fused::Applies(cos)) {  // RoPE in the [B, T, n, hd] layout
    auto cos_t = cos.reshape({t, head_dim_}), sin_t = sin.reshape({t, head_dim_});
    q = fused::Rope(q, cos_t, sin_t).transpose(1, 2);  // [B, nh, T, hd]
    k = fused::Rope(k, cos_t, sin_t).transpose(1, 2);  // [B, nkv, T, hd]
  } else {
    q = ApplyRope(q.transpose(1, 2), cos, sin);
    k = ApplyRope(k.transpose(1, 2), cos, sin);
  }
  if (kv != nullptr) {
    if (kv->k.defined()) {
      k = torch::cat({kv->k, k}, 2);  // [B, nkv, S, hd]
      v = torch::cat({kv->v, v}, 2);
    }
    kv->k = k;
    kv->v = v;
  }
  auto out = Attend(q, k, v);                                         // [B, nh, T, hd]
  out = out.transpose(1, 2).reshape({b, t, num_heads_ * head_dim_});  // [B, T, nh*hd]
  return o_proj(out);                                                 // [B, T, H]
}

torch::Tensor AttentionImpl::Attend(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v) {
  const int64_t t = q.size(2), s = k.size(2);
  const int64_t rep = num_heads_ / num_kv_heads_;
  auto keys = RepeatKv(k, rep);    // [B, nh, S, hd]
  auto values = RepeatKv(v, rep);  // [B, nh, S, hd]
  const bool plain_causal = !sliding_ && s == t;
  if (!softcap_ && plain_causal) {
    return at::scaled_dot_product_attention(q, keys, values, /*attn_mask=*/{}, 0.0,
                                            /*is_causal=*/true, scale_);
  }
  // Query i sits at position (s - t + i); it sees keys at positions j <= that, and within a
  // sliding window only j > position - window.
  auto opts = torch::TensorOptions().dtype(torch::kInt64).device(q.device());
  auto q_pos = torch::arange(s - t, s, opts).unsqueeze(1);  // [T, 1]
  auto k_pos = torch::arange(0, s, opts).unsqueeze(0);      // [1, S]
  auto allowed = k_pos <= q_pos;                            // [T, S]
  if (sliding_) allowed = allowed.logical_and(k_pos > q_pos - window_);
  if (!softcap_) {
    return at::scaled_dot_product_attention(q, keys, values, allowed, 0.0, false, scale_);
  }
  // Softcapping happens between the scaled scores and the mask: no SDPA for it.
  auto scores = torch::matmul(q, keys.transpose(2, 3)) * scale_;  // [B, nh, T, S]
  scores = Softcap(scores, *softcap_);
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  auto probs = torch::softmax(scores, -1, torch::kFloat32).to(q.scalar_type());
  return torch::matmul(probs, values);
}

// ---- MLP ----

MlpImpl::MlpImpl(int64_t hidden, int64_t intermediate, bool bias, Activation activation)
    : activation_(activation) {
  gate_proj = register_module("gate_proj", MakeLinear(hidden, intermediate, bias));
  up_proj = register_module("up_proj", MakeLinear(hidden, intermediate, bias));
  down_proj = register_module("down_proj", MakeLinear(intermediate, hidden, bias));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  const bool plain_silu = activation_ == Activation::kSilu && !activation_hook;
  if (plain_silu && !gate_proj->bias.defined()) {
    auto gated = fused::GatedUp(x, gate_proj->weight, up_proj->weight);  // [..., I]
    if (gated.defined()) return down_proj(gated);
  }
  auto g = gate_proj(x);  // [..., I]
  if (plain_silu && fused::Applies(g)) return down_proj(fused::SiluMul(g, up_proj(x)));
  g = activation_ == Activation::kSilu ? torch::silu(g) : torch::gelu(g, "tanh");
  if (activation_hook) activation_hook(g);
  return down_proj(g * up_proj(x));  // [..., H]
}

// ---- Sparse MoE ----

namespace {

// The experts' activation of each SparseMoe, recorded by its constructor: the block keeps no
// copy of the config, and the experts' own is private to MlpImpl. Keyed by the block's
// address; a block built later at the same address records its own.
std::mutex moe_activations_mu;
std::unordered_map<const SparseMoeImpl*, Activation>& MoeActivations() {
  static auto* activations = new std::unordered_map<const SparseMoeImpl*, Activation>();
  return *activations;
}

Activation MoeActivation(const SparseMoeImpl* block) {
  std::lock_guard<std::mutex> lock(moe_activations_mu);
  auto it = MoeActivations().find(block);
  return it == MoeActivations().end() ? Activation::kSilu : it->second;
}

// STEMMA_MOE=loop runs the experts one by one (the reference; also to compare speed); read on
// every forward so a test can switch it.
bool MoeLoopRequested() {
  const char* env = std::getenv("STEMMA_MOE");
  return env != nullptr && std::string(env) == "loop";
}

// The reference: per expert a nonzero() (a host sync on a GPU) and its own three products.
// flat [N, H], weights/indices [N, k] -> [N, H].
torch::Tensor LoopExperts(torch::nn::ModuleList& experts, const torch::Tensor& flat,
                          const torch::Tensor& weights, const torch::Tensor& indices) {
  auto out = torch::zeros_like(flat);  // [N, H]
  for (int64_t e = 0; e < static_cast<int64_t>(experts->size()); ++e) {
    auto hits = (indices == e).nonzero();  // [M, 2]: (token, slot)
    if (hits.size(0) == 0) continue;
    auto tokens = hits.select(1, 0), slots = hits.select(1, 1);
    auto expert_out = experts[e]->as<MlpImpl>()->forward(flat.index_select(0, tokens));  // [M, H]
    expert_out = expert_out * weights.index({tokens, slots}).unsqueeze(-1);
    out.index_add_(0, tokens, expert_out.to(out.scalar_type()));
  }
  return out;
}

// Grouped: every (token, slot) assignment sorted by expert on the device, one grouped product
// for gate|up and one for down, no host sync (GroupedProduct). The stable sort keeps tokens in
// order within an expert, so each token's contributions are added in expert order, as the
// loop adds them. flat [N, H], weights/indices [N, k] -> [N, H].
torch::Tensor GroupedExperts(torch::nn::ModuleList& experts, Activation activation,
                             const torch::Tensor& flat, const torch::Tensor& weights,
                             const torch::Tensor& indices) {
  const int64_t k = indices.size(1), count = static_cast<int64_t>(experts->size());
  auto assignment = indices.reshape({-1});                             // [M = N*k]
  auto order = torch::argsort(assignment, /*stable=*/true, 0, false);  // [M]
  auto token = torch::div(order, k, "floor");                          // [M]
  // Rows per expert and their running ends, on the device (bincount would ask the host for
  // the largest id).
  auto counts = torch::zeros({count}, assignment.options())
                    .index_add_(0, assignment, torch::ones_like(assignment));  // [E]
  auto ends = counts.cumsum(0).to(torch::kInt32);                              // [E]
  // The products run in autocast's dtype when it is on, as the experts' Linear layers would.
  auto dtype = flat.scalar_type();
  if (at::autocast::is_autocast_enabled(flat.device().type())) {
    dtype = at::autocast::get_autocast_dtype(flat.device().type());
  }
  std::vector<torch::Tensor> gate_up, down;  // gate_up: g0, u0, g1, u1, ...
  for (int64_t e = 0; e < count; ++e) {
    auto* mlp = experts[e]->as<MlpImpl>();
    gate_up.push_back(mlp->gate_proj->weight.to(dtype));
    gate_up.push_back(mlp->up_proj->weight.to(dtype));
    down.push_back(mlp->down_proj->weight.to(dtype));
  }
  const int64_t inter = gate_up[0].size(0), hidden = flat.size(1);
  auto w_gate_up = torch::stack(gate_up).view({count, 2 * inter, hidden});  // [E, 2I, H]
  auto w_down = torch::stack(down);                                         // [E, H, I]
  auto rows = flat.index_select(0, token).to(dtype);                        // [M, H]
  auto h = GroupedProduct(rows, w_gate_up, ends, counts);                   // [M, 2I]
  auto g = h.narrow(1, 0, inter), u = h.narrow(1, inter, inter);
  g = activation == Activation::kSilu ? torch::silu(g) : torch::gelu(g, "tanh");
  auto y = GroupedProduct(g * u, w_down, ends, counts);  // [M, H]
  y = y * weights.reshape({-1}).index_select(0, order).unsqueeze(-1);
  return torch::zeros_like(flat).index_add_(0, token, y.to(flat.scalar_type()));  // [N, H]
}

}  // namespace

SparseMoeImpl::SparseMoeImpl(const ModelConfig& c)
    : top_k_(c.num_experts_per_tok), norm_topk_prob_(c.norm_topk_prob) {
  gate = register_module("gate", MakeLinear(c.hidden_size, c.num_experts, false));
  experts = register_module("experts", torch::nn::ModuleList());
  for (int64_t e = 0; e < c.num_experts; ++e) {
    experts->push_back(Mlp(c.hidden_size, c.intermediate_size, false, c.activation));
  }
  std::lock_guard<std::mutex> lock(moe_activations_mu);
  MoeActivations()[this] = c.activation;
}

std::pair<torch::Tensor, torch::Tensor> SparseMoeImpl::forward(const torch::Tensor& x) {
  const auto sizes = x.sizes();
  auto flat = x.reshape({-1, x.size(-1)});                   // [N, H]
  auto logits = gate(flat);                                  // [N, E]
  auto probs = torch::softmax(logits, -1, torch::kFloat32);  // [N, E]
  auto [weights, indices] = torch::topk(probs, top_k_, -1);  // [N, k] each
  if (norm_topk_prob_) weights = weights / weights.sum(-1, /*keepdim=*/true);
  weights = weights.to(logits.scalar_type());
  auto out = MoeLoopRequested()
                 ? LoopExperts(experts, flat, weights, indices)
                 : GroupedExperts(experts, MoeActivation(this), flat, weights, indices);
  return {out.view(sizes), logits};
}

// ---- Decoder layer ----

DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& c, int64_t index)
    : sliding_(c.sliding_layers.at(index)), sandwich_norms_(c.sandwich_norms) {
  self_attn = register_module("self_attn", Attention(c, sliding_));
  if (c.is_moe()) {
    moe = register_module("mlp", SparseMoe(c));
  } else {
    mlp = register_module("mlp", Mlp(c.hidden_size, c.intermediate_size, c.mlp_bias, c.activation));
  }
  input_layernorm =
      register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps, c.gemma_norms));
  post_attention_layernorm = register_module("post_attention_layernorm",
                                             RMSNorm(c.hidden_size, c.rms_norm_eps, c.gemma_norms));
  if (sandwich_norms_) {
    pre_feedforward_layernorm = register_module(
        "pre_feedforward_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps, c.gemma_norms));
    post_feedforward_layernorm = register_module(
        "post_feedforward_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps, c.gemma_norms));
  }
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& h, const torch::Tensor& cos,
                                        const torch::Tensor& sin, LayerKV* kv,
                                        std::vector<torch::Tensor>* router_logits) {
  auto ffn = [&](const torch::Tensor& x) {  // [B, T, H] -> [B, T, H]
    if (!moe) return mlp(x);
    auto [out, logits] = moe(x);
    if (router_logits != nullptr) router_logits->push_back(logits);
    return out;
  };
  if (sandwich_norms_) {  // Gemma3: norms before and after both sub-blocks
    auto attn = post_attention_layernorm(self_attn(input_layernorm(h), cos, sin, kv));
    auto x = h + attn;
    return x + post_feedforward_layernorm(ffn(pre_feedforward_layernorm(x)));
  }
  auto x = h + self_attn(input_layernorm(h), cos, sin, kv);
  return x + ffn(post_attention_layernorm(x));
}

}  // namespace stemma::engine::model
