#include "coordinator/experiments/memory.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_ranks.h"
#include "common/layer_range.h"
#include "common/yaml_json.h"

namespace stemma::experiments {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// What a rank holds besides its model: on a GPU the CUDA context, cuBLAS and collective
// workspaces and the caching allocator's slack; on a CPU LibTorch's anonymous memory and code
// pages (measured: stemma-engine train of a model of a few thousand parameters peaks at
// ~190 MiB anonymous + 200-320 MiB of code, 0.49 GiB VmHWM; tests/check_memory_plan.py).
constexpr double kGpuRuntime = 2.0 * kGiB;
constexpr double kCpuRuntime = 0.5 * kGiB;

double D(int64_t v) { return static_cast<double>(v); }

// The trainable parameters of a train spec and those of them under a dense fp32 mask.
struct Trainable {
  double params = 0;
  double masked = 0;
};

double AttentionParams(const ModelShape& s) {
  const double hd = D(s.head_dim);
  return D(s.hidden) * hd * D(2 * s.heads + 2 * s.kv_heads);  // q, o; k, v
}

double NormParams(const ModelShape& s) {
  double n = D(s.hidden) * (s.sandwich_norms ? 4 : 2);
  if (s.qk_norm) n += D(s.head_dim) * 2;
  return n;
}

// Layers [begin, end) of the spec's freeze.layers, as a per-layer flag.
std::vector<bool> FrozenLayers(const v1::TrainFreeze& freeze, int64_t layers) {
  std::vector<bool> frozen(static_cast<size_t>(std::max<int64_t>(layers, 0)), false);
  for (const std::string& text : freeze.layers()) {
    absl::StatusOr<LayerRange> r = ParseLayerRange(text, "strategy.freeze.layers");
    if (!r.ok()) continue;
    absl::StatusOr<LayerRange> resolved = ResolveLayerRange(*r, layers, "strategy.freeze.layers");
    if (!resolved.ok()) continue;
    for (int64_t i = std::max<int64_t>(0, resolved->begin); i < resolved->end && i < layers; ++i)
      frozen[static_cast<size_t>(i)] = true;
  }
  return frozen;
}

Trainable TrainableOf(const v1::TrainSpec& t, const ModelShape& s) {
  const v1::TrainStrategy& st = t.strategy();
  const double expert = s.ExpertParams();
  const double experts = std::max<int64_t>(1, s.experts);
  const double router = s.experts > 0 ? D(s.hidden) * D(s.experts) : 0;
  Trainable out;
  if (st.has_neuron_mask()) {
    // Whole gate/up/down tensors get gradients and moments; their masks are dense fp32.
    out.params = out.masked = D(s.layers) * expert;
    return out;
  }
  if (st.has_expert_subset()) {
    // The selection file is read by the engine: the plan assumes experts_per_tok experts in
    // each of two layers (SSFT's last two layers) and their routers.
    const double per_layer = std::max<int64_t>(1, s.experts_per_tok) * expert +
                             (st.expert_subset().train_routers() ? router : 0);
    out.params = 2 * per_layer;
    return out;
  }
  const v1::TrainFreeze& f = st.freeze();
  const std::vector<bool> frozen = FrozenLayers(f, s.layers);
  const double frozen_experts =
      std::min<double>(experts, static_cast<double>(st.frozen_experts_size()));
  for (int64_t i = 0; i < s.layers; ++i) {
    if (frozen[static_cast<size_t>(i)]) continue;
    if (!f.shared() && !f.attention()) out.params += AttentionParams(s);
    if (!f.shared() && !f.norms()) out.params += NormParams(s);
    out.params += (experts - frozen_experts) * expert + router;
  }
  const double embed = s.EmbeddingParams();
  if (!f.shared() && !f.embeddings()) out.params += embed;
  if (!s.tied && !f.shared() && !f.head()) out.params += embed;
  if (!f.shared() && !f.final_norm() && !f.norms()) out.params += D(s.hidden);
  return out;
}

// Elements one token keeps for backward in one decoder layer, split into the residual stream
// (always fp32: the embedding is fp32 and autocast adds in fp32) and the products (bf16 under
// autocast). Read from engine/model/modules.cc and fused.cc: the layer's input and the first
// norm's output, the attention's own (without GQA the q/k/v product stays whole, since v is a
// view of it, and q and k after RoPE are new; with GQA the repeated keys and values replace
// it), SDPA's output, the residual after attention and the second norm's output, and the FFN's
// gate|up product, its sigmoid and the gated product (an MoE: each routed token's copy, those
// products and its output, and the router's logits).
struct LayerActivations {
  double residual = 0;
  double products = 0;
};

LayerActivations ActivationsPerToken(const ModelShape& s, bool autocast) {
  const double d = D(s.hidden), hd = D(s.head_dim), nh = D(s.heads), nkv = D(s.kv_heads);
  LayerActivations a;
  a.residual = 4 * d + (s.sandwich_norms ? 2 * d : 0);
  if (s.heads != s.kv_heads) {
    a.products = 4 * nh * hd;
  } else {
    a.products = (nh + 2 * nkv) * hd + (nh + nkv) * hd + nh * hd;
  }
  if (s.qk_norm) a.products += (nh + nkv) * hd;
  if (autocast) a.products += 4 * d;  // the bf16 casts of the norms' outputs (q, k, v; gate|up)
  const double f = D(s.intermediate);
  if (s.experts > 0) {
    const double k = std::max<int64_t>(1, s.experts_per_tok);
    a.products += k * (2 * d + 4 * f);
    a.residual += D(s.experts);  // router logits, fp32
  } else {
    a.products += 4 * f;
  }
  return a;
}

// Tokens one rank runs per micro-batch.
double TokensPerRank(const v1::TrainSpec& t, int64_t world) {
  const int64_t batch = std::max<int64_t>(1, t.has_batch_size() ? t.batch_size() : 1);
  const int64_t rows = (batch + world - 1) / world;
  return D(rows) * D(std::max<int64_t>(1, t.data().seq_len()));
}

void Add(MemoryEstimate* e, const char* name, double bytes) {
  if (bytes > 0) e->items.push_back({name, bytes});
}

// parallel.shard: full's persistent state (weights, gradient slice) and what it adds per step;
// returns the autograd gradients' bytes.
double AddFullShard(MemoryEstimate* e, const ModelShape& s, double nt, double w, bool autocast,
                    double bucket) {
  // ZeRO-3 (engine/train/layer_shards.h), at any world size: every weight, trainable or
  // frozen, as an fp32 slice of 1/W; the decoder layer that runs and the next one (its
  // prefetch) gathered in fp32, the embeddings, head and final norm for the whole step;
  // under autocast bf16 copies of the running layer and the outer unit. Gradients: one
  // layer's and the outer unit's, and a bucket being reduce-scattered. No load term: the
  // trainer builds the model weightless and each rank reads only its slices of the
  // checkpoint (engine/train/trainer.cc, LoadForTraining), so no rank ever holds the whole
  // model.
  const double n = s.Params();
  const double outer = s.EmbeddingParams() * (s.tied ? 1 : 2) + D(s.hidden);
  Add(e, "fp32 weight slices (1/W)", 4 * n / w);
  const double prefetched = s.layers > 1 ? s.LayerParams() : 0;
  Add(e, "gathered layers (running, prefetched), embeddings and head",
      4 * (s.LayerParams() + prefetched + outer) + (autocast ? 2 * (s.LayerParams() + outer) : 0));
  // The bucket: at most a quarter of a layer (ShardedAdamW::ReduceBuckets).
  const double grads =
      4 * std::min(nt, s.LayerParams() + outer) + std::min(s.LayerParams(), bucket / 2);
  Add(e, "gradient slice (1/W)", 4 * nt / w);
  // NCCL keeps a started reduce-scatter's buckets (and its outputs, 1/W of them) until its
  // Wait, and a layer's are waited for only when the layer before it starts its own: one
  // layer's fp32 gradients in flight beside the next one's (the CPU ring frees each bucket
  // as soon as it is reduced).
  if (e->gpu && e->world > 1) {
    Add(e, "reduce-scatters in flight (NCCL)",
        4 * std::min(nt, s.LayerParams()) * (1 + 1 / D(e->world)));
  }
  // glibc keeps the heap that the gathered layers, buckets and gradients free (the train
  // command keeps blocks up to 32 MiB in the heap and never trims it), and later requests of
  // other sizes do not fit all its holes. Measured (tests/check_memory_plan.py with an
  // LD_PRELOAD counter of live malloc bytes): the peak live heap above the runtime was the
  // plan's items within 7 % (25.6 M at 2 ranks 270 vs 290 MiB, at 4 ranks 166 vs 166), the
  // peak RssAnon 20-33 MiB more: 2.5-3 layers' fp32 on 10.8 M and 25.6 M models.
  if (!e->gpu) Add(e, "heap kept between layers (CPU)", 2 * 4 * s.LayerParams());
  return grads;
}

// The weights and gradient buffers of shard none | optimizer | gradients.
void AddReplicated(MemoryEstimate* e, const std::string& shard, double n, double nt, double w,
                   bool autocast, double bucket, int64_t bucket_mb) {
  const bool sharded = shard != "none" && e->world > 1;
  // The fp32 flat buffer is the compute replica on every rank and its own master copy
  // (engine/train/optimizer.h, sharded_optimizer.h). Every rank holds the whole model in it
  // (shard none loads the model whole; optimizer | gradients read the checkpoint straight
  // into the replica, trainer.cc LoadForTraining): no second copy at load.
  Add(e, "fp32 weights", 4 * n);
  if (autocast) Add(e, "bf16 weight copies", 2 * n);
  // shard none: the flat copy that is all-reduced; optimizer (ZeRO-1): the [W*k] buffer that
  // is reduce-scattered in place; both persist. gradients (ZeRO-2): the slice and a bucket.
  if (shard == "gradients" && sharded) {
    Add(e, "gradient slice (1/W) and bucket", 4 * nt / w + bucket);
    // NCCL keeps an overlapped bucket until its Wait: up to four started ones
    // (ShardedAdamW::StartRange). ZeRO-1's buckets are views of its flat gradient and shard
    // none's are that flat copy (OverlappedAllReduce): nothing more there.
    if (e->gpu) {
      Add(e, "buckets in flight (NCCL)", std::min(4 * nt, 4.0 * D(bucket_mb) * 1024 * 1024));
    }
  } else if (e->world > 1) {
    Add(e, "flat gradient copy (data parallel)", 4 * nt);
    // On a CPU, shard none all-reduces that copy in the engine's own TCP ring, which
    // receives one chunk (1/W of it) at a time into a buffer it keeps for the next step
    // (engine/train/distributed.cc, Ring::AllReduceSum); NCCL needs none, and the sharded
    // levels' reduce-scatters receive in pieces of 4 MiB. Measured: 1.2 bytes per parameter
    // more at 2 ranks than at 4 (tests/bench/sharded), where this predicts 1.
    if (!e->gpu && shard == "none") Add(e, "ring receive buffer (1/W)", 4 * nt / D(e->world));
  }
}

MemoryEstimate TrainMemory(const v1::JobSpec& job, const ModelShape& s) {
  const v1::TrainSpec& t = job.train();
  MemoryEstimate e;
  e.gpu = t.device().rfind("cuda", 0) == 0;
  e.world = WorldSize(job);
  const std::string shard = t.parallel().shard().empty() ? "none" : t.parallel().shard();
  const bool autocast = t.precision() == "bfloat16";
  const double c = autocast ? 2 : 4;  // bytes of a compute weight
  const double n = s.Params();
  const Trainable tr = TrainableOf(t, s);
  const double nt = tr.params;
  const bool sharded = shard != "none" && e.world > 1;
  const double w = sharded ? D(e.world) : 1;
  const bool l2sp = std::any_of(t.strategy().l2sp().begin(), t.strategy().l2sp().end(),
                                [](const v1::TrainL2spRule& r) { return r.lambda() > 0; });
  // Two gradient buckets in flight, never more than the gradients themselves.
  const int64_t bucket_mb = t.parallel().has_bucket_mb() ? t.parallel().bucket_mb() : 64;
  const double bucket = std::min(4 * nt, 2.0 * D(bucket_mb) * 1024 * 1024);
  double grads = 4 * nt;  // autograd's: built during backward, gone after the step
  const bool full = shard == "full";
  if (full) {
    grads = AddFullShard(&e, s, nt, w, autocast, bucket);
  } else {
    AddReplicated(&e, shard, n, nt, w, autocast, bucket, bucket_mb);
  }
  Add(&e, "Adam moments", 8 * nt / w);
  // The scratch is allocated for every trainable parameter of the slice but written only for
  // L2-SP ranges and masked tensors: a GPU's allocator holds all of it, a CPU process only the
  // pages written.
  if (!full) {
    Add(&e, "optimizer scratch", (e.gpu ? 4 * nt : (l2sp ? 4 * nt : 4 * tr.masked)) / w);
  }
  if (l2sp) Add(&e, "L2-SP anchor", 4 * nt / w);
  // Dense fp32 masks unsharded; one byte per owned element when sharded.
  Add(&e, "neuron masks", (sharded || full ? 1 : 4) * tr.masked / w);

  // Activations of one micro-batch; checkpointed layers keep only their input, and one layer
  // is recomputed at a time.
  const double tokens = TokensPerRank(t, e.world);
  const LayerActivations per = ActivationsPerToken(s, autocast);
  const double layer = tokens * (4 * per.residual + c * per.products);
  // `full` recomputes every layer in backward, whatever activation_checkpointing says.
  const int64_t every = full ? 1 : t.activation_checkpointing();
  const int64_t kept_layers = every > 0 ? (s.layers + every - 1) / every : 0;
  double activations =
      D(s.layers - kept_layers) * layer + D(kept_layers) * tokens * 4 * D(s.hidden);
  if (kept_layers > 0) activations += layer;  // the layer being recomputed
  // Backward's working set: one layer's gradients of its intermediates (about its
  // activations); and the final norm's input and output.
  activations += layer + tokens * 8 * D(s.hidden);
  // The loss: logits (compute dtype), their fp32 copy under autocast, log-softmax and the two
  // gradients in fp32, for one chunk of tokens at a time.
  const double chunk =
      t.loss_chunk_tokens() > 0 ? std::min(tokens, D(t.loss_chunk_tokens())) : tokens;
  const double logits = chunk * D(s.vocab) * (c + 12 + (autocast ? 4 : 0));
  // All at once: backward frees a layer's activations as its weights' gradients appear, but
  // the allocator rarely hands the freed blocks (activation-shaped) to the gradients
  // (weight-shaped); measured on CPU the gradients came on top (docs/experiments.md).
  Add(&e, "gradients", grads);
  Add(&e, "activations", activations);
  Add(&e, "logits and loss", logits);
  Add(&e, e.gpu ? "CUDA context and workspaces" : "runtime", e.gpu ? kGpuRuntime : kCpuRuntime);
  return e;
}

MemoryEstimate EvalMemory(const v1::JobSpec& job, const ModelShape& s) {
  const v1::EvalSpec& ev = job.eval();
  MemoryEstimate e;
  e.gpu = ev.device().rfind("cuda", 0) == 0;
  e.world = WorldSize(job);
  const double c = ev.dtype() == "bfloat16" ? 2 : 4;
  Add(&e, ev.dtype() == "bfloat16" ? "bf16 weights" : "fp32 weights", c * s.Params());
  int64_t seq = 0;
  for (const v1::EvalTask& task : ev.tasks()) {
    if (task.has_perplexity() && task.perplexity().seq_len() > 0)
      seq = std::max(seq, task.perplexity().seq_len());
  }
  // Unset: the training run's seq_len or the model's context (docs/engine/eval.md), here the
  // context where known, at most 4,096.
  if (seq == 0) seq = s.max_positions > 0 ? std::min<int64_t>(s.max_positions, 4096) : 4096;
  const double tokens = D(std::max<int64_t>(1, ev.has_batch_size() ? ev.batch_size() : 8)) * D(seq);
  const LayerActivations per = ActivationsPerToken(s, c == 2);
  // No gradients: one layer's tensors live at a time (and the residual stream).
  Add(&e, "activations (one layer)", tokens * (4 * per.residual + c * per.products));
  Add(&e, "logits", tokens * D(s.vocab) * (c + 8));
  Add(&e, e.gpu ? "CUDA context and workspaces" : "runtime", e.gpu ? kGpuRuntime : kCpuRuntime);
  return e;
}

int64_t Int(const YamlNode* root, const char* key) {
  const YamlNode* n = root->Find(key);
  int64_t v = 0;
  if (n != nullptr && n->IsScalar()) (void)absl::SimpleAtoi(n->scalar, &v);
  return v;
}

}  // namespace

