#include "engine/model/config.h"

#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace stemma::engine::model {
namespace {

using nlohmann::json;

absl::Status FieldError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: field '", field, "' ", what));
}

bool Has(const json& j, const std::string& key) {
  return j.is_object() && j.contains(key) && !j.at(key).is_null();
}

absl::StatusOr<int64_t> GetInt(const json& j, const std::string& key) {
  if (!Has(j, key)) return FieldError(key, "is missing");
  const json& v = j.at(key);
  if (!v.is_number_integer()) return FieldError(key, "must be an integer");
  return v.get<int64_t>();
}

absl::StatusOr<int64_t> GetInt(const json& j, const std::string& key, int64_t fallback) {
  if (!Has(j, key)) return fallback;
  return GetInt(j, key);
}

absl::StatusOr<int64_t> GetPositive(const json& j, const std::string& key) {
  ASSIGN_OR_RETURN(int64_t v, GetInt(j, key));
  if (v <= 0) return FieldError(key, absl::StrCat("must be positive, got ", v));
  return v;
}

absl::StatusOr<double> GetDouble(const json& j, const std::string& key, double fallback) {
  if (!Has(j, key)) return fallback;
  const json& v = j.at(key);
  if (!v.is_number()) return FieldError(key, "must be a number");
  return v.get<double>();
}

absl::StatusOr<std::optional<double>> GetOptionalDouble(const json& j, const std::string& key) {
  if (!Has(j, key)) return std::optional<double>();
  const json& v = j.at(key);
  if (!v.is_number()) return FieldError(key, "must be a number or null");
  return std::optional<double>(v.get<double>());
}

absl::StatusOr<bool> GetBool(const json& j, const std::string& key, bool fallback) {
  if (!Has(j, key)) return fallback;
  const json& v = j.at(key);
  if (!v.is_boolean()) return FieldError(key, "must be true or false");
  return v.get<bool>();
}

absl::StatusOr<std::string> GetString(const json& j, const std::string& key,
                                      const std::string& fallback) {
  if (!Has(j, key)) return fallback;
  const json& v = j.at(key);
  if (!v.is_string()) return FieldError(key, "must be a string");
  return v.get<std::string>();
}

absl::StatusOr<Activation> ParseActivation(const std::string& field, const std::string& name) {
  if (name == "silu" || name == "swish") return Activation::kSilu;
  if (name == "gelu_pytorch_tanh" || name == "gelu_tanh") return Activation::kGeluTanh;
  return FieldError(field, absl::StrCat("has unsupported activation '", name, "'"));
}

// One rope parameter dict (new `rope_parameters` or old `rope_scaling` style) over `base`.
// `where` names the dict in errors.
absl::StatusOr<RopeConfig> ParseRopeDict(const json& dict, const std::string& where,
                                         RopeConfig base, int64_t max_position_embeddings) {
  if (!dict.is_object()) return FieldError(where, "must be an object");
  RopeConfig rope = base;
  ASSIGN_OR_RETURN(std::string type, GetString(dict, "rope_type", ""));
  if (type.empty()) {
    ASSIGN_OR_RETURN(type, GetString(dict, "type", "default"));
  }
  ASSIGN_OR_RETURN(rope.theta, GetDouble(dict, "rope_theta", rope.theta));
  ASSIGN_OR_RETURN(double partial, GetDouble(dict, "partial_rotary_factor", 1.0));
  if (partial != 1.0) {
    return FieldError(where + ".partial_rotary_factor", "other than 1.0 is not supported");
  }
  if (type == "default") {
    rope.type = RopeConfig::Type::kDefault;
  } else if (type == "linear") {
    rope.type = RopeConfig::Type::kLinear;
    if (!Has(dict, "factor")) return FieldError(where + ".factor", "is missing");
    ASSIGN_OR_RETURN(rope.factor, GetDouble(dict, "factor", 1.0));
  } else if (type == "llama3") {
    rope.type = RopeConfig::Type::kLlama3;
    for (const char* key : {"factor", "low_freq_factor", "high_freq_factor"}) {
      if (!Has(dict, key)) return FieldError(absl::StrCat(where, ".", key), "is missing");
    }
    ASSIGN_OR_RETURN(rope.factor, GetDouble(dict, "factor", 1.0));
    ASSIGN_OR_RETURN(rope.low_freq_factor, GetDouble(dict, "low_freq_factor", 1.0));
    ASSIGN_OR_RETURN(rope.high_freq_factor, GetDouble(dict, "high_freq_factor", 4.0));
    ASSIGN_OR_RETURN(rope.original_max_position_embeddings,
                     GetInt(dict, "original_max_position_embeddings", max_position_embeddings));
    if (rope.high_freq_factor == rope.low_freq_factor) {
      return FieldError(where + ".high_freq_factor", "must differ from low_freq_factor");
    }
  } else {
    return FieldError(where + ".rope_type", absl::StrCat("'", type, "' is not supported"));
  }
  if (rope.theta <= 0) return FieldError(where + ".rope_theta", "must be positive");
  if (rope.factor <= 0) return FieldError(where + ".factor", "must be positive");
  return rope;
}

