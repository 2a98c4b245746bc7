// End-to-end tests of `stemma-engine train`: the real binary on tiny models (made by
// `stemma-engine init`) and synthetic token datasets, checked the way a user would check a
// run: the events it printed, the tensors it wrote, what it refused.
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
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
namespace {

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

std::string ReadText(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int Shell(const std::string& command) {
  int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

using Tensors = std::map<std::string, torch::Tensor>;

Tensors ReadTensors(const fs::path& dir) {
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

  static fs::path root_;
};

fs::path TrainTest::root_;

bool Same(const torch::Tensor& a, const torch::Tensor& b) { return torch::equal(a, b); }

// Every architecture trains: the loss falls, events follow the contract, the output loads.
TEST_F(TrainTest, EveryArchitectureTrainsAndReportsEvents) {
  for (const char* arch : {"llama", "qwen2", "gemma3", "olmoe"}) {
    SCOPED_TRACE(arch);
    json spec = BaseSpec(arch, absl::StrCat("full_", arch));
    spec["steps"] = 12;
    Result r = Run(spec, absl::StrCat("full_", arch));
    ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
    ASSERT_FALSE(r.events.empty());
    EXPECT_EQ(r.events.front()["event"], "start");
    EXPECT_EQ(r.events.front()["command"], "train");
    EXPECT_EQ(r.events.back()["event"], "done");
    auto steps = r.Of("step");
    ASSERT_EQ(steps.size(), 12u);
    for (size_t i = 0; i < steps.size(); ++i) {
      EXPECT_EQ(steps[i]["step"], static_cast<int64_t>(i + 1));
      EXPECT_EQ(steps[i]["total_steps"], 12);
      EXPECT_EQ(steps[i]["tokens"], static_cast<int64_t>((i + 1) * 4 * 16));
      EXPECT_GT(steps[i]["tokens_per_s"].get<double>(), 0.0);
      EXPECT_GE(steps[i]["grad_norm"].get<double>(), 0.0);
    }
    EXPECT_LT(steps.back()["loss"].get<double>(), steps.front()["loss"].get<double>() - 1.0);
    auto outputs = r.Of("output");
    ASSERT_EQ(outputs.size(), 1u);
    EXPECT_EQ(outputs[0]["name"], "model");
    EXPECT_EQ(outputs[0]["path"], (root_ / absl::StrCat("full_", arch)).string());
    // What the checkpoint registry records (engine/events.h).
    EXPECT_EQ(outputs[0]["type"], "checkpoint") << outputs[0].dump();
    EXPECT_EQ(outputs[0]["operation"], "cpt");
    EXPECT_EQ(outputs[0]["manifest_sha256"].get<std::string>().size(), 64u);
    EXPECT_EQ(outputs[0]["parents"], json::array({(root_ / arch).string()}));
    EXPECT_EQ(r.events.back()["trainable_fraction"], 1.0);
    // The output is a complete, verified checkpoint with every tensor of the base model.
    Tensors base = ReadTensors(root_ / arch),
            trained = ReadTensors(root_ / absl::StrCat("full_", arch));
    ASSERT_EQ(base.size(), trained.size());
    int changed = 0;
    for (const auto& [name, t] : base) {
      ASSERT_TRUE(trained.count(name)) << name;
      changed += !Same(t, trained[name]);
    }
    EXPECT_GE(changed, static_cast<int>(base.size()) - 1);  // all but possibly an unused row set
    EXPECT_TRUE(io::VerifyCheckpoint((root_ / absl::StrCat("full_", arch)).string()).ok());
  }
}

TEST_F(TrainTest, FrozenLayersEmbeddingsStayBitIdentical) {
  json spec = BaseSpec("llama", "frozen");
  spec["optimizer"]["weight_decay"] = 0.1;  // decay must not touch frozen tensors either
  spec["strategy"] = {{"freeze", {{"layers", {"0:1"}}, {"embeddings", true}}}};
  Result r = Run(spec, "frozen");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  Tensors base = ReadTensors(root_ / "llama"), trained = ReadTensors(root_ / "frozen");
  int64_t expect_trainable = 0, total = 0;
  for (const auto& [name, t] : base) {
    total += t.numel();
    const bool frozen =
        absl::StartsWith(name, "model.layers.0.") || name == "model.embed_tokens.weight";
    if (frozen) {
      EXPECT_TRUE(Same(t, trained[name])) << name << " changed although frozen";
    } else {
      EXPECT_FALSE(Same(t, trained[name])) << name << " did not train";
      expect_trainable += t.numel();
    }
  }
  const json& done = r.events.back();
  EXPECT_EQ(done["trainable_params"], expect_trainable);
  EXPECT_EQ(done["total_params"], total);
  EXPECT_DOUBLE_EQ(done["trainable_fraction"].get<double>(),
                   static_cast<double>(expect_trainable) / total);
}

double DistanceToBase(const Tensors& base, const Tensors& trained, const std::string& prefix) {
  double sum = 0;
  for (const auto& [name, t] : base) {
    if (absl::StartsWith(name, prefix)) sum += (trained.at(name) - t).pow(2).sum().item<double>();
  }
  return std::sqrt(sum);
}

TEST_F(TrainTest, L2spWithLargeLambdaKeepsLayersNearBase) {
  json plain = BaseSpec("llama", "l2sp_off");
  plain["steps"] = 8;
  Result off = Run(plain, "l2sp_off");
  ASSERT_EQ(off.exit_code, 0) << off.stderr_text;
  json spec = plain;
  spec["out"] = (root_ / "l2sp_on").string();
  // λ large on layer 1 only, tiny elsewhere: layer 1 stays near the base, layer 0 moves.
  spec["strategy"] = {{"l2sp", {{{"layers", {"1:2"}}, {"lambda", 1000.0}}, {{"lambda", 1e-6}}}}};
  Result on = Run(spec, "l2sp_on");
  ASSERT_EQ(on.exit_code, 0) << on.stderr_text;
  for (const json& e : on.Of("step")) EXPECT_TRUE(e.contains("l2sp"));
  EXPECT_GT(on.Of("step").back()["l2sp"].get<double>(), 0.0);
  Tensors base = ReadTensors(root_ / "llama");
  const double d_off = DistanceToBase(base, ReadTensors(root_ / "l2sp_off"), "model.layers.1.");
  const double d_on = DistanceToBase(base, ReadTensors(root_ / "l2sp_on"), "model.layers.1.");
  const double d0_on = DistanceToBase(base, ReadTensors(root_ / "l2sp_on"), "model.layers.0.");
  EXPECT_GT(d_off, 0.0);
  EXPECT_LT(d_on, 0.2 * d_off) << "off " << d_off << " on " << d_on;
  EXPECT_GT(d0_on, 3 * d_on);
}

TEST_F(TrainTest, NeuronMaskChangesOnlyMaskedRowsAndColumns) {
  const std::map<int, std::vector<int64_t>> sw = {{0, {1, 5, 7}}, {1, {0, 2}}};
  json mask = {{"format", "stemma.neuron_mask/1"},
               {"num_layers", 2},
               {"intermediate_size", 128},
               {"languages", {{"sw", {sw.at(0), sw.at(1)}}, {"yo", {{9}, json::array()}}}},
               {"params", json::object()},
               {"counts", {{"sw", {3, 2}}, {"yo", {1, 0}}}}};
  std::ofstream(root_ / "mask.json") << mask.dump();
  json spec = BaseSpec("llama", "masked");
  spec["optimizer"]["weight_decay"] = 0.1;  // decay and moments must be masked too
  spec["strategy"] = {
      {"neuron_mask", {{"file", (root_ / "mask.json").string()}, {"languages", {"sw"}}}}};
  Result r = Run(spec, "masked");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  Tensors base = ReadTensors(root_ / "llama"), trained = ReadTensors(root_ / "masked");
  int64_t changed_elements = 0;
  for (const auto& [name, t] : base) {
    auto diff = (trained[name] != t);  // bool, elementwise
    changed_elements += diff.sum().item<int64_t>();
    const int layer = absl::StartsWith(name, "model.layers.0.")   ? 0
                      : absl::StartsWith(name, "model.layers.1.") ? 1
                                                                  : -1;
    const bool rows = absl::StrContains(name, "gate_proj") || absl::StrContains(name, "up_proj");
    const bool cols = absl::StrContains(name, "down_proj");
    if (layer < 0 || (!rows && !cols)) {
      EXPECT_TRUE(Same(t, trained[name])) << name;
      continue;
    }
    const auto& listed = sw.at(layer);
    const int64_t n = rows ? t.size(0) : t.size(1);
    for (int64_t j = 0; j < n; ++j) {
      auto slice = rows ? diff.select(0, j) : diff.select(1, j);
      const bool in_mask = std::count(listed.begin(), listed.end(), j) > 0;
      if (in_mask) {
        EXPECT_GT(slice.sum().item<int64_t>(), slice.numel() / 2) << name << " neuron " << j;
      } else {
        EXPECT_EQ(slice.sum().item<int64_t>(), 0) << name << " neuron " << j << " changed";
      }
    }
  }
  // Σ_l |S_l| · 3 · H trainable parameters, reported.
  const int64_t expected = (3 + 2) * 3 * 64;
  EXPECT_EQ(r.events.front()["trainable_params"], expected);
  EXPECT_EQ(r.events.back()["trainable_params"], expected);
  EXPECT_LE(changed_elements, expected);
  EXPECT_GT(changed_elements, expected * 9 / 10);
  EXPECT_NEAR(r.events.back()["trainable_fraction"].get<double>(),
              static_cast<double>(expected) / r.events.back()["total_params"].get<double>(), 1e-12);
}

TEST_F(TrainTest, ExpertSubsetTrainsOnlyListedExpertsAndRestrictsTheRouter) {
  json selection = {{"_meta", json::object()},
                    {"shared_experts", {{"k1", {{"1", {3}}}}}},
                    {"ca", {{"seft", {{"1", {2}}}}, {"ssft_k1", {{"1", {2, 3, 3}}}}}}};
  std::ofstream(root_ / "experts.json") << selection.dump();
  json spec = BaseSpec("olmoe", "ssft");
  spec["strategy"] = {
      {"expert_subset",
       {{"file", (root_ / "experts.json").string()}, {"language", "ca"}, {"set", "ssft_k1"}}}};
  Result r = Run(spec, "ssft");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  Tensors base = ReadTensors(root_ / "olmoe"), trained = ReadTensors(root_ / "ssft");
  int64_t expected = 0;
  for (const auto& [name, t] : base) {
    const bool listed = absl::StartsWith(name, "model.layers.1.mlp.experts.2.") ||
                        absl::StartsWith(name, "model.layers.1.mlp.experts.3.");
    if (listed) {
      EXPECT_FALSE(Same(t, trained[name])) << name;
      expected += t.numel();
    } else if (name == "model.layers.1.mlp.gate.weight") {
      expected += t.numel();
      // The router trains, but only the rows of the experts it may pick get a gradient:
      // the others see -inf logits, probability 0, so Adam moves them by exactly 0.
      EXPECT_FALSE(Same(t.narrow(0, 2, 2), trained[name].narrow(0, 2, 2)));
      EXPECT_TRUE(Same(t.narrow(0, 0, 2), trained[name].narrow(0, 0, 2)))
          << "router rows of non-target experts changed: routing was not restricted";
    } else {
      EXPECT_TRUE(Same(t, trained[name])) << name;
    }
  }
  EXPECT_EQ(r.events.back()["trainable_params"], expected);
  EXPECT_FALSE(trained.count("model.layers.1.mlp.gate.bias"))
      << "the routing mask leaked into the output";
}

TEST_F(TrainTest, FrozenExpertStaysBitIdenticalWithLoadBalancingLoss) {
  json spec = BaseSpec("olmoe", "deltamoe");
  spec["optimizer"]["weight_decay"] = 0.1;
  spec["strategy"] = {{"frozen_experts", {0}}, {"aux_loss", {{"load_balancing", 0.01}}}};
  Result r = Run(spec, "deltamoe");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  for (const json& e : r.Of("step")) {
    ASSERT_TRUE(e.contains("load_balancing"));
    EXPECT_GT(e["load_balancing"].get<double>(), 0.5);  // 1.0 at uniform routing
  }
  Tensors base = ReadTensors(root_ / "olmoe"), trained = ReadTensors(root_ / "deltamoe");
  int frozen = 0;
  for (const auto& [name, t] : base) {
    if (absl::StrContains(name, ".mlp.experts.0.")) {
      EXPECT_TRUE(Same(t, trained[name])) << name;
      ++frozen;
    } else if (absl::StrContains(name, ".mlp.experts.") || absl::StrContains(name, "mlp.gate.")) {
      EXPECT_FALSE(Same(t, trained[name])) << name;
    }
  }
  EXPECT_EQ(frozen, 2 * 3);  // two layers, three projections
}

// FFN-only (the LAPE study's baseline): attention, norms, embeddings and head frozen, every
// MLP tensor trains.
TEST_F(TrainTest, FfnOnlyTrainsEveryMlpTensorAndNothingElse) {
  json spec = BaseSpec("llama", "ffn_only");
  spec["strategy"] = {
      {"freeze", {{"attention", true}, {"norms", true}, {"embeddings", true}, {"head", true}}}};
  Result r = Run(spec, "ffn_only");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  Tensors base = ReadTensors(root_ / "llama"), trained = ReadTensors(root_ / "ffn_only");
  int64_t mlp = 0;
  for (const auto& [name, t] : base) {
    if (absl::StrContains(name, ".mlp.")) {
      EXPECT_FALSE(Same(t, trained[name])) << name << " should train";
      mlp += t.numel();
    } else {
      EXPECT_TRUE(Same(t, trained[name])) << name << " should keep the base's bits";
    }
  }
  EXPECT_EQ(r.events.back()["trainable_params"], mlp);
}

// DeltaMoE's new-language phase as the seed specifies it: expert 0 AND every shared tensor
// (attention, norms, embeddings, head) keep the base's bits; only the other experts and the
// routers move.
TEST_F(TrainTest, FreezeSharedTrainsOnlyNewExpertsAndRouters) {
  json spec = BaseSpec("olmoe", "deltamoe_shared");
  spec["strategy"] = {{"frozen_experts", {0}},
                      {"freeze", {{"shared", true}}},
                      {"aux_loss", {{"load_balancing", 0.01}}}};
  Result r = Run(spec, "deltamoe_shared");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  Tensors base = ReadTensors(root_ / "olmoe"), trained = ReadTensors(root_ / "deltamoe_shared");
  int64_t moved = 0, kept = 0;
  for (const auto& [name, t] : base) {
    const bool new_expert =
        absl::StrContains(name, ".mlp.experts.") && !absl::StrContains(name, ".mlp.experts.0.");
    const bool router = absl::StrContains(name, "mlp.gate.");
    if (new_expert || router) {
      EXPECT_FALSE(Same(t, trained[name])) << name << " should train";
      moved += t.numel();
    } else {
      EXPECT_TRUE(Same(t, trained[name])) << name << " should keep the base's bits";
      ++kept;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_EQ(r.events.back()["trainable_params"], moved);

  json dense = BaseSpec("llama", "dense_shared");
  dense["strategy"] = {{"freeze", {{"shared", true}}}};
  Result refused = Run(dense, "dense_shared");
  EXPECT_EQ(refused.exit_code, 4) << refused.stderr_text;
  EXPECT_TRUE(absl::StrContains(refused.stderr_text, "freeze.shared: needs an MoE model"))
      << refused.stderr_text;
}

TEST_F(TrainTest, ResumedRunRepeatsTheLossCurveExactly) {
  json spec = BaseSpec("llama", "straight");
  spec["steps"] = 7;
  spec["grad_accum"] = 2;
  spec["optimizer"]["weight_decay"] = 0.05;
  spec["schedule"] = {{"warmup_steps", 2}, {"min_lr_ratio", 0.1}};
  spec["checkpoint"] = {{"every", 2}, {"keep", 2}};
  Result straight = Run(spec, "straight");
  ASSERT_EQ(straight.exit_code, 0) << straight.stderr_text;

  spec["out"] = (root_ / "resumed").string();
  Result first = Run(spec, "resumed_1", "--stop-after-step 5");
  EXPECT_NE(first.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(first.stderr_text, "stopped after step 5")) << first.stderr_text;
  EXPECT_FALSE(fs::exists(root_ / "resumed"));
  ASSERT_EQ(first.Of("checkpoint").size(), 2u);  // steps 2 and 4
  Result second = Run(spec, "resumed_2");
  ASSERT_EQ(second.exit_code, 0) << second.stderr_text;
  EXPECT_EQ(second.events.front()["resumed_from_step"], 4);
  // Steps 5..7 again after the restart; every loss, lr and grad norm equals the straight run's.
  auto expected = straight.Of("step");
  std::map<int64_t, json> by_step;
  for (const json& e : first.Of("step")) by_step[e["step"]] = e;
  for (const json& e : second.Of("step")) by_step[e["step"]] = e;  // the restart's win
  ASSERT_EQ(by_step.size(), 7u);
  for (const json& e : expected) {
    const json& got = by_step[e["step"]];
    EXPECT_EQ(got["loss"].get<double>(), e["loss"].get<double>()) << "step " << e["step"];
    EXPECT_EQ(got["grad_norm"].get<double>(), e["grad_norm"].get<double>()) << "step " << e["step"];
    EXPECT_EQ(got["lr"].get<double>(), e["lr"].get<double>());
    EXPECT_EQ(got["tokens"], e["tokens"]);
  }
  Tensors a = ReadTensors(root_ / "straight"), b = ReadTensors(root_ / "resumed");
  for (const auto& [name, t] : a) EXPECT_TRUE(Same(t, b[name])) << name;
  // keep: 2 -> only the newest two checkpoints stay.
  int kept = 0;
  for (const auto& entry : fs::directory_iterator(root_ / "straight.checkpoints")) {
    EXPECT_TRUE(absl::StartsWith(entry.path().filename().string(), "step-")) << entry.path();
    ++kept;
  }
  EXPECT_EQ(kept, 2);
  // Running the finished spec again reports the published model instead of failing.
  Result again = Run(spec, "resumed_3");
  ASSERT_EQ(again.exit_code, 0) << again.stderr_text;
  ASSERT_EQ(again.Of("output").size(), 1u);
}

// The loss curve equals transformers' model + torch.optim.AdamW + clip_grad_norm_ on the same
// rows (a one-document dataset without shuffling, whose windows the script rebuilds).
TEST_F(TrainTest, LossCurveMatchesTransformersWithTorchAdamW) {
  std::vector<int32_t> doc;
  for (int k = 0; k < 37; ++k) doc.push_back(3 + (k * 5) % 16);
  data::DatasetWriterOptions o;
  o.out_dir = (root_ / "one_doc").string();
  o.language = "xx";
  o.tokenizer = {.name = "synthetic",
                 .kind = "none",
                 .file = "",
                 .sha256 = "",
                 .vocab_size = 256,
                 .bos_id = 1,
                 .eos_id = 2};
  auto writer = data::DatasetWriter::Create(o);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->AddDocument(doc).ok());
  ASSERT_TRUE((*writer)->Finish({}).ok());
  for (const char* arch : {"llama", "qwen2", "gemma3"}) {
    SCOPED_TRACE(arch);
    json spec = BaseSpec(arch, absl::StrCat("reference_", arch));
    spec["data"] = {{"datasets", {{{"path", (root_ / "one_doc").string()}, {"weight", 1}}}},
                    {"seq_len", 16},
                    {"shuffle", false}};
    spec["steps"] = 5;
    spec["optimizer"] = {
        {"lr", 3e-3}, {"betas", {0.9, 0.95}}, {"eps", 1e-8}, {"weight_decay", 0.0}};
    spec["schedule"] = {{"type", "constant"}, {"warmup_steps", 0}};
    Result r = Run(spec, absl::StrCat("reference_", arch));
    ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
    json job = {{"model", (root_ / arch).string()},
                {"doc", doc},
                {"eos", 2},
                {"seq_len", 16},
                {"batch_size", 4},
                {"steps", 5},
                {"lr", 3e-3},
                {"betas", {0.9, 0.95}},
                {"eps", 1e-8},
                {"clip", 1.0}};
    std::ofstream(root_ / "reference_job.json") << job.dump();
    const fs::path out = root_ / "reference_out.json";
    ASSERT_EQ(Shell(absl::StrCat(STEMMA_PYTHON, " ", STEMMA_SOURCE_DIR,
                                 "/tests/engine/train_reference.py ",
                                 (root_ / "reference_job.json").string(), " > ", out.string())),
              0);
    json expected = json::parse(ReadText(out));
    auto losses = r.Losses();
    ASSERT_EQ(losses.size(), 5u);
    for (int step = 1; step <= 5; ++step) {
      EXPECT_NEAR(losses[step], expected[step - 1].get<double>(), 1e-4) << "step " << step;
    }
    EXPECT_LT(losses[5], losses[1]);
  }
}

// A run killed with SIGKILL at an arbitrary moment (here: once its second checkpoint is out,
// possibly while it writes the next) resumes and ends with the weights of an uninterrupted run.
TEST_F(TrainTest, KilledRunResumesToTheSameWeights) {
  json spec = BaseSpec("qwen2", "unkilled");
  spec["steps"] = 40;
  spec["checkpoint"] = {{"every", 3}, {"keep", 1}};
  Result straight = Run(spec, "unkilled");
  ASSERT_EQ(straight.exit_code, 0) << straight.stderr_text;

  spec["out"] = (root_ / "killed").string();
  const fs::path spec_path = root_ / "killed.json", out = root_ / "killed.stdout";
  std::ofstream(spec_path) << spec.dump(2);
  ASSERT_EQ(Shell(absl::StrCat(STEMMA_ENGINE_BIN, " train --spec ", spec_path.string(), " > ",
                               out.string(), " 2>/dev/null & echo $! > ",
                               (root_ / "killed.pid").string())),
            0);
  const std::string pid = ReadText(root_ / "killed.pid");
  bool killed = false;
  for (int i = 0; i < 6000 && !killed; ++i) {
    std::string text = ReadText(out);
    size_t checkpoints = 0;
    for (size_t at = text.find("\"checkpoint\""); at != std::string::npos;
         at = text.find("\"checkpoint\"", at + 1)) {
      ++checkpoints;
    }
    if (checkpoints >= 2) {
      killed = Shell("kill -9 " + pid) == 0;
    } else {
      usleep(5000);
    }
  }
  ASSERT_TRUE(killed) << "the run ended before it could be killed";
  usleep(200000);
  EXPECT_FALSE(fs::exists(root_ / "killed"));
  Result resumed = Run(spec, "killed_again");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.stderr_text;
  EXPECT_GE(resumed.events.front()["resumed_from_step"].get<int64_t>(), 6);
  Tensors a = ReadTensors(root_ / "unkilled"), b = ReadTensors(root_ / "killed");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(Same(t, b[name])) << name;
  EXPECT_EQ(resumed.Losses().rbegin()->second, straight.Losses().rbegin()->second);
}

struct BadCase {
  std::string name;
  std::function<void(json&, const fs::path&)> edit;  // edits the spec; may damage files
  std::string expected_error;                        // substring of stderr
  int exit_code = 4;  // bad input (not retried), unless the failure is not the spec's
};

// Mixed precision: the forward runs under bf16 autocast, master weights and the saved model
// stay fp32, and the loss curve follows the fp32 one closely.
TEST_F(TrainTest, Bf16AutocastTrainsWithFp32MasterWeights) {
  json fp32 = BaseSpec("llama", "prec_fp32");
  fp32["steps"] = 12;
  json bf16 = BaseSpec("llama", "prec_bf16");
  bf16["steps"] = 12;
  bf16["precision"] = "bfloat16";
  Result a = Run(fp32, "prec_fp32"), b = Run(bf16, "prec_bf16");
  ASSERT_EQ(a.exit_code, 0) << a.stderr_text;
  ASSERT_EQ(b.exit_code, 0) << b.stderr_text;
  EXPECT_EQ(b.events.front()["precision"], "bfloat16");
  auto sa = a.Of("step"), sb = b.Of("step");
  ASSERT_EQ(sa.size(), sb.size());
  EXPECT_LT(sb.back()["loss"].get<double>(), sb.front()["loss"].get<double>() - 1.0);
  bool any_different = false;
  for (size_t i = 0; i < sa.size(); ++i) {
    const double la = sa[i]["loss"].get<double>(), lb = sb[i]["loss"].get<double>();
    EXPECT_NEAR(lb, la, 0.05 * la) << "step " << i + 1;
    any_different |= la != lb;
  }
  EXPECT_TRUE(any_different) << "bf16 autocast had no effect";
  Tensors trained = ReadTensors(root_ / "prec_bf16");
  for (const auto& [name, t] : trained) EXPECT_EQ(t.scalar_type(), torch::kFloat32) << name;
}

// On a GPU machine (CTest label gpu is not needed: it skips without CUDA): the same run on
// cuda with bf16 autocast follows the CPU fp32 curve.
TEST_F(TrainTest, TrainsOnCudaWithBf16Autocast) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA GPU";
  json cpu = BaseSpec("llama", "cuda_ref");
  cpu["steps"] = 8;
  json gpu = BaseSpec("llama", "cuda_bf16");
  gpu["steps"] = 8;
  gpu["device"] = "cuda";
  gpu["precision"] = "bfloat16";
  gpu["checkpoint"] = {{"every", 4}};
  Result a = Run(cpu, "cuda_ref"), b = Run(gpu, "cuda_bf16");
  ASSERT_EQ(a.exit_code, 0) << a.stderr_text;
  ASSERT_EQ(b.exit_code, 0) << b.stderr_text;
  auto sa = a.Of("step"), sb = b.Of("step");
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_NEAR(sb[i]["loss"].get<double>(), sa[i]["loss"].get<double>(),
                0.05 * sa[i]["loss"].get<double>());
  }
  EXPECT_TRUE(io::VerifyCheckpoint((root_ / "cuda_bf16").string()).ok());
}

TEST_F(TrainTest, HeldOutLossPerDatasetWithoutDisturbingTraining) {
  if (!fs::exists(root_ / "yo")) WriteDataset("yo", 12);
  json plain = BaseSpec("llama", "heldout_plain");
  plain["steps"] = 6;
  plain["data"]["datasets"] = {{{"path", (root_ / "sw").string()}, {"weight", 1}},
                               {{"path", (root_ / "yo").string()}, {"weight", 1}}};
  plain["data"]["heldout_fraction"] = 0.2;
  json spec = plain;
  spec["out"] = (root_ / "heldout").string();
  spec["eval"] = {{"every", 2}, {"batches", 2}, {"batch_size", 3}};
  Result r = Run(spec, "heldout");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  // name -> step -> value
  std::map<std::string, std::map<int64_t, double>> metrics;
  for (const json& e : r.Of("metric")) {
    if (absl::StartsWith(e["name"].get<std::string>(), "trainable_"))
      continue;  // the start's size points
    metrics[e["name"].get<std::string>()][e["step"].get<int64_t>()] = e["value"].get<double>();
  }
  ASSERT_EQ(metrics.size(), 3u);
  for (const char* name : {"heldout_loss/sw", "heldout_loss/yo", "heldout_loss"}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(metrics.count(name));
    const auto& curve = metrics[name];
    ASSERT_EQ(curve.size(), 4u);  // before step 1, then steps 2, 4, 6
    for (int64_t step : {0, 2, 4, 6}) ASSERT_TRUE(curve.count(step)) << step;
    for (const auto& [step, value] : curve) EXPECT_TRUE(std::isfinite(value)) << step;
    EXPECT_LT(curve.at(6), curve.at(0) - 0.5);  // the learnable pattern is learnt
  }
  // Both datasets weigh the same number of tokens: the overall loss is their mean.
  EXPECT_NEAR(metrics["heldout_loss"][6],
              (metrics["heldout_loss/sw"][6] + metrics["heldout_loss/yo"][6]) / 2, 1e-9);
  // Evaluating draws nothing from the training data or the RNG: the same curve without it.
  Result without = Run(plain, "heldout_plain");
  ASSERT_EQ(without.exit_code, 0) << without.stderr_text;
  EXPECT_EQ(r.Losses(), without.Losses());
  for (const json& e : without.Of("metric")) {  // only the start's size points, no held-out loss
    EXPECT_TRUE(absl::StartsWith(e["name"].get<std::string>(), "trainable_")) << e.dump();
  }
}

TEST_F(TrainTest, BadInputsFailWithNamedCauseAndPublishNothing) {
  auto copy_model = [](const fs::path& to) {
    fs::remove_all(to);
    fs::copy(root_ / "llama", to, fs::copy_options::recursive);
  };
  std::vector<BadCase> cases = {
      {"unknown_field", [](json& s, const fs::path&) { s["optimizer"]["learning_rate"] = 1; },
       "learning_rate"},
      {"bad_range",
       [](json& s, const fs::path&) {
         s["strategy"] = {{"freeze", {{"layers", {"1:9"}}}}};
       },
       "strategy.freeze.layers[0]: layers '1:9' reach past the model's 2 layers"},
      {"empty_range",
       [](json& s, const fs::path&) {
         s["strategy"] = {{"freeze", {{"layers", {"3:3"}}}}};
       },
       "'3:3' is not a layer range (it is empty"},
      {"missing_model", [](json& s, const fs::path&) { s["model"] = "/nonexistent/model"; },
       "/nonexistent/model"},
      {"damaged_safetensors",
       [&](json& s, const fs::path& dir) {
         copy_model(dir / "damaged");
         fs::remove(dir / "damaged" / "stemma.json");  // so the file itself must be caught
         fs::resize_file(dir / "damaged" / "model.safetensors",
                         fs::file_size(dir / "damaged" / "model.safetensors") - 100);
         s["model"] = (dir / "damaged").string();
       },
       "model.safetensors", 1},
      {"shape_mismatch",
       [&](json& s, const fs::path& dir) {
         copy_model(dir / "reshaped");
         json config = json::parse(ReadText(dir / "reshaped" / "config.json"));
         config["intermediate_size"] = 96;
         std::ofstream(dir / "reshaped" / "config.json") << config.dump();
         fs::remove(dir / "reshaped" / "stemma.json");
         s["model"] = (dir / "reshaped").string();
       },
       "mlp.gate_proj.weight"},
      {"unknown_architecture",
       [&](json& s, const fs::path& dir) {
         copy_model(dir / "gpt2");
         json config = json::parse(ReadText(dir / "gpt2" / "config.json"));
         config["model_type"] = "gpt2";
         std::ofstream(dir / "gpt2" / "config.json") << config.dump();
         fs::remove(dir / "gpt2" / "stemma.json");
         s["model"] = (dir / "gpt2").string();
       },
       "gpt2"},
      {"nan_loss",
       [](json& s, const fs::path&) {
         s["optimizer"]["lr"] = 1e30;
         s["schedule"] = {{"warmup_steps", 0}};
         s["clip_grad_norm"] = 0;
         s["steps"] = 6;
         s["checkpoint"] = {{"every", 1}};
       },
       "training diverged at step", 1},
      {"neuron_mask_on_moe",
       [](json& s, const fs::path& dir) {
         s["model"] = (dir / "olmoe").string();
         s["strategy"] = {{"neuron_mask", {{"file", (dir / "mask.json").string()}}}};
       },
       "neuron_mask: needs a dense model"},
      {"missing_mask_language",
       [](json& s, const fs::path& dir) {
         json mask = {{"format", "stemma.neuron_mask/1"},
                      {"num_layers", 2},
                      {"intermediate_size", 128},
                      {"languages", {{"sw", {{1}, {2}}}}}};
         std::ofstream(dir / "mask_sw.json") << mask.dump();
         s["strategy"] = {
             {"neuron_mask", {{"file", (dir / "mask_sw.json").string()}, {"languages", {"zu"}}}}};
       },
       "languages.zu"},
      {"both_steps_and_tokens", [](json& s, const fs::path&) { s["max_tokens"] = 1000; },
       "exactly one of 'steps' and 'max_tokens'"},
      {"bad_device", [](json& s, const fs::path&) { s["device"] = "tpu"; },
       "device: 'tpu' is not cpu, cuda or cuda:N"},
      {"bad_precision", [](json& s, const fs::path&) { s["precision"] = "fp8"; },
       "precision: 'fp8' is not one of float32, bfloat16"},
      {"eval_without_heldout",
       [](json& s, const fs::path&) {
         s["eval"] = {{"every", 2}};
       },
       "eval.every: needs held-out documents"},
      {"eval_heldout_too_small",  // no document of 300 falls in a 1e-9 split
       [](json& s, const fs::path&) {
         s["data"]["heldout_fraction"] = 1e-9;
         s["eval"] = {{"every", 2}};
       },
       "eval: data.datasets[0]"},
  };
  if (!torch::cuda::is_available()) {
    cases.push_back({"cuda_without_gpu", [](json& s, const fs::path&) { s["device"] = "cuda"; },
                     "LibTorch sees no CUDA GPU"});
  }
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    json spec = BaseSpec("llama", "bad_" + c.name);
    c.edit(spec, root_);
    Result r = Run(spec, "bad_" + c.name);
    if (c.name == "damaged_safetensors" || c.name == "shape_mismatch") {
      EXPECT_NE(r.exit_code, 0);  // the reader's code for a damaged file
    } else {
      EXPECT_EQ(r.exit_code, c.exit_code) << r.stderr_text;
    }
    EXPECT_TRUE(absl::StrContains(r.stderr_text, "stemma-engine: error: ")) << r.stderr_text;
    EXPECT_TRUE(absl::StrContains(r.stderr_text, c.expected_error)) << r.stderr_text;
    EXPECT_FALSE(fs::exists(root_ / ("bad_" + c.name))) << "output published despite the error";
    EXPECT_TRUE(r.Of("done").empty());
    // No half-written checkpoint or output: no staging directories left beside them.
    for (const auto& entry : fs::directory_iterator(root_)) {
      EXPECT_FALSE(absl::StrContains(entry.path().filename().string(), ".tmp-")) << entry.path();
    }
    const fs::path ckpts = root_ / ("bad_" + c.name + ".checkpoints");
    if (fs::exists(ckpts)) {
      for (const auto& entry : fs::directory_iterator(ckpts)) {
        const std::string name = entry.path().filename().string();
        EXPECT_FALSE(absl::StrContains(name, ".tmp-")) << entry.path();
        EXPECT_TRUE(io::VerifyCheckpoint(entry.path().string()).ok()) << entry.path();
      }
    }
  }
}

// Issue 16 point 11: the first step is always reported, so a run shows its starting loss.
TEST_F(TrainTest, LogEveryReportsTheFirstStepToo) {
  json spec = BaseSpec("llama", "log_every");
  spec["steps"] = 7;
  spec["log_every"] = 3;
  Result r = Run(spec, "log_every");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  std::vector<int64_t> steps;
  for (const json& e : r.Of("step")) steps.push_back(e["step"]);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 3, 6, 7}));
}