double ModelShape::ExpertParams() const { return 3.0 * D(hidden) * D(intermediate); }

double ModelShape::LayerParams() const {
  const double router = experts > 0 ? D(hidden) * D(experts) : 0;
  return AttentionParams(*this) + NormParams(*this) +
         D(std::max<int64_t>(1, experts)) * ExpertParams() + router;
}

double ModelShape::Params() const {
  return D(layers) * LayerParams() + EmbeddingParams() * (tied ? 1 : 2) + D(hidden);
}

double ModelShape::ActiveParams() const {
  if (experts <= 0) return Params();
  const double idle = D(experts - std::max<int64_t>(1, experts_per_tok)) * ExpertParams();
  return Params() - D(layers) * idle;
}

ModelShape Upcycled(const ModelShape& base, int64_t experts, int64_t top_k) {
  ModelShape s = base;
  s.experts = std::max<int64_t>(1, experts);
  s.experts_per_tok = std::max<int64_t>(1, top_k);
  return s;
}

std::optional<ModelShape> ShapeFromConfig(std::string_view config_json) {
  absl::StatusOr<std::vector<YamlNode>> docs = LoadYamlDocuments(config_json, "config.json");
  if (!docs.ok() || docs->empty() || !(*docs)[0].IsMap()) return std::nullopt;
  const YamlNode* root = &(*docs)[0];
  std::string type;
  if (const YamlNode* m = root->Find("model_type"); m != nullptr && m->IsScalar()) type = m->scalar;
  if (const YamlNode* t = root->Find("text_config"); t != nullptr && t->IsMap()) root = t;
  ModelShape s;
  s.layers = Int(root, "num_hidden_layers");
  s.hidden = Int(root, "hidden_size");
  s.intermediate = Int(root, "intermediate_size");
  s.vocab = Int(root, "vocab_size");
  s.heads = Int(root, "num_attention_heads");
  s.kv_heads = Int(root, "num_key_value_heads");
  if (s.kv_heads <= 0) s.kv_heads = s.heads;
  s.head_dim = Int(root, "head_dim");
  if (s.head_dim <= 0 && s.heads > 0) s.head_dim = s.hidden / s.heads;
  s.experts = std::max(Int(root, "num_experts"), Int(root, "num_local_experts"));
  s.experts_per_tok = Int(root, "num_experts_per_tok");
  s.max_positions = Int(root, "max_position_embeddings");
  const bool gemma = type.find("gemma") != std::string::npos;
  s.tied = gemma;
  if (const YamlNode* n = root->Find("tie_word_embeddings"); n != nullptr && n->IsScalar())
    s.tied = n->scalar == "true";
  s.sandwich_norms = type.find("gemma3") != std::string::npos;
  s.qk_norm = s.sandwich_norms || type == "olmoe";
  if (!s.Valid()) return std::nullopt;
  return s;
}

