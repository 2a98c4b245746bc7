#include "coordinator/experiments/experiment_plan.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/auth.h"
#include "common/engine_cli.h"
#include "common/engine_spec.h"
#include "common/job_spec.h"
#include "common/proto_yaml.h"
#include "common/status.h"
#include "common/yaml_json.h"
#include "nlohmann/json.hpp"
#include "stemma/v1/spec_options.pb.h"
#include "stemma/v1/specs/merge.pb.h"

namespace stemma::experiments {
namespace {

namespace pb = google::protobuf;

// Stage keys besides the one kind key.
const std::set<std::string>& StageKeys() {
  static const auto* keys = new std::set<std::string>{
      "matrix", "needs", "resources", "priority", "max_attempts", "backoff", "timeout_ms",
      "labels", "nodes", "cache"};
  return *keys;
}

bool IsKind(const std::string& key) {
  return key == "noop" || key == "exec" || EngineSpecDescriptor(key) != nullptr;
}

using Coords = std::vector<std::pair<std::string, std::string>>;

struct Need {
  std::string stage;
  std::vector<std::pair<std::string, std::vector<std::string>>> where;  // axis → allowed values
  bool all = false;  // read every cell (that passes where), whatever the shared axes say
  int line = 0;
};

struct StageDef {
  std::string name;
  int line = 0;
  const YamlNode* node = nullptr;
  std::string kind;
  std::vector<Need> needs;
  std::vector<std::string> axes;
  std::vector<Coords> cells;
};

class Expander {
 public:
  explicit Expander(std::string_view file) : file_(file) {}

  absl::StatusOr<ExperimentPlan> Run(std::string_view text) {
    ASSIGN_OR_RETURN(std::vector<YamlNode> docs, LoadYamlDocuments(text, file_));
    if (docs.size() != 1 || !docs[0].IsMap()) return Error(0, "", "an experiment file is one mapping");
    const YamlNode& root = docs[0];
    const YamlNode* stages = nullptr;
    for (size_t k = 0; k + 1 < root.items.size(); k += 2) {
      const std::string& key = root.items[k].scalar;
      const YamlNode& value = root.items[k + 1];
      if (key == "name") {
        if (!value.IsScalar() || value.scalar.empty()) return Error(value.line, "name", "must be a non-empty name");
        plan_.name = value.scalar;
      } else if (key == "vars") {
        if (!value.IsMap() && !value.IsNull()) return Error(value.line, "vars", "must be a mapping");
        for (size_t v = 0; v + 1 < value.items.size(); v += 2) vars_[value.items[v].scalar] = &value.items[v + 1];
      } else if (key == "stages" || key == "jobs") {
        stages = &value;
      } else {
        return Error(root.items[k].line, key, "unknown field (allowed: name, vars, stages)");
      }
    }
    if (plan_.name.empty()) return Error(root.line, "name", "is required");
    if (plan_.name.size() > 100 || plan_.name.find_first_of(" /[]\t\n") != std::string::npos) {
      return Error(root.line, "name", "use letters, digits, '-', '_' or '.' (at most 100)");
    }
    if (stages == nullptr || !stages->IsMap() || stages->size() == 0) {
      return Error(root.line, "stages", "is required: a mapping of stage name to stage");
    }
    for (size_t k = 0; k + 1 < stages->items.size(); k += 2) {
      StageDef def;
      def.name = stages->items[k].scalar;
      def.line = stages->items[k].line;
      def.node = &stages->items[k + 1];
      if (def.name.empty() || def.name.find_first_of(" .[]=,$") != std::string::npos) {
        return Error(def.line, absl::StrCat("stages.", def.name), "a stage name has no spaces, dots, brackets or commas");
      }
      if (index_.count(def.name) > 0) return Error(def.line, absl::StrCat("stages.", def.name), "defined twice");
      index_[def.name] = defs_.size();
      defs_.push_back(std::move(def));
    }
    for (StageDef& def : defs_) RETURN_IF_ERROR(ReadStage(&def));
    ASSIGN_OR_RETURN(std::vector<size_t> order, TopologicalOrder());
    for (size_t i : order) RETURN_IF_ERROR(ExpandStage(defs_[i]));
    Totals();
    return std::move(plan_);
  }

 private:
  absl::Status Error(int line, std::string_view path, std::string_view what) const {
    return SpecError(file_, line, path, what);
  }

  std::string StagePath(const StageDef& def, std::string_view rest = "") const {
    return rest.empty() ? absl::StrCat("stages.", def.name) : absl::StrCat("stages.", def.name, ".", std::string(rest));
  }

