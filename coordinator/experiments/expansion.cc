#include "coordinator/experiments/expansion.h"

#include <cctype>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/proto_yaml.h"
#include "common/status.h"
#include "coordinator/experiments/early_stop.h"
#include "coordinator/experiments/extends.h"
#include "coordinator/experiments/matrix.h"

namespace stemma::experiments {
namespace {

namespace pb = google::protobuf;

bool ValidLabel(const std::string& key) {
  if (key.empty() || key.size() > 63) return false;
  for (char c : key) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.')
      return false;
  }
  return true;
}

std::string CellDir(const std::string& stage, const Coords& c) {
  std::string dir = stage;
  for (const auto& [a, v] : c) absl::StrAppend(&dir, "/", a, "=", v);
  return dir;
}

// The stage's fields with the cell's variants (matrix.h) merged over them, in axis order. A
// variant sets the stage's kind and job fields, not its matrix, needs, cache or early_stop.
absl::StatusOr<YamlNode> WithVariants(const StageDef& def, const Coords& coords,
                                      std::string_view file) {
  YamlNode stage = *def.node;
  for (const auto& [axis, value] : coords) {
    auto named = def.variants.find(axis);
    if (named == def.variants.end()) continue;
    const YamlNode& fields = named->second.at(value);
    for (size_t k = 0; k + 1 < fields.items.size(); k += 2) {
      const std::string& key = fields.items[k].scalar;
      if (key == def.kind || key == "resources" || key == "labels" || key == "priority" ||
          key == "max_attempts" || key == "backoff" || key == "timeout_ms" || key == "nodes") {
        continue;
      }
      return SpecError(file, fields.items[k].line,
                       StagePath(def, absl::StrCat("matrix.", axis, "[", value, "].", key)),
                       absl::StrCat("a variant sets the job's fields (", def.kind,
                                    ", resources, labels, priority, max_attempts, backoff, "
                                    "timeout_ms, nodes), not '",
                                    key, "'"));
    }
    stage = MergeYaml(stage, fields);
  }
  return stage;
}

// The cell's job as YAML: the stage's fields (and its variants') but
// matrix/needs/cache/early_stop, expressions substituted.
absl::StatusOr<YamlNode> JobYaml(const StageDef& def, const CellContext& ctx, std::string_view file,
                                 Expressions* expressions) {
  ASSIGN_OR_RETURN(const YamlNode stage, WithVariants(def, *ctx.coords, file));
  YamlNode job;
  job.kind = YamlNode::Kind::kMapping;
  job.line = def.node->line;
  for (size_t k = 0; k + 1 < stage.items.size(); k += 2) {
    const std::string& key = stage.items[k].scalar;
    if (key == "matrix" || key == "needs" || key == "cache" || key == "early_stop") continue;
    job.items.push_back(stage.items[k]);
    ASSIGN_OR_RETURN(YamlNode v,
                     expressions->Substitute(stage.items[k + 1], ctx, StagePath(def, key)));
    job.items.push_back(std::move(v));
  }
  return job;
}

// Dependencies: the cells it reads, and for a need it reads nothing from, every matching
// cell (an order-only edge).
absl::Status AddDependencies(const StageDef& def, const Coords& coords,
                             const std::set<std::string>& reads, const Expressions& expressions,
                             const ExperimentPlan& plan, PlanCell* cell) {
  std::set<std::string> deps(reads.begin(), reads.end());
  for (const Need& n : def.needs) {
    bool read_any = false;
    for (const PlanStage& up : plan.stages) {
      if (up.name != n.stage) continue;
      for (int i = up.first_cell; i < up.first_cell + up.cells; ++i)
        read_any |= reads.count(plan.cells[i].job_name) > 0;
    }
    if (read_any) continue;
    ASSIGN_OR_RETURN(std::vector<int> m,
                     expressions.Matching(def, coords, n.stage, n.line, StagePath(def, "needs")));
    for (int i : m) deps.insert(plan.cells[i].job_name);
  }
  for (const std::string& d : deps) cell->spec.add_depends_on(d);
  cell->reads.assign(reads.begin(), reads.end());
  return absl::OkStatus();
}

// An unset output path gets its place under the experiment, under the job's id, so a rerun
// with other inputs never meets an earlier output.
void PlaceOutput(const StageDef& def, const Coords& coords, const std::string& experiment,
                 v1::JobSpec* spec) {
  pb::Message* engine = MutableEngineSpecOf(spec);
  if (engine == nullptr) return;
  const pb::FieldDescriptor* out = engine->GetDescriptor()->FindFieldByName("out");
  if (out != nullptr && out->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING &&
      !out->is_repeated() && engine->GetReflection()->GetString(*engine, out).empty()) {
    engine->GetReflection()->SetString(engine, out,
                                       absl::StrCat("experiments/", experiment, "/",
                                                    CellDir(def.name, coords), "/", kSelfIdToken));
  }
}

absl::StatusOr<PlanCell> ExpandCell(const StageDef& def, const Coords& coords,
                                    std::string_view file, const ExpansionEnv& env,
                                    Expressions* expressions, const ExperimentPlan& plan) {
  PlanCell cell;
  cell.stage = def.name;
  cell.coords = coords;
  cell.job_name = CellName(def.name, coords);
  std::set<std::string> reads;
  CellContext ctx{&def, &coords, &reads};
  ASSIGN_OR_RETURN(YamlNode job, JobYaml(def, ctx, file, expressions));
  FieldLines lines;
  RETURN_IF_ERROR(ReadYamlInto(job, &cell.spec, file, StagePath(def), &lines));
  cell.spec.set_name(cell.job_name);
  cell.spec.set_experiment(plan.name);
  auto& labels = *cell.spec.mutable_labels();
  labels["stage"] = def.name;
  for (const auto& [axis, v] : coords) {
    if (ValidLabel(axis) && labels.count(axis) == 0) labels[axis] = v;
  }
  if (def.options.has_cache() && !def.options.cache()) labels["stemma.cache"] = "false";
  if (def.early_stop != nullptr) {
    if (def.kind != "train") {
      return SpecError(
          file, def.early_stop->line, StagePath(def, "early_stop"),
          absl::StrCat("early stopping needs a train stage (this one runs ", def.kind, ")"));
    }
    ASSIGN_OR_RETURN(*cell.spec.mutable_early_stop_rule(),
                     RuleForTrial(def.options.early_stop(), *def.early_stop, def.option_lines,
                                  StagePath(def, "early_stop"), file, cell.spec, cell.job_name));
  }
  RETURN_IF_ERROR(AddDependencies(def, coords, reads, *expressions, plan, &cell));
  PlaceOutput(def, coords, plan.name, &cell.spec);
  // Checked now, as the coordinator would at submit, with the stage's lines.
  if (env.check_job) {
    absl::Status st = env.check_job(cell.spec, std::string(file), StagePath(def), lines);
    if (!st.ok())
      return absl::InvalidArgumentError(
          absl::StrCat(st.message(), " (in cell ", cell.job_name, ")"));
  }
  return cell;
}

}  // namespace

absl::Status ExpandStage(const StageDef& def, std::string_view file, const ExpansionEnv& env,
                         Expressions* expressions, ExperimentPlan* plan) {
  PlanStage stage;
  stage.name = def.name;
  stage.kind = def.kind;
  for (const Need& n : def.needs) stage.needs.push_back(n.stage);
  stage.first_cell = static_cast<int>(plan->cells.size());
  stage.cells = static_cast<int>(def.cells.size());
  plan->stages.push_back(stage);
  for (const Coords& coords : def.cells) {
    ASSIGN_OR_RETURN(PlanCell cell, ExpandCell(def, coords, file, env, expressions, *plan));
    plan->cells.push_back(std::move(cell));
  }
  return absl::OkStatus();
}

}  // namespace stemma::experiments
