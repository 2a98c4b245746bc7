// Inside the trainer (trainer.h): the state of one training run and the parts of the loop
// that live in their own files. Internal to engine/train; commands include trainer.h.
//   trainer.cc      setup, the step loop, events, publishing `out`
//   step.cc         one optimizer step, held-out evaluation, SSFT router restriction
//   checkpoints.cc  resumable checkpoints: write, list, prune, resume
// Thread-safety: none; one thread drives a run.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/data/loader.h"
#include "engine/events.h"
#include "engine/io/manifest.h"
#include "engine/model/causal_lm.h"
#include "engine/train/distributed.h"
#include "engine/train/layer_shards.h"
#include "engine/train/optimizer.h"
#include "engine/train/overlapped_all_reduce.h"
#include "engine/train/plan.h"
#include "engine/train/sharded_optimizer.h"
#include "nlohmann/json.hpp"
#include "stemma/v1/specs/train.pb.h"

namespace stemma::engine::train {

// Everything one run holds: the spec, the model, its plan and optimizer, the data.
struct Run {
  const v1::TrainSpec* spec = nullptr;  // defaults filled (FillTrainDefaults)
  std::string source;                   // the spec file, for errors
  std::string spec_sha256;              // of the spec as manifests record it
  int64_t total_steps = 0;              // TotalSteps(spec)
  int64_t tokens_per_step = 0;          // TokensPerStep(spec)
  model::CausalLM lm{nullptr};
  TrainPlan plan;
  // parallel.shard: none → `optimizer` (every rank the whole state); optimizer | gradients →
  // `sharded` (ZeRO-1/2, sharded_optimizer.h); full → `full` (ZeRO-3, layer_shards.h, whose
  // hooks the model runs). Exactly one is set.
  std::unique_ptr<FlatAdamW> optimizer;
  std::unique_ptr<ShardedAdamW> sharded;
  std::unique_ptr<LayerShards> full;
  // none at W > 1: the gradient all-reduce overlapping the last backward (unless
  // ShardOverlapEnabled says no; then AllReduceMeanGradients after it).
  std::unique_ptr<OverlappedAllReduce> overlap;
  std::unique_ptr<data::Loader> loader;
  // The data-parallel group (RANK/WORLD_SIZE); a single process makes every collective a
  // no-op.
  std::unique_ptr<DataParallel> ranks;
  int64_t tokens = 0;
  torch::Device device = torch::kCPU;
  bool autocast_bf16 = false;  // precision: bfloat16
  // eval.every > 0: the fixed held-out rows of each dataset, [rows, seq_len + 1] row-major.
  struct HeldOut {
    std::string name;  // the dataset's language (its directory name if it has none)
    int64_t rows = 0;
    std::vector<int32_t> tokens;
  };
  std::vector<HeldOut> heldout;
};

// The spec as manifests record it (its sha256 identifies the run).
nlohmann::json SpecAsJson(const v1::TrainSpec& spec);
// The producer recorded in the manifests of checkpoints and of `out`: the command, the job
// and attempt, the spec as JSON and its sha256; `stopped_at_step` when stopped early.
io::ManifestProducer Producer(const Run& run, int64_t stopped_at_step = 0);

// ---- step.cc ----

struct StepResult {
  double loss = 0.0;  // mean cross-entropy per predicted token over the global batch
  double load_balancing = 0.0, router_z = 0.0;  // means over micro-batches and ranks
  FlatAdamW::StepStats stats;
  double lr = 0.0;
};

// One optimizer step (grad_accum micro-batches, the all-reduce, clipping, AdamW).
// InvalidArgument for a token outside the vocabulary, Internal for a NaN loss or gradient.
absl::StatusOr<StepResult> TrainStep(Run& run, int64_t step);

// Mean cross-entropy on each held-out set, emitted as `metric` events (`heldout_loss/<name>`
// and `heldout_loss` over all sets) at `step`. Every rank takes part (collective sums).
void EvaluateHeldOut(Run& run, int64_t step, const EventWriter& events);

// SSFT (algorithms.md §4.5): while training, the router of each listed layer may only pick
// the listed experts; Clear gives the model back its whole router (to save or evaluate it).
void RestrictRouters(Run& run);
void ClearRouterRestriction(Run& run);

// ---- checkpoints.cc ----

// "step-00000012": the directory of the checkpoint after `step`.
std::string StepDirName(int64_t step);
// Writes the checkpoint of `step` (weights, optimizer moments, RNG, loader position) to
// `path`, published atomically. Rank 0 only.
absl::Status WriteCheckpoint(Run& run, int64_t step, const std::string& path);
// The same under parallel.shard (optimizer | gradients | full): every rank writes its slice of
// the weights, moments and its RNG state, rank 0 the metadata and publishes the directory.
// Collective (every rank calls it).
absl::Status WriteShardedCheckpoint(Run& run, int64_t step, const std::string& path);
// Removes staging directories of checkpoints whose writer died (a killed attempt).
void RemoveStaleStaging(const std::string& dir);
// Keeps the newest `keep` complete checkpoints of `dir` (0: all).
void PruneCheckpoints(const std::string& dir, int64_t keep);
// Under parallel.shard: restores the weights, moments and RNG from the shard files of the
// checkpoint `dir` (`shard` is trainer_state.json's "shard" object), whatever world size
// wrote them: each rank reads the files that overlap its slice. Collective.
absl::Status RestoreShards(Run& run, const std::string& dir, const nlohmann::json& shard,
                           int64_t optimizer_step);
// Loads the newest checkpoint of the run's checkpoint directory into `run`; returns its step
// (0 when there is none). Errors name the checkpoint: a damaged file, a batch geometry that
// differs from the spec's.
absl::StatusOr<int64_t> Resume(Run& run);

}  // namespace stemma::engine::train