  absl::Status ReadStage(StageDef* def) {
    const YamlNode& n = *def->node;
    if (!n.IsMap()) return Error(n.line, StagePath(*def), "must be a mapping");
    for (size_t k = 0; k + 1 < n.items.size(); k += 2) {
      const std::string& key = n.items[k].scalar;
      if (IsKind(key)) {
        if (!def->kind.empty()) {
          return Error(n.items[k].line, StagePath(*def, key),
                       absl::StrCat("a stage runs one kind of job (", def->kind, " is already given)"));
        }
        def->kind = key;
      } else if (StageKeys().count(key) == 0) {
        return Error(n.items[k].line, StagePath(*def, key),
                     absl::StrCat("unknown field (allowed: ", absl::StrJoin(StageKeys(), ", "),
                                  ", and one kind: noop, exec, ", absl::StrJoin(EngineCommands(), ", "), ")"));
      }
    }
    if (def->kind.empty()) {
      return Error(n.line, StagePath(*def), absl::StrCat("give the stage one kind: noop, exec, ",
                                                          absl::StrJoin(EngineCommands(), ", ")));
    }
    if (const YamlNode* needs = n.Find("needs")) {
      if (!needs->IsSequence()) return Error(needs->line, StagePath(*def, "needs"), "must be a list of stages");
      for (size_t i = 0; i < needs->items.size(); ++i) {
        const YamlNode& item = needs->items[i];
        const std::string path = StagePath(*def, absl::StrCat("needs[", i, "]"));
        Need need;
        need.line = item.line;
        if (item.IsScalar()) {
          need.stage = item.scalar;
        } else if (item.IsMap()) {
          const YamlNode* stage = item.Find("stage");
          if (stage == nullptr || !stage->IsScalar()) return Error(item.line, path, "write {stage: S, where: {axis: value}}");
          need.stage = stage->scalar;
          for (size_t k = 0; k + 1 < item.items.size(); k += 2) {
            const std::string& key = item.items[k].scalar;
            if (key == "stage") continue;
            if (key == "all") {
              need.all = item.items[k + 1].IsScalar() && item.items[k + 1].scalar == "true";
              continue;
            }
            if (key != "where") return Error(item.items[k].line, absl::StrCat(path, ".", key), "unknown field (allowed: stage, where, all)");
            const YamlNode& where = item.items[k + 1];
            if (!where.IsMap()) return Error(where.line, absl::StrCat(path, ".where"), "must be a mapping of axis to value(s)");
            for (size_t w = 0; w + 1 < where.items.size(); w += 2) {
              std::vector<std::string> values;
              const YamlNode& v = where.items[w + 1];
              if (v.IsScalar()) {
                values.push_back(v.scalar);
              } else if (v.IsSequence()) {
                for (const YamlNode& x : v.items) values.push_back(x.scalar);
              } else {
                return Error(v.line, absl::StrCat(path, ".where.", where.items[w].scalar), "must be a value or a list of values");
              }
              need.where.emplace_back(where.items[w].scalar, std::move(values));
            }
          }
        } else {
          return Error(item.line, path, "must be a stage name or {stage: S, where: {...}}");
        }
        if (index_.count(need.stage) == 0) {
          return Error(item.line, path, absl::StrCat("unknown stage '", need.stage, "'"));
        }
        if (need.stage == def->name) return Error(item.line, path, "a stage cannot need itself");
        def->needs.push_back(std::move(need));
      }
    }
    return ReadMatrix(def);
  }

