#include "engine/train/spec.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "common/engine_spec.h"
#include "common/proto_yaml.h"
#include "common/status.h"

namespace stemma::engine::train {

void FillTrainDefaults(v1::TrainSpec* spec) {
  spec->mutable_data();
  spec->mutable_optimizer();
  spec->mutable_schedule();
  spec->mutable_strategy()->mutable_freeze();
  spec->mutable_strategy()->mutable_aux_loss();
  spec->mutable_checkpoint();
  spec->mutable_eval();
  spec->mutable_parallel();
  FillSpecDefaults(spec);
}

int64_t TokensPerStep(const v1::TrainSpec& spec) {
  return spec.batch_size() * spec.grad_accum() * spec.data().seq_len();
}

int64_t TotalSteps(const v1::TrainSpec& spec) {
  if (spec.has_steps()) return spec.steps();
  const int64_t per_step = std::max<int64_t>(TokensPerStep(spec), 1);
  return (spec.max_tokens() + per_step - 1) / per_step;
}

std::string CheckpointDir(const v1::TrainSpec& spec) {
  return spec.checkpoint().dir().empty() ? spec.out() + ".checkpoints" : spec.checkpoint().dir();
}

int64_t EvalBatchSize(const v1::TrainSpec& spec) {
  return spec.eval().has_batch_size() ? spec.eval().batch_size() : spec.batch_size();
}

double LearningRate(const v1::TrainOptimizer& optimizer, const v1::TrainSchedule& schedule,
                    int64_t step, int64_t total_steps) {
  const double peak = optimizer.lr();
  const int64_t warmup = schedule.warmup_steps();
  if (step <= warmup) return peak * static_cast<double>(step) / static_cast<double>(warmup);
  if (schedule.type() == "constant") return peak;
  const double floor = peak * schedule.min_lr_ratio();
  const int64_t decay_steps = total_steps - warmup;
  // Progress 0 at the first step after warmup, 1 at the last step.
  const double progress = decay_steps <= 1 ? 1.0
                                           : static_cast<double>(step - warmup - 1) /
                                                 static_cast<double>(decay_steps - 1);
  const double shape = schedule.type() == "linear"
                           ? 1.0 - progress
                           : 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return floor + (peak - floor) * shape;
}

absl::StatusOr<std::vector<LayerRange>> ParseLayerRanges(
    const google::protobuf::RepeatedPtrField<std::string>& texts, const std::string& field) {
  std::vector<LayerRange> out;
  for (int i = 0; i < texts.size(); ++i) {
    ASSIGN_OR_RETURN(LayerRange r, ParseLayerRange(texts[i], absl::StrCat(field, "[", i, "]")));
    out.push_back(std::move(r));
  }
  return out;
}

absl::StatusOr<v1::TrainSpec> ParseTrainSpecText(std::string_view text, const std::string& source) {
  ASSIGN_OR_RETURN(std::vector<YamlNode> docs, LoadYamlDocuments(text, source));
  if (docs.size() != 1 || !docs[0].IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": the spec must be one mapping"));
  }
  v1::TrainSpec spec;
  FieldLines lines;
  RETURN_IF_ERROR(ReadYamlInto(docs[0], &spec, source, "", &lines));
  FillSpecDefaults(&spec);
  SpecContext context;
  context.where = source;
  context.lines = &lines;
  RETURN_IF_ERROR(ValidateEngineSpec(spec, context));
  FillTrainDefaults(&spec);
  return spec;
}

}  // namespace stemma::engine::train
