// Stemma's checkpoints against Python's safetensors and transformers, both directions.
// Runs tests/engine/safetensors_interop.py with the engine venv's Python (STEMMA_PYTHON).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/io/checkpoint.h"
#include "engine/io/fs.h"

namespace stemma::engine::io {
namespace {

namespace fs = std::filesystem;

// Mirrors expected_tensors() in safetensors_interop.py.
std::map<std::string, at::Tensor> ExpectedTensors() {
  struct Spec {
    const char* name;
    at::ScalarType dtype;
    std::vector<int64_t> shape;
  };
  const Spec specs[] = {
      {"f64", at::kDouble, {3}},    {"f32", at::kFloat, {2, 3}},   {"f16", at::kHalf, {4, 2}},
      {"bf16", at::kBFloat16, {5}}, {"i64.scalar", at::kLong, {}}, {"i32.empty", at::kInt, {0}},
      {"i16", at::kShort, {2, 2}},  {"i8", at::kChar, {3}},        {"u8", at::kByte, {4}},
      {"bool", at::kBool, {3}},
  };
  std::map<std::string, at::Tensor> out;
  for (const auto& s : specs) {
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    at::Tensor base = at::remainder(at::arange(n, at::kLong) * 3, 11);
    at::Tensor v;
    if (s.dtype == at::kBool) {
      v = at::remainder(base, 2) == 1;
    } else if (s.dtype == at::kByte) {
      v = base.to(s.dtype);
    } else {
      v = (base - 5).to(s.dtype);
    }
    out[s.name] = v.reshape(s.shape);
  }
  return out;
}

TEST(InteropTest, PythonReadsOursAndWeReadPythonAndTransformers) {
  fs::path dir = fs::temp_directory_path() / ("stemma-interop-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);

  CheckpointWriterOptions options;
  options.max_shard_bytes = 40;  // sharded, so Python reads several of our files
  auto w = CheckpointWriter::Create((dir / "ours").string(), options);
  ASSERT_TRUE(w.ok()) << w.status();
  for (const auto& [name, t] : ExpectedTensors()) ASSERT_TRUE((*w)->AddTensor(name, t).ok());
  ASSERT_TRUE((*w)->Commit().ok());

  std::string cmd =
      std::string("'") + STEMMA_PYTHON + "' '" + STEMMA_INTEROP_SCRIPT + "' '" + dir.string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  // Python's safetensors file, read by us.
  auto theirs = SafetensorsFile::Open((dir / "theirs.safetensors").string());
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  for (const auto& [name, want] : ExpectedTensors()) {
    const TensorInfo* t = (*theirs)->Find(name);
    ASSERT_NE(t, nullptr) << name;
    at::Tensor got = at::from_blob((*theirs)->Data(*t), t->shape, want.options()).clone();
    EXPECT_TRUE(at::equal(got, want)) << name;
  }

  // transformers.save_pretrained, sharded with an index, read by CheckpointReader.
  auto hf = CheckpointReader::Open((dir / "hf").string());
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_GT((*hf)->shards().size(), 1u);
  EXPECT_EQ((*hf)->config()["model_type"], "llama");
  nlohmann::json sums = nlohmann::json::parse(*ReadFile((dir / "hf_sums.json").string()));
  EXPECT_EQ((*hf)->TensorNames().size(), sums.size());
  for (auto it = sums.begin(); it != sums.end(); ++it) {
    auto t = (*hf)->Tensor(it.key());
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->sizes().vec(), it.value()["shape"].get<std::vector<int64_t>>()) << it.key();
    EXPECT_EQ(t->scalar_type(), at::kBFloat16) << it.key();
    EXPECT_DOUBLE_EQ(t->to(at::kDouble).sum().item<double>(), it.value()["sum"].get<double>())
        << it.key();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace stemma::engine::io
