#include "coordinator/experiments/experiment_plan.h"

#include <cstdio>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "common/yaml_json.h"
#include "coordinator/experiments/cost.h"
#include "coordinator/experiments/expansion.h"
#include "coordinator/experiments/experiment_file.h"
#include "coordinator/experiments/expressions.h"
#include "coordinator/experiments/extends.h"
#include "coordinator/experiments/matrix.h"

namespace stemma::experiments {

std::string OutputToken(const std::string& job_name, const std::string& output) {
  return absl::StrCat("${{ ", job_name, ".outputs.", output, " }}");
}

std::vector<std::string> OutputsOfKind(std::string_view kind) {
  if (kind == "init" || kind == "train" || kind == "merge" || kind == "revert" ||
      kind == "interpolate" || kind == "graft" || kind == "upcycle") {
    return {"model"};
  }
  if (kind == "tokenize") return {"dataset"};
  if (kind == "prepare") return {"corpus"};
  if (kind == "eval") return {"results"};
  if (kind == "analyze")
    return {"results", "mask", "random_mask", "selection", "routing", "drift", "alignment"};
  return {};
}

absl::StatusOr<ExperimentPlan> ExpandExperiment(std::string_view text, std::string_view file,
                                                const ExpansionEnv& env) {
  ASSIGN_OR_RETURN(std::vector<YamlNode> docs, LoadYamlDocuments(text, file));
  if (docs.size() != 1 || !docs[0].IsMap())
    return SpecError(file, 0, "", "an experiment file is one mapping");
  // `extends:` (extends.h): the tree the file's fields are read from, kept while `f` points
  // into it.
  ASSIGN_OR_RETURN(const YamlNode root, ResolveExtends(docs[0], file, env.imports));
  ASSIGN_OR_RETURN(ExperimentFile f, ReadExperimentFile(root, file));
  ExperimentPlan plan;
  plan.name = f.envelope.name();
  Expressions expressions(file, f, plan);
  // What only variables are known for: the matrices (an axis, include or exclude from a
  // variable) and the needs' where.
  auto with_vars = [&](const YamlNode& value, const std::string& path) {
    return expressions.Substitute(value, {}, path);
  };
  for (StageDef& def : f.stages) {
    ASSIGN_OR_RETURN(Matrix m, ReadMatrix(def.node->Find("matrix"), def.name, file, with_vars));
    def.axes = std::move(m.axes);
    def.cells = std::move(m.cells);
    def.variants = std::move(m.variants);
    for (Need& need : def.needs) {
      if (need.where_node == nullptr) continue;
      ASSIGN_OR_RETURN(YamlNode where, with_vars(*need.where_node, need.where_path));
      RETURN_IF_ERROR(ReadWhere(where, need.where_path, file, &need));
    }
  }
  ASSIGN_OR_RETURN(std::vector<size_t> order, StageOrder(f, file));
  for (size_t i : order) RETURN_IF_ERROR(ExpandStage(f.stages[i], file, env, &expressions, &plan));
  std::map<std::string, v1::ModelSize> declared(f.envelope.models().begin(),
                                                f.envelope.models().end());  // `models:`
  EstimateCost(declared, env, &plan);
  return plan;
}

namespace {

// " ~24 GiB per GPU" for a stage: its largest cell's memory plan, and what does not fit the
// memory the plan was made against, with what would.
std::string StageMemory(const ExperimentPlan& plan, const PlanStage& s) {
  const PlanCell* largest = nullptr;
  for (int i = s.first_cell; i < s.first_cell + s.cells; ++i) {
    const PlanCell& c = plan.cells[i];
    if (c.memory.has_value() &&
        (largest == nullptr || c.memory->Bytes() > largest->memory->Bytes()))
      largest = &c;
  }
  if (largest == nullptr) return "";
  std::string out = absl::StrCat("  ", largest->memory->Short());
  const double limit = largest->memory->gpu ? plan.gpu_memory_bytes : plan.cpu_memory_bytes;
  if (limit <= 0) return out;
  if (largest->memory->Bytes() <= limit) return absl::StrCat(out, " (fits ", FormatGiB(limit), ")");
  absl::StrAppend(&out, " (does not fit ", FormatGiB(limit));
  if (std::string fix = WhatWouldFit(largest->spec, *largest->model_shape, limit); !fix.empty())
    absl::StrAppend(&out, "; ", fix);
  return absl::StrCat(out, ")");
}

}  // namespace

std::string FormatPlan(const ExperimentPlan& plan) {
  std::string out =
      absl::StrCat("experiment ", plan.name, ": ", plan.stages.size(), " stages, ",
                   plan.cells.size(), " jobs, ", plan.edges, " edges, ", plan.gpus, " GPUs\n");
  for (const PlanStage& s : plan.stages) {
    absl::StrAppend(&out, "  ", s.name, " (", s.kind, ", ", s.cells,
                    s.cells == 1 ? " job" : " jobs");
    if (!s.needs.empty()) absl::StrAppend(&out, "; needs ", absl::StrJoin(s.needs, ", "));
    absl::StrAppend(&out, ")", StageMemory(plan, s), "\n");
    for (int i = s.first_cell; i < s.first_cell + s.cells; ++i) {
      const PlanCell& c = plan.cells[i];
      absl::StrAppend(&out, "    ", c.job_name);
      if (c.spec.depends_on_size() > 0) {
        absl::StrAppend(&out, "  <- ", absl::StrJoin(c.spec.depends_on(), ", "));
      }
      absl::StrAppend(&out, "\n");
    }
  }
  char hours[64];
  std::snprintf(hours, sizeof hours, "%.3g", plan.gpu_hours_estimate);
  absl::StrAppend(&out, "estimate: ", hours,
                  " GPU-hours (6·N·tokens at 400 TFLOP/s, 40% utilisation)");
  if (plan.unknown_cost_cells > 0) {
    absl::StrAppend(&out, "; ", plan.unknown_cost_cells,
                    " training jobs not counted (model or budget unknown here)");
  }
  absl::StrAppend(&out, "\n");
  return out;
}

}  // namespace stemma::experiments
