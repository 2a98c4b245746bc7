// Activation checkpointing (checkpointing.h) and chunked cross-entropy (loss.h) against the
// plain path: the same loss, MoE aux losses, router logits and parameter gradients, for a
// dense (Llama), a Gemma-like (sliding windows, sandwich norms, final logit softcapping) and
// an MoE (OLMoE) tiny model; the layer hooks' order; and the peak memory each option saves,
// measured by a counting CPU allocator.
#include "engine/model/checkpointing.h"

#include <ATen/autocast_mode.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/causal_lm.h"
#include "engine/model/checkpoint.h"
#include "engine/model/config.h"
#include "engine/model/loss.h"

namespace stemma::engine::model {
namespace {

// ---- A CPU allocator that counts live bytes and their peak ----

// Its pointers are "simple" (context == data), as LibTorch's raw_allocate users require.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) { instance_ = this; }

  c10::DataPtr allocate(size_t n) override {
    void* data = base_->raw_allocate(n);
    {
      std::lock_guard<std::mutex> lock(mu_);
      sizes_[data] = n;
      live_ += static_cast<int64_t>(n);
      peak_ = std::max(peak_, live_);
    }
    return {data, data, &Free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  // Starts a measurement: the peak is reset to what is live now, which is returned.
  int64_t Reset() {
    std::lock_guard<std::mutex> lock(mu_);
    peak_ = live_;
    return live_;
  }
  int64_t peak() {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }

 private:
  static void Free(void* data) {
    CountingAllocator* self = instance_;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      auto it = self->sizes_.find(data);
      if (it != self->sizes_.end()) {
        self->live_ -= static_cast<int64_t>(it->second);
        self->sizes_.erase(it);
      }
    }
    self->base_->raw_deallocate(data);
  }

  inline static CountingAllocator* instance_ = nullptr;
  c10::Allocator* base_;
  std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;
  int64_t live_ = 0, peak_ = 0;
};

CountingAllocator& Counter() {
  // Installed once for the whole test binary (tensors allocated before keep their own
  // deleter); leaked, as LibTorch may free tensors after static destructors run.
  static CountingAllocator* counter = [] {
    auto* c = new CountingAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(c, /*priority=*/100);
    return c;
  }();
  return *counter;
}

// ---- Models and the two paths ----

ModelConfig TinyConfig(Arch arch, int layers) {
  auto j = *PresetConfigJson(arch, "tiny");
  j["num_hidden_layers"] = layers;
  if (arch == Arch::kGemma3) {
    nlohmann::json types = nlohmann::json::array();
    for (int i = 0; i < layers; ++i)
      types.push_back(i % 3 == 2 ? "full_attention" : "sliding_attention");
    j["layer_types"] = types;
    j["final_logit_softcapping"] = 3.0;  // tight enough to change the logits of a tiny model
  }
  auto config = ParseModelConfig(j);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

struct Batch {
  torch::Tensor inputs, targets;  // [B, T] int64 each
};

Batch RandomBatch(int64_t vocab, int64_t rows, int64_t seq, uint64_t seed) {
  torch::manual_seed(seed);
  auto tokens = torch::randint(3, vocab, {rows, seq + 1}, torch::kInt64);
  return {tokens.narrow(1, 0, seq), tokens.narrow(1, 1, seq)};
}

struct PathResult {
  double ce = 0.0, load_balancing = 0.0, router_z = 0.0;
  std::vector<torch::Tensor> router_logits;
  std::map<std::string, torch::Tensor> grads;
};

// One forward and backward of the mean CE (plus weighted MoE aux losses), as the trainer
// takes it. `plain`: forward() and the loss over the whole logits; otherwise ForwardLoss with
// `chunk` tokens and checkpointing every `every`-th layer.
PathResult RunPath(CausalLM& lm, const Batch& batch, bool plain, int64_t every, int64_t chunk) {
  lm->zero_grad();
  lm->model->SetActivationCheckpointing(every);
  ForwardOutput out;
  torch::Tensor ce;
  if (plain) {
    out = lm->forward(batch.inputs);
    ce = SummedCrossEntropy(out.logits, batch.targets);
  } else {
    out = lm->ForwardLoss(batch.inputs, batch.targets, chunk);
    ce = out.ce_sum;
  }
  auto loss = ce / static_cast<double>(batch.targets.numel());
  PathResult r;
  if (lm->config().is_moe()) {
    loss = loss + out.load_balancing_loss * 0.5 + out.router_z_loss * 0.1;
    r.load_balancing = out.load_balancing_loss.item<double>();
    r.router_z = out.router_z_loss.item<double>();
    for (const auto& l : out.router_logits) r.router_logits.push_back(l.detach().clone());
  }
  loss.backward();
  r.ce = ce.item<double>();
  for (const auto& p : lm->named_parameters()) {
    if (p.value().grad().defined()) r.grads[p.key()] = p.value().grad().clone();
  }
  lm->model->SetActivationCheckpointing(0);
  return r;
}

void ExpectSame(const PathResult& want, const PathResult& got, double tolerance,
                const std::string& what) {
  EXPECT_NEAR(got.ce, want.ce, tolerance * std::abs(want.ce)) << what;
  EXPECT_NEAR(got.load_balancing, want.load_balancing, 1e-6) << what;
  EXPECT_NEAR(got.router_z, want.router_z, 1e-6) << what;
  ASSERT_EQ(got.router_logits.size(), want.router_logits.size()) << what;
  for (size_t i = 0; i < want.router_logits.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got.router_logits[i], want.router_logits[i], 1e-5, 1e-6))
        << what << ": router logits of MoE layer " << i;
  }
  ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
  for (const auto& [name, g] : want.grads) {
    auto it = got.grads.find(name);
    ASSERT_NE(it, got.grads.end()) << what << ": no gradient for " << name;
    const double scale = g.abs().max().item<double>();
    const double diff = (it->second - g).abs().max().item<double>();
    EXPECT_LE(diff, tolerance * scale + 1e-9) << what << ": " << name;
  }
}

struct Variant {
  int64_t every, chunk;
};

class PathsTest : public testing::TestWithParam<Arch> {};

// Every variant of checkpointing and chunking gives the plain path's loss, aux losses,
// router logits and gradients.
TEST_P(PathsTest, CheckpointingAndChunkingMatchThePlainPath) {
  const Arch arch = GetParam();
  ModelConfig config = TinyConfig(arch, arch == Arch::kGemma3 ? 4 : 3);
  auto lm = *InitModel(config, 11);
  auto batch = RandomBatch(config.vocab_size, 2, 24, 5);
  const PathResult plain = RunPath(lm, batch, /*plain=*/true, 0, 0);
  EXPECT_GT(plain.grads.size(), 10u);
  for (Variant v : {Variant{1, 0}, Variant{2, 0}, Variant{0, 7}, Variant{0, 16}, Variant{1, 5},
                    Variant{2, 48}, Variant{3, 13}}) {
    const std::string what =
        absl::StrCat(ArchName(arch), " checkpointing ", v.every, ", chunk ", v.chunk);
    ExpectSame(plain, RunPath(lm, batch, /*plain=*/false, v.every, v.chunk), 1e-5, what);
  }
}

// Under bf16 autocast the recompute runs in bf16 as the forward did.
TEST_P(PathsTest, UnderBf16AutocastToo) {
  const Arch arch = GetParam();
  ModelConfig config = TinyConfig(arch, 3);
  auto lm = *InitModel(config, 12);
  auto batch = RandomBatch(config.vocab_size, 2, 16, 6);
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCPU, true);
  const PathResult plain = RunPath(lm, batch, true, 0, 0);
  const PathResult both = RunPath(lm, batch, false, 1, 9);
  at::autocast::set_autocast_enabled(at::kCPU, false);
  at::autocast::clear_cache();
  // bf16 products; the chunked loss sums its chunks in another order: a looser tolerance.
  ExpectSame(plain, both, 2e-2, absl::StrCat(ArchName(arch), " bf16"));
}

