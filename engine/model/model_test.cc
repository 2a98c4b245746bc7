// The models: config parsing, checkpoint round trips, the KV cache, MoE losses, and logits
// parity with transformers on tiny random checkpoints written by `stemma-engine init`.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/commands.h"
#include "engine/io/checkpoint.h"
#include "engine/io/safetensors.h"
#include "engine/model/causal_lm.h"
#include "engine/model/checkpoint.h"
#include "engine/model/config.h"

namespace stemma::engine::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kTokens[] = "5,17,42,99,3,250,7,128,64,1,200,33";

std::vector<int64_t> TokenIds() { return {5, 17, 42, 99, 3, 250, 7, 128, 64, 1, 200, 33}; }

// A fresh directory for one test (gtest runs each test in its own process under ctest).
std::string TestDir(const std::string& name) {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  std::string test = absl::StrCat(info->test_suite_name(), "_", info->name());
  std::replace(test.begin(), test.end(), '/', '_');
  fs::path dir =
      fs::path(testing::TempDir()) / absl::StrCat("model_test_", test, "_", name, "_", getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

int RunCommand(std::vector<std::string> args, int (*command)(int, char**)) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return command(static_cast<int>(argv.size()), argv.data());
}

std::string InitCheckpoint(const std::string& arch, const std::string& root, int seed = 7) {
  std::string out = root + "/" + arch;
  EXPECT_EQ(RunCommand({"init", "--arch", arch, "--preset", "tiny", "--seed", std::to_string(seed),
                        "--out", out},
                       RunInit),
            0);
  return out;
}

// A tensor from a safetensors file, copied to a CPU f32 tensor.
torch::Tensor ReadTensor(const std::string& path, const std::string& name) {
  auto file = io::SafetensorsFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return {};
  const io::TensorInfo* info = (*file)->Find(name);
  EXPECT_NE(info, nullptr) << path << " has no " << name;
  if (info == nullptr) return {};
  EXPECT_EQ(info->dtype, io::Dtype::kF32);
  return torch::from_blob((*file)->Data(*info), info->shape, torch::kFloat32).clone();
}

int RunPython(const std::string& args) {
  std::string command = absl::StrCat(STEMMA_PYTHON, " ", STEMMA_HF_LOGITS_SCRIPT, " ", args);
  return std::system(command.c_str());
}

double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// ---- config ----

json TinyJson(Arch arch) {
  auto j = PresetConfigJson(arch, "tiny");
  EXPECT_TRUE(j.ok()) << j.status();
  return *j;
}

TEST(ConfigTest, PresetsParse) {
  for (Arch arch : {Arch::kLlama, Arch::kQwen2, Arch::kGemma3, Arch::kOlmoe}) {
    auto c = ParseModelConfig(TinyJson(arch));
    ASSERT_TRUE(c.ok()) << ArchName(arch) << ": " << c.status();
    EXPECT_EQ(c->arch, arch);
    EXPECT_EQ(c->hidden_size, 64);
    EXPECT_EQ(c->vocab_size, 256);
  }
}

TEST(ConfigTest, FamilySpecifics) {
  auto llama = *ParseModelConfig(TinyJson(Arch::kLlama));
  EXPECT_EQ(llama.rope.type, RopeConfig::Type::kLlama3);
  EXPECT_EQ(llama.rope.factor, 8.0);
  EXPECT_EQ(llama.rope.original_max_position_embeddings, 64);
  EXPECT_FALSE(llama.qkv_bias);

  auto qwen = *ParseModelConfig(TinyJson(Arch::kQwen2));
  EXPECT_TRUE(qwen.qkv_bias);
  EXPECT_FALSE(qwen.o_bias);
  EXPECT_TRUE(qwen.tie_word_embeddings);

  auto gemma = *ParseModelConfig(TinyJson(Arch::kGemma3));
  EXPECT_TRUE(gemma.gemma_norms && gemma.scale_embeddings && gemma.sandwich_norms);
  EXPECT_EQ(gemma.sliding_layers, (std::vector<bool>{true, true, false}));
  EXPECT_EQ(gemma.rope.theta, 1000000.0);
  EXPECT_EQ(gemma.rope_local.theta, 10000.0);
  EXPECT_DOUBLE_EQ(gemma.attn_scale, 0.25);  // query_pre_attn_scalar 16
  EXPECT_EQ(gemma.activation, Activation::kGeluTanh);

  auto olmoe = *ParseModelConfig(TinyJson(Arch::kOlmoe));
  EXPECT_EQ(olmoe.num_experts, 4);
  EXPECT_EQ(olmoe.num_experts_per_tok, 2);
  EXPECT_EQ(olmoe.qk_norm, ModelConfig::QkNorm::kFull);
  EXPECT_FALSE(olmoe.norm_topk_prob);
}

TEST(ConfigTest, GemmaPatternAndMultimodalWrapper) {
  json text = TinyJson(Arch::kGemma3);
  text.erase("layer_types");
  text["num_hidden_layers"] = 12;
  text["sliding_window_pattern"] = 6;
  text["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  json wrapper = {{"model_type", "gemma3"}, {"text_config", text}};
  auto c = ParseModelConfig(wrapper);
  ASSERT_TRUE(c.ok()) << c.status();
  for (int i = 0; i < 12; ++i) EXPECT_EQ(c->sliding_layers[i], i != 5 && i != 11) << i;
  EXPECT_EQ(c->rope.type, RopeConfig::Type::kLinear);  // global layers only
  EXPECT_EQ(c->rope_local.type, RopeConfig::Type::kDefault);
}

TEST(ConfigTest, NewStyleRopeParameters) {
  json j = TinyJson(Arch::kLlama);
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1234.0}};
  auto c = ParseModelConfig(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.type, RopeConfig::Type::kDefault);
  EXPECT_EQ(c->rope.theta, 1234.0);
}

