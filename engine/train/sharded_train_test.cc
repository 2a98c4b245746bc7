// Sharded data parallel (`parallel.shard`, sharded_optimizer.h) end to end: the real
// `stemma-engine train` as 2 and 4 rank processes on loopback against ONE process with the
// same global batch, for every strategy: the losses, gradient norms and the published weights
// must agree to float tolerance (the sums over ranks only change the order of additions), and
// what the strategy freezes must keep the base's bits. A sharded checkpoint resumes at another
// world size and continues the same loss curve.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/train/overlapped_all_reduce.h"
#include "engine/train/rank_processes.h"
#include "engine/train/train_test_fixture.h"

namespace stemma::engine::train {
namespace {

class ShardedTrainTest : public TrainTest {
 protected:
  // Runs `spec` as `world` rank processes (RANK/WORLD_SIZE/MASTER_*); returns each rank's
  // result (only rank 0 prints events) and, in `peak_anon_kib`, each rank's peak RssAnon.
  static std::vector<Result> RunRanks(const json& spec, const std::string& name, int world,
                                      const std::string& extra = "",
                                      std::vector<int64_t>* peak_anon_kib = nullptr,
                                      const std::string& env = "") {
    const fs::path spec_path = root_ / (name + ".json");
    std::ofstream(spec_path) << spec.dump(2);
    const int port = FreePort();
    std::vector<std::string> commands;
    for (int r = 0; r < world; ++r) {
      const std::string base = (root_ / absl::StrCat(name, ".", r)).string();
      commands.push_back(absl::StrCat("env RANK=", r, " LOCAL_RANK=", r, " WORLD_SIZE=", world,
                                      " MASTER_ADDR=127.0.0.1 MASTER_PORT=", port,
                                      " STEMMA_DDP_TIMEOUT_S=60 OMP_NUM_THREADS=1 ", env, " ",
                                      STEMMA_ENGINE_BIN, " train --spec ", spec_path.string(), " ",
                                      extra, " > ", base, ".stdout 2> ", base, ".stderr"));
    }
    const std::vector<RankProcess> processes = RunRankCommands(commands);
    std::vector<Result> results(world);
    for (int r = 0; r < world; ++r) {
      const std::string base = (root_ / absl::StrCat(name, ".", r)).string();
      Result& result = results[r];
      result.exit_code = processes[r].exit_code;
      if (peak_anon_kib != nullptr) peak_anon_kib->push_back(processes[r].peak_anon_kib);
      result.stdout_text = ReadText(base + ".stdout");
      result.stderr_text = ReadText(base + ".stderr");
      std::istringstream lines(result.stdout_text);
      for (std::string line; std::getline(lines, line);) {
        json e = json::parse(line, nullptr, false);
        if (!e.is_discarded() && e.is_object() && e.contains("event")) result.events.push_back(e);
      }
    }
    return results;
  }

  // Same step count, losses and gradient norms (and L2-SP terms) step for step.
  static void ExpectSameCurve(const Result& one, const Result& many, const std::string& what) {
    const auto a = one.Of("step"), b = many.Of("step");
    ASSERT_EQ(a.size(), b.size()) << what << "\n" << many.stderr_text;
    ASSERT_FALSE(a.empty()) << what;
    for (size_t i = 0; i < a.size(); ++i) {
      for (const char* key : {"loss", "grad_norm", "l2sp"}) {
        if (!a[i].contains(key)) continue;
        ASSERT_TRUE(b[i].contains(key)) << what << " step " << i + 1 << " lacks " << key;
        const double x = a[i][key], y = b[i][key];
        EXPECT_LE(std::abs(x - y), 2e-5 * std::abs(x) + 1e-9)
            << what << " step " << i + 1 << " " << key << ": " << x << " vs " << y;
      }
    }
  }