  absl::Status ReadMatrix(StageDef* def) {
    const YamlNode* m = def->node->Find("matrix");
    if (m == nullptr || m->IsNull()) {
      def->cells.push_back({});
      return absl::OkStatus();
    }
    const std::string mpath = StagePath(*def, "matrix");
    if (!m->IsMap()) return Error(m->line, mpath, "must be a mapping of axis to values");
    std::vector<std::pair<std::string, std::vector<std::string>>> axes;
    const YamlNode* include = nullptr;
    const YamlNode* exclude = nullptr;
    for (size_t k = 0; k + 1 < m->items.size(); k += 2) {
      const std::string& axis = m->items[k].scalar;
      const YamlNode& values = m->items[k + 1];
      if (axis == "include") { include = &values; continue; }
      if (axis == "exclude") { exclude = &values; continue; }
      if (axis.empty() || axis.find_first_of(" .[]=,$") != std::string::npos) {
        return Error(m->items[k].line, absl::StrCat(mpath, ".", axis), "an axis name has no spaces, dots, brackets or commas");
      }
      std::vector<YamlNode> items;
      if (values.IsSequence()) {
        items = values.items;
      } else if (values.IsScalar() && IsExpression(values.scalar)) {
        // An axis from a variable: `lr: ${{ vars.lrs }}`.
        ASSIGN_OR_RETURN(YamlNode expanded, Substitute(values, {}, absl::StrCat(mpath, ".", axis)));
        if (!expanded.IsSequence()) return Error(values.line, absl::StrCat(mpath, ".", axis), "must be a list of values");
        items = expanded.items;
      } else {
        return Error(values.line, absl::StrCat(mpath, ".", axis), "must be a list of values");
      }
      if (items.empty()) return Error(values.line, absl::StrCat(mpath, ".", axis), "is empty: the matrix would have no cells");
      std::vector<std::string> texts;
      for (const YamlNode& v : items) {
        if (!v.IsScalar()) return Error(v.line, absl::StrCat(mpath, ".", axis), "values must be scalars");
        if (v.scalar.find_first_of(",[]=") != std::string::npos) {
          return Error(v.line, absl::StrCat(mpath, ".", axis), absl::StrCat("value '", v.scalar, "' may not hold ',', '[', ']' or '='"));
        }
        texts.push_back(v.scalar);
      }
      axes.emplace_back(axis, std::move(texts));
      def->axes.push_back(axis);
    }
    // The product, first axis outermost.
    std::vector<Coords> cells = {{}};
    for (const auto& [axis, values] : axes) {
      std::vector<Coords> next;
      for (const Coords& c : cells) {
        for (const std::string& v : values) {
          Coords d = c;
          d.emplace_back(axis, v);
          next.push_back(std::move(d));
        }
      }
      cells = std::move(next);
    }
    if (axes.empty()) cells.clear();
    auto entries = [&](const YamlNode* list, const char* what) -> absl::StatusOr<std::vector<Coords>> {
      std::vector<Coords> out;
      if (list == nullptr) return out;
      if (!list->IsSequence()) return Error(list->line, absl::StrCat(mpath, ".", what), "must be a list of mappings");
      for (size_t i = 0; i < list->items.size(); ++i) {
        const YamlNode& e = list->items[i];
        if (!e.IsMap() || e.size() == 0) return Error(e.line, absl::StrCat(mpath, ".", what, "[", i, "]"), "must be a mapping of axis to value");
        Coords c;
        for (size_t k = 0; k + 1 < e.items.size(); k += 2) {
          if (!e.items[k + 1].IsScalar()) return Error(e.items[k + 1].line, absl::StrCat(mpath, ".", what, "[", i, "].", e.items[k].scalar), "must be a value");
          c.emplace_back(e.items[k].scalar, e.items[k + 1].scalar);
        }
        out.push_back(std::move(c));
      }
      return out;
    };
    // GitHub Actions' order: exclude first (a partial match removes), then include (extends a
    // cell whose original values it does not change, else adds a cell).
    ASSIGN_OR_RETURN(std::vector<Coords> excludes, entries(exclude, "exclude"));
    for (size_t i = 0; i < excludes.size(); ++i) {
      for (const auto& [axis, v] : excludes[i]) {
        if (std::find(def->axes.begin(), def->axes.end(), axis) == def->axes.end()) {
          return Error(exclude->items[i].line, absl::StrCat(mpath, ".exclude[", i, "].", axis),
                       absl::StrCat("'", axis, "' is not an axis of this matrix"));
        }
      }
      cells.erase(std::remove_if(cells.begin(), cells.end(), [&](const Coords& c) {
                    for (const auto& [axis, v] : excludes[i]) {
                      if (Get(c, axis) != v) return false;
                    }
                    return true;
                  }), cells.end());
    }
    const size_t original_axes = def->axes.size();
    ASSIGN_OR_RETURN(std::vector<Coords> includes, entries(include, "include"));
    const size_t original_cells = cells.size();
    for (const Coords& inc : includes) {
      bool extended = false;
      for (size_t ci = 0; ci < original_cells; ++ci) {
        Coords& c = cells[ci];
        bool fits = true;
        for (const auto& [axis, v] : inc) {
          const bool original = std::find(def->axes.begin(), def->axes.begin() + original_axes, axis) !=
                                def->axes.begin() + original_axes;
          if (original && Get(c, axis) != v) fits = false;
        }
        if (!fits) continue;
        for (const auto& [axis, v] : inc) {
          bool set = false;
          for (auto& [a, old] : c) {
            if (a == axis) {
              old = v;  // a value an earlier include added may be overwritten
              set = true;
            }
          }
          if (!set) c.emplace_back(axis, v);
        }
        extended = true;
      }
      if (!extended) cells.push_back(inc);
      for (const auto& [axis, v] : inc) {
        if (std::find(def->axes.begin(), def->axes.end(), axis) == def->axes.end()) def->axes.push_back(axis);
      }
    }
    if (cells.empty()) return Error(m->line, mpath, "has no cells (every combination was excluded)");
    // Cells in axis order, and distinct.
    std::set<std::string> seen;
    for (Coords& c : cells) {
      Coords ordered;
      for (const std::string& axis : def->axes) {
        if (Has(c, axis)) ordered.emplace_back(axis, Get(c, axis));
      }
      c = std::move(ordered);
      if (!seen.insert(CellName(def->name, c)).second) {
        return Error(m->line, mpath, absl::StrCat("cell ", CellName(def->name, c), " appears twice"));
      }
    }
    def->cells = std::move(cells);
    return absl::OkStatus();
  }

  static bool Has(const Coords& c, const std::string& axis) {
    for (const auto& [a, v] : c) {
      if (a == axis) return true;
    }
    return false;
  }
  static std::string Get(const Coords& c, const std::string& axis) {
    for (const auto& [a, v] : c) {
      if (a == axis) return v;
    }
    return "\x01";  // matches no value
  }

  static std::string CellName(const std::string& stage, const Coords& c) {
    if (c.empty()) return stage;
    std::vector<std::string> parts;
    for (const auto& [a, v] : c) parts.push_back(absl::StrCat(a, "=", v));
    return absl::StrCat(stage, "[", absl::StrJoin(parts, ","), "]");
  }

  absl::StatusOr<std::vector<size_t>> TopologicalOrder() {
    std::vector<int> state(defs_.size(), 0);  // 0 new, 1 on the path, 2 done
    std::vector<size_t> order;
    std::function<absl::Status(size_t, std::vector<std::string>&)> visit =
        [&](size_t i, std::vector<std::string>& path) -> absl::Status {
      if (state[i] == 2) return absl::OkStatus();
      path.push_back(defs_[i].name);
      if (state[i] == 1) {
        return Error(defs_[i].line, StagePath(defs_[i], "needs"),
                     absl::StrCat("the stages form a cycle: ", absl::StrJoin(path, " -> ")));
      }
      state[i] = 1;
      for (const Need& n : defs_[i].needs) RETURN_IF_ERROR(visit(index_.at(n.stage), path));
      state[i] = 2;
      path.pop_back();
      order.push_back(i);
      return absl::OkStatus();
    };
    for (size_t i = 0; i < defs_.size(); ++i) {
      std::vector<std::string> path;
      RETURN_IF_ERROR(visit(i, path));
    }
    return order;
  }

  // --- Expressions ------------------------------------------------------------------------

  static bool IsExpression(std::string_view s) { return s.find("${{") != std::string_view::npos; }

  struct CellContext {
    const StageDef* def = nullptr;
    const Coords* coords = nullptr;
    // needs.S.outputs.O references resolved so far: job names read.
    std::set<std::string>* reads = nullptr;
  };