TEST(ConfigTest, ErrorsNameTheField) {
  json j = TinyJson(Arch::kLlama);
  j.erase("hidden_size");
  auto c = ParseModelConfig(j);
  EXPECT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("hidden_size"), std::string::npos) << c.status();

  j = TinyJson(Arch::kLlama);
  j["model_type"] = "mamba";
  c = ParseModelConfig(j);
  EXPECT_NE(c.status().message().find("model_type"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("mamba"), std::string::npos) << c.status();

  j = TinyJson(Arch::kLlama);
  j["rope_scaling"]["rope_type"] = "yarn";
  c = ParseModelConfig(j);
  EXPECT_NE(c.status().message().find("rope_scaling.rope_type"), std::string::npos) << c.status();

  j = TinyJson(Arch::kLlama);
  j["rope_scaling"].erase("low_freq_factor");
  c = ParseModelConfig(j);
  EXPECT_NE(c.status().message().find("rope_scaling.low_freq_factor"), std::string::npos)
      << c.status();

  j = TinyJson(Arch::kOlmoe);
  j["num_experts_per_tok"] = 9;
  c = ParseModelConfig(j);
  EXPECT_NE(c.status().message().find("num_experts_per_tok"), std::string::npos) << c.status();

  j = TinyJson(Arch::kQwen2);
  j["num_key_value_heads"] = 3;
  c = ParseModelConfig(j);
  EXPECT_NE(c.status().message().find("num_key_value_heads"), std::string::npos) << c.status();

  EXPECT_FALSE(ArchFromName("gpt2").ok());
  EXPECT_FALSE(PresetConfigJson(Arch::kLlama, "huge").ok());
}

// ---- checkpoints ----

class ArchTest : public testing::TestWithParam<std::string> {};

// init -> the checkpoint holds exactly the parameter names; loading gives the same values as
// initialising again with the same seed.
TEST_P(ArchTest, InitSaveLoadRoundTrip) {
  const std::string dir = InitCheckpoint(GetParam(), TestDir("ckpt"), /*seed=*/11);
  auto reader = io::CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->has_manifest());
  auto loaded = LoadModel(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();

  std::vector<std::string> names = ParameterNames(*loaded);
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ((*reader)->TensorNames(), sorted);
  EXPECT_TRUE(std::find(names.begin(), names.end(), "model.embed_tokens.weight") != names.end());
  EXPECT_TRUE(std::find(names.begin(), names.end(), "model.layers.1.self_attn.q_proj.weight") !=
              names.end());

  auto fresh = InitModel((*loaded)->config(), 11);
  ASSERT_TRUE(fresh.ok());
  auto fresh_params = (*fresh)->named_parameters();
  for (const auto& item : (*loaded)->named_parameters()) {
    auto stored = (*reader)->Tensor(item.key());
    ASSERT_TRUE(stored.ok()) << stored.status();
    EXPECT_TRUE(torch::equal(item.value(), *stored)) << item.key();
    EXPECT_TRUE(torch::equal(item.value(), fresh_params[item.key()])) << item.key();
  }
}

