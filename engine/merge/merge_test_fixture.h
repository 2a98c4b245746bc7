// What merge_test.cc and merge_durability_test.cc share: small random Llama-shaped
// checkpoints written here (mixed dtypes, sharded), read back, and the real stemma-engine
// binary run on a spec (the MergeTest fixture).
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/io/checkpoint.h"
#include "engine/io/safetensors.h"
#include "engine/io/sha256.h"
#include "engine/merge/checkpoint_stream.h"
#include "engine/merge/dtype_convert.h"
#include "engine/merge/kernels.h"
#include "engine/merge/merge_plan.h"

namespace stemma::engine::merge {

namespace fs = std::filesystem;

// The binary under test: the build's stemma-engine, or $STEMMA_ENGINE_BIN when set.
inline const char* EngineBin() {
  const char* env = std::getenv("STEMMA_ENGINE_BIN");
  return env != nullptr && *env != '\0' ? env : STEMMA_ENGINE_BIN;
}
using io::Dtype;
using nlohmann::json;

struct Tensor {
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  std::vector<float> values;  // exactly representable in dtype
};
using Model = std::map<std::string, Tensor>;

inline json TinyConfig(int layers = 4) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", 16},
          {"intermediate_size", 32},
          {"num_hidden_layers", layers},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 2},
          {"vocab_size", 64},
          {"rms_norm_eps", 1e-5},
          {"tie_word_embeddings", false},
          {"max_position_embeddings", 128},
          {"hidden_act", "silu"}};
}

inline float RoundTo(Dtype dtype, float v) {
  float out;
  uint8_t bytes[8];
  FromF32(&v, 1, dtype, bytes, 0);
  ToF32(bytes, dtype, 0, 1, &out);
  return out;
}

// A Llama-shaped model with values ~ N(center, scale^2), rounded to `dtype`.
inline Model RandomModel(uint32_t seed, Dtype dtype, int layers = 4, float center = 0.0f,
                         float scale = 1.0f, int vocab = 64) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(center, scale);
  Model m;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    Tensor t{dtype, shape, {}};
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    for (int64_t i = 0; i < n; ++i) t.values.push_back(RoundTo(dtype, normal(rng)));
    m[name] = std::move(t);
  };
  add("model.embed_tokens.weight", {vocab, 16});
  add("lm_head.weight", {vocab, 16});
  add("model.norm.weight", {16});
  for (int l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    add(p + "input_layernorm.weight", {16});
    add(p + "post_attention_layernorm.weight", {16});
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"})
      add(p + "self_attn." + proj + ".weight", {16, 16});
    add(p + "mlp.gate_proj.weight", {32, 16});
    add(p + "mlp.up_proj.weight", {32, 16});
    add(p + "mlp.down_proj.weight", {16, 32});
  }
  return m;
}

// Writes `m` as a checkpoint: one file, or `shards` files with an index.
inline void WriteModel(const std::string& dir, const Model& m, const json& config, int shards = 1) {
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << config.dump(2);
  std::vector<std::vector<uint8_t>> storage;
  std::vector<std::vector<io::TensorToWrite>> files(shards);
  json weight_map = json::object();
  int i = 0;
  for (const auto& [name, t] : m) {
    std::vector<uint8_t> bytes(t.values.size() * io::DtypeSize(t.dtype));
    FromF32(t.values.data(), t.values.size(), t.dtype, bytes.data(), 0);
    storage.push_back(std::move(bytes));
    const int shard = i++ % shards;
    files[shard].push_back({name, t.dtype, t.shape, storage.back().data(), storage.back().size()});
    weight_map[name] = shards == 1
                           ? "model.safetensors"
                           : absl::StrFormat("model-%05d-of-%05d.safetensors", shard + 1, shards);
  }
  for (int s = 0; s < shards; ++s) {
    const std::string file = shards == 1
                                 ? "model.safetensors"
                                 : absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards);
    ASSERT_TRUE(io::WriteSafetensors(dir + "/" + file, files[s]).ok());
  }
  if (shards > 1) {
    std::ofstream(dir + "/model.safetensors.index.json")
        << json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump();
  }
}

inline Model ReadModel(const std::string& dir) {
  auto src = SourceCheckpoint::Open(dir);
  EXPECT_TRUE(src.ok()) << src.status();
  Model m;
  if (!src.ok()) return m;
  for (const std::string& name : (*src)->names()) {
    auto t = (*src)->Find(name);
    Tensor out{t.info->dtype, t.info->shape, std::vector<float>(t.info->numel())};
    ToF32(t.data, t.info->dtype, 0, t.info->numel(), out.values.data());
    m[name] = std::move(out);
  }
  return m;
}

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Unit in the last place of `dtype` around |x|.
inline double Ulp(Dtype dtype, double x) {
  const int mantissa = dtype == Dtype::kBF16 ? 7 : dtype == Dtype::kF16 ? 10 : 23;
  const double mag = std::max(std::fabs(x), dtype == Dtype::kF16 ? 6.1e-5 : 1e-30);
  return std::exp2(std::floor(std::log2(mag)) - mantissa);
}

// `out` is the exact value `ref` rounded once to its dtype (plus fp32 arithmetic error).
inline void ExpectRounded(const Tensor& out, const std::vector<double>& ref,
                          const std::string& name) {
  ASSERT_EQ(out.values.size(), ref.size()) << name;
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double tolerance = 0.5 * Ulp(out.dtype, ref[i]) + 4e-7 * std::fabs(ref[i]) + 1e-7;
    if (std::fabs(out.values[i] - ref[i]) > tolerance && bad++ < 3) {
      ADD_FAILURE() << name << "[" << i << "] = " << out.values[i] << ", want " << ref[i];
    }
  }
  EXPECT_EQ(bad, 0) << name;
}

// `models:` as the spec writes them: one {path: ...} mapping per checkpoint.
inline json Paths(std::initializer_list<std::string> paths) {
  json out = json::array();
  for (const std::string& p : paths) out.push_back({{"path", p}});
  return out;
}

struct Result {
  int code = -1;
  std::string out, err;
  std::vector<json> events;
};

class MergeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() /
            absl::StrCat("merge_test_", ::getpid(), "_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string P(const std::string& name) const { return dir_ + "/" + name; }

  std::string SpecFile(const json& spec) {
    const std::string path = P(absl::StrCat("spec", specs_++, ".json"));
    std::ofstream(path) << spec.dump(2);
    return path;
  }

  Result Run(const std::string& command, const json& spec, const std::string& env = "") {
    const std::string spec_path = SpecFile(spec);
    Result r;
    const std::string cmd = absl::StrCat(env, " ", EngineBin(), " ", command, " --spec ", spec_path,
                                         " >", P("stdout"), " 2>", P("stderr"));
    const int status = std::system(cmd.c_str());
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = ReadText(P("stdout"));
    r.err = ReadText(P("stderr"));
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      json j = json::parse(line, nullptr, false);
      EXPECT_FALSE(j.is_discarded()) << "stdout line is not JSON: " << line;
      if (!j.is_discarded()) {
        EXPECT_TRUE(j.contains("event")) << line;
        r.events.push_back(j);
      }
    }
    return r;
  }

  std::string dir_;
  int specs_ = 0;
};

}  // namespace stemma::engine::merge
