// The per-task cache (task_cache.h) as one eval job sees it: per task its key and the entry
// found, decided before any model loads, and the store of what the job computes. Torch-free.
// Thread-compatible.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/eval/eval_plan.h"
#include "engine/eval/perplexity_totals.h"
#include "engine/eval/task_cache.h"
#include "stemma/v1/specs/eval.pb.h"

namespace stemma::engine::eval {

struct CachedTasks {
  std::unique_ptr<TaskCache> cache;       // null: nothing is cached
  std::vector<std::string> keys;          // per task; "" when the task is not cached
  std::vector<Json> identities;           // per task: what went into its key
  std::vector<std::optional<Json>> hits;  // per task: the stored entry found
  // The eval tokenizer's kind (Tokenizer::kind), stored in each entry written so that an
  // all-hit eval can write the results' tokenizer.kind without loading the tokenizer: its
  // files are in every key, so an entry's kind is the kind of the tokenizer that would load.
  // Empty: not stored.
  std::string tokenizer_kind;

  // Whether there is at least one task and every task hit.
  bool AllHit() const;
  // The tokenizer kind the hits recorded, when every hit has one and they agree; nullopt
  // otherwise (entries written before the kind was stored: the tokenizer must be loaded).
  std::optional<std::string> StoredTokenizerKind() const;
  // {dir, served, computed}: the results file's task_cache.
  Json Summary() const;
  // Stores task i's result as computed now (rank 0), with the perplexity totals that
  // bpb/all sums and where it was computed (STEMMA_JOB_ID, `out`, the time). A failure to
  // store is said on stderr, not fatal.
  void Store(size_t i, const Json& result, const std::optional<PerplexityTotals>& totals,
             const std::string& out) const;
};

// Looks every task of `spec` (run defaults and sequence lengths resolved: EvalPlan::spec) up
// in `cache` (null: nothing cached) for the checkpoint `checkpoint` (CheckpointIdentity).
CachedTasks LookUpCachedTasks(std::unique_ptr<TaskCache> cache, const v1::EvalSpec& spec,
                              const Json& checkpoint);

}  // namespace stemma::engine::eval