TEST(CheckpointTest, ArchSpecificNames) {
  auto names_of = [](Arch arch) {
    auto lm = InitModel(*ParseModelConfig(TinyJson(arch)), 1);
    return ParameterNames(*lm);
  };
  auto has = [](const std::vector<std::string>& names, const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  auto llama = names_of(Arch::kLlama);
  EXPECT_TRUE(has(llama, "lm_head.weight"));
  EXPECT_FALSE(has(llama, "model.layers.0.self_attn.q_proj.bias"));
  auto qwen = names_of(Arch::kQwen2);
  EXPECT_FALSE(has(qwen, "lm_head.weight"));  // tied
  EXPECT_TRUE(has(qwen, "model.layers.0.self_attn.q_proj.bias"));
  EXPECT_FALSE(has(qwen, "model.layers.0.self_attn.o_proj.bias"));
  auto gemma = names_of(Arch::kGemma3);
  EXPECT_TRUE(has(gemma, "model.layers.2.self_attn.q_norm.weight"));
  EXPECT_TRUE(has(gemma, "model.layers.2.pre_feedforward_layernorm.weight"));
  EXPECT_TRUE(has(gemma, "model.layers.2.post_feedforward_layernorm.weight"));
  EXPECT_FALSE(has(gemma, "lm_head.weight"));
  auto olmoe = names_of(Arch::kOlmoe);
  EXPECT_TRUE(has(olmoe, "model.layers.1.mlp.gate.weight"));
  EXPECT_TRUE(has(olmoe, "model.layers.1.mlp.experts.3.down_proj.weight"));
  EXPECT_TRUE(has(olmoe, "model.layers.0.self_attn.k_norm.weight"));
  EXPECT_FALSE(has(olmoe, "model.layers.0.mlp.gate_proj.weight"));
}

TEST(CheckpointTest, MissingAndMisshapenTensorsAreNamed) {
  auto lm = *InitModel(*ParseModelConfig(TinyJson(Arch::kLlama)), 1);
  auto params = lm->named_parameters();
  auto missing = LoadWeights(lm, [&](const std::string& name) -> absl::StatusOr<torch::Tensor> {
    if (name == "model.layers.1.mlp.up_proj.weight") {
      return absl::NotFoundError("checkpoint has no tensor 'model.layers.1.mlp.up_proj.weight'");
    }
    return params[name].clone();
  });
  EXPECT_TRUE(absl::IsNotFound(missing)) << missing;
  EXPECT_NE(missing.message().find("model.layers.1.mlp.up_proj.weight"), std::string::npos);

  auto misshapen = LoadWeights(lm, [&](const std::string& name) -> absl::StatusOr<torch::Tensor> {
    if (name == "model.norm.weight") return torch::ones({65});
    return params[name].clone();
  });
  EXPECT_TRUE(absl::IsInvalidArgument(misshapen)) << misshapen;
  EXPECT_NE(misshapen.message().find("model.norm.weight"), std::string::npos);
  EXPECT_NE(misshapen.message().find("[65]"), std::string::npos);
}

// Multimodal Gemma3 checkpoints keep the text decoder under language_model.* (or, as newer
// transformers save them, model.language_model.*).
TEST(CheckpointTest, GemmaMultimodalPrefixes) {
  auto source = *InitModel(*ParseModelConfig(TinyJson(Arch::kGemma3)), 2);
  auto params = source->named_parameters();
  for (const std::string prefix : {"language_model.", "model.language_model."}) {
    auto lm = *InitModel(*ParseModelConfig(TinyJson(Arch::kGemma3)), 3);
    auto status = LoadWeights(lm, [&](const std::string& name) -> absl::StatusOr<torch::Tensor> {
      std::string key = name;
      if (prefix == "language_model.") {
        if (name.rfind("language_model.", 0) != 0) return absl::NotFoundError(name);
        key = name.substr(prefix.size());
      } else {
        if (name.rfind("model.language_model.", 0) != 0) return absl::NotFoundError(name);
        key = "model." + name.substr(prefix.size());
      }
      return params[key].clone();
    });
    ASSERT_TRUE(status.ok()) << prefix << ": " << status;
    for (const auto& item : lm->named_parameters()) {
      EXPECT_TRUE(torch::equal(item.value(), params[item.key()])) << prefix << item.key();
    }
  }
}

// Saved in bf16, loaded back into fp32 parameters: each value is its bf16 rounding, and the
// config says bfloat16.
TEST(CheckpointTest, Bf16SaveLoad) {
  auto lm = *InitModel(*ParseModelConfig(TinyJson(Arch::kQwen2)), 4);
  const std::string dir = TestDir("bf16") + "/ckpt";
  SaveOptions options;
  options.dtype = torch::kBFloat16;
  ASSERT_TRUE(SaveModel(lm, dir, options).ok());
  auto reader = *io::CheckpointReader::Open(dir);
  EXPECT_EQ(reader->config()["torch_dtype"], "bfloat16");
  EXPECT_EQ(reader->Find("model.embed_tokens.weight")->dtype, io::Dtype::kBF16);
  auto loaded = LoadModel(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto original = lm->named_parameters();
  for (const auto& item : (*loaded)->named_parameters()) {
    EXPECT_EQ(item.value().scalar_type(), torch::kFloat32);
    EXPECT_TRUE(
        torch::equal(item.value(), original[item.key()].to(torch::kBFloat16).to(torch::kFloat32)))
        << item.key();
  }
}

TEST(CheckpointTest, CommandsFailCleanly) {
  const std::string root = TestDir("bad");
  EXPECT_NE(RunCommand({"init", "--arch", "gpt2", "--out", root + "/x"}, RunInit), 0);
  EXPECT_FALSE(fs::exists(root + "/x"));
  EXPECT_NE(RunCommand({"logits", "--model", root + "/none", "--tokens", "1"}, RunLogits), 0);
  const std::string dir = InitCheckpoint("llama", root);
  EXPECT_NE(RunCommand({"logits", "--model", dir, "--tokens", "1,999"}, RunLogits),
            0);                                                                  // vocab 256
  EXPECT_NE(RunCommand({"init", "--arch", "llama", "--out", dir}, RunInit), 0);  // exists
}

// ---- generation ----

// Decoding token by token through the KV cache gives the logits of one full forward pass
// (Gemma3's sliding window of 4 is shorter than the sequence).
TEST_P(ArchTest, KvCacheMatchesFullForward) {
  auto lm = *InitModel(*ParseModelConfig(TinyJson(*ArchFromName(GetParam()))), 3);
  torch::NoGradGuard no_grad;
  auto ids = torch::tensor(TokenIds(), torch::kInt64).unsqueeze(0);  // [1, T]
  auto full = lm->forward(ids).logits;                               // [1, T, V]
  KVCache cache;
  auto first = lm->forward(ids.slice(1, 0, 5), &cache).logits;  // prefill 5
  EXPECT_LT(MaxAbsDiff(first, full.slice(1, 0, 5)), 1e-5);
  for (int64_t i = 5; i < ids.size(1); ++i) {
    auto step = lm->forward(ids.slice(1, i, i + 1), &cache).logits;  // [1, 1, V]
    EXPECT_LT(MaxAbsDiff(step, full.slice(1, i, i + 1)), 1e-5) << "position " << i;
  }
  EXPECT_EQ(cache.length(), ids.size(1));

  auto generated = GreedyGenerate(lm, ids.slice(1, 0, 4), 6);
  ASSERT_EQ(generated.size(1), 10);
  auto again = lm->forward(generated).logits.argmax(-1);  // [1, 10]
  EXPECT_TRUE(torch::equal(again.slice(1, 3, 9), generated.slice(1, 4, 10)));
}

// The manual attention path (used for score softcapping) against SDPA: with a cap far above
// the scores, softcapping is the identity, so the logits must agree (sliding window included).
TEST(AttentionTest, SoftcapPathMatchesSdpa) {
  for (Arch arch : {Arch::kLlama, Arch::kGemma3}) {
    ModelConfig config = *ParseModelConfig(TinyJson(arch));
    auto plain = *InitModel(config, 9);
    config.attn_logit_softcapping = 1e9;
    auto capped = *InitModel(config, 9);
    torch::NoGradGuard no_grad;
    auto ids = torch::tensor(TokenIds(), torch::kInt64).unsqueeze(0);
    EXPECT_LT(MaxAbsDiff(plain->forward(ids).logits, capped->forward(ids).logits), 1e-5)
        << ArchName(arch);
    config.attn_logit_softcapping = 1e-3;  // a real cap changes the result
    auto tight = *InitModel(config, 9);
    EXPECT_GT(MaxAbsDiff(plain->forward(ids).logits, tight->forward(ids).logits), 1e-6);
  }
}

// ---- MoE losses ----

TEST(MoeLossTest, UniformRoutingValues) {
  std::vector<torch::Tensor> logits = {torch::zeros({6, 4}), torch::zeros({6, 4})};
  EXPECT_NEAR(LoadBalancingLoss(logits, 2).item<double>(), 1.0, 1e-6);
  EXPECT_NEAR(HfLoadBalancingLoss(logits, 2).item<double>(), 2.0, 1e-6);  // k for uniform
  EXPECT_NEAR(RouterZLoss(logits).item<double>(), std::pow(std::log(4.0), 2), 1e-5);
}

TEST(MoeLossTest, ForwardReturnsLosses) {
  auto lm = *InitModel(*ParseModelConfig(TinyJson(Arch::kOlmoe)), 5);
  auto out = lm->forward(torch::tensor(TokenIds(), torch::kInt64).unsqueeze(0));
  ASSERT_EQ(out.router_logits.size(), 2u);
  EXPECT_EQ(out.router_logits[0].sizes(), (std::vector<int64_t>{12, 4}));
  ASSERT_TRUE(out.load_balancing_loss.defined());
  ASSERT_TRUE(out.router_z_loss.defined());
  out.load_balancing_loss.backward();  // differentiable through the router probabilities
  auto grad = lm->named_parameters()["model.layers.0.mlp.gate.weight"].grad();
  ASSERT_TRUE(grad.defined());
  EXPECT_GT(grad.abs().sum().item<double>(), 0);
}

// ---- parity with transformers ----

// `stemma-engine init` -> `stemma-engine logits` and transformers on the same checkpoint
// and tokens: fp32 logits within 1e-4.
TEST_P(ArchTest, LogitsMatchTransformers) {
  const std::string root = TestDir("parity");
  const std::string dir = InitCheckpoint(GetParam(), root);
  const std::string ours = root + "/engine.safetensors", theirs = root + "/hf.safetensors";
  ASSERT_EQ(RunCommand({"logits", "--model", dir, "--tokens", kTokens, "--out", ours}, RunLogits),
            0);
  ASSERT_EQ(RunPython(absl::StrCat("--model ", dir, " --tokens ", kTokens, " --out ", theirs)), 0)
      << "transformers could not run " << dir;
  auto a = ReadTensor(ours, "logits"), b = ReadTensor(theirs, "logits");
  ASSERT_TRUE(a.defined() && b.defined());
  ASSERT_EQ(a.sizes(), b.sizes());
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{1, 12, 259}));  // init's default byte tokenizer
  const double diff = MaxAbsDiff(a, b);
  std::printf("%s: max |logits - transformers| = %.3g (logit scale %.3g)\n", GetParam().c_str(),
              diff, b.abs().max().item<double>());
  EXPECT_LE(diff, 1e-4);

  if (GetParam() == "olmoe") {
    auto lm = *LoadModel(dir);
    torch::NoGradGuard no_grad;
    auto out = lm->forward(torch::tensor(TokenIds(), torch::kInt64).unsqueeze(0));
    auto router = ReadTensor(theirs, "router_logits");  // [L, T, E]
    EXPECT_LE(MaxAbsDiff(torch::stack(out.router_logits), router), 1e-4);
    const double hf_aux = ReadTensor(theirs, "aux_loss").item<double>();
    EXPECT_NEAR(HfLoadBalancingLoss(out.router_logits, 2).item<double>(), hf_aux, 1e-5);
  }
}

