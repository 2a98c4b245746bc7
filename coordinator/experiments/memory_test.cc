// The memory plan's arithmetic on published shapes (its accuracy against measured peaks is
// tests/integration/memory_plan_test.cc's).
#include "coordinator/experiments/memory.h"

#include <gtest/gtest.h>

#include "coordinator/experiments/experiment_plan.h"

namespace stemma::experiments {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Llama-2-7B's config.json (the fields the plan reads).
constexpr const char* kLlama2 = R"({"model_type": "llama", "hidden_size": 4096,
  "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
  "num_key_value_heads": 32, "vocab_size": 32000, "tie_word_embeddings": false})";
// OLMoE-1B-7B's.
constexpr const char* kOlmoe = R"({"model_type": "olmoe", "hidden_size": 2048,
  "intermediate_size": 1024, "num_hidden_layers": 16, "num_attention_heads": 16,
  "num_key_value_heads": 16, "vocab_size": 50304, "num_experts": 64, "num_experts_per_tok": 8})";

v1::JobSpec TrainJob(int gpus, int nodes, int64_t batch) {
  v1::JobSpec job;
  job.set_name("ft");
  job.mutable_resources()->set_gpus(gpus);
  job.set_nodes(nodes);
  v1::TrainSpec* t = job.mutable_train();
  t->set_model("/m");
  t->mutable_data()->set_seq_len(4096);
  t->set_batch_size(batch);
  t->set_device("cuda");
  t->set_precision("bfloat16");
  t->set_loss_chunk_tokens(0);
  return job;
}

TEST(MemoryPlan, ShapesFromConfigCountThePublishedParameters) {
  auto llama = ShapeFromConfig(kLlama2);
  ASSERT_TRUE(llama.has_value());
  EXPECT_NEAR(llama->Params() / 1e9, 6.74, 0.01);
  EXPECT_DOUBLE_EQ(llama->ActiveParams(), llama->Params());
  auto olmoe = ShapeFromConfig(kOlmoe);
  ASSERT_TRUE(olmoe.has_value());
  EXPECT_NEAR(olmoe->Params() / 1e9, 6.92, 0.03);
  EXPECT_NEAR(olmoe->ActiveParams() / 1e9, 1.28, 0.03) << "8 of 64 experts per token";
  EXPECT_FALSE(ShapeFromConfig(R"({"hidden_size": 8})").has_value());
  EXPECT_FALSE(ShapeFromConfig("not json").has_value());
}

TEST(MemoryPlan, ReplicatedFullFineTuningOfA7BNeedsMoreThanAnH100) {
  auto llama = ShapeFromConfig(kLlama2);
  ASSERT_TRUE(llama.has_value());
  // One 4,096-token row per GPU on 8 GPUs, nothing sharded: gpu-scale.md's 146–172 GiB
  // (its rough reading of the same trainer, ±20 %; it takes the larger of activations and
  // gradients, the plan their sum, as measured on CPU).
  auto e = EstimateJobMemory(TrainJob(8, 1, 8), *llama);
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->gpu);
  EXPECT_EQ(e->world, 8);
  EXPECT_GT(e->Bytes(), 130 * kGiB) << e->Text();
  EXPECT_LT(e->Bytes(), 210 * kGiB) << e->Text();
  EXPECT_NE(e->Text().find("Adam moments"), std::string::npos) << e->Text();
  // Sharded over the 8 ranks with every layer recomputed it fits an 80 GB GPU.
  v1::JobSpec fixed = TrainJob(8, 1, 8);
  fixed.mutable_train()->mutable_parallel()->set_shard("full");
  fixed.mutable_train()->set_activation_checkpointing(1);
  auto small = EstimateJobMemory(fixed, *llama);
  ASSERT_TRUE(small.has_value());
  EXPECT_LT(small->Bytes(), 40 * kGiB) << small->Text();
  // Each level holds no more than the one before (optimizer and gradients differ only where
  // the gradients, not the activations, make the peak), and full far less than none.
  double last = e->Bytes();
  for (const char* shard : {"optimizer", "gradients", "full"}) {
    v1::JobSpec j = TrainJob(8, 1, 8);
    j.mutable_train()->mutable_parallel()->set_shard(shard);
    const double bytes = EstimateJobMemory(j, *llama)->Bytes();
    EXPECT_LE(bytes, last) << shard;
    last = bytes;
  }
  EXPECT_LT(last, e->Bytes() / 2);
}

