// The training spec of `stemma-engine train` (docs/engine/train.md) is the typed message
// stemma.v1.TrainSpec (proto/stemma/v1/specs/train.proto) itself: the schema holds every
// default, ParseEngineCommandLine (common/engine_cli.h) reads and checks it, and the planner,
// the optimizer and the trainer read the message. This header adds only what the schema
// cannot say statically: values derived from other fields. No LibTorch here: the spec is
// checked completely before any model is loaded, so a typo fails in milliseconds.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/layer_range.h"
#include "stemma/v1/specs/train.pb.h"

namespace stemma::engine::train {

// Decoder layers, half-open, with "middle" (common/layer_range.h: the one convention).
using ::stemma::LayerRange;

// Makes the sub-messages whose fields have defaults present, then fills every default of
// the schema (FillSpecDefaults fills only sub-messages that are set). What the trainer
// reads, and what its manifests record as the spec. Idempotent.
void FillTrainDefaults(v1::TrainSpec* spec);

// batch_size × grad_accum × data.seq_len.
int64_t TokensPerStep(const v1::TrainSpec& spec);
// `steps`, or ⌈max_tokens / tokens per step⌉.
int64_t TotalSteps(const v1::TrainSpec& spec);
// checkpoint.dir, or `<out>.checkpoints`.
std::string CheckpointDir(const v1::TrainSpec& spec);
// eval.batch_size, or the training batch_size.
int64_t EvalBatchSize(const v1::TrainSpec& spec);

// The learning rate of optimizer step `step` (1-based) out of `total_steps`: linear warmup
// lr*s/W for s <= W, then cosine (or linear) decay from lr to lr*min_lr_ratio, reached at the
// last step; constant keeps lr after the warmup.
double LearningRate(const v1::TrainOptimizer& optimizer, const v1::TrainSchedule& schedule,
                    int64_t step, int64_t total_steps);

// The ranges of a repeated layer-range field; `field` names it in errors ("<field>[i]: ...").
absl::StatusOr<std::vector<LayerRange>> ParseLayerRanges(
    const google::protobuf::RepeatedPtrField<std::string>& texts, const std::string& field);

// YAML or JSON text → a TrainSpec with the same reading, defaults and checks as the command
// line (relative paths are left as they are), then FillTrainDefaults. For tests and tools.
absl::StatusOr<v1::TrainSpec> ParseTrainSpecText(std::string_view text, const std::string& source);

}  // namespace stemma::engine::train