  // The upstream cells of need `stage` that a cell with `coords` reads.
  absl::StatusOr<std::vector<int>> Matching(const StageDef& def, const Coords& coords, const std::string& stage,
                                            int line, const std::string& path) {
    const Need* need = nullptr;
    for (const Need& n : def.needs) {
      if (n.stage == stage) need = &n;
    }
    if (need == nullptr) {
      return Error(line, path, absl::StrCat("stage '", stage, "' is not in this stage's needs"));
    }
    const PlanStage& up = plan_.stages[stage_index_.at(stage)];
    std::vector<int> out;
    for (int i = up.first_cell; i < up.first_cell + up.cells; ++i) {
      const Coords& uc = cell_coords_[i];
      bool ok = true;
      for (const auto& [axis, v] : coords) {
        if (!need->all && Has(uc, axis) && Get(uc, axis) != v) ok = false;
      }
      for (const auto& [axis, allowed] : need->where) {
        if (std::find(allowed.begin(), allowed.end(), Get(uc, axis)) == allowed.end()) ok = false;
      }
      if (ok) out.push_back(i);
    }
    if (out.empty()) {
      return Error(line, path, absl::StrCat("reads no cell of stage '", stage, "' (no cell of it matches ",
                                            CellName(def.name, coords), " and the need's where)"));
    }
    return out;
  }

  // One `${{ ... }}` expression: vars.X, matrix.X or needs.S.outputs.O. For needs, `target`
  // is the one upstream cell to read (the caller chose it), or -1 when it must be unique.
  absl::StatusOr<YamlNode> Evaluate(std::string_view expr, const YamlNode& at, const CellContext& ctx,
                                    const std::string& path, int target) {
    std::string e(absl::StripAsciiWhitespace(absl::string_view(expr.data(), expr.size())));
    if (absl::StartsWith(e, "vars.")) {
      auto it = vars_.find(e.substr(5));
      if (it == vars_.end()) return Error(at.line, path, absl::StrCat("unknown variable '", e.substr(5), "' (vars: ", VarNames(), ")"));
      // A variable may itself hold expressions (a list of eval tasks that read upstream
      // datasets): they are evaluated in the cell that uses it.
      if (++depth_ > 8) {
        depth_ = 0;
        return Error(at.line, path, "variables refer to each other more than 8 deep");
      }
      absl::StatusOr<YamlNode> v = Substitute(*it->second, ctx, path, target);
      --depth_;
      if (!v.ok()) return v.status();
      if (v->IsScalar()) v->line = at.line;
      return *std::move(v);
    }
    if (absl::StartsWith(e, "matrix.")) {
      const std::string axis = e.substr(7);
      if (ctx.coords == nullptr || !Has(*ctx.coords, axis)) {
        return Error(at.line, path, absl::StrCat("matrix key '", axis, "' is not defined for this cell (axes: ",
                                                 ctx.def != nullptr ? absl::StrJoin(ctx.def->axes, ", ") : "", ")"));
      }
      YamlNode v;
      v.kind = YamlNode::Kind::kScalar;
      v.scalar = Get(*ctx.coords, axis);
      v.line = at.line;
      return v;
    }
    if (absl::StartsWith(e, "needs.")) {
      const std::vector<std::string> parts = absl::StrSplit(e, '.');
      if (parts.size() == 4 && parts[2] == "matrix" && stage_index_.count(parts[1]) > 0) {
        // A coordinate of the upstream cell read (in a fan-in item: that item's cell).
        int cell = target;
        if (cell < 0) {
          ASSIGN_OR_RETURN(std::vector<int> m, Matching(*ctx.def, *ctx.coords, parts[1], at.line, path));
          if (m.size() != 1) return Error(at.line, path, absl::StrCat("reads ", m.size(), " cells of stage '", parts[1], "'"));
          cell = m[0];
        }
        if (!Has(cell_coords_[cell], parts[3])) {
          return Error(at.line, path, absl::StrCat("stage '", parts[1], "' has no matrix key '", parts[3], "'"));
        }
        return Scalar(Get(cell_coords_[cell], parts[3]), at.line, true);
      }
      if (parts.size() != 4 || parts[2] != "outputs") {
        return Error(at.line, path, absl::StrCat("write ${{ needs.STAGE.outputs.NAME }} or ${{ needs.STAGE.matrix.KEY }}, not '", e, "'"));
      }
      const std::string& stage = parts[1];
      const std::string& output = parts[3];
      if (stage_index_.count(stage) == 0) {
        return Error(at.line, path, absl::StrCat("stage '", stage, "' is not in this stage's needs"));
      }
      const PlanStage& up = plan_.stages[stage_index_.at(stage)];
      const std::vector<std::string> outs = OutputsOfKind(up.kind);
      if (std::find(outs.begin(), outs.end(), output) == outs.end()) {
        return Error(at.line, path, absl::StrCat("stage '", stage, "' (", up.kind, ") has no output '", output,
                                                 "' (outputs: ", outs.empty() ? "none" : absl::StrJoin(outs, ", "), ")"));
      }
      int cell = target;
      if (cell < 0) {
        ASSIGN_OR_RETURN(std::vector<int> m, Matching(*ctx.def, *ctx.coords, stage, at.line, path));
        if (m.size() != 1) {
          return Error(at.line, path, absl::StrCat("reads ", m.size(), " cells of stage '", stage,
                                                   "'; put it in a list to take them all, or narrow the need with where"));
        }
        cell = m[0];
      }
      ctx.reads->insert(plan_.cells[cell].job_name);
      YamlNode v;
      v.kind = YamlNode::Kind::kScalar;
      v.plain = false;
      v.scalar = OutputToken(plan_.cells[cell].job_name, output);
      v.line = at.line;
      return v;
    }
    return Error(at.line, path, absl::StrCat("unknown expression '${{ ", e, " }}' (use vars.X, matrix.X or needs.S.outputs.O)"));
  }