  // The published weights agree to float rounding relative to how far each tensor moved, and
  // a tensor that did not move in the single-process run keeps the base's bits.
  static void ExpectSameWeights(const Tensors& base, const Tensors& one, const fs::path& out,
                                const std::string& what) {
    Tensors many = ReadTensors(out);
    ASSERT_EQ(many.size(), one.size()) << what;
    int moved_tensors = 0;
    for (const auto& [name, x] : one) {
      ASSERT_TRUE(many.count(name)) << what << ": " << name;
      const torch::Tensor& y = many.at(name);
      // Elements the single process left alone (frozen, masked out) keep their bits here too.
      const torch::Tensor kept = x == base.at(name);
      EXPECT_TRUE(torch::equal(y.masked_select(kept), x.masked_select(kept)))
          << what << ": " << name << " changed elements the single process kept";
      const double moved = (x - base.at(name)).norm().item<double>();
      if (moved == 0.0) {
        EXPECT_TRUE(Same(y, base.at(name))) << what << ": " << name << " should keep its bits";
        continue;
      }
      ++moved_tensors;
      // Relative to the movement, in norm: Adam's normalisation m/sqrt(v) amplifies the
      // rounding of a reordered sum where a gradient element is near zero, so single
      // elements may differ by a good part of one lr-sized step; a wrong update differs in
      // norm by about as much as it moved.
      const double differ = (x - y).norm().item<double>();
      EXPECT_LE(differ, 2e-3 * moved)
          << what << ": " << name << " moved " << moved << " (norm), runs differ by " << differ;
    }
    EXPECT_GT(moved_tensors, 0) << what << ": nothing trained";
  }

  // One process, then every shard level at 2 and 4 ranks, all with the same global batch.
  static void ExpectShardedEqualsSingle(json spec, const std::string& name,
                                        const std::string& arch) {
    spec["batch_size"] = 4;
    spec["grad_accum"] = 2;
    spec["optimizer"]["weight_decay"] = 0.1;
    spec["log_every"] = 1;
    spec["out"] = (root_ / (name + "_single")).string();
    Result single = Run(spec, name + "_single", "", "OMP_NUM_THREADS=1 ");
    ASSERT_EQ(single.exit_code, 0) << single.stderr_text;
    const Tensors base = ReadTensors(root_ / arch);
    const Tensors one = ReadTensors(root_ / (name + "_single"));
    for (const std::string level : {"optimizer", "gradients", "full"}) {
      for (int world : {2, 4}) {
        const std::string run = absl::StrCat(name, "_", level, "_", world);
        json sharded = spec;
        sharded["out"] = (root_ / run).string();
        // Small buckets: several reduce-scatters per micro-batch, pieces cutting tensors.
        sharded["parallel"] = {{"shard", level}, {"bucket_mb", 1}};
        // `full` checkpoints every layer whatever is asked: on at 2 ranks, off at 4.
        if (level == "full") sharded["activation_checkpointing"] = world == 2 ? 1 : 0;
        std::vector<Result> ranks = RunRanks(sharded, run, world);
        for (int r = 0; r < world; ++r) {
          ASSERT_EQ(ranks[r].exit_code, 0) << run << " rank " << r << ":\n" << ranks[r].stderr_text;
        }
        ExpectSameCurve(single, ranks[0], run);
        ExpectSameWeights(base, one, root_ / run, run);
      }
    }
  }

