#include "coordinator/experiments/experiment_file.h"

#include <functional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/engine_cli.h"
#include "common/engine_spec.h"
#include "common/status.h"
#include "coordinator/experiments/extends.h"

namespace stemma::experiments {
namespace {

// Stage keys besides the one kind key.
const std::set<std::string>& StageKeys() {
  static const auto* keys = new std::set<std::string>{
      "matrix",     "needs",  "resources", "priority", "max_attempts", "backoff",
      "timeout_ms", "labels", "nodes",     "cache",    "early_stop"};
  return *keys;
}

// A mapping node holding the items of `from` whose keys are in `keys`, in order (what the
// YAML→proto reader reads of a mapping that also holds other things).
YamlNode Pick(const YamlNode& from, const std::set<std::string>& keys) {
  YamlNode out;
  out.kind = YamlNode::Kind::kMapping;
  out.line = from.line;
  for (size_t k = 0; k + 1 < from.items.size(); k += 2) {
    if (keys.count(from.items[k].scalar) == 0) continue;
    out.items.push_back(from.items[k]);
    out.items.push_back(from.items[k + 1]);
  }
  return out;
}

// `models: {PATH: {params: N, layers: L}}` as read: every size a positive number.
absl::Status CheckModels(const v1::ExperimentFile& envelope, const FieldLines& lines,
                         std::string_view file) {
  for (const auto& [path, size] : envelope.models()) {
    const std::string where = absl::StrCat("models.", path);
    auto positive = [&](const char* field, bool set, double value) -> absl::Status {
      const std::string fpath = absl::StrCat(where, ".", field);
      if (set && !(value > 0 && value <= 1e15))
        return SpecError(file, lines.Line(fpath), fpath, "must be a positive number");
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(positive("params", size.has_params(), size.params()));
    RETURN_IF_ERROR(positive("layers", size.has_layers(), size.layers()));
    if (!size.has_params() || static_cast<int64_t>(size.params()) <= 0)
      return SpecError(file, lines.Line(where), absl::StrCat(where, ".params"), "is required");
  }
  return absl::OkStatus();
}

// The envelope's own fields (name, models) through the one YAML→proto reader.
absl::Status ReadEnvelope(const YamlNode& root, std::string_view file, v1::ExperimentFile* out) {
  for (const char* field : {"name", "models"}) {
    if (const YamlNode* v = root.Find(field)) RETURN_IF_ERROR(RefuseExpressions(*v, file, field));
  }
  if (const YamlNode* name = root.Find("name");
      name != nullptr && (!name->IsScalar() || name->scalar.empty())) {
    return SpecError(file, name->line, "name", "must be a non-empty name");
  }
  if (const YamlNode* models = root.Find("models"); models != nullptr && !models->IsMap()) {
    return SpecError(file, models->line, "models",
                     "must be a mapping of model path to {params, layers}");
  }
  FieldLines lines;
  RETURN_IF_ERROR(ReadYamlInto(Pick(root, {"name", "models"}), out, file, "", &lines));
  if (out->name().empty()) return SpecError(file, root.line, "name", "is required");
  if (out->name().size() > 100 || out->name().find_first_of(" /[]\t\n") != std::string::npos) {
    return SpecError(file, root.line, "name", "use letters, digits, '-', '_' or '.' (at most 100)");
  }
  return CheckModels(*out, lines, file);
}

bool ContainsExpression(const YamlNode& n) {
  if (n.IsScalar()) return n.scalar.find("${{") != std::string::npos;
  for (const YamlNode& c : n.items) {
    if (ContainsExpression(c)) return true;
  }
  return false;
}

// One entry of `needs`: a stage's name, or {stage: S, where: {axis: value(s)}, all: true}.
absl::StatusOr<Need> ReadNeed(const YamlNode& item, const std::string& path,
                              std::string_view file) {
  Need need;
  need.line = item.line;
  if (item.IsScalar()) {
    RETURN_IF_ERROR(RefuseExpressions(item, file, path));
    need.stage = item.scalar;
    return need;
  }
  if (!item.IsMap())
    return SpecError(file, item.line, path, "must be a stage name or {stage: S, where: {...}}");
  const YamlNode* stage = item.Find("stage");
  if (stage == nullptr || !stage->IsScalar())
    return SpecError(file, item.line, path, "write {stage: S, where: {axis: value}}");
  RETURN_IF_ERROR(RefuseExpressions(*stage, file, absl::StrCat(path, ".stage")));
  if (const YamlNode* all = item.Find("all"))
    RETURN_IF_ERROR(RefuseExpressions(*all, file, absl::StrCat(path, ".all")));
  need.stage = stage->scalar;
  for (size_t k = 0; k + 1 < item.items.size(); k += 2) {
    const std::string& key = item.items[k].scalar;
    if (key == "stage") continue;
    if (key == "all") {
      need.all = item.items[k + 1].IsScalar() && item.items[k + 1].scalar == "true";
      continue;
    }
    if (key != "where")
      return SpecError(file, item.items[k].line, absl::StrCat(path, ".", key),
                       "unknown field (allowed: stage, where, all)");
    const YamlNode& where = item.items[k + 1];
    if (!where.IsMap() && !(where.IsScalar() && where.scalar.find("${{") != std::string::npos))
      return SpecError(file, where.line, absl::StrCat(path, ".where"),
                       "must be a mapping of axis to value(s)");
    if (ContainsExpression(where)) {
      need.where_node = &where;  // evaluated with the variables (experiment_plan.cc)
      need.where_path = absl::StrCat(path, ".where");
    } else {
      RETURN_IF_ERROR(ReadWhere(where, absl::StrCat(path, ".where"), file, &need));
    }
  }
  return need;
}

// The stage's kind key, and no key a stage does not have.
absl::Status ReadKind(StageDef* def, std::string_view file) {
  const YamlNode& n = *def->node;
  for (size_t k = 0; k + 1 < n.items.size(); k += 2) {
    const std::string& key = n.items[k].scalar;
    if (IsKind(key)) {
      if (!def->kind.empty()) {
        return SpecError(
            file, n.items[k].line, StagePath(*def, key),
            absl::StrCat("a stage runs one kind of job (", def->kind, " is already given)"));
      }
      def->kind = key;
    } else if (key == "search") {
      return SpecError(
          file, n.items[k].line, StagePath(*def, key),
          n.Find("matrix") == nullptr
              ? "a search samples a matrix, and this stage has none: write matrix: {search: "
                "{...}, AXIS: ...}"
              : "search belongs inside the stage's matrix: matrix: {search: {...}, AXIS: ...}");
    } else if (StageKeys().count(key) == 0) {
      return SpecError(
          file, n.items[k].line, StagePath(*def, key),
          absl::StrCat("unknown field (allowed: ", absl::StrJoin(StageKeys(), ", "),
                       ", and one kind: noop, exec, ", absl::StrJoin(EngineCommands(), ", "), ")"));
    }
  }
  if (def->kind.empty()) {
    return SpecError(file, n.line, StagePath(*def),
                     absl::StrCat("give the stage one kind: noop, exec, ",
                                  absl::StrJoin(EngineCommands(), ", ")));
  }
  return absl::OkStatus();
}

// A stage's kind, needs and options (its matrix is read later, with expressions: matrix.h).
absl::Status ReadStage(const ExperimentFile& f, StageDef* def, std::string_view file) {
  const YamlNode& n = *def->node;
  if (!n.IsMap()) return SpecError(file, n.line, StagePath(*def), "must be a mapping");
  RETURN_IF_ERROR(ReadKind(def, file));
  if (const YamlNode* needs = n.Find("needs")) {
    if (!needs->IsSequence())
      return SpecError(file, needs->line, StagePath(*def, "needs"), "must be a list of stages");
    for (size_t i = 0; i < needs->items.size(); ++i) {
      const YamlNode& item = needs->items[i];
      const std::string path = StagePath(*def, absl::StrCat("needs[", i, "]"));
      ASSIGN_OR_RETURN(Need need, ReadNeed(item, path, file));
      if (f.index.count(need.stage) == 0)
        return SpecError(file, item.line, path, absl::StrCat("unknown stage '", need.stage, "'"));
      if (need.stage == def->name)
        return SpecError(file, item.line, path, "a stage cannot need itself");
      def->needs.push_back(std::move(need));
    }
  }
  for (const char* field : {"cache", "early_stop"}) {
    if (const YamlNode* v = n.Find(field))
      RETURN_IF_ERROR(RefuseExpressions(*v, file, StagePath(*def, field)));
  }
  def->early_stop = n.Find("early_stop");
  if (def->early_stop != nullptr && !def->early_stop->IsMap()) {
    return SpecError(file, def->early_stop->line, StagePath(*def, "early_stop"),
                     "write {metric: heldout_loss, mode: min, rungs: [STEP, ...], keep: 0.5}");
  }
  return ReadYamlInto(Pick(n, {"cache", "early_stop"}), &def->options, file, StagePath(*def),
                      &def->option_lines);
}

}  // namespace

absl::Status ReadWhere(const YamlNode& where, const std::string& path, std::string_view file,
                       Need* need) {
  if (!where.IsMap())
    return SpecError(file, where.line, path, "must be a mapping of axis to value(s)");
  for (size_t w = 0; w + 1 < where.items.size(); w += 2) {
    std::vector<std::string> values;
    const YamlNode& v = where.items[w + 1];
    const std::string vpath = absl::StrCat(path, ".", where.items[w].scalar);
    RETURN_IF_ERROR(RefuseExpressions(where.items[w], file, vpath));
    if (v.IsScalar()) {
      values.push_back(v.scalar);
    } else if (v.IsSequence()) {
      for (const YamlNode& x : v.items) {
        if (!x.IsScalar())
          return SpecError(file, x.line, vpath, "must be a value or a list of values");
        values.push_back(x.scalar);
      }
    } else {
      return SpecError(file, v.line, vpath, "must be a value or a list of values");
    }
    need->where.emplace_back(where.items[w].scalar, std::move(values));
  }
  return absl::OkStatus();
}

bool IsKind(const std::string& key) {
  return key == "noop" || key == "exec" || EngineSpecDescriptor(key) != nullptr;
}

std::string StagePath(const StageDef& def, std::string_view rest) {
  return rest.empty() ? absl::StrCat("stages.", def.name)
                      : absl::StrCat("stages.", def.name, ".", std::string(rest));
}

absl::StatusOr<ExperimentFile> ReadExperimentFile(const YamlNode& root, std::string_view file) {
  ExperimentFile f;
  const YamlNode* stages = nullptr;
  for (size_t k = 0; k + 1 < root.items.size(); k += 2) {
    const std::string& key = root.items[k].scalar;
    const YamlNode& value = root.items[k + 1];
    if (key == "vars") {
      if (!value.IsMap() && !value.IsNull())
        return SpecError(file, value.line, "vars", "must be a mapping");
      for (size_t v = 0; v + 1 < value.items.size(); v += 2) {
        RETURN_IF_ERROR(RefuseExpressions(value.items[v], file, "vars"));
        f.vars[value.items[v].scalar] = &value.items[v + 1];
      }
    } else if (key == "stages" || key == "jobs") {
      stages = &value;
    } else if (key != "name" && key != "models") {
      return SpecError(file, root.items[k].line, key,
                       "unknown field (allowed: name, extends, vars, models, stages)");
    }
  }
  RETURN_IF_ERROR(ReadEnvelope(root, file, &f.envelope));
  if (stages == nullptr || !stages->IsMap() || stages->size() == 0) {
    return SpecError(file, root.line, "stages", "is required: a mapping of stage name to stage");
  }
  for (size_t k = 0; k + 1 < stages->items.size(); k += 2) {
    StageDef def;
    def.name = stages->items[k].scalar;
    def.line = stages->items[k].line;
    RETURN_IF_ERROR(RefuseExpressions(stages->items[k], file, "stages"));
    def.node = &stages->items[k + 1];
    if (def.name.empty() || def.name.find_first_of(" .[]=,$") != std::string::npos) {
      return SpecError(file, def.line, absl::StrCat("stages.", def.name),
                       "a stage name has no spaces, dots, brackets or commas");
    }
    if (f.index.count(def.name) > 0)
      return SpecError(file, def.line, absl::StrCat("stages.", def.name), "defined twice");
    f.index[def.name] = f.stages.size();
    f.stages.push_back(std::move(def));
  }
  for (StageDef& def : f.stages) RETURN_IF_ERROR(ReadStage(f, &def, file));
  return f;
}

absl::StatusOr<std::vector<size_t>> StageOrder(const ExperimentFile& f, std::string_view file) {
  std::vector<int> state(f.stages.size(), 0);  // 0 new, 1 on the path, 2 done
  std::vector<size_t> order;
  std::function<absl::Status(size_t, std::vector<std::string>&)> visit =
      [&](size_t i, std::vector<std::string>& path) -> absl::Status {
    if (state[i] == 2) return absl::OkStatus();
    path.push_back(f.stages[i].name);
    if (state[i] == 1) {
      return SpecError(file, f.stages[i].line, StagePath(f.stages[i], "needs"),
                       absl::StrCat("the stages form a cycle: ", absl::StrJoin(path, " -> ")));
    }
    state[i] = 1;
    for (const Need& n : f.stages[i].needs) RETURN_IF_ERROR(visit(f.index.at(n.stage), path));
    state[i] = 2;
    path.pop_back();
    order.push_back(i);
    return absl::OkStatus();
  };
  for (size_t i = 0; i < f.stages.size(); ++i) {
    std::vector<std::string> path;
    RETURN_IF_ERROR(visit(i, path));
  }
  return order;
}

}  // namespace stemma::experiments