std::optional<ModelShape> ShapeFromDeclared(const v1::ModelSize& size) {
  ModelShape s;
  s.layers = static_cast<int64_t>(size.layers());
  const double params = size.params();
  if (s.layers <= 0 && params <= 0) return std::nullopt;
  if (s.layers <= 0) s.layers = 32;
  s.hidden = size.has_hidden_size()
                 ? static_cast<int64_t>(size.hidden_size())
                 : static_cast<int64_t>(std::sqrt(params / (12.0 * D(s.layers))) / 128 + 0.5) * 128;
  if (s.hidden <= 0) return std::nullopt;
  s.intermediate = size.has_intermediate_size() ? static_cast<int64_t>(size.intermediate_size())
                                                : s.hidden * 8 / 3;
  s.vocab = size.has_vocab_size() ? static_cast<int64_t>(size.vocab_size()) : 32000;
  s.heads = size.has_num_attention_heads() ? static_cast<int64_t>(size.num_attention_heads())
                                           : std::max<int64_t>(1, s.hidden / 128);
  s.kv_heads =
      size.has_num_key_value_heads() ? static_cast<int64_t>(size.num_key_value_heads()) : s.heads;
  s.head_dim = size.has_head_dim() ? static_cast<int64_t>(size.head_dim()) : s.hidden / s.heads;
  s.tied = size.tie_word_embeddings();
  s.experts = static_cast<int64_t>(size.num_experts());
  s.experts_per_tok = static_cast<int64_t>(size.num_experts_per_tok());
  if (!s.Valid()) return std::nullopt;
  return s;
}