// The other direction, and a stronger check: transformers builds the model from the same
// config.json, gives it O(1) random weights (so attention, norms, RoPE and routing all move
// the logits), saves it with save_pretrained (its own config and tensor layout), and the
// engine loads that directory.
TEST_P(ArchTest, LoadsTransformersCheckpointWithLargeWeights) {
  const std::string root = TestDir("hf");
  const std::string config_dir = InitCheckpoint(GetParam(), root);
  const std::string dir = root + "/hf-saved";
  const std::string ours = root + "/engine.safetensors", theirs = root + "/hf.safetensors";
  ASSERT_EQ(RunPython(absl::StrCat("--create-from ", config_dir, " --seed 3 --model ", dir,
                                   " --tokens ", kTokens, " --out ", theirs)),
            0);
  ASSERT_EQ(RunCommand({"logits", "--model", dir, "--tokens", kTokens, "--out", ours}, RunLogits),
            0);
  auto a = ReadTensor(ours, "logits"), b = ReadTensor(theirs, "logits");
  ASSERT_TRUE(a.defined() && b.defined());
  ASSERT_EQ(a.sizes(), b.sizes());
  const double diff = MaxAbsDiff(a, b);
  std::printf("%s (transformers checkpoint, large weights): max |diff| = %.3g (logit scale %.3g)\n",
              GetParam().c_str(), diff, b.abs().max().item<double>());
  EXPECT_LE(diff, 1e-4);
  if (GetParam() == "olmoe") {
    auto lm = *LoadModel(dir);
    torch::NoGradGuard no_grad;
    auto out = lm->forward(torch::tensor(TokenIds(), torch::kInt64).unsqueeze(0));
    EXPECT_LE(MaxAbsDiff(torch::stack(out.router_logits), ReadTensor(theirs, "router_logits")),
              1e-4);
    EXPECT_NEAR(HfLoadBalancingLoss(out.router_logits, 2).item<double>(),
                ReadTensor(theirs, "aux_loss").item<double>(), 1e-5);
  }
}