// Single-dict RoPE (Llama, Qwen2, OLMoE): `rope_parameters`, else top-level `rope_theta` plus
// an optional `rope_scaling`.
absl::StatusOr<RopeConfig> ParseRope(const json& j, int64_t max_pos) {
  RopeConfig base;
  ASSIGN_OR_RETURN(base.theta, GetDouble(j, "rope_theta", 10000.0));
  if (Has(j, "rope_parameters")) {
    return ParseRopeDict(j.at("rope_parameters"), "rope_parameters", base, max_pos);
  }
  if (Has(j, "rope_scaling")) {
    return ParseRopeDict(j.at("rope_scaling"), "rope_scaling", base, max_pos);
  }
  return base;
}

absl::Status ParseCommon(const json& j, ModelConfig& c) {
  ASSIGN_OR_RETURN(c.vocab_size, GetPositive(j, "vocab_size"));
  ASSIGN_OR_RETURN(c.hidden_size, GetPositive(j, "hidden_size"));
  ASSIGN_OR_RETURN(c.intermediate_size, GetPositive(j, "intermediate_size"));
  ASSIGN_OR_RETURN(c.num_hidden_layers, GetPositive(j, "num_hidden_layers"));
  ASSIGN_OR_RETURN(c.num_attention_heads, GetPositive(j, "num_attention_heads"));
  ASSIGN_OR_RETURN(c.num_key_value_heads, GetInt(j, "num_key_value_heads", c.num_attention_heads));
  if (c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0) {
    return FieldError("num_key_value_heads",
                      absl::StrCat("must be positive and divide num_attention_heads (",
                                   c.num_attention_heads, "), got ", c.num_key_value_heads));
  }
  ASSIGN_OR_RETURN(c.head_dim, GetInt(j, "head_dim", c.hidden_size / c.num_attention_heads));
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) {
    return FieldError("head_dim", absl::StrCat("must be positive and even, got ", c.head_dim));
  }
  ASSIGN_OR_RETURN(c.max_position_embeddings, GetInt(j, "max_position_embeddings", 2048));
  ASSIGN_OR_RETURN(c.rms_norm_eps, GetDouble(j, "rms_norm_eps", 1e-6));
  ASSIGN_OR_RETURN(c.tie_word_embeddings, GetBool(j, "tie_word_embeddings", false));
  c.attn_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  c.sliding_layers.assign(c.num_hidden_layers, false);
  return absl::OkStatus();
}