// Issue 16 points 5 and 6 and 8: "middle" resolved and printed; relative paths against the
// storage root; threads from the job's CPUs and refused above them; the attempt in the manifest.
TEST_F(TrainTest, MiddleStorageRootThreadsAndAttempt) {
  json spec = BaseSpec("gemma3", "middle");  // 3 layers: middle is layer 1
  spec["model"] = "gemma3";                  // relative: under STEMMA_STORAGE_ROOT
  spec["out"] = "rel/middle";
  spec["data"]["datasets"] = {{{"path", "sw"}}};
  spec.erase("threads");
  spec["strategy"] = {{"freeze", {{"layers", {"middle"}}}}};
  const fs::path elsewhere = root_ / "specs";
  fs::create_directories(elsewhere);
  const std::string env = absl::StrCat("STEMMA_STORAGE_ROOT=", root_.string(),
                                       " STEMMA_CPUS=1 STEMMA_JOB_ID=j7 STEMMA_ATTEMPT_ID=j7.2 ");
  Result r = Run(spec, "specs/middle", "", env);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  const json& start = r.events.front();
  EXPECT_EQ(start["model"], (root_ / "gemma3").string());
  EXPECT_EQ(start["out"], (root_ / "rel" / "middle").string());
  EXPECT_EQ(start["threads"], 1);
  EXPECT_EQ(start["num_layers"], 3);
  ASSERT_EQ(start["layer_ranges"].size(), 1u) << start.dump();
  EXPECT_EQ(start["layer_ranges"][0]["field"], "strategy.freeze.layers[0]");
  EXPECT_EQ(start["layer_ranges"][0]["range"], "middle");
  EXPECT_EQ(start["layer_ranges"][0]["layers"], "1");
  Tensors base = ReadTensors(root_ / "gemma3"), trained = ReadTensors(root_ / "rel" / "middle");
  for (const auto& [name, t] : base) {
    if (absl::StartsWith(name, "model.layers.1.")) EXPECT_TRUE(Same(t, trained[name])) << name;
    if (absl::StartsWith(name, "model.layers.0.mlp.")) EXPECT_FALSE(Same(t, trained[name])) << name;
  }
  json manifest = json::parse(ReadText(root_ / "rel" / "middle" / "stemma.json"));
  EXPECT_EQ(manifest["producer"]["job"], "j7") << manifest["producer"].dump();
  EXPECT_EQ(manifest["producer"]["attempt"], "j7.2");
  // More threads than the job's CPUs: refused before any work, as bad input.
  spec["threads"] = 2;
  spec["out"] = "rel/too_many";
  Result refused = Run(spec, "specs/too_many", "", env);
  EXPECT_EQ(refused.exit_code, 4);
  EXPECT_TRUE(
      absl::StrContains(refused.stderr_text, "threads: 2 threads is more than the job's 1 CPUs"))
      << refused.stderr_text;
}

