#include "engine/eval/eval_spec.h"

#include <cstdint>
#include <filesystem>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/spec_file.h"
#include "common/status.h"

namespace stemma::engine::eval {
namespace {

namespace fs = std::filesystem;

// Reads typed fields of one JSON object, with errors naming "<file>: <where>.<field>".
class Fields {
 public:
  Fields(const nlohmann::json& object, std::string file, std::string where)
      : object_(object), file_(std::move(file)), where_(std::move(where)) {}

  absl::Status Error(const std::string& field, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": ", Path(field), ": ", what));
  }
  bool Has(const std::string& field) const { return object_.contains(field); }

  absl::Status String(const std::string& field, std::string* out, bool required = false) const {
    if (!Has(field)) return required ? Error(field, "missing") : absl::OkStatus();
    const auto& v = object_.at(field);
    if (!v.is_string()) return Error(field, absl::StrCat("must be a string, got ", v.type_name()));
    *out = v.get<std::string>();
    if (required && out->empty()) return Error(field, "must not be empty");
    return absl::OkStatus();
  }
  template <typename Int>
  absl::Status Integer(const std::string& field, Int* out, int64_t minimum) const {
    if (!Has(field)) return absl::OkStatus();
    const auto& v = object_.at(field);
    const bool fits = v.is_number_unsigned()
                          ? v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)
                          : v.is_number_integer();
    if (!fits || v.get<int64_t>() < minimum) {
      return Error(field, absl::StrCat("must be an integer >= ", minimum));
    }
    *out = static_cast<Int>(v.get<int64_t>());
    return absl::OkStatus();
  }
  absl::Status Number(const std::string& field, double* out) const {
    if (!Has(field)) return absl::OkStatus();
    const auto& v = object_.at(field);
    if (!v.is_number()) return Error(field, "must be a number");
    *out = v.get<double>();
    return absl::OkStatus();
  }
  absl::Status Bool(const std::string& field, std::optional<bool>* out) const {
    if (!Has(field)) return absl::OkStatus();
    const auto& v = object_.at(field);
    if (!v.is_boolean()) return Error(field, "must be true or false");
    *out = v.get<bool>();
    return absl::OkStatus();
  }
  absl::Status OneOf(const std::string& field, const std::string& value,
                     const std::set<std::string>& allowed) const {
    if (allowed.count(value)) return absl::OkStatus();
    std::string list;
    for (const auto& a : allowed) absl::StrAppend(&list, list.empty() ? "" : ", ", a);
    return Error(field, absl::StrCat("'", value, "' is not one of: ", list));
  }

 private:
  std::string Path(const std::string& field) const {
    return where_.empty() ? field : absl::StrCat(where_, ".", field);
  }
  const nlohmann::json& object_;
  std::string file_, where_;
};

std::string Resolve(const std::string& path, const fs::path& base) {
  if (path.empty()) return path;
  fs::path p(path);
  return (p.is_absolute() ? p : base / p).lexically_normal().string();
}

absl::Status ParsePerplexity(const Fields& f, TaskSpec* task) {
  RETURN_IF_ERROR(f.String("split", &task->split));
  RETURN_IF_ERROR(f.OneOf("split", task->split, {"heldout", "all"}));
  RETURN_IF_ERROR(f.Number("heldout_fraction", &task->heldout_fraction));
  RETURN_IF_ERROR(f.Integer("split_seed", &task->split_seed, 0));
  RETURN_IF_ERROR(f.Integer("seq_len", &task->seq_len, 2));
  if (task->split == "heldout" && !(task->heldout_fraction > 0 && task->heldout_fraction < 1)) {
    return f.Error("heldout_fraction",
                   "must be in (0, 1) with split: heldout (the training run's value)");
  }
  if (task->name.empty()) task->name = task->language;
  return absl::OkStatus();
}

absl::Status ParseChoice(const Fields& f, TaskSpec* task) {
  RETURN_IF_ERROR(f.String("format", &task->format, /*required=*/true));
  RETURN_IF_ERROR(f.OneOf("format", task->format, {"belebele", "piqa", "global_piqa"}));
  RETURN_IF_ERROR(f.Bool("add_bos", &task->add_bos));
  RETURN_IF_ERROR(f.Integer("max_length", &task->max_length, 1));
  if (task->sampler.empty()) task->sampler = task->format == "belebele" ? "first_n" : "seeded";
  if (task->name.empty()) task->name = absl::StrCat(task->format, "_", task->language);
  return absl::OkStatus();
}

absl::Status ParseTranslation(const Fields& f, TaskSpec* task) {
  RETURN_IF_ERROR(f.String("source_language", &task->source_language, /*required=*/true));
  RETURN_IF_ERROR(f.String("source_field", &task->source_field));
  RETURN_IF_ERROR(f.String("target_field", &task->target_field));
  RETURN_IF_ERROR(f.String("source_name", &task->source_name));
  RETURN_IF_ERROR(f.String("target_name", &task->target_name));
  RETURN_IF_ERROR(f.Integer("max_new_tokens", &task->max_new_tokens, 1));
  if (task->source_name.empty()) task->source_name = task->source_language;
  if (task->target_name.empty()) task->target_name = task->language;
  if (task->sampler.empty()) task->sampler = "seeded";
  if (task->name.empty()) task->name = absl::StrCat(task->source_language, "-", task->language);
  return absl::OkStatus();
}