// Config variants the presets do not cover, through the same transformers round trip: each
// mutates a tiny preset's config.json, transformers builds and saves the model, the engine
// loads it.
struct Variant {
  std::string name;
  Arch arch;
  std::function<void(json&)> mutate;
};

class VariantTest : public testing::TestWithParam<Variant> {};

TEST_P(VariantTest, LogitsMatchTransformers) {
  const Variant& v = GetParam();
  const std::string root = TestDir("variant");
  json config = TinyJson(v.arch);
  v.mutate(config);
  ASSERT_TRUE(ParseModelConfig(config).ok()) << ParseModelConfig(config).status();
  const std::string config_dir = root + "/config";
  fs::create_directories(config_dir);
  std::ofstream(config_dir + "/config.json") << config.dump(2);
  const std::string dir = root + "/hf-saved";
  const std::string ours = root + "/engine.safetensors", theirs = root + "/hf.safetensors";
  ASSERT_EQ(RunPython(absl::StrCat("--create-from ", config_dir, " --seed 5 --model ", dir,
                                   " --tokens ", kTokens, " --out ", theirs)),
            0);
  ASSERT_EQ(RunCommand({"logits", "--model", dir, "--tokens", kTokens, "--out", ours}, RunLogits),
            0);
  auto a = ReadTensor(ours, "logits"), b = ReadTensor(theirs, "logits");
  ASSERT_TRUE(a.defined() && b.defined());
  ASSERT_EQ(a.sizes(), b.sizes());
  const double diff = MaxAbsDiff(a, b);
  std::printf("%s: max |diff| = %.3g (logit scale %.3g)\n", v.name.c_str(), diff,
              b.abs().max().item<double>());
  EXPECT_LE(diff, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, VariantTest,
    testing::Values(Variant{"llama_mha_biases_default_rope", Arch::kLlama,
                            [](json& j) {
                              j["num_key_value_heads"] = 4;
                              j["attention_bias"] = true;
                              j["mlp_bias"] = true;
                              j.erase("rope_scaling");
                              j["rope_theta"] = 10000.0;
                            }},
                    Variant{"qwen2_sliding_window_untied", Arch::kQwen2,
                            [](json& j) {
                              j["use_sliding_window"] = true;
                              j["sliding_window"] = 4;
                              j["max_window_layers"] = 1;
                              j["tie_word_embeddings"] = false;
                            }},
                    Variant{"gemma3_softcap_linear_rope_pattern", Arch::kGemma3,
                            [](json& j) {
                              j["attn_logit_softcapping"] = 2.0;
                              j["final_logit_softcapping"] = 5.0;
                              j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
                              j.erase("layer_types");
                              j["sliding_window_pattern"] = 2;
                              j["num_hidden_layers"] = 4;
                            }},
                    Variant{"olmoe_norm_topk_clip_qkv", Arch::kOlmoe,
                            [](json& j) {
                              j["norm_topk_prob"] = true;
                              j["clip_qkv"] = 0.5;
                              j["num_experts"] = 6;
                              j["num_experts_per_tok"] = 3;
                            }}),
    [](const auto& info) { return info.param.name; });

INSTANTIATE_TEST_SUITE_P(Families, ArchTest, testing::Values("llama", "qwen2", "gemma3", "olmoe"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace stemma::engine::model
