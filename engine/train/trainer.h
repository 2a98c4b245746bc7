// The training loop of `stemma-engine train` (docs/train.md): loads the base model, applies
// the spec's strategy (plan.h), trains with FlatAdamW on batches from the data loader,
// publishes resumable checkpoints and the final model, and reports JSON-line events.
//
// Resumption: when the checkpoint directory holds a complete checkpoint, training continues
// from the newest one (weights, optimizer moments, step, RNG and loader state), so a run
// interrupted anywhere and restarted produces the same loss curve, step for step (bitwise on
// CPU with the same thread count).
//
// Data parallel (RANK/WORLD_SIZE, engine/train/distributed.h): every rank reads the same
// global batches and keeps rows [rank·B/W, (rank+1)·B/W) of each micro-batch; gradients are
// averaged, so the update equals one process with the whole batch. Only rank 0 prints events
// and writes checkpoints and the final model.
//
// Early stopping: when the attempt directory ($STEMMA_WORKDIR) holds the file `stop`
// (common/engine_contract.h), training ends after the current step and that step's model is
// published as `out` like a finished one, its stemma.json noting `stopped_at_step`; the
// `done` event says the same, and the command exits 0.
//
// Preemption: when it holds the file `preempt` instead, the checkpoint of the current step
// is saved at once (the resumable one, as checkpoint.every would write it) and the command
// exits 5 (kExitPreempted) without publishing; the next run resumes from that checkpoint
// and repeats the same loss curve. A run with checkpoint.every 0 resumes from it too.
//
// Header without LibTorch: train_command.cc stays a cheap translation unit.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/events.h"
#include "stemma/v1/specs/train.pb.h"

namespace stemma::engine::train {

struct RunOptions {
  std::string source = "spec";  // the spec file (or "command line"), for errors
  // Stop (as if preempted) right after the checkpoint of this step; 0: run to the end.
  int64_t stop_after_step = 0;
};

// kPreempted: the attempt directory held the preempt file (common/engine_contract.h
// kPreemptFile); the checkpoint of the last step done is saved, nothing is published.
enum class RunResult { kFinished, kStopped, kPreempted };

// Runs (or resumes) the training `spec` describes. Errors name the cause: a spec field, a
// file or tensor, a NaN loss (with the step). Nothing partial is ever published: checkpoints
// and the output go through io::CheckpointWriter's staging directory and atomic rename.
// `spec` has its defaults filled (FillTrainDefaults, spec.h) and its rules checked.
absl::StatusOr<RunResult> Train(const v1::TrainSpec& spec, const RunOptions& options,
                                const EventWriter& events);

}  // namespace stemma::engine::train