  // Stopped after step 2 at 2 ranks, resumed at 4 (and at 1): the same curve as a run straight
  // through, and the same final weights.
  static void ExpectResumesAtAnotherWorldSize(const std::string& level) {
    json spec = BaseSpec("llama", "");
    spec["steps"] = 6;
    spec["log_every"] = 1;
    spec["optimizer"]["weight_decay"] = 0.1;
    spec["strategy"] = {{"l2sp", {{{"lambda", 0.5}}}}};
    spec["parallel"] = {{"shard", level}, {"bucket_mb", 1}};
    const std::string straight_name = "resume_straight_" + level;
    spec["out"] = (root_ / straight_name).string();
    std::vector<Result> straight = RunRanks(spec, straight_name, 2);
    ASSERT_EQ(straight[0].exit_code, 0) << straight[0].stderr_text;
    const Tensors base = ReadTensors(root_ / "llama");
    const Tensors one = ReadTensors(root_ / straight_name);

    for (int resumed_world : {4, 1}) {
      const std::string name = absl::StrCat("resume_", level, "_at_", resumed_world);
      const fs::path root = root_;
      json stopped = spec;
      stopped["out"] = (root / name).string();
      stopped["checkpoint"] = {{"every", 2}, {"keep", 2}};
      std::vector<Result> first = RunRanks(stopped, name, 2, "--stop-after-step 2");
      ASSERT_EQ(first[0].exit_code, 3) << first[0].stderr_text;  // stopped as if preempted
      ASSERT_TRUE(fs::exists(root / (name + ".checkpoints") / "step-00000002" /
                             "shard-00001-of-00002.safetensors"));
      Result rest;
      if (resumed_world == 1) {
        rest = Run(stopped, name + "_rest", "", "OMP_NUM_THREADS=1 ");
      } else {
        rest = RunRanks(stopped, name + "_rest", resumed_world)[0];
      }
      ASSERT_EQ(rest.exit_code, 0) << rest.stderr_text;
      ASSERT_FALSE(rest.Of("start").empty());
      EXPECT_EQ(rest.Of("start")[0]["resumed_from_step"], 2);
      const auto a = straight[0].Losses(), b = first[0].Losses(), c = rest.Losses();
      ASSERT_EQ(a.size(), 6u);
      for (const auto& [step, loss] : a) {
        const double other = step <= 2 ? b.at(step) : c.at(step);
        EXPECT_LE(std::abs(loss - other), 2e-5 * loss) << name << " step " << step;
      }
      ExpectSameWeights(base, one, root / name, name);
    }
  }
};

TEST_F(ShardedTrainTest, DenseEqualsOneProcess) {
  ExpectShardedEqualsSingle(BaseSpec("llama", ""), "dense", "llama");
}

TEST_F(ShardedTrainTest, FreezeEqualsOneProcess) {
  json spec = BaseSpec("llama", "");
  spec["strategy"] = {{"freeze", {{"layers", {"0:1"}}, {"embeddings", true}}}};
  ExpectShardedEqualsSingle(spec, "freeze", "llama");
}

TEST_F(ShardedTrainTest, L2spEqualsOneProcess) {
  json spec = BaseSpec("llama", "");
  spec["strategy"] = {{"l2sp", {{{"layers", {"1:2"}}, {"lambda", 5.0}}, {{"lambda", 0.01}}}}};
  ExpectShardedEqualsSingle(spec, "l2sp", "llama");
}

TEST_F(ShardedTrainTest, NeuronMaskEqualsOneProcess) {
  json mask = {
      {"format", "stemma.neuron_mask/1"}, {"num_layers", 2},
      {"intermediate_size", 128},         {"languages", {{"sw", {{1, 5, 7, 100}, {0, 2, 127}}}}},
      {"params", json::object()},         {"counts", {{"sw", {4, 3}}}}};
  std::ofstream(root_ / "shard_mask.json") << mask.dump();
  json spec = BaseSpec("llama", "");
  spec["strategy"] = {
      {"neuron_mask", {{"file", (root_ / "shard_mask.json").string()}, {"languages", {"sw"}}}}};
  ExpectShardedEqualsSingle(spec, "mask", "llama");
}

TEST_F(ShardedTrainTest, ExpertSubsetEqualsOneProcess) {
  json selection = {{"_meta", json::object()},
                    {"shared_experts", {{"k1", {{"1", {3}}}}}},
                    {"ca", {{"ssft_k1", {{"1", {2, 3}}}}}}};
  std::ofstream(root_ / "shard_experts.json") << selection.dump();
  json spec = BaseSpec("olmoe", "");
  spec["strategy"] = {{"expert_subset",
                       {{"file", (root_ / "shard_experts.json").string()},
                        {"language", "ca"},
                        {"set", "ssft_k1"}}}};
  ExpectShardedEqualsSingle(spec, "ssft", "olmoe");
}

TEST_F(ShardedTrainTest, DeltaMoeFrozenExpertAndSharedEqualsOneProcess) {
  json spec = BaseSpec("olmoe", "");
  spec["strategy"] = {{"frozen_experts", {0}}, {"freeze", {{"shared", true}}}};
  ExpectShardedEqualsSingle(spec, "deltamoe", "olmoe");
}

// The load-balancing loss is a function of each rank's own micro-batch (its token fractions
// and mean router probabilities), under every shard level as under `none` (plain data
// parallel), so with it on W ranks are compared with W ranks at `none`, not with one process.
TEST_F(ShardedTrainTest, DeltaMoeWithLoadBalancingEqualsUnshardedRanks) {
  json spec = BaseSpec("olmoe", "");
  spec["strategy"] = {{"frozen_experts", {0}},
                      {"freeze", {{"shared", true}}},
                      {"aux_loss", {{"load_balancing", 0.01}}}};
  spec["grad_accum"] = 2;
  spec["optimizer"]["weight_decay"] = 0.1;
  spec["log_every"] = 1;
  spec["out"] = (root_ / "lb_none").string();
  std::vector<Result> none = RunRanks(spec, "lb_none", 2);
  ASSERT_EQ(none[0].exit_code, 0) << none[0].stderr_text;
  for (const std::string level : {"gradients", "full"}) {
    const std::string run = "lb_" + level;
    spec["out"] = (root_ / run).string();
    spec["parallel"] = {{"shard", level}, {"bucket_mb", 1}};
    std::vector<Result> sharded = RunRanks(spec, run, 2);
    ASSERT_EQ(sharded[0].exit_code, 0) << sharded[0].stderr_text;
    ExpectSameCurve(none[0], sharded[0], "load balancing, " + level + " vs none at 2 ranks");
    for (size_t i = 0; i < none[0].Of("step").size(); ++i) {
      EXPECT_NEAR(none[0].Of("step")[i]["load_balancing"].get<double>(),
                  sharded[0].Of("step")[i]["load_balancing"].get<double>(), 1e-6);
    }
    ExpectSameWeights(ReadTensors(root_ / "olmoe"), ReadTensors(root_ / "lb_none"), root_ / run,
                      "load balancing, " + level);
  }
}

// Reducing gradients while backward runs and gathering the layers' matrices in bf16 under
// bf16 autocast (the defaults) against reducing them after each layer's backward and
// gathering fp32 (STEMMA_SHARD_OVERLAP=0 STEMMA_SHARD_BF16_GATHER=0): the same buckets and
// sums, and the same bf16 products, so the same losses, gradient norms and weights, bit for
// bit, with gradient accumulation, L2-SP and a frozen layer, in float32 and under bf16.
TEST_F(ShardedTrainTest, OverlapAndBf16GathersChangeNothing) {
  json spec = BaseSpec("llama", "");
  spec["batch_size"] = 4;
  spec["grad_accum"] = 2;
  spec["log_every"] = 1;
  spec["optimizer"]["weight_decay"] = 0.1;
  spec["strategy"] = {{"l2sp", {{{"lambda", 0.01}}}}, {"freeze", {{"layers", {"0:1"}}}}};
  // optimizer, gradients: uneven reduce-scatters of contiguous buckets, summed in the same
  // order; none: DDP's all-reduce in other buckets (at 2 ranks a sum of two is exact in any
  // order, so also bit for bit).
  for (const auto& [level, precision] :
       std::vector<std::pair<std::string, std::string>>{{"full", "float32"},
                                                        {"full", "bfloat16"},
                                                        {"gradients", "float32"},
                                                        {"optimizer", "float32"},
                                                        {"none", "float32"}}) {
    spec["precision"] = precision;
    spec["parallel"] = {{"shard", level}, {"bucket_mb", 1}};
    std::map<std::string, std::vector<Result>> runs;
    for (const std::string on : {"0", "1"}) {
      const std::string name = absl::StrCat("overlap_", level, "_", precision, "_", on);
      spec["out"] = (root_ / name).string();
      runs[on] =
          RunRanks(spec, name, 2, "", nullptr,
                   absl::StrCat("STEMMA_SHARD_OVERLAP=", on, " STEMMA_SHARD_BF16_GATHER=", on));
      ASSERT_EQ(runs[on][0].exit_code, 0) << runs[on][0].stderr_text;
      ASSERT_EQ(runs[on][1].exit_code, 0) << runs[on][1].stderr_text;
    }
    const std::string what = level + " " + precision;
    const auto off = runs["0"][0].Of("step"), on = runs["1"][0].Of("step");
    ASSERT_EQ(off.size(), on.size()) << what;
    ASSERT_FALSE(off.empty()) << what;
    for (size_t i = 0; i < off.size(); ++i) {
      for (const char* key : {"loss", "grad_norm", "l2sp"}) {
        EXPECT_EQ(off[i][key].get<double>(), on[i][key].get<double>())
            << what << " step " << i + 1 << " " << key;
      }
    }
    const Tensors a = ReadTensors(root_ / absl::StrCat("overlap_", level, "_", precision, "_0"));
    const Tensors b = ReadTensors(root_ / absl::StrCat("overlap_", level, "_", precision, "_1"));
    ASSERT_EQ(a.size(), b.size()) << what;
    for (const auto& [name, x] : a) EXPECT_TRUE(Same(x, b.at(name))) << what << ": " << name;
  }
}

TEST_F(ShardedTrainTest, ShardedCheckpointResumesAtAnotherWorldSize) {
  ExpectResumesAtAnotherWorldSize("gradients");
}

TEST_F(ShardedTrainTest, FullShardCheckpointResumesAtAnotherWorldSize) {
  ExpectResumesAtAnotherWorldSize("full");
}

// A checkpoint written under `full` has a layout per layer: resuming it at `gradients` is
// refused, naming the level.
TEST_F(ShardedTrainTest, ResumingAFullShardCheckpointAtAnotherLevelIsRefused) {
  json spec = BaseSpec("llama", "full_then_gradients");
  spec["steps"] = 4;
  spec["checkpoint"] = {{"every", 2}};
  spec["parallel"] = {{"shard", "full"}};
  std::vector<Result> first = RunRanks(spec, "full_first", 2, "--stop-after-step 2");
  ASSERT_EQ(first[0].exit_code, 3) << first[0].stderr_text;
  spec["parallel"] = {{"shard", "gradients"}};
  std::vector<Result> second = RunRanks(spec, "full_second", 2);
  EXPECT_NE(second[0].exit_code, 0);
  EXPECT_TRUE(absl::StrContains(second[0].stderr_text, "parallel.shard: full"))
      << second[0].stderr_text;
}

// Peak anonymous RSS per rank at 2 ranks for a model whose weights and optimizer state
// dominate (4 layers of hidden 1024, FFN 2816: 51 M parameters, 16-token rows): `full` keeps
// 16/W bytes per parameter (master slice, moments, gradient slice) plus one layer, where
// `gradients` keeps the fp32 replica, the moments' slice and the whole autograd gradients.
TEST_F(ShardedTrainTest, FullShardHoldsLessPerRankThanGradients) {
  const fs::path model = root_ / "llama-wide";
  ASSERT_EQ(Shell(absl::StrCat(STEMMA_ENGINE_BIN,
                               " init --arch llama --num-layers 4 --hidden-size 1024 "
                               "--intermediate-size 2816 --num-heads 8 --num-kv-heads 8 "
                               "--head-dim 128 --seed 3 --out ",
                               model.string(), " > /dev/null")),
            0);
  std::map<std::string, int64_t> peak;
  for (const std::string level : {"gradients", "full"}) {
    json spec = BaseSpec("llama", "wide_" + level);
    spec["model"] = model.string();
    spec["steps"] = 2;
    spec["batch_size"] = 2;
    spec["parallel"] = {{"shard", level}};
    std::vector<int64_t> kib;
    std::vector<Result> ranks = RunRanks(spec, "wide_" + level, 2, "", &kib);
    for (const Result& r : ranks) ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
    peak[level] = *std::max_element(kib.begin(), kib.end());
  }
  std::printf(
      "peak RssAnon per rank, 51 M parameters, 2 ranks: gradients %.1f MiB, full %.1f MiB\n",
      peak["gradients"] / 1024.0, peak["full"] / 1024.0);
  EXPECT_LT(peak["full"], peak["gradients"]);
}

// Slice-only loading (issue 26): under `full` no rank ever holds the whole model, not even
// while loading it. A 16-layer model of 113 M parameters (453 MB in fp32) with everything but
// the final norm frozen, so that training itself keeps 4/W bytes per parameter (the frozen
// slices) and one or two gathered layers: at 4 ranks each rank's peak RssAnon above the same
// run on the tiny model (the runtime's share) stays under 3/4 of the model's fp32 size.
// Building the whole model first and sharding it afterwards costs at least its whole size on
// every rank. Rank 0 publishes the model as well: it writes it tensor by tensor as the units
// are gathered (gathering the whole model there first would cost its size again).
TEST_F(ShardedTrainTest, FullShardNeverMaterialisesTheModel) {
  const fs::path model = root_ / "llama-deep";
  ASSERT_EQ(Shell(absl::StrCat(STEMMA_ENGINE_BIN,
                               " init --arch llama --num-layers 16 --hidden-size 768 "
                               "--intermediate-size 2048 --num-heads 12 --num-kv-heads 12 "
                               "--head-dim 64 --seed 3 --out ",
                               model.string(), " > /dev/null")),
            0);
  auto reader = io::CheckpointReader::Open(model.string());
  ASSERT_TRUE(reader.ok()) << reader.status();
  int64_t model_bytes = 0;
  for (const std::string& name : (*reader)->TensorNames()) {
    model_bytes += (*reader)->Find(name)->numel() * 4;
  }
  auto peak = [&](const std::string& name, const std::string& dir) {
    json spec = BaseSpec("llama", name);
    spec["model"] = dir;
    spec["steps"] = 1;
    spec["strategy"] = {{"freeze", {{"layers", {"0:"}}, {"embeddings", true}, {"head", true}}}};
    spec["parallel"] = {{"shard", "full"}};
    std::vector<int64_t> kib;
    std::vector<Result> ranks = RunRanks(spec, name, 4, "", &kib);
    for (const Result& r : ranks) EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
    return *std::max_element(kib.begin(), kib.end()) * int64_t{1024};
  };
  const int64_t runtime = peak("load_tiny", (root_ / "llama").string());
  const int64_t deep = peak("load_deep", model.string());
  std::printf(
      "peak RssAnon per rank at 4 ranks, full, %.0f MB fp32 model: %.1f MiB (%.1f MiB above the "
      "tiny model's run, %.2f of the model)\n",
      model_bytes / 1e6, deep / 1048576.0, (deep - runtime) / 1048576.0,
      static_cast<double>(deep - runtime) / model_bytes);
  EXPECT_LT(deep - runtime, model_bytes * 3 / 4);
}

TEST_F(ShardedTrainTest, ResumingAnUnshardedCheckpointShardedIsRefused) {
  json spec = BaseSpec("llama", "");
  spec["steps"] = 4;
  spec["out"] = (root_ / "mixed").string();
  spec["checkpoint"] = {{"every", 2}};
  Result first = Run(spec, "mixed_first", "--stop-after-step 2");
  ASSERT_EQ(first.exit_code, 3) << first.stderr_text;
  spec["parallel"] = {{"shard", "optimizer"}};
  Result second = Run(spec, "mixed_second");
  EXPECT_NE(second.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(second.stderr_text, "parallel.shard: none")) << second.stderr_text;
}

// The overlap's defaults (measured, overlapped_all_reduce.h): on CUDA at every level, on a
// CPU at every level but gradients; STEMMA_SHARD_OVERLAP forces either way.
TEST(ShardOverlap, DefaultsPerLevelAndDeviceAndTheEnvironmentForces) {
  const char* saved = std::getenv("STEMMA_SHARD_OVERLAP");
  const std::string before = saved != nullptr ? saved : "";
  const torch::Device cpu(torch::kCPU), cuda(torch::kCUDA, 0);
  unsetenv("STEMMA_SHARD_OVERLAP");
  for (const std::string level : {"none", "optimizer", "gradients", "full"}) {
    EXPECT_TRUE(ShardOverlapEnabled(level, cuda)) << level;
    EXPECT_EQ(ShardOverlapEnabled(level, cpu), level != "gradients") << level;
  }
  setenv("STEMMA_SHARD_OVERLAP", "1", 1);
  EXPECT_TRUE(ShardOverlapEnabled("gradients", cpu));
  setenv("STEMMA_SHARD_OVERLAP", "0", 1);
  EXPECT_FALSE(ShardOverlapEnabled("full", cuda));
  EXPECT_FALSE(ShardOverlapEnabled("none", cpu));
  if (saved != nullptr) {
    setenv("STEMMA_SHARD_OVERLAP", before.c_str(), 1);
  } else {
    unsetenv("STEMMA_SHARD_OVERLAP");
  }
}

}  // namespace
}  // namespace stemma::engine::train