INSTANTIATE_TEST_SUITE_P(Archs, PathsTest,
                         testing::Values(Arch::kLlama, Arch::kGemma3, Arch::kOlmoe),
                         [](const auto& info) { return std::string(ArchName(info.param)); });

// A trained layer whose input needs no gradient (frozen embedding) still gets its gradients;
// frozen layers get none.
TEST(CheckpointingTest, TrainedLayerAfterFrozenEmbedding) {
  ModelConfig config = TinyConfig(Arch::kLlama, 3);
  auto lm = *InitModel(config, 13);
  auto batch = RandomBatch(config.vocab_size, 2, 12, 7);
  lm->model->embed_tokens->weight.set_requires_grad(false);
  for (auto& p : lm->model->layers[1]->parameters()) p.set_requires_grad(false);
  const PathResult plain = RunPath(lm, batch, true, 0, 0);
  EXPECT_EQ(plain.grads.count("model.embed_tokens.weight"), 0u);
  EXPECT_EQ(plain.grads.count("model.layers.0.mlp.up_proj.weight"), 1u);
  EXPECT_EQ(plain.grads.count("model.layers.1.mlp.up_proj.weight"), 0u);
  ExpectSame(plain, RunPath(lm, batch, false, 1, 5), 1e-5, "frozen embedding, layer 1");
}