absl::Status ParseLlama(const json& j, ModelConfig& c) {
  RETURN_IF_ERROR(ParseCommon(j, c));
  ASSIGN_OR_RETURN(std::string act, GetString(j, "hidden_act", "silu"));
  ASSIGN_OR_RETURN(c.activation, ParseActivation("hidden_act", act));
  ASSIGN_OR_RETURN(bool attention_bias, GetBool(j, "attention_bias", false));
  c.qkv_bias = c.o_bias = attention_bias;
  ASSIGN_OR_RETURN(c.mlp_bias, GetBool(j, "mlp_bias", false));
  ASSIGN_OR_RETURN(int64_t tp, GetInt(j, "pretraining_tp", 1));
  if (tp != 1) return FieldError("pretraining_tp", "other than 1 is not supported");
  ASSIGN_OR_RETURN(c.rope, ParseRope(j, c.max_position_embeddings));
  c.rope_local = c.rope;
  return absl::OkStatus();
}

absl::Status ParseQwen2(const json& j, ModelConfig& c) {
  RETURN_IF_ERROR(ParseCommon(j, c));
  ASSIGN_OR_RETURN(std::string act, GetString(j, "hidden_act", "silu"));
  ASSIGN_OR_RETURN(c.activation, ParseActivation("hidden_act", act));
  c.qkv_bias = true;  // Qwen2Attention: bias=True on q, k, v; none on o.
  ASSIGN_OR_RETURN(c.rope, ParseRope(j, c.max_position_embeddings));
  c.rope_local = c.rope;
  // Sliding window only with use_sliding_window, on layers >= max_window_layers (or as
  // layer_types says).
  ASSIGN_OR_RETURN(bool use_sliding, GetBool(j, "use_sliding_window", false));
  if (use_sliding) {
    ASSIGN_OR_RETURN(c.sliding_window, GetInt(j, "sliding_window", 4096));
    if (c.sliding_window <= 0) return FieldError("sliding_window", "must be positive");
    ASSIGN_OR_RETURN(int64_t max_window_layers, GetInt(j, "max_window_layers", 28));
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      c.sliding_layers[i] = i >= max_window_layers;
    }
  }
  if (Has(j, "layer_types")) {
    const json& types = j.at("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != c.num_hidden_layers) {
      return FieldError("layer_types", "must be a list with one entry per layer");
    }
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const json& t = types[i];
      if (t == "sliding_attention") {
        if (!use_sliding) continue;  // transformers: sliding_window is None without it
        c.sliding_layers[i] = true;
      } else if (t == "full_attention") {
        c.sliding_layers[i] = false;
      } else {
        return FieldError(absl::StrCat("layer_types[", i, "]"),
                          "must be full_attention or "
                          "sliding_attention");
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ParseGemma3(const json& j, ModelConfig& c) {
  RETURN_IF_ERROR(ParseCommon(j, c));
  // Gemma3TextConfig defaults where the field is absent.
  ASSIGN_OR_RETURN(c.head_dim, GetInt(j, "head_dim", 256));
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) return FieldError("head_dim", "must be even");
  ASSIGN_OR_RETURN(c.max_position_embeddings, GetInt(j, "max_position_embeddings", 131072));
  ASSIGN_OR_RETURN(c.tie_word_embeddings, GetBool(j, "tie_word_embeddings", true));
  ASSIGN_OR_RETURN(std::string act, GetString(j, "hidden_activation", "gelu_pytorch_tanh"));
  ASSIGN_OR_RETURN(c.activation, ParseActivation("hidden_activation", act));
  ASSIGN_OR_RETURN(bool attention_bias, GetBool(j, "attention_bias", false));
  c.qkv_bias = c.o_bias = attention_bias;
  ASSIGN_OR_RETURN(double query_pre_attn_scalar, GetDouble(j, "query_pre_attn_scalar", 256));
  if (query_pre_attn_scalar <= 0) return FieldError("query_pre_attn_scalar", "must be positive");
  c.attn_scale = 1.0 / std::sqrt(query_pre_attn_scalar);
  // transformers' Gemma3Attention reads attn_logit_softcapping but never applies it (unlike
  // Gemma2's); released Gemma 3 configs set it to null. Follow transformers: validate, ignore.
  RETURN_IF_ERROR(GetOptionalDouble(j, "attn_logit_softcapping").status());
  c.attn_logit_softcapping.reset();
  ASSIGN_OR_RETURN(c.final_logit_softcapping, GetOptionalDouble(j, "final_logit_softcapping"));
  ASSIGN_OR_RETURN(bool bidirectional, GetBool(j, "use_bidirectional_attention", false));
  if (bidirectional) return FieldError("use_bidirectional_attention", "true is not supported");
  c.gemma_norms = c.scale_embeddings = c.sandwich_norms = true;
  c.qk_norm = ModelConfig::QkNorm::kPerHead;

  ASSIGN_OR_RETURN(c.sliding_window, GetInt(j, "sliding_window", 4096));
  if (c.sliding_window <= 0) return FieldError("sliding_window", "must be positive");
  if (Has(j, "layer_types")) {
    const json& types = j.at("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != c.num_hidden_layers) {
      return FieldError("layer_types", "must be a list with one entry per layer");
    }
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const json& t = types[i];
      if (t != "sliding_attention" && t != "full_attention") {
        return FieldError(absl::StrCat("layer_types[", i, "]"),
                          "must be full_attention or sliding_attention");
      }
      c.sliding_layers[i] = t == "sliding_attention";
    }
  } else {
    ASSIGN_OR_RETURN(int64_t pattern, GetInt(j, "sliding_window_pattern", 6));
    if (pattern <= 0) return FieldError("sliding_window_pattern", "must be positive");
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) c.sliding_layers[i] = (i + 1) % pattern != 0;
  }

  // RoPE: new style nests one dict per layer type; old style has rope_theta (global, default
  // 1e6), rope_local_base_freq (default 1e4) and rope_scaling, which applies to global layers.
  RopeConfig global, local;
  ASSIGN_OR_RETURN(global.theta, GetDouble(j, "rope_theta", 1000000.0));
  ASSIGN_OR_RETURN(local.theta, GetDouble(j, "rope_local_base_freq", 10000.0));
  if (Has(j, "rope_parameters")) {
    const json& rp = j.at("rope_parameters");
    if (!rp.is_object()) return FieldError("rope_parameters", "must be an object");
    if (Has(rp, "full_attention")) {
      ASSIGN_OR_RETURN(
          global, ParseRopeDict(rp.at("full_attention"), "rope_parameters.full_attention", global,
                                c.max_position_embeddings));
    }
    if (Has(rp, "sliding_attention")) {
      ASSIGN_OR_RETURN(
          local, ParseRopeDict(rp.at("sliding_attention"), "rope_parameters.sliding_attention",
                               local, c.max_position_embeddings));
    }
  } else if (Has(j, "rope_scaling")) {
    ASSIGN_OR_RETURN(global, ParseRopeDict(j.at("rope_scaling"), "rope_scaling", global,
                                           c.max_position_embeddings));
  }
  c.rope = global;
  c.rope_local = local;
  return absl::OkStatus();
}