  std::string VarNames() const {
    std::vector<std::string> names;
    for (const auto& [k, v] : vars_) names.push_back(k);
    return names.empty() ? "none" : absl::StrJoin(names, ", ");
  }

  // A scalar with expressions: a whole-scalar expression takes the value (any node); text
  // around expressions makes a string.
  absl::StatusOr<YamlNode> SubstituteScalar(const YamlNode& node, const CellContext& ctx, const std::string& path,
                                            int target) {
    const std::string& s = node.scalar;
    if (!IsExpression(s)) return node;
    std::string out;
    size_t pos = 0;
    while (true) {
      const size_t open = s.find("${{", pos);
      if (open == std::string::npos) break;
      const size_t close = s.find("}}", open);
      if (close == std::string::npos) return Error(node.line, path, "an expression is not closed with }}");
      ASSIGN_OR_RETURN(YamlNode v, Evaluate(std::string_view(s).substr(open + 3, close - open - 3), node, ctx, path, target));
      if (open == 0 && close + 2 == s.size()) return v;  // the whole scalar
      if (!v.IsScalar()) return Error(node.line, path, "a list or mapping cannot be part of a text");
      out += s.substr(pos, open - pos);
      out += v.scalar;
      pos = close + 2;
    }
    out += s.substr(pos);
    YamlNode r = node;
    r.scalar = std::move(out);
    r.plain = true;
    return r;
  }

  // The `needs.S` stages an item's expressions read (for list fan-in).
  static void NeedsIn(const YamlNode& n, std::set<std::string>* stages) {
    if (n.IsScalar()) {
      size_t pos = 0;
      while ((pos = n.scalar.find("${{", pos)) != std::string::npos) {
        const size_t close = n.scalar.find("}}", pos);
        if (close == std::string::npos) return;
        std::string e(absl::StripAsciiWhitespace(n.scalar.substr(pos + 3, close - pos - 3)));
        if (absl::StartsWith(e, "needs.")) {
          const std::vector<std::string> parts = absl::StrSplit(e, '.');
          if (parts.size() >= 2) stages->insert(parts[1]);
        }
        pos = close + 2;
      }
      return;
    }
    for (const YamlNode& c : n.items) NeedsIn(c, stages);
  }

  absl::StatusOr<YamlNode> Substitute(const YamlNode& node, const CellContext& ctx, const std::string& path,
                                      int target = -1) {
    if (node.IsScalar()) return SubstituteScalar(node, ctx, path, target);
    YamlNode out = node;
    out.items.clear();
    if (node.IsMap()) {
      for (size_t k = 0; k + 1 < node.items.size(); k += 2) {
        // Keys may hold expressions too ({"${{ matrix.family }}": 0.9}); they stay text.
        ASSIGN_OR_RETURN(YamlNode key, SubstituteScalar(node.items[k], ctx, path, target));
        if (!key.IsScalar()) return Error(node.items[k].line, path, "a key must be a single value");
        out.items.push_back(std::move(key));
        ASSIGN_OR_RETURN(YamlNode v, Substitute(node.items[k + 1], ctx, absl::StrCat(path, ".", node.items[k].scalar), target));
        out.items.push_back(std::move(v));
      }
      return out;
    }
    if (node.IsSequence()) {
      for (size_t i = 0; i < node.items.size(); ++i) {
        const YamlNode& item = node.items[i];
        const std::string ipath = absl::StrCat(path, "[", i, "]");
        std::set<std::string> stages;
        NeedsIn(item, &stages);
        if (stages.size() > 1) return Error(item.line, ipath, "one list item may read one upstream stage");
        if (stages.size() == 1 && target < 0 && ctx.def != nullptr) {
          // Fan-in: one item per upstream cell this cell reads.
          ASSIGN_OR_RETURN(std::vector<int> cells, Matching(*ctx.def, *ctx.coords, *stages.begin(), item.line, ipath));
          for (int c : cells) {
            ASSIGN_OR_RETURN(YamlNode v, Substitute(item, ctx, ipath, c));
            out.items.push_back(std::move(v));
          }
          continue;
        }
        ASSIGN_OR_RETURN(YamlNode v, Substitute(item, ctx, ipath, target));
        if (v.IsSequence() && item.IsScalar() && IsExpression(item.scalar)) {
          for (YamlNode& x : v.items) out.items.push_back(std::move(x));  // a list variable spliced in
        } else {
          out.items.push_back(std::move(v));
        }
      }
      return out;
    }
    return out;
  }

  // --- Cells ------------------------------------------------------------------------------

  static YamlNode Scalar(std::string text, int line, bool plain = false) {
    YamlNode n;
    n.kind = YamlNode::Kind::kScalar;
    n.scalar = std::move(text);
    n.plain = plain;
    n.line = line;
    return n;
  }

