// Cell expansion: each cell of a stage becomes one typed job (v1::JobSpec) — the stage's job
// fields with the cell's expressions substituted, read by the one YAML→proto reader — named
// `<stage>[axis=value,...]`, labelled with its stage and coordinates, depending on the cells
// it reads (or, for a need it reads nothing from, on every matching cell), its unset output
// path placed under the experiment, its early-stop rule made for it, and checked as the
// coordinator would at submit. Pure: no store, no clock, no files (the check is the caller's).
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "coordinator/experiments/experiment_file.h"
#include "coordinator/experiments/experiment_plan.h"
#include "coordinator/experiments/expressions.h"

namespace stemma::experiments {

// Appends stage `def` (its upstream stages already expanded) and its cells to `plan`.
absl::Status ExpandStage(const StageDef& def, std::string_view file, const ExpansionEnv& env,
                         Expressions* expressions, ExperimentPlan* plan);

}  // namespace stemma::experiments