absl::Status ParseOlmoe(const json& j, ModelConfig& c) {
  RETURN_IF_ERROR(ParseCommon(j, c));
  ASSIGN_OR_RETURN(c.rms_norm_eps, GetDouble(j, "rms_norm_eps", 1e-5));
  ASSIGN_OR_RETURN(c.max_position_embeddings, GetInt(j, "max_position_embeddings", 4096));
  ASSIGN_OR_RETURN(std::string act, GetString(j, "hidden_act", "silu"));
  ASSIGN_OR_RETURN(c.activation, ParseActivation("hidden_act", act));
  ASSIGN_OR_RETURN(bool attention_bias, GetBool(j, "attention_bias", false));
  c.qkv_bias = c.o_bias = attention_bias;
  ASSIGN_OR_RETURN(c.rope, ParseRope(j, c.max_position_embeddings));
  c.rope_local = c.rope;
  // transformers sizes k_norm as (hidden / heads) * kv_heads and views q/k with head_dim: the
  // two agree only when head_dim == hidden / heads.
  if (c.head_dim * c.num_attention_heads != c.hidden_size) {
    return FieldError("head_dim", "must equal hidden_size / num_attention_heads for olmoe");
  }
  c.qk_norm = ModelConfig::QkNorm::kFull;
  ASSIGN_OR_RETURN(c.clip_qkv, GetOptionalDouble(j, "clip_qkv"));
  ASSIGN_OR_RETURN(c.num_experts, GetInt(j, "num_experts", 64));
  ASSIGN_OR_RETURN(c.num_experts_per_tok, GetInt(j, "num_experts_per_tok", 8));
  if (c.num_experts <= 0) return FieldError("num_experts", "must be positive");
  if (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts) {
    return FieldError("num_experts_per_tok", "must be in [1, num_experts]");
  }
  ASSIGN_OR_RETURN(c.norm_topk_prob, GetBool(j, "norm_topk_prob", false));
  ASSIGN_OR_RETURN(c.router_aux_loss_coef, GetDouble(j, "router_aux_loss_coef", 0.01));
  return absl::OkStatus();
}

