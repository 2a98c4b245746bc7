#include "engine/eval/cached_tasks.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "common/engine_contract.h"

namespace stemma::engine::eval {

bool CachedTasks::AllHit() const {
  if (hits.empty()) return false;
  for (const auto& h : hits) {
    if (!h.has_value()) return false;
  }
  return true;
}

std::optional<std::string> CachedTasks::StoredTokenizerKind() const {
  std::optional<std::string> kind;
  for (const auto& h : hits) {
    if (!h.has_value()) continue;
    if (!h->contains("tokenizer_kind") || !(*h)["tokenizer_kind"].is_string()) return std::nullopt;
    const std::string k = (*h)["tokenizer_kind"].get<std::string>();
    if (k.empty() || (kind.has_value() && *kind != k)) return std::nullopt;
    kind = k;
  }
  return kind;
}

Json CachedTasks::Summary() const {
  int hit = 0;
  for (const auto& h : hits) hit += h.has_value() ? 1 : 0;
  return {
      {"dir", cache->dir()}, {"served", hit}, {"computed", static_cast<int>(hits.size()) - hit}};
}

void CachedTasks::Store(size_t i, const Json& result, const std::optional<PerplexityTotals>& totals,
                        const std::string& out) const {
  if (cache == nullptr || keys[i].empty()) return;
  const char* job = std::getenv(std::string(engine_contract::kEnvJobId).c_str());
  Json entry = {{"key", keys[i]},
                {"identity", identities[i]},
                {"result", result},
                {"computed_by",
                 {{"job", job != nullptr ? job : ""},
                  {"results", out},
                  {"time_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count()}}}};
  if (!tokenizer_kind.empty()) entry["tokenizer_kind"] = tokenizer_kind;
  if (totals.has_value()) {
    entry["totals"] = {{"nll", totals->nll}, {"tokens", totals->tokens}, {"bytes", totals->bytes}};
  }
  if (absl::Status s = cache->Store(keys[i], entry); !s.ok()) {
    std::fprintf(stderr, "stemma-engine: eval: task cache not written: %s\n",
                 std::string(s.message()).c_str());
  }
}

CachedTasks LookUpCachedTasks(std::unique_ptr<TaskCache> cache, const v1::EvalSpec& spec,
                              const Json& checkpoint) {
  CachedTasks c;
  c.cache = std::move(cache);
  const size_t n = static_cast<size_t>(spec.tasks_size());
  c.keys.assign(n, "");
  c.identities.assign(n, Json());
  c.hits.assign(n, std::nullopt);
  if (c.cache == nullptr || !checkpoint.contains("sha256")) return c;
  const Json content = SpecContent(spec);  // defaults and resolved sequence lengths filled
  const std::string tokenizer = TokenizerIdentity(spec.tokenizer());
  for (size_t i = 0; i < n; ++i) {
    const v1::EvalTask& t = spec.tasks(static_cast<int>(i));
    const std::string fewshot = t.has_choice()        ? t.choice().fewshot_data()
                                : t.has_translation() ? t.translation().fewshot_data()
                                                      : "";
    const std::string data = DataIdentity(t.data());
    const std::string fewshot_id = DataIdentity(fewshot);
    if (data.empty() || (!fewshot.empty() && fewshot_id.empty())) continue;
    c.identities[i] = {{"checkpoint", checkpoint["sha256"]},
                       {"tokenizer", tokenizer},
                       {"task", content["tasks"][i]},
                       {"data", data},
                       {"fewshot", fewshot_id},
                       {"dtype", spec.dtype()},
                       {"device", spec.device()},
                       {"batch_size", spec.batch_size()}};
    c.keys[i] = c.cache->Key(c.identities[i]);
    c.hits[i] = c.cache->Find(c.keys[i]);
  }
  return c;
}

}  // namespace stemma::engine::eval
