// The training spec of `stemma-engine train --spec FILE` (docs/train.md): a YAML or JSON
// document parsed into typed structs. No LibTorch here: the spec is checked completely (types,
// ranges, unknown fields) before any model is loaded, so a typo fails in milliseconds.
//
// Errors are InvalidArgument naming the file and the field ("spec.yaml: optimizer.lr: must
// be > 0"). Relative paths are resolved against the spec file's directory.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace stemma::engine::train {

// Decoder layers [begin, end): Python slice convention, so "9:28" is layers 9..27 — the
// middle block M of algorithms.md §0.2. "7" is layer 7 alone; "9:" runs to the last layer and
// ":9" starts at 0 (end < 0 and begin < 0 stand for those open ends until resolved).
struct LayerRange {
  int64_t begin = 0;
  int64_t end = -1;  // -1: through the last layer
  std::string text;  // as written, for errors
};

// "a:b", "a", "a:" or ":b" with non-negative decimal integers. Bounds are checked against the
// model later (ResolveLayerRange), since the spec does not know the layer count.
absl::StatusOr<LayerRange> ParseLayerRange(absl::string_view text, absl::string_view where);

// [begin, end) within a model of `num_layers` layers; InvalidArgument naming `where` for an
// empty range or one past the last layer.
absl::StatusOr<LayerRange> ResolveLayerRange(const LayerRange& range, int64_t num_layers,
                                             absl::string_view where);

struct OptimizerSpec {
  double lr = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

struct ScheduleSpec {
  enum class Kind { kCosine, kConstant, kLinear };
  Kind kind = Kind::kCosine;
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.0;  // final lr = lr * min_lr_ratio (cosine, linear)
};

// The learning rate of optimizer step `step` (1-based) out of `total_steps`: linear warmup
// lr*s/W for s <= W, then cosine (or linear) decay from lr to lr*min_lr_ratio, reached at the
// last step; constant keeps lr after the warmup.
double LearningRate(const OptimizerSpec& optimizer, const ScheduleSpec& schedule, int64_t step,
                    int64_t total_steps);

struct FreezeSpec {
  std::vector<LayerRange> layers;
  bool embeddings = false;  // model.embed_tokens.weight (and a tied head with it)
  bool head = false;        // lm_head.weight (untied models)
  bool final_norm = false;  // model.norm.weight
};

// One L2-SP rule: λ for the tensors of `layers`, or (no layers) for every trainable tensor no
// other rule names — layer tensors and non-layer ones (embeddings, final norm, head).
struct L2spRule {
  std::vector<LayerRange> layers;
  double lambda = 0.0;
};

struct NeuronMaskSpec {
  std::string file;                    // stemma.neuron_mask/1 JSON (analyze lape)
  std::vector<std::string> languages;  // union of these; empty: all in the file
};

struct ExpertSubsetSpec {
  std::string file;      // expert-selection JSON (algorithms.md §4.4)
  std::string language;  // top-level key, e.g. "ca"
  std::string set;       // e.g. "ssft_k5", "seft"
  bool train_routers = true;
};

struct AuxLossSpec {
  double load_balancing = 0.0;  // coefficient of model::LoadBalancingLoss
  double router_z = 0.0;        // coefficient of model::RouterZLoss
};

struct StrategySpec {
  FreezeSpec freeze;
  std::vector<L2spRule> l2sp;
  std::optional<NeuronMaskSpec> neuron_mask;
  std::optional<ExpertSubsetSpec> expert_subset;
  std::vector<int64_t> frozen_experts;
  AuxLossSpec aux_loss;
};

struct DataSpec {
  nlohmann::json mixture;  // datasets / temperature / family_weights: data::MixtureSpecFromJson
  int64_t seq_len = 0;
  double heldout_fraction = 0.0;
  uint64_t split_seed = 0;
  bool shuffle = true;
};

struct CheckpointSpec {
  int64_t every = 0;  // steps between checkpoints; 0: none (no resume either)
  std::string dir;    // default: <out>.checkpoints
  int64_t keep = 2;   // newest checkpoints kept; 0 keeps all
};

// Held-out evaluation while training: before the first step of a fresh run, every `every`
// steps and after the last, the mean cross-entropy of the model on the same held-out rows of
// each dataset (the first batches × batch_size rows of its held-out split, in index order).
struct EvalSpec {
  int64_t every = 0;       // 0: off
  int64_t batches = 4;     // per dataset
  int64_t batch_size = 0;  // rows per forward pass; 0: the training batch_size
};

struct TrainSpec {
  std::string model;  // base HF checkpoint directory
  std::string out;    // final checkpoint directory
  DataSpec data;
  int64_t batch_size = 1;  // rows per micro-batch, over all ranks together
  int64_t grad_accum = 1;  // micro-batches per optimizer step
  int64_t steps = 0;       // optimizer steps; or derived from max_tokens
  int64_t max_tokens = 0;
  uint64_t seed = 0;
  int threads = 0;  // at::set_num_threads; 0 keeps LibTorch's default
  OptimizerSpec optimizer;
  ScheduleSpec schedule;
  double clip_grad_norm = 1.0;  // 0: no clipping
  StrategySpec strategy;
  CheckpointSpec checkpoint;
  EvalSpec eval;
  std::string save_dtype = "float32";  // float32 | bfloat16 | float16 for `out`
  // Where the model lives: "cpu", "cuda" or "cuda:N" (a worker's CUDA_VISIBLE_DEVICES decides
  // which physical GPU "cuda" is). Master weights and Adam moments stay fp32 on that device.
  std::string device = "cpu";
  // "float32", or "bfloat16": forward and backward under bf16 autocast (the matrix products in
  // bf16, losses and reductions in fp32), the usual mixed precision on GPUs.
  std::string precision = "float32";
  bool overwrite = false;              // replace an existing `out`
  int64_t log_every = 1;               // step events every N steps (and the last)

  std::string source;    // the spec file, for errors
  nlohmann::json raw;    // the parsed document, recorded in manifests

  int64_t tokens_per_step() const { return batch_size * grad_accum * data.seq_len; }
};

// Parses a spec document. `source` names the file in errors; relative paths are resolved
// against `base_dir` (the spec file's directory) when it is not empty.
absl::StatusOr<TrainSpec> ParseTrainSpec(const nlohmann::json& doc, const std::string& source,
                                         const std::string& base_dir);

// ReadSpecFile + ParseTrainSpec.
absl::StatusOr<TrainSpec> LoadTrainSpec(const std::string& path);

}  // namespace stemma::engine::train
