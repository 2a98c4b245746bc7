// The `stemma-engine eval --spec FILE` spec (docs/eval.md, "Spec"), parsed and checked.
// Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

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
  int64_t seq_len = 0;  // 0: min(model max positions, 2048)
  // Choice.
  std::string format;  // "belebele" | "piqa" | "global_piqa"
  std::optional<bool> add_bos;  // default: when the tokenizer has a BOS
  int64_t max_length = 0;       // 0: model max positions
  // Translation.
  std::string source_language;
  std::string source_field = "src", target_field = "tgt";
  std::string source_name, target_name;  // labels in the prompt
  int64_t max_new_tokens = 256;
};

struct EvalSpec {
  std::string spec_path;
  std::string model;      // checkpoint directory
  std::string tokenizer;  // default: model
  std::string out;        // results JSON
  std::string dtype = "float32";
  int64_t batch_size = 8;
  int threads = 0;
  std::vector<TaskSpec> tasks;
  nlohmann::json raw;  // the spec as read, for the results file
};

const char* TaskTypeName(TaskType type);

// Checks every field (unknown keys, types, ranges, values) of `spec` read from `spec_path`;
// relative paths are resolved against the spec file's directory. Errors are
// InvalidArgument naming the file and field, e.g. "eval.yaml: tasks[1].k: must be >= 0".
absl::StatusOr<EvalSpec> ParseEvalSpec(const nlohmann::json& spec, const std::string& spec_path);

}  // namespace stemma::engine::eval