// The chunked loss alone, with ignored targets (-100) and a tied head.
TEST(ChunkedCrossEntropyTest, IgnoredTargetsAndTiedHead) {
  ModelConfig config = TinyConfig(Arch::kQwen2, 2);  // tie_word_embeddings
  ASSERT_TRUE(config.tie_word_embeddings);
  auto lm = *InitModel(config, 14);
  auto batch = RandomBatch(config.vocab_size, 3, 10, 8);
  batch.targets = batch.targets.clone();
  batch.targets.index_put_({0, torch::indexing::Slice(2, 6)}, -100);
  batch.targets.index_put_({2, 9}, -100);
  const PathResult plain = RunPath(lm, batch, true, 0, 0);
  EXPECT_EQ(plain.grads.count("lm_head.weight"), 0u);
  for (int64_t chunk : {1, 4, 29}) {
    ExpectSame(plain, RunPath(lm, batch, false, 0, chunk), 1e-5, absl::StrCat("chunk ", chunk));
  }
}

// ---- Hooks ----

// The order of the hooks in a training step, the gradients they see, and that hooks alone
// (checkpointing off) checkpoint every layer with the plain path's result.
TEST(LayerHooksTest, OrderAndGradients) {
  ModelConfig config = TinyConfig(Arch::kOlmoe, 3);
  auto lm = *InitModel(config, 15);
  auto batch = RandomBatch(config.vocab_size, 2, 8, 9);
  const PathResult plain = RunPath(lm, batch, true, 0, 0);

  std::vector<std::string> events;
  auto hooks = std::make_shared<LayerHooks>();
  hooks->gather = [&](int i) { events.push_back(absl::StrCat("gather ", i)); };
  hooks->release = [&](int i) { events.push_back(absl::StrCat("release ", i)); };
  hooks->grads_ready = [&](int i) {
    // This layer's gradients are in .grad; the layer below has not been reached yet.
    auto* layer = lm->model->layers[i]->as<DecoderLayerImpl>();
    EXPECT_TRUE(layer->self_attn->q_proj->weight.grad().defined()) << i;
    if (i > 0) {
      auto* below = lm->model->layers[i - 1]->as<DecoderLayerImpl>();
      EXPECT_FALSE(below->self_attn->q_proj->weight.grad().defined()) << i;
    }
    events.push_back(absl::StrCat("grads_ready ", i));
  };
  lm->model->SetLayerHooks(hooks);
  const PathResult hooked = RunPath(lm, batch, false, 0, 0);
  EXPECT_EQ(events, (std::vector<std::string>{"gather 0", "release 0", "gather 1", "release 1",
                                              "gather 2", "release 2", "gather 2", "grads_ready 2",
                                              "release 2", "gather 1", "grads_ready 1", "release 1",
                                              "gather 0", "grads_ready 0", "release 0"}));
  ExpectSame(plain, hooked, 1e-5, "hooks");

  // Without grad (evaluation): gather and release around each layer only.
  events.clear();
  {
    torch::NoGradGuard no_grad;
    lm->forward(batch.inputs);
  }
  EXPECT_EQ(events, (std::vector<std::string>{"gather 0", "release 0", "gather 1", "release 1",
                                              "gather 2", "release 2"}));
  lm->model->SetLayerHooks(nullptr);
}

// ---- Peak memory ----

// Peak bytes allocated during one forward and backward, above what was live before.
int64_t PeakBytes(CausalLM& lm, const Batch& batch, bool plain, int64_t every, int64_t chunk) {
  auto& counter = Counter();
  lm->zero_grad();
  for (auto& p : lm->parameters()) p.mutable_grad() = torch::Tensor();
  const int64_t before = counter.Reset();
  RunPath(lm, batch, plain, every, chunk);
  return counter.peak() - before;
}

// A configuration where activations (6 layers, 2,048 tokens) and logits (vocabulary 4,096)
// dominate: checkpointing and chunking each lower the peak, both together the most.
TEST(MemoryTest, CheckpointingAndChunkingLowerThePeak) {
  Counter();  // install before the model exists
  ModelConfig config = TinyConfig(Arch::kLlama, 6);
  config.vocab_size = 4096;
  auto lm = *InitModel(config, 16);
  auto batch = RandomBatch(config.vocab_size, 4, 512, 10);
  const int64_t plain = PeakBytes(lm, batch, true, 0, 0);
  const int64_t every1 = PeakBytes(lm, batch, false, 1, 0);
  const int64_t every2 = PeakBytes(lm, batch, false, 2, 0);
  const int64_t chunked = PeakBytes(lm, batch, false, 0, 256);
  const int64_t both = PeakBytes(lm, batch, false, 1, 256);
  auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
  std::printf(
      "peak MiB above the model (llama tiny, 6 layers, H 64, V 4096, 4 x 512 tokens): plain "
      "%.1f, checkpointing every layer %.1f, every 2nd %.1f, loss chunks of 256 %.1f, both "
      "%.1f\n",
      mib(plain), mib(every1), mib(every2), mib(chunked), mib(both));
  EXPECT_LT(every1, plain);
  EXPECT_LT(every2, plain);
  EXPECT_LT(every1, every2);
  EXPECT_LT(chunked, plain);
  EXPECT_LT(both, std::min(every1, chunked));
}

}  // namespace
}  // namespace stemma::engine::model
