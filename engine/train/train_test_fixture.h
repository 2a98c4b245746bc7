// The fixture of the end-to-end tests of `stemma-engine train` (train_test.cc,
// train_strategies_test.cc): the real binary on tiny models (made by `stemma-engine init`)
// and a synthetic token dataset, in a directory of the test process's own.
#pragma once

#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/data/dataset_writer.h"
#include "engine/io/checkpoint.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace stemma::engine::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Result {
  int exit_code = -1;
  std::vector<json> events;
  std::string stdout_text, stderr_text;

  std::vector<json> Of(const std::string& kind) const {
    std::vector<json> out;
    for (const json& e : events) {
      if (e["event"] == kind) out.push_back(e);
    }
    return out;
  }
  std::map<int64_t, double> Losses() const {
    std::map<int64_t, double> out;
    for (const json& e : Of("step")) out[e["step"].get<int64_t>()] = e["loss"].get<double>();
    return out;
  }
};

inline std::string ReadText(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline int Shell(const std::string& command) {
  int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

using Tensors = std::map<std::string, torch::Tensor>;

inline Tensors ReadTensors(const fs::path& dir) {
  auto reader = io::CheckpointReader::Open(dir.string());
  EXPECT_TRUE(reader.ok()) << reader.status();
  Tensors out;
  if (!reader.ok()) return out;
  for (const std::string& name : (*reader)->TensorNames()) {
    out[name] = (*reader)->Tensor(name)->clone();
  }
  return out;
}

class TrainTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / absl::StrCat("stemma_train_test_", getpid());
    fs::remove_all(root_);
    fs::create_directories(root_);
    for (const char* arch : {"llama", "qwen2", "gemma3", "olmoe"}) {
      ASSERT_EQ(Shell(absl::StrCat(STEMMA_ENGINE_BIN, " init --arch ", arch, " --seed 7 --out ",
                                   (root_ / arch).string(), " > /dev/null")),
                0);
    }
    WriteDataset("sw", 11);
  }
  static void TearDownTestSuite() {
    if (std::getenv("STEMMA_KEEP_TEST_DIR") == nullptr) fs::remove_all(root_);
  }

  // Documents of a learnable pattern (runs of +step sequences over the 16 ids 3..18), so the
  // loss falls quickly on a tiny model (from ln 256 toward ln 16 and below).
  static void WriteDataset(const std::string& name, uint32_t seed) {
    data::DatasetWriterOptions o;
    o.out_dir = (root_ / name).string();
    o.language = name;
    o.tokenizer = {.name = "synthetic",
                   .kind = "none",
                   .file = "",
                   .sha256 = "",
                   .vocab_size = 256,
                   .bos_id = 1,
                   .eos_id = 2};
    auto writer = data::DatasetWriter::Create(o);
    ASSERT_TRUE(writer.ok()) << writer.status();
    std::mt19937 rng(seed);
    for (int d = 0; d < 300; ++d) {
      std::vector<int32_t> doc;
      int32_t value = 3 + rng() % 16, step = 1 + rng() % 2;
      const int length = 20 + rng() % 60;
      for (int k = 0; k < length; ++k) {
        doc.push_back(value);
        value = 3 + (value - 3 + step) % 16;
      }
      ASSERT_TRUE((*writer)->AddDocument(doc).ok());
    }
    ASSERT_TRUE((*writer)->Finish({}).ok());
  }

  // A small complete spec; tests override fields.
  static json BaseSpec(const std::string& arch, const std::string& out) {
    return {{"model", (root_ / arch).string()},
            {"out", (root_ / out).string()},
            // One dataset needs no weight (issue 16 point 2).
            {"data", {{"datasets", {{{"path", (root_ / "sw").string()}}}}, {"seq_len", 16}}},
            {"batch_size", 4},
            {"grad_accum", 1},
            {"steps", 4},
            {"seed", 3},
            {"threads", 1},
            {"optimizer", {{"lr", 1e-2}, {"weight_decay", 0.0}}},
            {"schedule", {{"warmup_steps", 1}}},
            {"clip_grad_norm", 1.0}};
  }

  // `env` prefixes the command ("STEMMA_CPUS=1 ").
  static Result Run(const json& spec, const std::string& name, const std::string& extra = "",
                    const std::string& env = "") {
    const fs::path spec_path = root_ / (name + ".json");
    std::ofstream(spec_path) << spec.dump(2);
    const fs::path out = root_ / (name + ".stdout"), err = root_ / (name + ".stderr");
    Result r;
    r.exit_code = Shell(absl::StrCat(env, STEMMA_ENGINE_BIN, " train --spec ", spec_path.string(),
                                     " ", extra, " > ", out.string(), " 2> ", err.string()));
    r.stdout_text = ReadText(out);
    r.stderr_text = ReadText(err);
    std::istringstream lines(r.stdout_text);
    for (std::string line; std::getline(lines, line);) {
      json e = json::parse(line, nullptr, false);
      EXPECT_FALSE(e.is_discarded()) << "stdout line is not JSON: " << line;
      EXPECT_TRUE(e.is_object() && e.contains("event")) << line;
      EXPECT_TRUE(absl::StartsWith(line, "{\"event\":")) << line;
      if (!e.is_discarded()) r.events.push_back(e);
    }
    return r;
  }

  inline static fs::path root_;
};

inline bool Same(const torch::Tensor& a, const torch::Tensor& b) { return torch::equal(a, b); }

}  // namespace stemma::engine::train
