// Early stopping of a train stage's trials (`early_stop:` in an experiment file): the rule,
// and the compact form it travels in on each trial's job (the `stemma.early_stop` label).
// Pure: no store, no clock. The coordinator's part that applies it as metric points arrive,
// and keeps its decisions durable, is coordinator/early_stopper.h.
//
// The rule (asynchronous successive halving, ASHA as Ray Tune's ASHAScheduler and
// Determined's adaptive ASHA apply it, with stopping only, no promotion queue):
//   The trials of one stage of one revision of an experiment form one bracket. When a trial
//   reports the metric at a step at or past rung R's step for the first time, its value is
//   recorded at R and decided at once, against the values recorded at R so far (its own
//   included; n of them):
//     - while n < max(ceil(1/keep), min_trials) the trial continues (too few to judge);
//     - otherwise it continues when its rank (1 + the number of recorded values strictly
//       better than its own) is at most ceil(keep · n), and is stopped otherwise.
//   Decisions are final: a trial continued at R is never stopped at R later, whatever
//   arrives after it; it may be stopped at a later rung. One point that passes several
//   rungs at once is recorded at each of them in order, up to the first stop.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stemma::experiments {

struct EarlyStopConfig {
  std::string metric;          // loss, heldout_loss or heldout_loss/<dataset>
  bool maximize = false;       // mode: max
  std::vector<int64_t> rungs;  // steps, ascending
  double keep = 0.5;           // fraction kept at each rung, in (0, 1)
  int min_trials = 0;          // 0: ceil(1/keep)
};

// The label that carries an early-stop config on each trial's job.
inline constexpr const char* kEarlyStopLabel = "stemma.early_stop";

// "heldout_loss|min|100,200|0.5|0" (at most 253 characters: the label limit).
std::string FormatEarlyStop(const EarlyStopConfig& config);
absl::StatusOr<EarlyStopConfig> ParseEarlyStop(const std::string& text);

struct RungDecision {
  bool stop = false;
  int trials = 0;      // n: values recorded at the rung, this one included
  int rank = 0;        // 1 = best
  int keep_count = 0;  // ceil(keep · n); 0 while too few trials reached the rung
};

// Decides a trial whose `value` has just been recorded at a rung; `recorded` holds every
// value recorded at that rung, this trial's included.
RungDecision DecideAtRung(const EarlyStopConfig& config, const std::vector<double>& recorded,
                          double value);

// "stopped early at rung 1 (step 100): heldout_loss=2.31, not in the top 0.5 of 4"
std::string StopReason(const EarlyStopConfig& config, int rung_index, int64_t rung_step,
                       double value, const RungDecision& decision);

}  // namespace stemma::experiments
