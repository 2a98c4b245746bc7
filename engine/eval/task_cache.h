// Eval results cached per task (docs/eval.md § Per-task cache). An eval job whose task list
// changed (a language dropped or added) reruns only the tasks it has not computed before for
// the same model: each task's result is stored under a key over everything that decides it
// — the checkpoint's manifest hash, the tokenizer's files, the task's spec with every
// default filled (its resolved sequence length included), the content of its data and
// few-shot files, dtype, device, batch size and the engine build — and read back verbatim,
// so a cached bits-per-byte is the computed one to the last digit.
//
// Where: the directory in STEMMA_EVAL_CACHE (the worker sets it to the owner's
// `<storage root>/<owner>/.stemma-cache/eval`, or `<storage root>/.stemma-cache/eval`
// without authentication, and leaves it unset for `cache: false` and `--force`); unset,
// nothing is cached. An entry is one JSON file `<key>.json`, written atomically.
//
// Ranks: every rank of a job must decide the same hits. An entry counts only when it was
// written before the attempt's spec file (STEMMA_WORKDIR/spec.json, written once by the
// worker before any rank starts), so an entry another job writes while the ranks look is
// ignored by all of them. Thread-compatible.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace stemma::engine::eval {

class TaskCache {
 public:
  // From the environment; null when STEMMA_EVAL_CACHE is unset or empty.
  static std::unique_ptr<TaskCache> FromEnv();
  // A cache in `dir`; entries newer than `cutoff_ns` (a file's mtime, 0: none) are ignored.
  TaskCache(std::string dir, int64_t cutoff_ns, std::string engine_build);

  // The key of a task: sha256 over `identity` (what decides the result) and the engine build.
  std::string Key(const nlohmann::ordered_json& identity) const;
  // The stored entry of `key` ({key, identity, result, totals, computed_by}), or nullopt (also
  // for a damaged or foreign file: another key, metrics that are not numbers, bad totals).
  std::optional<nlohmann::ordered_json> Find(const std::string& key) const;
  absl::Status Store(const std::string& key, const nlohmann::ordered_json& entry) const;

  const std::string& dir() const { return dir_; }
  // The engine build in every key: STEMMA_ENGINE_BUILD_ID, else (a run outside a worker) a
  // hash of this binary.
  const std::string& engine_build() const { return engine_build_; }

 private:
  std::string dir_;
  int64_t cutoff_ns_ = 0;
  std::string engine_build_;
};

// What a data path stands for in a key: a directory by its manifest (manifest::ManifestPathOf:
// stemma.json, else a prepared corpus's manifest.json, else a token dataset's index.json), a
// file by its sha256; "" when it has neither (an empty path, a directory without a manifest,
// an unreadable file): such a task is not cached.
std::string DataIdentity(const std::string& path);

// The tokenizer directory's identity: the sha256 of each tokenizer file it holds.
std::string TokenizerIdentity(const std::string& dir);

}  // namespace stemma::engine::eval
