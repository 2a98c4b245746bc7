// What `stemma-engine eval` fills into its spec, the typed stemma.v1.EvalSpec
// (proto/stemma/v1/specs/eval.proto, already checked by ParseEngineCommandLine), before any
// work: run defaults, and what it learns from the model directory (its max positions, the
// training run's sequence length). Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stemma/v1/specs/eval.pb.h"

namespace stemma::engine::eval {

// Fills what eval decides before any work from the spec file and the job: `tokenizer` (the
// model), `out` (beside the spec file, `<stem>.results.json`), `threads` (EffectiveThreads)
// and each task's defaults that depend on other fields (FillEvalTaskDefaults). Every other
// default is the schema's, filled by ParseEngineCommandLine.
void FillRunDefaults(const std::string& spec_path, v1::EvalSpec* spec);

// What eval reads from the checkpoint directory before it loads the weights.
struct ModelFacts {
  int64_t max_positions = 0;  // config.json max_position_embeddings (text_config's too)
  // data.seq_len of the training run that made the checkpoint, from its stemma.json: a
  // `train` output, or a merge/revert/... whose train ancestors (followed through the
  // manifests' parents, a few levels) all used the same seq_len.
  std::optional<int64_t> training_seq_len;
  std::string training_run;  // the train output it came from
};

// FailedPrecondition naming the directory when it has no readable config.json with a
// positive max_position_embeddings.
absl::StatusOr<ModelFacts> ReadModelFacts(const std::string& model_dir);

// Perplexity tasks without seq_len get the training run's, else min(max_positions, 2048).
// `sources` gets, per task, where its seq_len came from ("spec", "training run (<path>)",
// "model maximum ..."; "" for other types). InvalidArgument naming the task when a seq_len
// exceeds the model's max_position_embeddings.
absl::Status ResolveSequenceLengths(const ModelFacts& facts, v1::EvalSpec* spec,
                                    std::vector<std::string>* sources);

}  // namespace stemma::engine::eval