TEST(MemoryPlan, CpuDataParallelCountsTheRingsReceiveBuffer) {
  auto llama = ShapeFromConfig(kLlama2);
  ASSERT_TRUE(llama.has_value());
  auto ring = [&](int ranks, const char* device, const char* shard) {
    v1::JobSpec job = TrainJob(0, 1, 4);
    job.mutable_resources()->set_ranks_per_part(ranks);
    job.mutable_train()->set_device(device);
    job.mutable_train()->mutable_parallel()->set_shard(shard);
    auto e = EstimateJobMemory(job, *llama);
    if (!e.has_value()) return -1.0;
    for (const MemoryItem& i : e->items) {
      if (i.name.find("ring") != std::string::npos) return i.bytes;
    }
    return 0.0;
  };
  // Shard none on 4 CPU ranks: one chunk of the flat gradient, 4/W bytes per parameter.
  EXPECT_NEAR(ring(4, "cpu", "none"), llama->Params(), 1e3);
  EXPECT_NEAR(ring(2, "cpu", "none"), 2 * llama->Params(), 1e3);
  // One process has no ring; NCCL receives into its own buffers; the sharded levels'
  // reduce-scatters receive in small pieces.
  EXPECT_EQ(ring(1, "cpu", "none"), 0.0);
  EXPECT_EQ(ring(4, "cuda", "none"), 0.0);
  EXPECT_EQ(ring(4, "cpu", "optimizer"), 0.0);
  EXPECT_EQ(ring(4, "cpu", "full"), 0.0);
}

// NCCL keeps an overlapped reduction's buffers until its Wait (the overlap is on by default on
// CUDA): ZeRO-2 up to four buckets of bucket_mb, ZeRO-3 one layer's reduce-scatter (and its
// outputs, 1/W of it). ZeRO-1's buckets are views of its flat gradient and shard none's are
// that flat copy, counted already; the CPU ring frees a bucket once it is reduced. On a CPU,
// full counts the heap glibc keeps between layers instead.
TEST(MemoryPlan, NcclReductionsInFlightAndTheCpuHeapBetweenLayers) {
  auto llama = ShapeFromConfig(kLlama2);
  ASSERT_TRUE(llama.has_value());
  auto item = [&](const char* device, const char* shard, const std::string& name) {
    v1::JobSpec job = TrainJob(8, 1, 8);
    job.mutable_train()->set_device(device);
    job.mutable_train()->mutable_parallel()->set_shard(shard);
    job.mutable_train()->mutable_parallel()->set_bucket_mb(25);
    auto e = EstimateJobMemory(job, *llama);
    double bytes = 0;
    for (const MemoryItem& i : e->items) {
      if (i.name.find(name) != std::string::npos) bytes += i.bytes;
    }
    return bytes;
  };
  const double mib = 1024.0 * 1024.0;
  EXPECT_DOUBLE_EQ(item("cuda", "gradients", "(NCCL)"), 4 * 25 * mib);
  EXPECT_DOUBLE_EQ(item("cuda", "full", "(NCCL)"), 4 * llama->LayerParams() * (1 + 1.0 / 8));
  for (const char* shard : {"none", "optimizer"}) EXPECT_EQ(item("cuda", shard, "(NCCL)"), 0.0);
  for (const char* shard : {"none", "optimizer", "gradients", "full"}) {
    EXPECT_EQ(item("cpu", shard, "(NCCL)"), 0.0) << shard;
  }
  EXPECT_DOUBLE_EQ(item("cpu", "full", "heap kept"), 2 * 4 * llama->LayerParams());
  EXPECT_EQ(item("cuda", "full", "heap kept"), 0.0);
  EXPECT_EQ(item("cpu", "gradients", "heap kept"), 0.0);
  // Nothing is loaded whole at full: no item is the whole model's fp32 weights.
  EXPECT_EQ(item("cpu", "full", "fp32 weights"), 0.0);
}