// Issue 16 point 4: held out by position (the end of the corpus) and by a separate dataset.
TEST_F(TrainTest, HeldOutByPositionAndBySeparateDataset) {
  if (!fs::exists(root_ / "yo")) WriteDataset("yo", 12);
  json spec = BaseSpec("llama", "heldout_last");
  spec["data"]["heldout_fraction"] = 0.05;
  spec["data"]["heldout_split"] = "last";
  spec["eval"] = {{"every", 4}, {"batches", 1}};
  Result last = Run(spec, "heldout_last");
  ASSERT_EQ(last.exit_code, 0) << last.stderr_text;
  // heldout_loss/sw and heldout_loss at steps 0 and 4, after trainable_fraction and
  // trainable_params at the start.
  ASSERT_EQ(last.Of("metric").size(), 6u);
  EXPECT_EQ(last.Of("metric")[0]["name"], "trainable_fraction");
  EXPECT_EQ(last.Of("metric")[0]["value"], 1.0);
  EXPECT_EQ(last.Of("metric")[1]["name"], "trainable_params");
  json separate = BaseSpec("llama", "heldout_separate");
  separate["data"]["datasets"] = {
      {{"path", (root_ / "sw").string()}, {"heldout_path", (root_ / "yo").string()}}};
  separate["eval"] = {{"every", 4}, {"batches", 1}};
  Result r = Run(separate, "heldout_separate");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  std::set<std::string> names;
  for (const json& e : r.Of("metric")) names.insert(e["name"]);
  EXPECT_EQ(names, (std::set<std::string>{"heldout_loss/sw", "heldout_loss", "trainable_fraction",
                                          "trainable_params"}));
  // All of sw trains: the same curve as without any held-out set.
  json plain = BaseSpec("llama", "heldout_none");
  Result none = Run(plain, "heldout_none");
  ASSERT_EQ(none.exit_code, 0) << none.stderr_text;
  EXPECT_EQ(r.Losses(), none.Losses());
}

