// The results of `stemma-engine eval` (docs/eval.md § Events and results file): per task its
// metric events and its entry in the results file, then the file, written atomically, and
// the output and done events. Torch-free, so the LibTorch engine and the front that answers
// a fully cached eval without it (serve_cached.h) write the same bytes. Thread-compatible.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "engine/eval/cached_tasks.h"
#include "engine/eval/eval_plan.h"
#include "engine/eval/perplexity_totals.h"
#include "stemma/v1/specs/eval.pb.h"

namespace stemma::engine::eval {

// Emits the metric event `<metric>/<task name>` (labels task, type, language; the corpus
// `suite`'s name, version and content hash when it is not null) and sets
// result["metrics"][metric].
void EmitTaskMetric(const v1::EvalTask& task, const Json& suite, const std::string& metric,
                    double value, Json* result);

class EvalResults {
 public:
  // `plan` must outlive this. `device` is the one the model runs on (the spec's when no model
  // loads), `ranks` the job's world size (1 when none joined).
  EvalResults(const EvalPlan& plan, const Json& checkpoint, std::string_view tokenizer_kind,
              const std::string& device, int ranks);

  // Task i's entry before its numbers: name, type, language, data, metrics {}, suite.
  Json TaskResult(size_t i) const;
  // Task i as its cache entry has it (CachedTasks::hits): every field of the stored result,
  // its metrics emitted as if computed now, and `cache` naming where it came from.
  void AddServed(size_t i, const Json& entry);
  // A task computed now (rank 0), with its perplexity totals if it is a perplexity task.
  void AddComputed(Json result, const std::optional<PerplexityTotals>& totals);

  // After every task, in task order: ppl/all and bpb/all over more than one perplexity task
  // (micro-averaged over their tokens and bytes), `task_cache` when `cached` has a cache, the
  // file written atomically to the spec's `out`, then the output and done events.
  absl::Status Finish(const CachedTasks& cached);

 private:
  void Add(Json result, const std::optional<PerplexityTotals>& totals);

  const EvalPlan& plan_;
  Json checkpoint_sha256_;
  Json results_;
  PerplexityTotals all_;
  int perplexity_tasks_ = 0;
};

// An eval whose every task hit (cached.AllHit()): served without a model or ranks, as
// EvalResults writes it (device: the spec's; ranks: 1). The start event is the caller's.
absl::Status WriteServedEval(const EvalPlan& plan, const Json& checkpoint,
                             std::string_view tokenizer_kind, const CachedTasks& cached);

}  // namespace stemma::engine::eval