int64_t WorldSize(const v1::JobSpec& job) {
  return static_cast<int64_t>(std::max(1, job.nodes())) * RanksPerPart(job);
}

std::optional<MemoryEstimate> EstimateJobMemory(const v1::JobSpec& job, const ModelShape& shape) {
  if (!shape.Valid()) return std::nullopt;
  if (job.has_train()) return TrainMemory(job, shape);
  if (job.has_eval()) return EvalMemory(job, shape);
  return std::nullopt;
}

double MemoryEstimate::Bytes() const {
  double total = 0;
  for (const MemoryItem& i : items) total += i.bytes;
  return total;
}

std::string FormatGiB(double bytes) {
  const double gib = bytes / kGiB;
  char buf[32];
  std::snprintf(buf, sizeof buf, gib >= 10 ? "%.0f GiB" : "%.1f GiB", gib);
  return buf;
}

std::string MemoryEstimate::Short() const {
  return absl::StrCat("~", FormatGiB(Bytes()), gpu ? " per GPU" : " per CPU process");
}

std::string MemoryEstimate::Items() const {
  std::vector<std::string> parts;
  for (const MemoryItem& i : items) parts.push_back(absl::StrCat(i.name, " ", FormatGiB(i.bytes)));
  return absl::StrJoin(parts, " + ");
}