absl::StatusOr<TaskSpec> ParseTask(const nlohmann::json& j, const std::string& file, size_t index,
                                   const fs::path& base) {
  const std::string where = absl::StrCat("tasks[", index, "]");
  std::string type;
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", where, ": must be a mapping"));
  }
  Fields f(j, file, where);
  RETURN_IF_ERROR(f.String("type", &type, /*required=*/true));
  RETURN_IF_ERROR(f.OneOf("type", type, {"perplexity", "choice", "translation"}));
  const std::string at = absl::StrCat(file, ": ", where);
  if (type == "perplexity") {
    RETURN_IF_ERROR(CheckKeys(j, {"type", "name", "language", "data", "limit", "split",
                                  "heldout_fraction", "split_seed", "seq_len"}, at));
  } else if (type == "choice") {
    RETURN_IF_ERROR(CheckKeys(j, {"type", "name", "language", "data", "limit", "k", "seed",
                                  "sampler", "fewshot_data", "format", "add_bos", "max_length"},
                              at));
  } else {
    RETURN_IF_ERROR(CheckKeys(j, {"type", "name", "language", "data", "limit", "k", "seed",
                                  "sampler", "fewshot_data", "source_language", "source_field",
                                  "target_field", "source_name", "target_name", "max_new_tokens"},
                              at));
  }
  TaskSpec task;
  task.type = type == "perplexity" ? TaskType::kPerplexity
              : type == "choice"   ? TaskType::kChoice
                                   : TaskType::kTranslation;
  RETURN_IF_ERROR(f.String("name", &task.name));
  RETURN_IF_ERROR(f.String("language", &task.language, /*required=*/true));
  RETURN_IF_ERROR(f.String("data", &task.data, /*required=*/true));
  task.data = Resolve(task.data, base);
  RETURN_IF_ERROR(f.Integer("limit", &task.limit, 0));
  RETURN_IF_ERROR(f.Integer("k", &task.k, 0));
  RETURN_IF_ERROR(f.Integer("seed", &task.seed, 0));
  RETURN_IF_ERROR(f.String("sampler", &task.sampler));
  if (!task.sampler.empty()) RETURN_IF_ERROR(f.OneOf("sampler", task.sampler, {"first_n", "seeded"}));
  RETURN_IF_ERROR(f.String("fewshot_data", &task.fewshot_data));
  task.fewshot_data = Resolve(task.fewshot_data, base);
  switch (task.type) {
    case TaskType::kPerplexity: RETURN_IF_ERROR(ParsePerplexity(f, &task)); break;
    case TaskType::kChoice: RETURN_IF_ERROR(ParseChoice(f, &task)); break;
    case TaskType::kTranslation: RETURN_IF_ERROR(ParseTranslation(f, &task)); break;
  }
  return task;
}

}  // namespace

const char* TaskTypeName(TaskType type) {
  switch (type) {
    case TaskType::kPerplexity: return "perplexity";
    case TaskType::kChoice: return "choice";
    case TaskType::kTranslation: return "translation";
  }
  return "?";
}

absl::StatusOr<EvalSpec> ParseEvalSpec(const nlohmann::json& j, const std::string& spec_path) {
  const std::string file = spec_path;
  RETURN_IF_ERROR(CheckKeys(
      j, {"model", "tokenizer", "out", "dtype", "batch_size", "threads", "tasks"}, file));
  const fs::path base = fs::absolute(fs::path(spec_path)).parent_path();
  EvalSpec spec;
  spec.spec_path = spec_path;
  spec.raw = j;
  Fields f(j, file, "");
  RETURN_IF_ERROR(f.String("model", &spec.model, /*required=*/true));
  spec.model = Resolve(spec.model, base);
  RETURN_IF_ERROR(f.String("tokenizer", &spec.tokenizer));
  spec.tokenizer = spec.tokenizer.empty() ? spec.model : Resolve(spec.tokenizer, base);
  RETURN_IF_ERROR(f.String("out", &spec.out));
  if (spec.out.empty()) {
    // Beside the spec: eval.yaml -> eval.results.json.
    fs::path p = fs::absolute(fs::path(spec_path));
    spec.out = (p.parent_path() / (p.stem().string() + ".results.json")).string();
  } else {
    spec.out = Resolve(spec.out, base);
  }
  RETURN_IF_ERROR(f.String("dtype", &spec.dtype));
  RETURN_IF_ERROR(f.OneOf("dtype", spec.dtype, {"float32", "bfloat16"}));
  RETURN_IF_ERROR(f.Integer("batch_size", &spec.batch_size, 1));
  RETURN_IF_ERROR(f.Integer("threads", &spec.threads, 0));
  if (!j.contains("tasks") || !j["tasks"].is_array() || j["tasks"].empty()) {
    return f.Error("tasks", "must be a non-empty list");
  }
  std::set<std::string> names;
  for (size_t i = 0; i < j["tasks"].size(); ++i) {
    ASSIGN_OR_RETURN(TaskSpec task, ParseTask(j["tasks"][i], file, i, base));
    if (!names.insert(task.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          file, ": tasks[", i, "].name: '", task.name, "' is used by an earlier task"));
    }
    spec.tasks.push_back(std::move(task));
  }
  return spec;
}

}  // namespace stemma::engine::eval
