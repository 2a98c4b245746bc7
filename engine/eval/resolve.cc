#include "engine/eval/resolve.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/engine_cli.h"
#include "common/eval_task.h"
#include "common/files.h"
#include "common/status.h"
#include "engine/io/manifest.h"

namespace stemma::engine::eval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kDefaultMaxSeqLen = 2048;

// config.json is a file the model directory carries (not the spec): read as JSON. nullopt
// when missing or unreadable.
std::optional<json> ReadJson(const fs::path& path) {
  absl::StatusOr<std::string> text = files::ReadFile(path.string());
  if (!text.ok()) return std::nullopt;
  json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// The checkpoint's stemma.json through the one manifest reader; nullopt when it has none or
// it does not parse (a checkpoint from elsewhere: nothing to learn from it).
std::optional<io::Manifest> ReadManifest(const fs::path& dir) {
  const std::string path = (dir / io::kManifestName).string();
  absl::StatusOr<std::string> text = files::ReadFile(path);
  if (!text.ok()) return std::nullopt;
  absl::StatusOr<io::Manifest> manifest = io::ParseManifest(*text, path);
  if (!manifest.ok()) return std::nullopt;
  return *std::move(manifest);
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
  const std::optional<io::Manifest> manifest = ReadManifest(dir);
  if (!manifest) return found;
  if (manifest->producer.command == "train") {
    const json& params = manifest->producer.params;
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
  if (depth <= 0) return found;
  for (const io::ManifestParent& parent : manifest->parents) {
    Found p = TrainingSeqLen(parent.path, depth - 1);
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

void FillRunDefaults(const std::string& spec_path, v1::EvalSpec* spec) {
  if (spec->tokenizer().empty()) spec->set_tokenizer(spec->model());
  if (spec->out().empty()) {
    // Beside the spec: eval.yaml -> eval.results.json.
    const fs::path p =
        spec_path.empty() ? fs::current_path() / "eval" : fs::absolute(fs::path(spec_path));
    spec->set_out((p.parent_path() / (p.stem().string() + ".results.json")).string());
  }
  spec->set_threads(EffectiveThreads(spec->threads()));
  for (v1::EvalTask& task : *spec->mutable_tasks()) FillEvalTaskDefaults(&task);
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

absl::Status ResolveSequenceLengths(const ModelFacts& facts, v1::EvalSpec* spec,
                                    std::vector<std::string>* sources) {
  sources->assign(spec->tasks_size(), "");
  for (int i = 0; i < spec->tasks_size(); ++i) {
    v1::EvalTask& task = *spec->mutable_tasks(i);
    if (!task.has_perplexity()) continue;
    v1::PerplexityTask& p = *task.mutable_perplexity();
    std::string& source = (*sources)[i];
    if (p.has_seq_len()) {
      source = "spec";
    } else if (facts.training_seq_len && *facts.training_seq_len >= 2 &&
               *facts.training_seq_len <= facts.max_positions) {
      p.set_seq_len(*facts.training_seq_len);
      source = absl::StrCat("training run (", facts.training_run, ")");
    } else {
      p.set_seq_len(std::min(facts.max_positions, kDefaultMaxSeqLen));
      source = "model maximum (min(max_position_embeddings, 2048))";
    }
    if (p.seq_len() > facts.max_positions) {
      return absl::InvalidArgumentError(
          absl::StrCat("task ", task.name(), ": seq_len ", p.seq_len(),
                       " exceeds the model's max_position_embeddings ", facts.max_positions));
    }
  }
  return absl::OkStatus();
}

}  // namespace stemma::engine::eval