std::string MemoryEstimate::Text() const {
  return absl::StrCat(Items(), " = ", Short(),
                      world > 1 ? absl::StrCat(" (", world, " ranks)") : "");
}

std::string WhatWouldFit(const v1::JobSpec& job, const ModelShape& shape, double limit_bytes) {
  if (!job.has_train()) return "";
  struct Option {
    const char* shard;
    int64_t checkpointing;
    bool one_row;  // one row per rank per micro-batch, grad_accum keeping the global batch
  };
  static const Option kOptions[] = {
      {nullptr, 1, false},     {"optimizer", 0, false}, {"gradients", 0, false},
      {"gradients", 1, false}, {"full", 0, false},      {"full", 1, false},
      {"full", 1, true},
  };
  const v1::TrainSpec& t = job.train();
  const int64_t world = WorldSize(job);
  for (const Option& o : kOptions) {
    if (o.shard != nullptr && world <= 1) continue;  // sharding needs several ranks
    v1::JobSpec changed = job;
    v1::TrainSpec* ct = changed.mutable_train();
    std::vector<std::string> fields;
    if (o.shard != nullptr && t.parallel().shard() != o.shard) {
      ct->mutable_parallel()->set_shard(o.shard);
      fields.push_back(absl::StrCat("parallel.shard: ", o.shard));
    }
    if (o.checkpointing > 0 && t.activation_checkpointing() != o.checkpointing) {
      ct->set_activation_checkpointing(o.checkpointing);
      fields.push_back("activation_checkpointing: 1");
    }
    const int64_t batch = std::max<int64_t>(1, t.has_batch_size() ? t.batch_size() : 1);
    if (o.one_row && batch > world) {
      const int64_t factor = (batch + world - 1) / world;
      ct->set_batch_size(world);
      ct->set_grad_accum(std::max<int64_t>(1, t.grad_accum()) * factor);
      fields.push_back(absl::StrCat("batch_size: ", world));
      fields.push_back(absl::StrCat("grad_accum: ", ct->grad_accum()));
    }
    if (fields.empty()) continue;
    std::optional<MemoryEstimate> e = EstimateJobMemory(changed, shape);
    if (e.has_value() && e->Bytes() <= limit_bytes) {
      return absl::StrCat("with ", absl::StrJoin(fields, " and "), ": ", e->Short());
    }
  }
  return "";
}

}  // namespace stemma::experiments
