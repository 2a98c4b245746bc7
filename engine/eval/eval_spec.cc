#include "engine/eval/eval_spec.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/engine_cli.h"
#include "common/status.h"
#include "engine/io/manifest.h"

namespace stemma::engine::eval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kDefaultMaxSeqLen = 2048;

// config.json and stemma.json are files the model directory carries (not the spec): read as
// JSON. nullopt when missing or unreadable.
std::optional<json> ReadJson(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// An integer that a JSON writer may have printed as a number or (proto JSON's int64) a string.
std::optional<int64_t> IntegerAt(const json& j, std::initializer_list<const char*> path) {
  const json* node = &j;
  for (const char* key : path) {
    if (!node->is_object() || !node->contains(key)) return std::nullopt;
    node = &(*node)[key];
  }
  int64_t v = 0;
  if (node->is_number_integer()) return node->get<int64_t>();
  if (node->is_string() && absl::SimpleAtoi(node->get<std::string>(), &v)) return v;
  return std::nullopt;
}

// The training seq_len of checkpoint `dir` (see ModelFacts::training_seq_len).
struct Found {
  std::optional<int64_t> seq_len;
  std::string run;
  bool conflict = false;
};

Found TrainingSeqLen(const fs::path& dir, int depth) {
  Found found;
  const std::optional<json> manifest = ReadJson(dir / io::kManifestName);
  if (!manifest || !manifest->is_object()) return found;
  const json producer = manifest->value("producer", json::object());
  if (producer.is_object() && producer.value("command", "") == "train") {
    const json params = producer.value("params", json::object());
    for (auto path : {std::initializer_list<const char*>{"spec", "data", "seq_len"},
                      std::initializer_list<const char*>{"seq_len"}}) {
      if (auto v = IntegerAt(params, path); v && *v > 0) {
        found.seq_len = v;
        found.run = dir.string();
        return found;
      }
    }
    return found;
  }
  if (depth <= 0 || !manifest->contains("parents") || !(*manifest)["parents"].is_array())
    return found;
  for (const json& parent : (*manifest)["parents"]) {
    if (!parent.is_object() || !parent.contains("path") || !parent["path"].is_string()) continue;
    Found p = TrainingSeqLen(parent["path"].get<std::string>(), depth - 1);
    if (p.conflict) return p;
    if (!p.seq_len) continue;
    if (found.seq_len && *found.seq_len != *p.seq_len) {
      found.conflict = true;
      return found;
    }
    if (!found.seq_len) found = p;
  }
  return found;
}

}  // namespace

const char* TaskTypeName(TaskType type) {
  switch (type) {
    case TaskType::kPerplexity:
      return "perplexity";
    case TaskType::kChoice:
      return "choice";
    case TaskType::kTranslation:
      return "translation";
  }
  return "?";
}

EvalSpec EvalSpecFromProto(const v1::EvalSpec& proto, const std::string& spec_path) {
  EvalSpec spec;
  spec.spec_path = spec_path;
  spec.model = proto.model();
  spec.tokenizer = proto.tokenizer().empty() ? proto.model() : proto.tokenizer();
  spec.out = proto.out();
  if (spec.out.empty()) {
    // Beside the spec: eval.yaml -> eval.results.json.
    const fs::path p =
        spec_path.empty() ? fs::current_path() / "eval" : fs::absolute(fs::path(spec_path));
    spec.out = (p.parent_path() / (p.stem().string() + ".results.json")).string();
  }
  spec.dtype = proto.dtype();
  spec.batch_size = proto.batch_size();
  spec.threads = EffectiveThreads(proto.threads());
  for (const v1::EvalTask& t : proto.tasks()) {
    TaskSpec task;
    task.type = t.type() == "perplexity" ? TaskType::kPerplexity
                : t.type() == "choice"   ? TaskType::kChoice
                                         : TaskType::kTranslation;
    task.language = t.language();
    task.data = t.data();
    task.limit = t.limit();
    task.k = t.k();
    if (t.has_seed()) task.seed = t.seed();
    task.sampler = t.sampler();
    task.fewshot_data = t.fewshot_data();
    if (!t.split().empty()) task.split = t.split();
    task.heldout_fraction = t.heldout_fraction();
    task.split_seed = t.split_seed();
    if (t.has_heldout_split()) task.heldout_split = t.heldout_split();
    if (t.has_seq_len()) {
      task.seq_len = t.seq_len();
      task.seq_len_source = "spec";
    }
    task.format = t.format();
    if (t.has_add_bos()) task.add_bos = t.add_bos();
    task.max_length = t.max_length();
    task.source_language = t.source_language();
    if (!t.source_field().empty()) task.source_field = t.source_field();
    if (!t.target_field().empty()) task.target_field = t.target_field();
    task.source_name = t.source_name().empty() ? t.source_language() : t.source_name();
    task.target_name = t.target_name().empty() ? t.language() : t.target_name();
    if (t.has_max_new_tokens()) task.max_new_tokens = t.max_new_tokens();
    switch (task.type) {
      case TaskType::kPerplexity:
        task.name = task.language;
        break;
      case TaskType::kChoice:
        if (task.sampler.empty()) task.sampler = task.format == "belebele" ? "first_n" : "seeded";
        task.name = absl::StrCat(task.format, "_", task.language);
        break;
      case TaskType::kTranslation:
        if (task.sampler.empty()) task.sampler = "seeded";
        task.name = absl::StrCat(task.source_language, "-", task.language);
        break;
    }
    if (!t.name().empty()) task.name = t.name();
    spec.tasks.push_back(std::move(task));
  }
  return spec;
}

absl::StatusOr<ModelFacts> ReadModelFacts(const std::string& model_dir) {
  const fs::path config_path = fs::path(model_dir) / "config.json";
  std::optional<json> config = ReadJson(config_path);
  if (!config) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model: ", model_dir, " has no readable config.json (is it a checkpoint directory?)"));
  }
  ModelFacts facts;
  auto max = IntegerAt(*config, {"max_position_embeddings"});
  if (!max) max = IntegerAt(*config, {"text_config", "max_position_embeddings"});
  if (!max || *max < 2) {
    return absl::FailedPreconditionError(
        absl::StrCat(config_path.string(), ": no max_position_embeddings >= 2"));
  }
  facts.max_positions = *max;
  const Found found = TrainingSeqLen(model_dir, /*depth=*/4);
  if (found.seq_len && !found.conflict) {
    facts.training_seq_len = found.seq_len;
    facts.training_run = found.run;
  }
  return facts;
}

absl::Status ResolveSequenceLengths(const ModelFacts& facts, EvalSpec* spec) {
  for (TaskSpec& task : spec->tasks) {
    if (task.type != TaskType::kPerplexity) continue;
    if (task.seq_len == 0) {
      if (facts.training_seq_len && *facts.training_seq_len >= 2 &&
          *facts.training_seq_len <= facts.max_positions) {
        task.seq_len = *facts.training_seq_len;
        task.seq_len_source = absl::StrCat("training run (", facts.training_run, ")");
      } else {
        task.seq_len = std::min(facts.max_positions, kDefaultMaxSeqLen);
        task.seq_len_source = "model maximum (min(max_position_embeddings, 2048))";
      }
    }
    if (task.seq_len > facts.max_positions) {
      return absl::InvalidArgumentError(
          absl::StrCat("task ", task.name, ": seq_len ", task.seq_len,
                       " exceeds the model's max_position_embeddings ", facts.max_positions));
    }
  }
  return absl::OkStatus();
}

}  // namespace stemma::engine::eval
