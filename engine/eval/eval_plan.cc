#include "engine/eval/eval_plan.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/engine_contract.h"
#include "common/engine_spec.h"
#include "common/eval_task.h"
#include "common/status.h"
#include "engine/eval/resolve.h"
#include "engine/events.h"
#include "engine/io/fs.h"
#include "engine/io/manifest.h"
#include "engine/io/sha256.h"

namespace stemma::engine::eval {
namespace {

namespace fs = std::filesystem;

// A choice or translation file inside a prepared corpus (`stemma-engine prepare`,
// docs/corpus.md): <corpus>/suites/<name>.jsonl listed in suites/suites.json, or
// <corpus>/pairs/<base>-<lang>.jsonl, with <corpus>/manifest.json of format stemma.corpus/*.
// Returns {name, version, file, sha256 (of the file now), corpus, corpus_content_hash}, or
// null for any other file (nothing is refused here: a file outside a corpus is evaluated as
// before).
Json SuiteOf(const std::string& data) {
  const fs::path file = fs::absolute(data).lexically_normal();
  const fs::path dir = file.parent_path();
  const fs::path corpus = dir.parent_path();
  const std::string kind = dir.filename().string();
  if (kind != "suites" && kind != "pairs") return nullptr;
  auto read_json = [](const fs::path& path) -> Json {
    auto text = io::ReadFile(path.string());
    if (!text.ok()) return nullptr;
    Json j = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
    return j.is_discarded() || !j.is_object() ? Json(nullptr) : j;
  };
  const Json manifest = read_json(corpus / "manifest.json");
  if (manifest.is_null() || !manifest.contains("format") || !manifest["format"].is_string() ||
      manifest["format"].get<std::string>().rfind("stemma.corpus/", 0) != 0) {
    return nullptr;
  }
  const std::string rel = absl::StrCat(kind, "/", file.filename().string());
  Json suite = nullptr;
  if (kind == "suites") {
    const Json index = read_json(dir / "suites.json");
    if (index.is_null() || !index.contains("suites") || !index["suites"].is_array()) return nullptr;
    for (const auto& s : index["suites"]) {
      if (s.is_object() && s.value("file", "") == rel) {
        suite = {{"name", s.value("name", "")}, {"version", s.value("version", "")}};
      }
    }
  } else if (manifest.contains("suites") && manifest["suites"].is_object()) {
    suite = {{"name", absl::StrCat("pairs_", file.stem().string())},
             {"version", manifest["suites"].value("pairs", "")}};
  }
  if (suite.is_null()) return nullptr;
  suite["file"] = rel;
  auto sha = io::Sha256File(file.string());
  if (sha.ok()) suite["sha256"] = *sha;
  suite["corpus"] = corpus.string();
  suite["corpus_content_hash"] = manifest.value("content_hash", "");
  return suite;
}

// The start event's task list, and per task its corpus suite (SuiteOf) or null.
Json TaskPlan(const v1::EvalSpec& spec, const std::vector<std::string>& seq_len_sources,
              std::vector<Json>* suites) {
  Json task_plan = Json::array();
  for (int i = 0; i < spec.tasks_size(); ++i) {
    const v1::EvalTask& t = spec.tasks(i);
    Json entry = {{"name", t.name()}, {"type", EvalTaskType(t)}, {"language", t.language()}};
    if (t.has_perplexity()) {
      entry["seq_len"] = t.perplexity().seq_len();
      entry["seq_len_source"] = seq_len_sources[i];
      suites->push_back(nullptr);
    } else {
      suites->push_back(SuiteOf(t.data()));
      if (!suites->back().is_null()) {
        entry["suite"] = suites->back()["name"];
        entry["suite_version"] = suites->back()["version"];
        entry["corpus_content_hash"] = suites->back()["corpus_content_hash"];
      }
    }
    task_plan.push_back(std::move(entry));
  }
  return task_plan;
}

}  // namespace

absl::StatusOr<EvalPlan> PlanEval(const v1::EvalSpec& given, const std::string& spec_path) {
  EvalPlan plan;
  plan.given = given;
  plan.spec = given;
  plan.spec_path = spec_path;
  FillRunDefaults(spec_path, &plan.spec);
  ASSIGN_OR_RETURN(ModelFacts facts, ReadModelFacts(plan.spec.model()));
  RETURN_IF_ERROR(ResolveSequenceLengths(facts, &plan.spec, &plan.seq_len_sources));
  plan.task_plan = TaskPlan(plan.spec, plan.seq_len_sources, &plan.suites);
  return plan;
}

v1::EngineEvent StartEvent(const EvalPlan& plan) {
  const v1::EvalSpec& spec = plan.spec;
  return CommandEvent(engine_contract::kEventStart, "eval",
                      {{"spec", plan.spec_path},
                       {"model", spec.model()},
                       {"dtype", spec.dtype()},
                       {"device", spec.device()},
                       {"threads", spec.threads()},
                       {"threads_source", plan.given.threads() > 0 ? "spec"
                                          : spec.threads() > 0     ? "job cpus (STEMMA_CPUS)"
                                                                   : "torch default"},
                       {"tasks", plan.task_plan}});
}

absl::StatusOr<Json> CheckpointIdentity(const std::string& dir) {
  const fs::path manifest = fs::path(dir) / io::kManifestName;
  Json id = {{"path", dir}};
  if (fs::exists(manifest)) {
    ASSIGN_OR_RETURN(std::string hash, io::Sha256File(manifest.string()));
    id["sha256"] = hash;
    id["hash_of"] = io::kManifestName;
    return id;
  }
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == "config.json" || entry.path().extension() == ".safetensors") files.push_back(name);
  }
  if (ec) return absl::NotFoundError(absl::StrCat(dir, ": ", ec.message()));
  std::sort(files.begin(), files.end());
  std::string listing;
  for (const auto& name : files) {
    ASSIGN_OR_RETURN(std::string hash, io::Sha256File((fs::path(dir) / name).string()));
    absl::StrAppend(&listing, hash, "  ", name, "\n");
  }
  id["sha256"] = io::Sha256Hex(listing);
  id["hash_of"] = "weights";
  return id;
}

Json SpecContent(const v1::EvalSpec& spec) {
  Json content = Json::parse(SpecToJson(spec));
  if (!content.contains("tasks")) return content;
  for (int i = 0; i < spec.tasks_size(); ++i) {
    Json& task = content["tasks"][i];
    const std::string type = EvalTaskType(spec.tasks(i));
    if (type.empty() || !task.contains(type)) continue;
    Json flat = {{"type", type}};
    for (auto& [key, value] : task.items()) {
      if (key != type) flat[key] = value;
    }
    for (auto& [key, value] : task[type].items()) flat[key] = value;
    task = std::move(flat);
  }
  return content;
}

}  // namespace stemma::engine::eval
