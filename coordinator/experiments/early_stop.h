// Early stopping of a train stage's trials (`early_stop:` in an experiment file): the rule,
// and how a stage's `early_stop:` becomes each trial's typed JobSpec.early_stop_rule (kept
// with the job, so it is as durable as the job). Pure: no store, no clock, no files. The
// coordinator's part that applies it as metric points arrive, and keeps its decisions
// durable, is coordinator/early_stopper.h.
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
//
// `method: pareto` (MO-ASHA, Schmucker et al. 2021: successive halving where the rank is a
// Pareto rank) ranks by two or more `objectives` instead of one metric. A trial is recorded
// at R once it has reported every objective at a step at or past R (each objective's first
// such value), and decided against the vectors recorded at R so far:
//   - non-dominated sorting (NSGA-II's) splits them into fronts 0, 1, ...: front 0 is every
//     vector no other dominates (at least as good in every objective, better in one), front 1
//     what only front 0 dominates, and so on;
//   - within a front, the crowding distance (NSGA-II's: per objective, the gap between the two
//     neighbours in that objective's order over the front's range; a front's extremes and
//     fronts of one or two are infinite) ranks a trial in a sparse part of the front first;
//   - rank = 1 + the trials in a better front + the trials of its own front with a strictly
//     larger crowding distance; the count needed and the cut are as above (ceil(keep · n)).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/proto_yaml.h"
#include "common/yaml_json.h"
#include "stemma/v1/job.pb.h"

namespace stemma::experiments {

// The rule of one trial from its stage's `early_stop:` as read (`written`; `node` is the
// mapping it was read from, `lines` where each field is, `path` its field path):
// rungs_tokens become steps of `cell`'s train spec (the first step whose tokens reach them),
// the mode and keep are written out, and every rung must come before the end of training.
// InvalidArgument "<file>: line L: <path>: <problem>" naming the cell where it depends on one.
absl::StatusOr<v1::EarlyStopRule> RuleForTrial(const v1::EarlyStopRule& written,
                                               const YamlNode& node, const FieldLines& lines,
                                               const std::string& path, std::string_view file,
                                               const v1::JobSpec& cell,
                                               const std::string& cell_name);

// A rule as a submitted job carries it: InvalidArgument "early_stop_rule.<field>: <problem>".
absl::Status CheckRule(const v1::EarlyStopRule& rule);

// The rule's keep (its default 0.5 when unset) and direction.
double Keep(const v1::EarlyStopRule& rule);
inline bool Maximize(const v1::EarlyStopRule& rule) { return rule.mode() == "max"; }

inline bool IsPareto(const v1::EarlyStopRule& rule) { return rule.method() == "pareto"; }

struct RungDecision {
  bool stop = false;
  int trials = 0;      // n: values recorded at the rung, this one included
  int rank = 0;        // 1 = best
  int keep_count = 0;  // ceil(keep · n); 0 while too few trials reached the rung
  int front = 0;       // pareto: the trial's front (0: non-dominated)
  int fronts = 0;      // pareto: how many fronts the rung's trials form
};

// Pareto: the front of each vector (objective values, "min" or "max" per `modes`), 0 first.
std::vector<int> ParetoFronts(const std::vector<std::vector<double>>& points,
                              const std::vector<bool>& maximize);
// Pareto: the crowding distance of each of `members` (indexes into `points`, one front).
std::vector<double> CrowdingDistances(const std::vector<std::vector<double>>& points,
                                      const std::vector<int>& members);

// Pareto: decides the trial whose objective values `value` have just been recorded at a rung;
// `recorded` holds every vector recorded there, this trial's included (at `self`).
RungDecision DecideAtRungPareto(const v1::EarlyStopRule& rule,
                                const std::vector<std::vector<double>>& recorded, size_t self);

// Pareto: "heldout_loss/uk=2.31, heldout_loss/en=3.02".
std::string ObjectiveValues(const v1::EarlyStopRule& rule, const std::vector<double>& values);
std::string StopReasonPareto(const v1::EarlyStopRule& rule, int rung_index, int64_t rung_step,
                             const std::vector<double>& values, const RungDecision& decision);

// Decides a trial whose `value` has just been recorded at a rung; `recorded` holds every
// value recorded at that rung, this trial's included.
RungDecision DecideAtRung(const v1::EarlyStopRule& rule, const std::vector<double>& recorded,
                          double value);

// "stopped early at rung 1 (step 100): heldout_loss=2.31, not in the top 0.5 of 4"
std::string StopReason(const v1::EarlyStopRule& rule, int rung_index, int64_t rung_step,
                       double value, const RungDecision& decision);

}  // namespace stemma::experiments