// A dense family (llama, qwen2, gemma3) whose MLPs were upcycled into sparse MoE blocks
// (`stemma-engine upcycle`, docs/merge.md): the dense config plus num_experts,
// num_experts_per_tok and norm_topk_prob (default true, so identical experts reproduce the
// dense model). Everything else keeps the family's meaning.
absl::Status ParseUpcycledMoe(const json& j, ModelConfig& c) {
  ASSIGN_OR_RETURN(c.num_experts, GetInt(j, "num_experts"));
  ASSIGN_OR_RETURN(c.num_experts_per_tok, GetInt(j, "num_experts_per_tok"));
  if (c.num_experts <= 0) return FieldError("num_experts", "must be positive");
  if (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts) {
    return FieldError("num_experts_per_tok", "must be in [1, num_experts]");
  }
  if (c.mlp_bias) return FieldError("num_experts", "MoE experts have no bias (mlp_bias is true)");
  ASSIGN_OR_RETURN(c.norm_topk_prob, GetBool(j, "norm_topk_prob", true));
  ASSIGN_OR_RETURN(c.router_aux_loss_coef, GetDouble(j, "router_aux_loss_coef", 0.01));
  return absl::OkStatus();
}

}  // namespace

absl::string_view ArchName(Arch arch) {
  switch (arch) {
    case Arch::kLlama:
      return "llama";
    case Arch::kQwen2:
      return "qwen2";
    case Arch::kGemma3:
      return "gemma3";
    case Arch::kOlmoe:
      return "olmoe";
  }
  return "unknown";
}

absl::StatusOr<Arch> ArchFromName(absl::string_view name) {
  if (name == "llama") return Arch::kLlama;
  if (name == "qwen2") return Arch::kQwen2;
  if (name == "gemma3") return Arch::kGemma3;
  if (name == "olmoe") return Arch::kOlmoe;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown architecture '", name, "' (want llama, qwen2, gemma3 or olmoe)"));
}

