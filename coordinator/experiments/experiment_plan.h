// Experiment files: one YAML file that describes a whole study, expanded into a DAG of
// typed jobs. Pure (no store, no clock, no files: what only files tell — a model's size, the
// check of a job as submitted — the caller gives in an ExpansionEnv): the coordinator
// expands, validates and submits the result in one transaction
// (coordinator/experiment_revisions.h); `stemma sweep --dry-run` prints it.
//
// The parts, one concern each: experiment_file.h (the envelope: name, vars, models, stages),
// matrix.h and search.h (a stage's cells: grid or random search), expressions.h
// (`${{ }}`), expansion.h (cells into jobs), early_stop.h (a trial's rule), cost.h (the
// GPU-hour estimate). Wiring the outputs into the inputs happens when a job is released
// (coordinator/wiring.h).
//
//   name: family-experts
//   vars: {base: /ckpt/base, steps: 40}
//   stages:
//     cpt:
//       matrix:
//         family: [slavic, germanic]
//         strategy: [dense, freeze]
//         exclude: [{family: germanic, strategy: freeze}]
//         include: [{family: romance, strategy: dense}]
//       resources: {cpus: 1}
//       train:
//         model: ${{ vars.base }}
//         data: {datasets: [{path: data/${{ matrix.family }}}], seq_len: 64}
//         steps: ${{ vars.steps }}
//     revert:
//       needs: [{stage: cpt, where: {strategy: dense}}]   # one revert per dense expert
//       matrix: {family: [slavic, germanic]}
//       revert: {base: ${{ vars.base }}, model: ${{ needs.cpt.outputs.model }}, layers: middle}
//     soup:
//       needs: [cpt]                                     # fan-in: every cpt cell
//       merge: {method: linear, models: [${{ needs.cpt.outputs.model }}]}
//
// Rules:
// - `${{ vars.X }}` and `${{ matrix.X }}` may appear in any scalar; a scalar that is only the
//   expression takes the value's type (so `steps: ${{ vars.steps }}` is a number).
// - `${{ needs.S.outputs.O }}` names output O of stage S, which the stage must list in
//   `needs`. A cell reads the cells of S that agree with it on every matrix axis the two
//   stages share and that pass the need's `where` filter. As an item of a list it becomes one
//   item per matching cell (fan-in, in S's cell order); elsewhere it must match exactly one
//   cell. `{stage: S, all: true}` reads every cell of S (that passes `where`) whatever the
//   shared axes say (an eval of one expert on every language's data). A cell depends only on the
//   cells it reads (a need no expression uses: on every matching cell), never on the whole upstream
//   stage.
// - Cells are named `<stage>[axis=value,...]` (axes in matrix order); a stage without a
//   matrix has one cell named after the stage.
// - An engine spec's unset top-level output path (`out`) becomes
//   experiments/<name>/<cell path>, relative to the worker's storage root.
// - Every error is one InvalidArgument "<file>: line L: <path>: <problem>", and nothing of
//   the experiment is submitted.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/proto_yaml.h"
#include "coordinator/experiments/memory.h"
#include "stemma/v1/job.pb.h"

namespace stemma::experiments {

struct PlanCell {
  std::string stage;
  std::vector<std::pair<std::string, std::string>> coords;  // matrix axis → value, in order
  std::string job_name;                                     // cpt[family=slavic,strategy=dense]
  v1::JobSpec spec;  // typed; name, experiment, labels, depends_on (job names) set
  // Inputs still to be wired: "${{ <job name>.outputs.<output> }}" tokens in its spec.
  std::vector<std::string> reads;  // job names whose outputs the spec reads
  // Train and eval cells whose model's shape is known here: the shape and the memory plan.
  std::optional<ModelShape> model_shape;
  std::optional<MemoryEstimate> memory;
};

struct PlanStage {
  std::string name;
  std::string kind;                // JobSpec kind: train, merge, eval, noop, ...
  std::vector<std::string> needs;  // upstream stages
  int first_cell = 0;              // cells of this stage: [first_cell, first_cell + cells)
  int cells = 0;
};

struct ExperimentPlan {
  std::string name;
  std::vector<PlanStage> stages;  // topological order
  std::vector<PlanCell> cells;    // stage by stage, in that order
  int64_t edges = 0;              // dependency edges between cells
  int64_t gpus = 0;               // GPUs asked for by all cells together (gpus × nodes)
  // 6·N·tokens over an assumed 400 TFLOP/s at 40% utilisation, for train cells whose model
  // size and token budget are known here; unknown_cost_cells counts the others (cost.h).
  double gpu_hours_estimate = 0;
  int64_t unknown_cost_cells = 0;
  // The memory per device the cells are planned against (a GPU's, or a CPU worker's memory),
  // set by the caller before FormatPlan; 0: not known, the plan only prints the estimates.
  double gpu_memory_bytes = 0;
  double cpu_memory_bytes = 0;
};

// Parameters of the model at a path (its config.json), or nullopt when unknown.
using ModelParams = std::function<std::optional<int64_t>(const std::string& path)>;

// What expanding a file asks of the world outside it; the coordinator's answers read files
// (coordinator/experiment_revisions.h).
struct ExpansionEnv {
  // For the GPU-hour estimate of a model neither the file's `models:` nor an upstream cell
  // sizes; null: unknown.
  ModelParams model_params;
  // The shape of the model at a path for the memory plan (memory.h); null: unknown.
  std::function<std::optional<ModelShape>(const std::string& path)> model_shape;
  // Checks a cell's job as the coordinator would at submit (common/job_spec.h's
  // CheckJobAsSubmitted, which reads a model's config.json for layer ranges); null: unchecked.
  std::function<absl::Status(const v1::JobSpec& job, const std::string& where,
                             const std::string& path, const FieldLines& lines)>
      check_job;
  // The files the text extends, by the name it gives them (extends.h): what the client sent
  // beside it (SubmitExperimentRequest.imports).
  std::map<std::string, std::string> imports;
};

// Expands the experiment file `text` (named `file` in errors).
absl::StatusOr<ExperimentPlan> ExpandExperiment(std::string_view text, std::string_view file,
                                                const ExpansionEnv& env);

// The DAG as text for people: stages with their cells and what each reads, then totals.
std::string FormatPlan(const ExperimentPlan& plan);

// "${{ <job>.outputs.<name> }}", the wiring token left in a cell's spec.
std::string OutputToken(const std::string& job_name, const std::string& output);
// In an output path the expansion chose: the job's id, filled in at release.
inline constexpr char kSelfIdToken[] = "${{ self.id }}";

// The outputs a job kind reports (its `output` events' names).
std::vector<std::string> OutputsOfKind(std::string_view kind);

}  // namespace stemma::experiments