  absl::Status ExpandStage(const StageDef& def) {
    PlanStage stage;
    stage.name = def.name;
    stage.kind = def.kind;
    for (const Need& n : def.needs) stage.needs.push_back(n.stage);
    stage.first_cell = static_cast<int>(plan_.cells.size());
    stage.cells = static_cast<int>(def.cells.size());
    stage_index_[def.name] = plan_.stages.size();
    plan_.stages.push_back(stage);
    bool cache = true;
    if (const YamlNode* c = def.node->Find("cache")) {
      if (!c->IsScalar() || (c->scalar != "true" && c->scalar != "false")) {
        return Error(c->line, StagePath(def, "cache"), "must be true or false");
      }
      cache = c->scalar == "true";
    }
    for (const Coords& coords : def.cells) {
      PlanCell cell;
      cell.stage = def.name;
      cell.coords = coords;
      cell.job_name = CellName(def.name, coords);
      std::set<std::string> reads;
      CellContext ctx{&def, &coords, &reads};
      // The job as YAML: the stage's fields but matrix/needs/cache, expressions substituted.
      YamlNode job;
      job.kind = YamlNode::Kind::kMapping;
      job.line = def.node->line;
      for (size_t k = 0; k + 1 < def.node->items.size(); k += 2) {
        const std::string& key = def.node->items[k].scalar;
        if (key == "matrix" || key == "needs" || key == "cache") continue;
        job.items.push_back(def.node->items[k]);
        ASSIGN_OR_RETURN(YamlNode v, Substitute(def.node->items[k + 1], ctx, StagePath(def, key)));
        job.items.push_back(std::move(v));
      }
      FieldLines lines;
      RETURN_IF_ERROR(ReadYamlInto(job, &cell.spec, file_, StagePath(def), &lines));
      cell.spec.set_name(cell.job_name);
      cell.spec.set_experiment(plan_.name);
      auto& labels = *cell.spec.mutable_labels();
      labels["stage"] = def.name;
      for (const auto& [axis, v] : coords) {
        if (ValidLabel(axis) && labels.count(axis) == 0) labels[axis] = v;
      }
      if (!cache) labels["stemma.cache"] = "false";
      // Dependencies: the cells it reads, and for a need it reads nothing from, every
      // matching cell (an order-only edge).
      std::set<std::string> deps(reads.begin(), reads.end());
      for (const Need& n : def.needs) {
        bool read_any = false;
        const PlanStage& up = plan_.stages[stage_index_.at(n.stage)];
        for (int i = up.first_cell; i < up.first_cell + up.cells; ++i) read_any |= reads.count(plan_.cells[i].job_name) > 0;
        if (read_any) continue;
        ASSIGN_OR_RETURN(std::vector<int> m, Matching(def, coords, n.stage, n.line, StagePath(def, "needs")));
        for (int i : m) deps.insert(plan_.cells[i].job_name);
      }
      for (const std::string& d : deps) cell.spec.add_depends_on(d);
      cell.reads.assign(reads.begin(), reads.end());
      // An unset output path gets its place under the experiment.
      if (google::protobuf::Message* engine = MutableEngineSpecOf(&cell.spec)) {
        const pb::FieldDescriptor* out = engine->GetDescriptor()->FindFieldByName("out");
        if (out != nullptr && out->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING && !out->is_repeated() &&
            engine->GetReflection()->GetString(*engine, out).empty()) {
          // Under the job's id, so a rerun with other inputs never meets an earlier output.
          engine->GetReflection()->SetString(
              engine, out, absl::StrCat("experiments/", plan_.name, "/", CellDir(def.name, coords), "/${{ self.id }}"));
        }
      }
      // Checked now, as the coordinator would at submit, with the stage's lines.
      absl::Status st = CheckJobAsSubmitted(cell.spec, file_, StagePath(def), lines);
      if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat(st.message(), " (in cell ", cell.job_name, ")"));
      cell_coords_.push_back(coords);
      plan_.cells.push_back(std::move(cell));
    }
    return absl::OkStatus();
  }

  static bool ValidLabel(const std::string& key) {
    if (key.empty() || key.size() > 63) return false;
    for (char c : key) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') return false;
    }
    return true;
  }

  static std::string CellDir(const std::string& stage, const Coords& c) {
    std::string dir = stage;
    for (const auto& [a, v] : c) absl::StrAppend(&dir, "/", a, "=", v);
    return dir;
  }

  void Totals() {
    std::map<std::string, int> index;
    for (size_t i = 0; i < plan_.cells.size(); ++i) index[plan_.cells[i].job_name] = static_cast<int>(i);
    for (const PlanCell& c : plan_.cells) {
      plan_.edges += c.spec.depends_on_size();
      plan_.gpus += static_cast<int64_t>(std::max(0, c.spec.resources().gpus())) * std::max(1, c.spec.nodes());
      if (!c.spec.has_train()) continue;
      const v1::JobSpec& s = c.spec;
      // 6·N·D: parameters from the base model's config, tokens from the budget.
      const std::string model = FirstInputModel(s.train());
      std::optional<int64_t> params = ModelParams(model);
      const double tokens = TrainTokens(s);
      if (!params.has_value() || tokens <= 0) {
        ++plan_.unknown_cost_cells;
        continue;
      }
      plan_.gpu_hours_estimate += 6.0 * static_cast<double>(*params) * tokens / (400e12 * 0.4) / 3600.0;
    }
  }

  static double TrainTokens(const v1::JobSpec& s) {
    const pb::Message& t = s.train();
    const pb::Descriptor* d = t.GetDescriptor();
    const pb::Reflection* r = t.GetReflection();
    auto number = [&](const pb::Message& m, const char* name) -> double {
      const pb::FieldDescriptor* f = m.GetDescriptor()->FindFieldByName(name);
      if (f == nullptr || f->is_repeated()) return 0;
      switch (f->cpp_type()) {
        case pb::FieldDescriptor::CPPTYPE_INT64: return static_cast<double>(m.GetReflection()->GetInt64(m, f));
        case pb::FieldDescriptor::CPPTYPE_INT32: return m.GetReflection()->GetInt32(m, f);
        case pb::FieldDescriptor::CPPTYPE_DOUBLE: return m.GetReflection()->GetDouble(m, f);
        default: return 0;
      }
    };
    if (double max_tokens = number(t, "max_tokens"); max_tokens > 0) return max_tokens;
    double seq = 0;
    if (const pb::FieldDescriptor* data = d->FindFieldByName("data");
        data != nullptr && data->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE && r->HasField(t, data)) {
      seq = number(r->GetMessage(t, data), "seq_len");
    }
    const double batch = std::max(1.0, number(t, "batch_size"));
    const double accum = std::max(1.0, number(t, "grad_accum"));
    return number(t, "steps") * batch * accum * seq;
  }

