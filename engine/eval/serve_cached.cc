#include "engine/eval/serve_cached.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/engine_cli.h"
#include "common/engine_contract.h"
#include "common/files.h"
#include "common/manifest.h"
#include "engine/eval/cached_tasks.h"
#include "engine/eval/eval_plan.h"
#include "engine/eval/eval_results.h"
#include "engine/eval/task_cache.h"
#include "engine/events.h"
#include "engine/tokenizer/tokenizer.h"

namespace stemma::engine::eval {
namespace {

// The device names ResolveDevice (device.h) accepts by their spelling alone: cpu, cuda,
// cuda:N (N without leading zeros). Anything else goes to the LibTorch engine, which says
// what is wrong with it.
bool DeviceNeedsNoCheck(const std::string& name) {
  if (name.empty() || name == "cpu" || name == "cuda") return true;
  if (name.rfind("cuda:", 0) != 0) return false;
  const std::string index = name.substr(5);
  if (index.empty() || index.size() > 4 || (index.size() > 1 && index[0] == '0')) return false;
  for (char c : index) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// What a served eval needs, all read before it writes anything.
struct AllCached {
  EvalPlan plan;
  Json checkpoint;
  std::string tokenizer_kind;
  CachedTasks cached;
};

// The eval planned and looked up as the LibTorch engine does (eval_command.cc, up to its
// cache lookup, without the model or the tasks' data); nullopt when anything fails or a task
// misses. What a miss costs here is paid again by the LibTorch engine, so the expensive parts
// come last (the tokenizer is loaded only for an answer whose entries do not record its kind)
// or not at all (a checkpoint without stemma.json, whose identity is a hash of all its
// weights, is left to that engine).
std::optional<AllCached> LookUp(int argc, char** argv, std::unique_ptr<TaskCache> cache) {
  absl::StatusOr<EngineInvocation> inv = ParseEngineCommandLine("eval", argc, argv, {});
  if (!inv.ok() || inv->help) return std::nullopt;
  const auto& given = static_cast<const v1::EvalSpec&>(*inv->spec);
  if (!DeviceNeedsNoCheck(given.device())) return std::nullopt;
  absl::StatusOr<EvalPlan> plan = PlanEval(given, inv->spec_file);
  if (!plan.ok()) return std::nullopt;
  const std::string model = plan->spec.model();
  if (!files::PathExists(absl::StrCat(model, "/", manifest::kManifestName))) return std::nullopt;
  absl::StatusOr<Json> checkpoint = CheckpointIdentity(model);
  if (!checkpoint.ok()) return std::nullopt;
  CachedTasks cached = LookUpCachedTasks(std::move(cache), plan->spec, *checkpoint);
  if (!cached.AllHit()) return std::nullopt;
  // The results name the tokenizer's kind: recorded in the entries (whose keys hold the
  // tokenizer's files), else — entries written before the kind was — from loading it.
  std::optional<std::string> kind = cached.StoredTokenizerKind();
  if (!kind.has_value()) {
    auto tokenizer = tokenizer::Tokenizer::Load(plan->spec.tokenizer());
    if (!tokenizer.ok()) return std::nullopt;
    kind = std::string((*tokenizer)->kind());
  }
  return AllCached{*std::move(plan), *std::move(checkpoint), *std::move(kind), std::move(cached)};
}

}  // namespace

std::optional<int> ServeCachedEval(int argc, char** argv) {
  std::unique_ptr<TaskCache> cache = TaskCache::FromEnv();
  if (cache == nullptr) return std::nullopt;
  ::setenv("STEMMA_ENGINE_BUILD_ID", cache->engine_build().c_str(), /*overwrite=*/0);
  std::optional<AllCached> all = LookUp(argc, argv, std::move(cache));
  if (!all.has_value()) return std::nullopt;
  EventWriter().Emit(StartEvent(all->plan));
  const absl::Status written =
      WriteServedEval(all->plan, all->checkpoint, all->tokenizer_kind, all->cached);
  return written.ok() ? engine_contract::kExitOk : ReportEngineFailure(written);
}

}  // namespace stemma::engine::eval
