// The memory plan: the peak memory one rank of a train or eval job holds on its device, from
// the job's spec, the model's shape and the data-parallel world size, itemised. Pure: no
// store, no clock, no files (the caller reads config.json: ShapeFromConfig).
//
// The model (docs/experiments.md, "Memory plan", has the formula and its measured accuracy):
// bytes the trainer allocates (engine/train/optimizer.cc, trainer.cc, step.cc) per parameter
// N (N_t trainable), per shard of W ranks at `parallel.shard`; activations per token per
// decoder layer as the model's forward keeps them for backward (engine/model/modules.cc);
// logits per loss chunk; a fixed runtime (CUDA context and workspaces, or LibTorch on CPU).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "stemma/v1/experiment.pb.h"
#include "stemma/v1/job.pb.h"

namespace stemma::experiments {

// A decoder-only transformer's shape, as config.json names it. `experts` 0: dense.
struct ModelShape {
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t intermediate = 0;  // per expert for MoE
  int64_t vocab = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t experts = 0;
  int64_t experts_per_tok = 0;
  int64_t max_positions = 0;    // max_position_embeddings; 0: unknown
  bool tied = false;            // the output head is the input embedding
  bool sandwich_norms = false;  // Gemma 3: norms before and after both sub-blocks
  bool qk_norm = false;

  // Parameters: all of them, and those one token runs (MoE: experts_per_tok of the experts).
  double Params() const;
  double ActiveParams() const;
  // One decoder layer's parameters, and the part of them in one expert's FFN.
  double LayerParams() const;
  double ExpertParams() const;
  double EmbeddingParams() const { return static_cast<double>(vocab) * hidden; }
  bool Valid() const { return layers > 0 && hidden > 0 && vocab > 0 && heads > 0; }
};

// The shape from a config.json's text (a `text_config` where there is one); nullopt when it
// lacks hidden_size, num_hidden_layers, vocab_size or num_attention_heads.
std::optional<ModelShape> ShapeFromConfig(std::string_view config_json);

// The shape from an experiment file's `models:` entry: its shape fields where given, else a
// Llama-like shape with `params` and `layers` (hidden from params ≈ 12·layers·hidden²).
std::optional<ModelShape> ShapeFromDeclared(const v1::ModelSize& size);

// An upcycled copy of `base` with `experts` experts per layer, `top_k` of them per token.
ModelShape Upcycled(const ModelShape& base, int64_t experts, int64_t top_k);

struct MemoryItem {
  std::string name;  // "fp32 weights", "Adam moments", ...
  double bytes = 0;
};

struct MemoryEstimate {
  bool gpu = false;   // per GPU, else per CPU process
  int64_t world = 1;  // data-parallel ranks
  std::vector<MemoryItem> items;
  double Bytes() const;
  int64_t MiB() const { return static_cast<int64_t>(Bytes() / (1 << 20) + 0.5); }
  // "fp32 weights 25 GiB + ... = ~146 GiB per GPU (8 ranks)"
  std::string Text() const;
  // "fp32 weights 25 GiB + ..." (the items only)
  std::string Items() const;
  // "~146 GiB per GPU"
  std::string Short() const;
};

// The estimate for a train or eval job reading a model of `shape`; nullopt for other kinds.
std::optional<MemoryEstimate> EstimateJobMemory(const v1::JobSpec& job, const ModelShape& shape);

// Data-parallel ranks of a job: nodes × RanksPerPart (common/job_ranks.h).
int64_t WorldSize(const v1::JobSpec& job);

// What would make a job that needs more than `limit_bytes` per device fit, as the fields to
// set and the estimate they give ("with parallel.shard: full and activation_checkpointing: 1:
// ~24 GiB"); "" when nothing the plan knows of fits.
std::string WhatWouldFit(const v1::JobSpec& job, const ModelShape& shape, double limit_bytes);

// "80 GiB" from MiB (whole GiB above 10, one decimal below).
std::string FormatGiB(double bytes);

}  // namespace stemma::experiments