  // Parameters of a model from its config.json: 12·L·d² for the blocks plus V·d per
  // embedding matrix (an estimate; MoE counts every expert).
  static std::optional<int64_t> ModelParams(const std::string& dir) {
    if (dir.empty()) return std::nullopt;
    std::optional<int64_t> layers = ModelLayersFromConfig(dir);
    if (!layers.has_value()) return std::nullopt;
    absl::StatusOr<std::vector<YamlNode>> docs = [&]() -> absl::StatusOr<std::vector<YamlNode>> {
      std::FILE* f = std::fopen((dir + "/config.json").c_str(), "rb");
      if (f == nullptr) return absl::NotFoundError("no config");
      std::string text;
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
      std::fclose(f);
      return LoadYamlDocuments(text, "config.json");
    }();
    if (!docs.ok() || docs->empty()) return std::nullopt;
    const YamlNode* root = &(*docs)[0];
    if (const YamlNode* t = root->Find("text_config"); t != nullptr && t->IsMap()) root = t;
    auto get = [&](const char* key) -> int64_t {
      const YamlNode* n = root->Find(key);
      int64_t v = 0;
      if (n != nullptr && n->IsScalar()) (void)absl::SimpleAtoi(n->scalar, &v);
      return v;
    };
    const int64_t d = get("hidden_size"), v = get("vocab_size"), ffn = get("intermediate_size");
    const int64_t experts = std::max<int64_t>(1, get("num_experts"));
    if (d <= 0) return std::nullopt;
    const int64_t block = 4 * d * d + experts * 3 * d * std::max<int64_t>(ffn, 1);
    return *layers * block + 2 * v * d;
  }

  std::string file_;
  ExperimentPlan plan_;
  std::vector<StageDef> defs_;
  std::map<std::string, size_t> index_;
  std::map<std::string, const YamlNode*> vars_;
  std::map<std::string, size_t> stage_index_;
  std::vector<Coords> cell_coords_;
  int depth_ = 0;
};

}  // namespace

std::string OutputToken(const std::string& job_name, const std::string& output) {
  return absl::StrCat("${{ ", job_name, ".outputs.", output, " }}");
}

std::vector<std::string> OutputsOfKind(std::string_view kind) {
  if (kind == "init" || kind == "train" || kind == "merge" || kind == "revert" ||
      kind == "interpolate" || kind == "graft" || kind == "upcycle") {
    return {"model"};
  }
  if (kind == "tokenize") return {"dataset"};
  if (kind == "eval") return {"results"};
  if (kind == "analyze") return {"results", "mask", "selection", "routing", "drift", "alignment"};
  return {};
}

absl::StatusOr<ExperimentPlan> ExpandExperiment(std::string_view text, std::string_view file) {
  return Expander(file).Run(text);
}

namespace {

absl::Status WireMessage(
    pb::Message* m,
    const std::function<const pb::Map<std::string, std::string>*(const std::string&)>& outputs_of,
    const std::string& self_id) {
  const pb::Descriptor* d = m->GetDescriptor();
  const pb::Reflection* r = m->GetReflection();
  auto wire = [&](const std::string& value, std::string* out) -> absl::Status {
    *out = value;
    size_t pos = 0;
    while ((pos = out->find("${{ ", pos)) != std::string::npos) {
      const size_t close = out->find(" }}", pos);
      if (close == std::string::npos) return absl::OkStatus();
      const std::string inner = out->substr(pos + 4, close - pos - 4);
      if (inner == "self.id" && !self_id.empty()) {
        out->replace(pos, close + 3 - pos, self_id);
        pos += self_id.size();
        continue;
      }
      const size_t dot = inner.rfind(".outputs.");
      if (dot == std::string::npos) {
        pos = close + 3;
        continue;
      }
      const std::string job = inner.substr(0, dot), name = inner.substr(dot + 9);
      const pb::Map<std::string, std::string>* outputs = outputs_of(job);
      if (outputs == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat("reads an output of ", job, ", which is not one of its dependencies"));
      }
      auto it = outputs->find(name);
      if (it == outputs->end()) {
        return absl::FailedPreconditionError(absl::StrCat(job, " succeeded without reporting its '", name, "' output"));
      }
      out->replace(pos, close + 3 - pos, it->second);
      pos += it->second.size();
    }
    return absl::OkStatus();
  };
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (f->is_map()) continue;
      if (f->is_repeated()) {
        for (int k = 0; k < r->FieldSize(*m, f); ++k) RETURN_IF_ERROR(WireMessage(r->MutableRepeatedMessage(m, f, k), outputs_of, self_id));
      } else if (r->HasField(*m, f)) {
        RETURN_IF_ERROR(WireMessage(r->MutableMessage(m, f), outputs_of, self_id));
      }
      continue;
    }
    if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_STRING) continue;
    std::string wired;
    if (f->is_repeated()) {
      for (int k = 0; k < r->FieldSize(*m, f); ++k) {
        const std::string v = r->GetRepeatedString(*m, f, k);
        if (v.find("${{ ") == std::string::npos) continue;
        RETURN_IF_ERROR(wire(v, &wired));
        r->SetRepeatedString(m, f, k, wired);
      }
    } else {
      const std::string v = r->GetString(*m, f);
      if (v.find("${{ ") == std::string::npos) continue;
      RETURN_IF_ERROR(wire(v, &wired));
      r->SetString(m, f, wired);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WireInputs(
    v1::JobSpec* spec,
    const std::function<const pb::Map<std::string, std::string>*(const std::string&)>& outputs_of,
    const std::string& self_id) {
  pb::Message* engine = MutableEngineSpecOf(spec);
  if (engine == nullptr) return absl::OkStatus();
  return WireMessage(engine, outputs_of, self_id);
}

namespace {

std::string Sha256(std::string_view data) { return Sha256Hex(absl::string_view(data.data(), data.size())); }

std::optional<std::string> ReadSmallFile(const std::string& path, size_t limit) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return std::nullopt;
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) {
    text.append(buf, n);
    if (text.size() > limit) {
      std::fclose(f);
      return std::nullopt;
    }
  }
  std::fclose(f);
  return text;
}