absl::StatusOr<ModelConfig> ParseModelConfig(const json& json_in) {
  if (!json_in.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  ModelConfig c;
  c.raw = json_in;
  ASSIGN_OR_RETURN(std::string model_type, GetString(json_in, "model_type", ""));
  if (model_type.empty()) return FieldError("model_type", "is missing");
  const json* j = &json_in;
  if (model_type == "gemma3") {
    // The multimodal config: the text decoder's fields live under text_config.
    if (!Has(json_in, "text_config")) return FieldError("text_config", "is missing");
    j = &json_in.at("text_config");
    if (!j->is_object()) return FieldError("text_config", "must be an object");
  }
  absl::Status status;
  if (model_type == "llama") {
    c.arch = Arch::kLlama;
    status = ParseLlama(*j, c);
  } else if (model_type == "qwen2") {
    c.arch = Arch::kQwen2;
    status = ParseQwen2(*j, c);
  } else if (model_type == "gemma3_text" || model_type == "gemma3") {
    c.arch = Arch::kGemma3;
    status = ParseGemma3(*j, c);
  } else if (model_type == "olmoe") {
    c.arch = Arch::kOlmoe;
    status = ParseOlmoe(*j, c);
  } else {
    return FieldError("model_type", absl::StrCat("'", model_type,
                                                 "' is not a supported architecture (llama, "
                                                 "qwen2, gemma3_text, gemma3, olmoe)"));
  }
  RETURN_IF_ERROR(status);
  if (c.arch != Arch::kOlmoe && Has(*j, "num_experts")) RETURN_IF_ERROR(ParseUpcycledMoe(*j, c));
  return c;
}

absl::StatusOr<nlohmann::json> PresetConfigJson(Arch arch, absl::string_view preset) {
  if (preset != "tiny" && preset != "small") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown preset '", preset, "' (want tiny or small)"));
  }
  json j = {
      {"vocab_size", 256},
      {"hidden_size", 64},
      {"intermediate_size", 128},
      {"num_hidden_layers", 2},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 2},
      {"head_dim", 16},
      {"max_position_embeddings", 512},
      {"initializer_range", 0.02},
      {"use_cache", true},
      {"torch_dtype", "float32"},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
      {"pad_token_id", 0},
  };
  switch (arch) {
    case Arch::kLlama:
      j["model_type"] = "llama";
      j["architectures"] = {"LlamaForCausalLM"};
      j["hidden_act"] = "silu";
      j["rms_norm_eps"] = 1e-5;
      j["tie_word_embeddings"] = false;
      j["attention_bias"] = false;
      j["mlp_bias"] = false;
      j["rope_theta"] = 500000.0;
      // Llama-3.1 style scaling, with a short original context so that all three frequency
      // bands (kept, smoothed, divided) occur at head_dim 16.
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", 8.0},
                           {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0},
                           {"original_max_position_embeddings", 64}};
      break;
    case Arch::kQwen2:
      j["model_type"] = "qwen2";
      j["architectures"] = {"Qwen2ForCausalLM"};
      j["hidden_act"] = "silu";
      j["rms_norm_eps"] = 1e-6;
      j["tie_word_embeddings"] = true;  // as in the small Qwen2 models
      j["rope_theta"] = 1000000.0;
      j["use_sliding_window"] = false;
      break;
    case Arch::kGemma3:
      j["model_type"] = "gemma3_text";
      j["architectures"] = {"Gemma3ForCausalLM"};
      j["num_hidden_layers"] = 3;
      j["hidden_activation"] = "gelu_pytorch_tanh";
      j["rms_norm_eps"] = 1e-6;
      j["tie_word_embeddings"] = true;
      j["query_pre_attn_scalar"] = 16;
      j["sliding_window"] = 4;  // shorter than the test sequences, so the window matters
      j["layer_types"] = {"sliding_attention", "sliding_attention", "full_attention"};
      j["rope_theta"] = 1000000.0;
      j["rope_local_base_freq"] = 10000.0;
      j["final_logit_softcapping"] = nullptr;
      j["attn_logit_softcapping"] = nullptr;
      break;
    case Arch::kOlmoe:
      j["model_type"] = "olmoe";
      j["architectures"] = {"OlmoeForCausalLM"};
      j["num_key_value_heads"] = 4;
      j.erase("head_dim");
      j["intermediate_size"] = 32;
      j["hidden_act"] = "silu";
      j["rms_norm_eps"] = 1e-5;
      j["tie_word_embeddings"] = false;
      j["rope_theta"] = 10000.0;
      j["num_experts"] = 4;
      j["num_experts_per_tok"] = 2;
      j["norm_topk_prob"] = false;
      j["router_aux_loss_coef"] = 0.01;
      j["clip_qkv"] = nullptr;
      j["attention_bias"] = false;
      break;
  }
  if (preset == "small") {
    // Deep enough for layer-range strategies (8 layers: the middle block is 2:7), still
    // seconds per step on a laptop core: demos and benchmarks.
    j["hidden_size"] = 128;
    j["num_hidden_layers"] = 8;
    j["intermediate_size"] = arch == Arch::kOlmoe ? 96 : 384;
    if (j.contains("head_dim")) j["head_dim"] = 32;
    if (arch == Arch::kGemma3) {
      j["query_pre_attn_scalar"] = 32;
      j["sliding_window"] = 64;
      json types = json::array();
      for (int i = 0; i < 8; ++i)
        types.push_back(i % 6 == 5 ? "full_attention" : "sliding_attention");
      j["layer_types"] = types;
    }
  }
  return j;
}

