#include "engine/eval/eval_results.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/engine_contract.h"
#include "common/eval_task.h"
#include "common/status.h"
#include "engine/events.h"
#include "engine/io/durable.h"

namespace stemma::engine::eval {
namespace {

namespace fs = std::filesystem;

void Emit(const v1::EngineEvent& event) { EventWriter().Emit(event); }

// Invalid UTF-8 (which no input should carry) is replaced rather than thrown on.
std::string Dump(const Json& j, int indent) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

// Writes `text` to `path` atomically (engine/io/durable.h: temporary file, fsync, rename,
// directory fsync), so readers see the old file or the whole new one.
absl::Status WriteAtomically(const std::string& path, const std::string& text) {
  const fs::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  return io::WriteFileAtomic(path, text);
}

}  // namespace

void EmitTaskMetric(const v1::EvalTask& task, const Json& suite, const std::string& metric,
                    double value, Json* result) {
  const std::string name = absl::StrCat(metric, "/", task.name());
  v1::EngineEvent event = MetricEvent(
      name, value, std::nullopt,
      {{"task", task.name()}, {"type", EvalTaskType(task)}, {"language", task.language()}});
  if (!suite.is_null()) {
    AddDetails({{"suite", suite["name"]},
                {"suite_version", suite["version"]},
                {"corpus_content_hash", suite["corpus_content_hash"]}},
               &event);
  }
  Emit(event);
  (*result)["metrics"][metric] = value;
}

EvalResults::EvalResults(const EvalPlan& plan, const Json& checkpoint,
                         std::string_view tokenizer_kind, const std::string& device, int ranks)
    : plan_(plan), checkpoint_sha256_(checkpoint["sha256"]) {
  const v1::EvalSpec& spec = plan.spec;
  const std::string& path = plan.spec_path;
  results_ = {{"format", "stemma-eval-v1"},
              {"checkpoint", checkpoint},
              {"tokenizer", {{"path", spec.tokenizer()}, {"kind", std::string(tokenizer_kind)}}},
              {"spec",
               {{"path", path.empty() ? "" : fs::absolute(path).string()},
                {"content", SpecContent(plan.given)}}},
              {"dtype", spec.dtype()},
              {"device", device},
              {"ranks", ranks},
              {"tasks", Json::array()},
              {"metrics", Json::object()}};
}

Json EvalResults::TaskResult(size_t i) const {
  const v1::EvalTask& t = plan_.spec.tasks(static_cast<int>(i));
  Json result = {{"name", t.name()},
                 {"type", EvalTaskType(t)},
                 {"language", t.language()},
                 {"data", t.data()},
                 {"metrics", Json::object()}};
  if (!plan_.suites[i].is_null()) result["suite"] = plan_.suites[i];
  return result;
}

void EvalResults::AddServed(size_t i, const Json& entry) {
  const v1::EvalTask& t = plan_.spec.tasks(static_cast<int>(i));
  Json result = TaskResult(i);
  const Json& stored = entry["result"];
  for (const auto& [key, value] : stored.items()) {
    if (key != "metrics") result[key] = value;
  }
  for (const auto& [metric, value] : stored["metrics"].items()) {
    EmitTaskMetric(t, plan_.suites[i], metric, value.get<double>(), &result);
  }
  result["cache"] = {{"served_from", entry.contains("computed_by") ? entry["computed_by"] : Json()},
                     {"key", entry["key"]}};
  std::optional<PerplexityTotals> totals;
  if (entry.contains("totals")) {
    totals.emplace();
    totals->nll = entry["totals"]["nll"].get<double>();
    totals->tokens = entry["totals"]["tokens"].get<int64_t>();
    totals->bytes = entry["totals"]["bytes"].get<int64_t>();
  }
  Add(std::move(result), totals);
}

void EvalResults::AddComputed(Json result, const std::optional<PerplexityTotals>& totals) {
  Add(std::move(result), totals);
}

void EvalResults::Add(Json result, const std::optional<PerplexityTotals>& totals) {
  const std::string name = result["name"].get<std::string>();
  for (const auto& [metric, value] : result["metrics"].items()) {
    results_["metrics"][absl::StrCat(metric, "/", name)] = value;
  }
  if (totals.has_value()) {
    all_.nll += totals->nll;
    all_.tokens += totals->tokens;
    all_.bytes += totals->bytes;
    ++perplexity_tasks_;
  }
  results_["tasks"].push_back(std::move(result));
}

absl::Status EvalResults::Finish(const CachedTasks& cached) {
  const v1::EvalSpec& spec = plan_.spec;
  if (perplexity_tasks_ > 1) {
    // Micro-average over all languages' tokens (bytes).
    for (const auto& [metric, value] :
         {std::pair{"ppl/all", all_.Perplexity()}, std::pair{"bpb/all", all_.BitsPerByte()}}) {
      Emit(MetricEvent(metric, value));
      results_["metrics"][metric] = value;
    }
  }
  if (cached.cache != nullptr) results_["task_cache"] = cached.Summary();
  RETURN_IF_ERROR(WriteAtomically(spec.out(), Dump(results_, 2) + "\n"));
  ASSIGN_OR_RETURN(v1::EngineEvent output,
                   OutputEvent("results", spec.out(), "eval", {spec.model()}));
  Emit(output);
  Emit(CommandEvent(engine_contract::kEventDone, "eval",
                    {{"results", spec.out()},
                     {"checkpoint_sha256", checkpoint_sha256_},
                     {"metrics", results_["metrics"]}}));
  return absl::OkStatus();
}

absl::Status WriteServedEval(const EvalPlan& plan, const Json& checkpoint,
                             std::string_view tokenizer_kind, const CachedTasks& cached) {
  EvalResults results(plan, checkpoint, tokenizer_kind, plan.spec.device(), /*ranks=*/1);
  for (size_t i = 0; i < cached.hits.size(); ++i) results.AddServed(i, *cached.hits[i]);
  return results.Finish(cached);
}

}  // namespace stemma::engine::eval
