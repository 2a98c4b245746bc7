// The `stemma-engine eval` spec as the command uses it: the typed stemma.v1.EvalSpec
// (proto/stemma/v1/specs/eval.proto, already checked by ParseEngineCommandLine) with every
// type-dependent default resolved, plus what the engine learns from the model directory
// before any work (its max positions, the training run's sequence length). Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stemma/v1/specs/eval.pb.h"

namespace stemma::engine::eval {

enum class TaskType { kPerplexity, kChoice, kTranslation };

struct TaskSpec {
  TaskType type = TaskType::kPerplexity;
  std::string name;      // metric names are "<metric>/<name>"
  std::string language;  // the evaluated (target) language
  std::string data;      // absolute path: dataset dir (perplexity) or JSONL file
  int64_t limit = 0;     // perplexity: documents; others: examples (0 = all)
  // Few-shot (choice, translation).
  int64_t k = 0;
  uint64_t seed = 1234;
  std::string sampler;       // "first_n" | "seeded"
  std::string fewshot_data;  // pool file; empty = the evaluated file itself
  // Perplexity.
  std::string split = "heldout";  // "heldout" | "all"
  double heldout_fraction = 0;
  uint64_t split_seed = 0;
  std::string heldout_split = "hash";  // "hash" | "last" (the training loader's rules)
  int64_t seq_len = 0;                 // resolved by ResolveSequenceLengths (> 0 after it)
  std::string seq_len_source;          // "spec", "training run (<path>)", "model maximum"
  // Choice.
  std::string format;           // "belebele" | "piqa" | "global_piqa"
  std::optional<bool> add_bos;  // default: when the tokenizer has a BOS
  int64_t max_length = 0;       // 0: model max positions
  // Translation.
  std::string source_language;
  std::string source_field = "src", target_field = "tgt";
  std::string source_name, target_name;  // labels in the prompt
  int64_t max_new_tokens = 256;
};

struct EvalSpec {
  std::string spec_path;  // --spec, or "" when given by flags only
  std::string model;      // checkpoint directory
  std::string tokenizer;  // default: model
  std::string out;        // results JSON
  std::string dtype = "float32";
  int64_t batch_size = 8;
  int64_t threads = 0;  // EffectiveThreads: the spec's, else the job's CPUs, else 0
  std::vector<TaskSpec> tasks;
};

const char* TaskTypeName(TaskType type);

// The command's view of a checked spec: type-dependent defaults (names, samplers, prompt
// labels), `out` beside the spec file when unset, threads from the job's CPUs. Paths are
// already absolute (ParseEngineCommandLine resolved them).
EvalSpec EvalSpecFromProto(const v1::EvalSpec& proto, const std::string& spec_path);

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

// Perplexity tasks without seq_len get the training run's, else min(max_positions, 2048);
// each records where its value came from. InvalidArgument naming the task when a seq_len
// exceeds the model's max_position_embeddings.
absl::Status ResolveSequenceLengths(const ModelFacts& facts, EvalSpec* spec);

}  // namespace stemma::engine::eval
