#include "engine/eval/task_cache.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/engine_contract.h"
#include "common/files.h"
#include "common/manifest.h"
#include "common/sha256.h"

namespace stemma::engine::eval {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

std::string Env(std::string_view name) {
  const char* v = std::getenv(std::string(name).c_str());
  return v == nullptr ? "" : v;
}

int64_t MtimeNs(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

// Whether `entry` is one that serving can read: its key, a result whose metrics are numbers,
// and perplexity totals (when it has them) of the right types.
bool WellFormed(const Json& entry, const std::string& key) {
  if (!entry.is_object() || !entry.contains("key") || entry["key"] != key) return false;
  if (!entry.contains("result") || !entry["result"].is_object()) return false;
  const Json& result = entry["result"];
  if (!result.contains("metrics") || !result["metrics"].is_object()) return false;
  for (const auto& [name, value] : result["metrics"].items()) {
    if (!value.is_number()) return false;
  }
  if (!entry.contains("totals")) return true;
  const Json& totals = entry["totals"];
  return totals.is_object() && totals.contains("nll") && totals["nll"].is_number() &&
         totals.contains("tokens") && totals["tokens"].is_number_integer() &&
         totals.contains("bytes") && totals["bytes"].is_number_integer();
}

}  // namespace

std::unique_ptr<TaskCache> TaskCache::FromEnv() {
  const std::string dir = Env("STEMMA_EVAL_CACHE");
  if (dir.empty()) return nullptr;
  // The attempt's spec file, written once before the ranks start (see the header).
  const std::string workdir = Env(engine_contract::kEnvWorkdir);
  const int64_t cutoff = workdir.empty() ? 0 : MtimeNs(workdir + "/spec.json");
  std::string build = Env("STEMMA_ENGINE_BUILD_ID");
  if (build.empty()) {
    // A run outside a worker: this binary's own bytes.
    absl::StatusOr<std::string> self = Sha256File("/proc/self/exe");
    build = self.ok() ? "sha256:" + self->substr(0, 16) : "unknown";
  }
  return std::make_unique<TaskCache>(dir, cutoff, build);
}

TaskCache::TaskCache(std::string dir, int64_t cutoff_ns, std::string engine_build)
    : dir_(std::move(dir)), cutoff_ns_(cutoff_ns), engine_build_(std::move(engine_build)) {}

std::string TaskCache::Key(const Json& identity) const {
  return Sha256Hex(absl::StrCat("stemma-eval-task-v1\n", identity.dump(), "\n", engine_build_));
}

std::optional<Json> TaskCache::Find(const std::string& key) const {
  const std::string path = absl::StrCat(dir_, "/", key, ".json");
  const int64_t mtime = MtimeNs(path);
  if (mtime == 0 || (cutoff_ns_ > 0 && mtime >= cutoff_ns_)) return std::nullopt;
  absl::StatusOr<std::string> text = files::ReadFile(path);
  if (!text.ok()) return std::nullopt;
  Json entry = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  // A damaged or foreign file is a miss (and is overwritten when the task is computed).
  if (entry.is_discarded() || !WellFormed(entry, key)) return std::nullopt;
  return entry;
}

absl::Status TaskCache::Store(const std::string& key, const Json& entry) const {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(dir_, ": ", ec.message()));
  return files::WriteFileAtomic(absl::StrCat(dir_, "/", key, ".json"), entry.dump(2) + "\n");
}

std::string DataIdentity(const std::string& path) {
  if (path.empty()) return "";
  // The artifact's manifest as the registry and memoization name it; a directory without one
  // maps to a stemma.json that does not exist: its content cannot be named cheaply, so it is
  // not cached.
  const std::string file = manifest::ManifestPathOf(path);
  absl::StatusOr<std::string> h = Sha256File(file);
  if (!h.ok()) return "";
  if (file == path) return "sha256:" + *h;  // a file
  return absl::StrCat(fs::path(file).filename().string(), ":", *h);
}

std::string TokenizerIdentity(const std::string& dir) {
  std::string id;
  for (const char* name : {"tokenizer.json", "tokenizer.model", "stemma_tokenizer.json",
                           "tokenizer_config.json", "special_tokens_map.json", "config.json"}) {
    absl::StatusOr<std::string> h = Sha256File(absl::StrCat(dir, "/", name));
    if (h.ok()) absl::StrAppend(&id, name, ":", *h, ";");
  }
  return id;
}

}  // namespace stemma::engine::eval
