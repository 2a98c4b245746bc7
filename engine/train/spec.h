// The training spec of `stemma-engine train` (docs/engine/train.md): the typed message
// stemma.v1.TrainSpec (proto/stemma/v1/specs/train.proto), read and checked by
// common/engine_cli.h (YAML or JSON, defaults, rules, relative paths), turned into the
// plain structs the planner and the trainer use. No LibTorch here: the spec is checked
// completely before any model is loaded, so a typo fails in milliseconds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/layer_range.h"
#include "nlohmann/json.hpp"
#include "stemma/v1/specs/train.pb.h"

namespace stemma::engine::train {

// Decoder layers, half-open, with "middle" (common/layer_range.h: the one convention).
using ::stemma::LayerRange;

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
  bool shared = false;      // MoE: everything but experts and routers
  bool attention = false;   // every self_attn tensor
  bool norms = false;       // every norm, the final norm included
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
  v1::TrainData mixture;  // datasets / weights / temperature: data::OpenMixture
  int64_t seq_len = 0;
  double heldout_fraction = 0.0;
  bool heldout_last = false;  // heldout_split: last (else hash)
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
  int64_t threads = 0;  // 0: EffectiveThreads (the job's CPUs, else LibTorch's default)
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
  bool overwrite = false;  // replace an existing `out`
  int64_t log_every = 1;   // step events every N steps (and the first and last)

  std::string source;  // the spec file, for errors
  nlohmann::json raw;  // the typed spec as JSON (defaults filled), recorded in manifests

  int64_t tokens_per_step() const { return batch_size * grad_accum * data.seq_len; }
};

// The structs of a spec read by ParseEngineCommandLine (defaults filled, rules checked, paths
// resolved). Fills the defaults of sub-messages the spec left out. `source` names the file in
// errors. InvalidArgument for what the rules cannot say (a layer range that does not parse).
absl::StatusOr<TrainSpec> TrainSpecFromProto(v1::TrainSpec proto, const std::string& source);

// YAML or JSON text → TrainSpec, with the same reading and checks as the command line
// (relative paths are left as they are). For tests and tools.
absl::StatusOr<TrainSpec> ParseTrainSpecText(std::string_view text, const std::string& source);

}  // namespace stemma::engine::train