TEST(MemoryPlan, WhatWouldFitNamesTheFields) {
  auto llama = ShapeFromConfig(kLlama2);
  ASSERT_TRUE(llama.has_value());
  const std::string fix = WhatWouldFit(TrainJob(8, 1, 128), *llama, 80 * kGiB);
  EXPECT_NE(fix.find("parallel.shard: "), std::string::npos) << fix;
  EXPECT_NE(fix.find("GiB per GPU"), std::string::npos) << fix;
  // One GPU cannot shard: nothing the plan knows of fits a 7B's optimizer state in 16 GiB.
  EXPECT_EQ(WhatWouldFit(TrainJob(1, 1, 1), *llama, 16 * kGiB), "");
}

TEST(MemoryPlan, CheckpointingAndChunkedLossShrinkActivations) {
  auto llama = ShapeFromConfig(kLlama2);
  ASSERT_TRUE(llama.has_value());
  v1::JobSpec j = TrainJob(1, 1, 8);  // 32k tokens: activations and logits make the peak
  const double plain = EstimateJobMemory(j, *llama)->Bytes();
  j.mutable_train()->set_activation_checkpointing(1);
  const double recomputed = EstimateJobMemory(j, *llama)->Bytes();
  j.mutable_train()->set_loss_chunk_tokens(1024);
  const double chunked = EstimateJobMemory(j, *llama)->Bytes();
  EXPECT_LT(recomputed, plain);
  EXPECT_LT(chunked, recomputed);
}

TEST(MemoryPlan, EvalHoldsWeightsInItsDtype) {
  auto llama = ShapeFromConfig(kLlama2);
  ASSERT_TRUE(llama.has_value());
  v1::JobSpec job;
  job.mutable_eval()->set_model("/m");
  job.mutable_eval()->set_dtype("bfloat16");
  job.mutable_eval()->set_device("cuda");
  job.mutable_eval()->set_batch_size(1);
  auto e = EstimateJobMemory(job, *llama);
  ASSERT_TRUE(e.has_value());
  EXPECT_NEAR(e->items[0].bytes / 1e9, 2 * 6.74, 0.1) << e->Text();
  EXPECT_LT(e->Bytes(), 24 * kGiB) << e->Text();
  // Windows default to the model's context: a 512-position model's are 8x shorter.
  auto short_context = ShapeFromConfig(
      R"({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
          "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32000,
          "max_position_embeddings": 512})");
  ASSERT_TRUE(short_context.has_value());
  auto windowed = EstimateJobMemory(job, *short_context);
  ASSERT_TRUE(windowed.has_value());
  EXPECT_LT(windowed->Bytes(), e->Bytes() - 1 * kGiB) << windowed->Text();
}

TEST(MemoryPlan, PlanCellsCarryEstimatesAndGpuHoursCountActiveExperts) {
  constexpr const char* kFile = R"(name: moe
models:
  /olmoe: {params: 6920000000, layers: 16, hidden_size: 2048, intermediate_size: 1024,
           vocab_size: 50304, num_attention_heads: 16, num_key_value_heads: 16,
           num_experts: 64, num_experts_per_tok: 8}
  /dense: {params: 6920000000, layers: 16}
stages:
  a:
    matrix: {m: [/olmoe, /dense]}
    resources: {gpus: 8}
    train: {model: "${{ matrix.m }}", data: {datasets: [{path: /d}], seq_len: 4096},
            steps: 100, batch_size: 8, device: cuda, precision: bfloat16}
)";
  auto plan = ExpandExperiment(kFile, "moe.yaml", ExpansionEnv{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->cells.size(), 2u);
  for (const PlanCell& c : plan->cells) ASSERT_TRUE(c.memory.has_value()) << c.job_name;
  const double tokens = 100.0 * 8 * 4096;
  const double active =
      plan->cells[0].model_shape->ActiveParams() / plan->cells[0].model_shape->Params() * 6.92e9;
  EXPECT_NEAR(plan->gpu_hours_estimate, 6.0 * (active + 6.92e9) * tokens / 160e12 / 3600.0, 1e-6);
  plan->gpu_memory_bytes = 80 * kGiB;
  const std::string text = FormatPlan(*plan);
  EXPECT_NE(text.find("GiB per GPU"), std::string::npos) << text;
}

}  // namespace
}  // namespace stemma::experiments