TEST_F(TrainTest, HelpListsEveryFieldWithItsDefault) {
  const fs::path out = root_ / "help.stdout";
  ASSERT_EQ(Shell(absl::StrCat(STEMMA_ENGINE_BIN, " train --help > ", out.string())), 0);
  const std::string help = ReadText(out);
  for (const char* needle : {"usage: stemma-engine train", "optimizer.betas", "default [0.9, 0.95]",
                             "schedule.min_lr_ratio", "data.heldout_split", "--stop-after-step"}) {
    EXPECT_TRUE(absl::StrContains(help, needle)) << needle << "\n" << help;
  }
}

// Early stopping (common/engine_contract.h kStopFile): with <STEMMA_WORKDIR>/stop present,
// training ends after the current step and publishes that step's model as `out`, noting
// stopped_at_step, with its output event, and exits 0.
TEST_F(TrainTest, StopFileEndsTrainingAfterTheStepAndPublishesTheModel) {
  const fs::path workdir = root_ / "stop_attempt";
  fs::create_directories(workdir);
  std::ofstream(workdir / "stop") << "stopped early at rung 1 (step 1)";
  json spec = BaseSpec("llama", "stopped");
  spec["steps"] = 6;
  Result r = Run(spec, "stopped", "", absl::StrCat("STEMMA_WORKDIR=", workdir.string(), " "));
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_EQ(r.Of("step").size(), 1u) << r.stdout_text;
  ASSERT_EQ(r.Of("output").size(), 1u) << r.stdout_text;
  EXPECT_EQ(r.Of("output")[0]["path"], (root_ / "stopped").string());
  ASSERT_EQ(r.Of("done").size(), 1u);
  EXPECT_EQ(r.Of("done")[0]["stopped_at_step"], 1);
  json manifest = json::parse(ReadText(root_ / "stopped" / "stemma.json"));
  EXPECT_EQ(manifest["producer"]["params"]["stopped_at_step"], 1) << manifest["producer"].dump();
  // The published model is a whole checkpoint: it trains on.
  json next = BaseSpec("stopped", "after_stop");
  Result more = Run(next, "after_stop");
  EXPECT_EQ(more.exit_code, 0) << more.stderr_text;
  // Without the file the same spec runs every step.
  spec["out"] = (root_ / "not_stopped").string();
  Result full = Run(spec, "not_stopped");
  ASSERT_EQ(full.exit_code, 0) << full.stderr_text;
  EXPECT_EQ(full.Of("step").size(), 6u);
  EXPECT_EQ(full.Of("done")[0]["stopped_at_step"], 0);
}

}  // namespace
}  // namespace stemma::engine::train