// What an input path stands for in the key: its manifest's hash when readable here.
std::string InputIdentity(const std::string& path) {
  // A checkpoint's stemma.json, or a token dataset's index.json (its manifest).
  if (auto manifest = ReadSmallFile(path + "/stemma.json", 64 << 20)) return "sha256:" + Sha256(*manifest);
  if (auto index = ReadSmallFile(path + "/index.json", 64 << 20)) return "sha256:" + Sha256(*index);
  if (auto file = ReadSmallFile(path, 64 << 20)) return "sha256:" + Sha256(*file);
  return path;
}

void Canonicalize(pb::Message* m) {
  const pb::Descriptor* d = m->GetDescriptor();
  const pb::Reflection* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (f->is_map()) continue;
      if (f->is_repeated()) {
        for (int k = 0; k < r->FieldSize(*m, f); ++k) Canonicalize(r->MutableRepeatedMessage(m, f, k));
      } else if (r->HasField(*m, f)) {
        Canonicalize(r->MutableMessage(m, f));
      }
      continue;
    }
    const int role = f->options().GetExtension(v1::rules).role();
    if (role == v1::ROLE_OUTPUT_PATH) {
      r->ClearField(m, f);
      continue;
    }
    if ((role != v1::ROLE_INPUT_MODEL && role != v1::ROLE_INPUT_PATH) ||
        f->cpp_type() != pb::FieldDescriptor::CPPTYPE_STRING) {
      continue;
    }
    if (f->is_repeated()) {
      for (int k = 0; k < r->FieldSize(*m, f); ++k) r->SetRepeatedString(m, f, k, InputIdentity(r->GetRepeatedString(*m, f, k)));
    } else if (r->HasField(*m, f) || !r->GetString(*m, f).empty()) {
      r->SetString(m, f, InputIdentity(r->GetString(*m, f)));
    }
  }
}

}  // namespace

std::string CacheKey(const v1::JobSpec& spec, const std::string& engine_build) {
  const pb::Message* engine = EngineSpecOf(spec);
  if (engine == nullptr) return "";
  std::unique_ptr<pb::Message> copy(engine->New());
  copy->CopyFrom(*engine);
  FillSpecDefaults(copy.get());
  Canonicalize(copy.get());
  if (auto* merge = dynamic_cast<v1::MergeSpec*>(copy.get()); merge != nullptr && merge->method() == "linear") {
    // A uniform soup does not depend on the order of its models.
    bool uniform = true;
    for (const auto& m : merge->models()) uniform &= !m.has_weight() || m.weight() == merge->models(0).weight();
    if (uniform) {
      std::sort(merge->mutable_models()->begin(), merge->mutable_models()->end(),
                [](const v1::MergeModel& a, const v1::MergeModel& b) { return a.path() < b.path(); });
    }
  }
  // Canonical: nlohmann's objects sort their keys, so map fields (family_weights) hash the
  // same whatever order protobuf's map iterates in.
  const std::string json = nlohmann::json::parse(SpecToJson(*copy), nullptr, false).dump();
  if (json.find("${{") != std::string::npos) return "";
  return Sha256(absl::StrCat(JobKind(spec), "\n", json, "\n", engine_build));
}

bool OutputsStillThere(const pb::Map<std::string, std::string>& outputs) {
  if (outputs.empty()) return false;
  for (const auto& [name, path] : outputs) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
      if (!ReadSmallFile(path + "/stemma.json", 64 << 20).has_value() &&
          !ReadSmallFile(path + "/index.json", 64 << 20).has_value()) {
        return false;
      }
    } else if (!std::filesystem::is_regular_file(path, ec)) {
      return false;
    }
  }
  return true;
}

std::string FormatPlan(const ExperimentPlan& plan) {
  std::string out = absl::StrCat("experiment ", plan.name, ": ", plan.stages.size(), " stages, ",
                                 plan.cells.size(), " jobs, ", plan.edges, " edges, ", plan.gpus, " GPUs\n");
  for (const PlanStage& s : plan.stages) {
    absl::StrAppend(&out, "  ", s.name, " (", s.kind, ", ", s.cells, s.cells == 1 ? " job" : " jobs");
    if (!s.needs.empty()) absl::StrAppend(&out, "; needs ", absl::StrJoin(s.needs, ", "));
    absl::StrAppend(&out, ")\n");
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
  absl::StrAppend(&out, "estimate: ", hours, " GPU-hours (6·N·tokens at 400 TFLOP/s, 40% utilisation)");
  if (plan.unknown_cost_cells > 0) {
    absl::StrAppend(&out, "; ", plan.unknown_cost_cells, " training jobs not counted (model or budget unknown here)");
  }
  absl::StrAppend(&out, "\n");
  return out;
}

}  // namespace stemma::experiments