absl::Status ApplyModelSizes(Arch arch, const ModelSizes& sizes, json* config) {
  json& j = *config;
  auto bad = [](absl::string_view field, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
  };
  if (sizes.hidden_size) j["hidden_size"] = *sizes.hidden_size;
  if (sizes.num_layers) j["num_hidden_layers"] = *sizes.num_layers;
  if (sizes.num_heads) j["num_attention_heads"] = *sizes.num_heads;
  if (sizes.num_kv_heads) j["num_key_value_heads"] = *sizes.num_kv_heads;
  if (sizes.intermediate_size) j["intermediate_size"] = *sizes.intermediate_size;
  if (sizes.max_position_embeddings) j["max_position_embeddings"] = *sizes.max_position_embeddings;
  if (sizes.vocab_size) j["vocab_size"] = *sizes.vocab_size;
  if (sizes.tie_embeddings) j["tie_word_embeddings"] = *sizes.tie_embeddings;
  if (sizes.num_experts || sizes.experts_per_token) {
    if (arch != Arch::kOlmoe) {
      return bad(sizes.num_experts ? "num_experts" : "experts_per_token",
                 "applies to arch olmoe only");
    }
    if (sizes.num_experts) j["num_experts"] = *sizes.num_experts;
    if (sizes.experts_per_token) j["num_experts_per_tok"] = *sizes.experts_per_token;
  }
  const int64_t hidden = j.at("hidden_size").get<int64_t>();
  const int64_t heads = j.at("num_attention_heads").get<int64_t>();
  const int64_t kv = j.at("num_key_value_heads").get<int64_t>();
  int64_t head_dim = 0;
  if (sizes.head_dim) {
    head_dim = *sizes.head_dim;
  } else if (hidden % heads != 0) {
    return bad("num_heads",
               absl::StrCat(heads, " does not divide hidden_size ", hidden, " (or give head_dim)"));
  } else {
    head_dim = hidden / heads;
  }
  if (heads % kv != 0) {
    return bad("num_kv_heads",
               absl::StrCat(kv, " does not divide the ", heads, " attention heads"));
  }
  if (head_dim % 2 != 0)
    return bad("head_dim", absl::StrCat(head_dim, " must be even (RoPE rotates pairs)"));
  if (arch == Arch::kOlmoe) {
    // OLMoE's config has no head_dim: transformers derives hidden_size / heads.
    if (sizes.head_dim && *sizes.head_dim * heads != hidden) {
      return bad("head_dim", "olmoe takes no head_dim of its own (it is hidden_size / num_heads)");
    }
    if (hidden % heads != 0)
      return bad("num_heads", absl::StrCat(heads, " does not divide hidden_size ", hidden));
    const int64_t experts = j.at("num_experts").get<int64_t>();
    if (j.at("num_experts_per_tok").get<int64_t>() > experts) {
      return bad("experts_per_token", absl::StrCat(j.at("num_experts_per_tok").get<int64_t>(),
                                                   " is more than the ", experts, " experts"));
    }
  } else {
    j["head_dim"] = head_dim;
  }
  if (arch == Arch::kGemma3) {
    j["query_pre_attn_scalar"] = head_dim;
    const int64_t layers = j.at("num_hidden_layers").get<int64_t>();
    json types = json::array();
    for (int64_t i = 0; i < layers; ++i) {
      const bool full = i % 6 == 5 || (layers < 6 && i == layers - 1);
      types.push_back(full ? "full_attention" : "sliding_attention");
    }
    j["layer_types"] = types;
  }
  return absl::OkStatus();
}

}  // namespace stemma::engine::model
