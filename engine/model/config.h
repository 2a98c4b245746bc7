// ModelConfig: the architecture of a decoder-only causal LM, parsed from a Hugging Face
// config.json. No LibTorch here, so anything can read a config cheaply.
//
// Supported `model_type`s: llama, qwen2, gemma3_text (and gemma3, whose text model sits under
// `text_config`), olmoe. Field semantics follow transformers 5.x (models/<name>/
// configuration_<name>.py and modeling_rope_utils.py); where a field is absent the default is
// the one transformers' config class uses, and the fields no family can do without
// (vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads) are
// required.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace stemma::engine::model {

enum class Arch { kLlama, kQwen2, kGemma3, kOlmoe };

// "llama", "qwen2", "gemma3", "olmoe" (the names `stemma-engine init --arch` takes).
absl::string_view ArchName(Arch arch);
absl::StatusOr<Arch> ArchFromName(absl::string_view name);

// One RoPE parameter set (transformers' `rope_parameters` entry).
struct RopeConfig {
  enum class Type { kDefault, kLinear, kLlama3 };
  Type type = Type::kDefault;
  double theta = 10000.0;
  // kLinear and kLlama3: inverse frequencies divided by `factor` (llama3: low frequencies only,
  // with a smooth ramp between low_freq_factor and high_freq_factor wavelengths).
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

enum class Activation { kSilu, kGeluTanh };

struct ModelConfig {
  Arch arch = Arch::kLlama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // per expert for OLMoE
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  Activation activation = Activation::kSilu;

  // Biases: Llama/OLMoE/Gemma3 `attention_bias` puts a bias on q, k, v and o; Qwen2 always
  // has q, k, v biases and never an o bias. Llama `mlp_bias` on gate, up and down.
  bool qkv_bias = false;
  bool o_bias = false;
  bool mlp_bias = false;

  // RoPE for full-attention layers, and for sliding-window layers (Gemma3's
  // rope_local_base_freq; equal to `rope` elsewhere).
  RopeConfig rope;
  RopeConfig rope_local;

  // Per layer: true where the layer attends within `sliding_window` tokens only
  // (key position > query position - sliding_window).
  std::vector<bool> sliding_layers;
  int64_t sliding_window = 0;

  // Attention scores are scaled by attn_scale (head_dim^-0.5, Gemma3 query_pre_attn_scalar^-0.5).
  double attn_scale = 0.0;
  // tanh softcapping of attention scores (Gemma2 style). Gemma3 configs may carry the field,
  // but transformers does not apply it for Gemma3, so neither do we (it stays unset).
  std::optional<double> attn_logit_softcapping;
  std::optional<double> final_logit_softcapping;

  // Gemma3: RMSNorm multiplies by (1 + w), embeddings are scaled by sqrt(hidden_size), per-head
  // q_norm/k_norm, and pre/post feed-forward norms around the MLP and after attention.
  bool gemma_norms = false;
  bool scale_embeddings = false;
  bool sandwich_norms = false;
  enum class QkNorm { kNone, kPerHead, kFull };  // Gemma3 per head; OLMoE over the whole q/k
  QkNorm qk_norm = QkNorm::kNone;

  // OLMoE: every layer's MLP is a sparse MoE block.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  bool norm_topk_prob = false;
  double router_aux_loss_coef = 0.0;
  std::optional<double> clip_qkv;

  // The config.json this came from, carried unchanged into saved checkpoints.
  nlohmann::json raw;

  bool is_moe() const { return num_experts > 0; }
};

// Parses config.json. Errors: InvalidArgument naming the field (missing, wrong type, out of
// range, or an unsupported value such as an unknown model_type or rope type).
absl::StatusOr<ModelConfig> ParseModelConfig(const nlohmann::json& json);

// The `--preset tiny` (or `small`) configuration of `arch` as a config.json that transformers
// loads (old-style rope fields, which transformers still reads). tiny is sized for unit tests
// on a 2-core CPU, small (8 layers: a middle block) for demos; docs/engine/init.md lists both.
absl::StatusOr<nlohmann::json> PresetConfigJson(Arch arch, absl::string_view preset);

// Sizes that override a preset's (`stemma-engine init --hidden-size 256 ...`); unset keeps it.
struct ModelSizes {
  std::optional<int64_t> hidden_size, num_layers, num_heads, num_kv_heads, head_dim,
      intermediate_size, max_position_embeddings, vocab_size, num_experts, experts_per_token;
  std::optional<bool> tie_embeddings;
};

// Applies `sizes` to a preset's config.json: head_dim follows hidden_size / num_heads unless
// given (Gemma3's query_pre_attn_scalar with it), Gemma3's layer_types are laid out again for
// the new depth (every sixth layer full attention, and the last of a model under six layers).
// InvalidArgument naming the size field for a combination no model can have (heads that do
// not divide the width, KV heads that do not divide the heads, top-k above the experts).
absl::Status ApplyModelSizes(Arch arch, const ModelSizes& sizes, nlohmann::json* config);

}  // namespace stemma::engine::model
