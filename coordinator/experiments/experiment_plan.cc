#include "coordinator/experiments/experiment_plan.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/engine_cli.h"
#include "common/engine_spec.h"
#include "common/job_spec.h"
#include "common/proto_yaml.h"
#include "common/status.h"
#include "common/yaml_json.h"
#include "coordinator/experiments/early_stop.h"
#include "stemma/v1/spec_options.pb.h"
#include "stemma/v1/specs/train.pb.h"

namespace stemma::experiments {
namespace {

namespace pb = google::protobuf;

// Stage keys besides the one kind key.
const std::set<std::string>& StageKeys() {
  static const auto* keys = new std::set<std::string>{
      "matrix",     "needs",  "resources", "priority", "max_attempts", "backoff",
      "timeout_ms", "labels", "nodes",     "cache",    "early_stop"};
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
    if (docs.size() != 1 || !docs[0].IsMap())
      return Error(0, "", "an experiment file is one mapping");
    const YamlNode& root = docs[0];
    const YamlNode* stages = nullptr;
    for (size_t k = 0; k + 1 < root.items.size(); k += 2) {
      const std::string& key = root.items[k].scalar;
      const YamlNode& value = root.items[k + 1];
      if (key == "name") {
        if (!value.IsScalar() || value.scalar.empty())
          return Error(value.line, "name", "must be a non-empty name");
        plan_.name = value.scalar;
      } else if (key == "vars") {
        if (!value.IsMap() && !value.IsNull())
          return Error(value.line, "vars", "must be a mapping");
        for (size_t v = 0; v + 1 < value.items.size(); v += 2)
          vars_[value.items[v].scalar] = &value.items[v + 1];
      } else if (key == "stages" || key == "jobs") {
        stages = &value;
      } else if (key == "models") {
        RETURN_IF_ERROR(ReadModels(value));
      } else {
        return Error(root.items[k].line, key,
                     "unknown field (allowed: name, vars, models, stages)");
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
        return Error(def.line, absl::StrCat("stages.", def.name),
                     "a stage name has no spaces, dots, brackets or commas");
      }
      if (index_.count(def.name) > 0)
        return Error(def.line, absl::StrCat("stages.", def.name), "defined twice");
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
    return rest.empty() ? absl::StrCat("stages.", def.name)
                        : absl::StrCat("stages.", def.name, ".", std::string(rest));
  }

  absl::Status ReadStage(StageDef* def) {
    const YamlNode& n = *def->node;
    if (!n.IsMap()) return Error(n.line, StagePath(*def), "must be a mapping");
    for (size_t k = 0; k + 1 < n.items.size(); k += 2) {
      const std::string& key = n.items[k].scalar;
      if (IsKind(key)) {
        if (!def->kind.empty()) {
          return Error(
              n.items[k].line, StagePath(*def, key),
              absl::StrCat("a stage runs one kind of job (", def->kind, " is already given)"));
        }
        def->kind = key;
      } else if (key == "search") {
        return Error(
            n.items[k].line, StagePath(*def, key),
            n.Find("matrix") == nullptr
                ? "a search samples a matrix, and this stage has none: write matrix: {search: "
                  "{...}, AXIS: ...}"
                : "search belongs inside the stage's matrix: matrix: {search: {...}, AXIS: ...}");
      } else if (StageKeys().count(key) == 0) {
        return Error(n.items[k].line, StagePath(*def, key),
                     absl::StrCat("unknown field (allowed: ", absl::StrJoin(StageKeys(), ", "),
                                  ", and one kind: noop, exec, ",
                                  absl::StrJoin(EngineCommands(), ", "), ")"));
      }
    }
    if (def->kind.empty()) {
      return Error(n.line, StagePath(*def),
                   absl::StrCat("give the stage one kind: noop, exec, ",
                                absl::StrJoin(EngineCommands(), ", ")));
    }
    if (const YamlNode* needs = n.Find("needs")) {
      if (!needs->IsSequence())
        return Error(needs->line, StagePath(*def, "needs"), "must be a list of stages");
      for (size_t i = 0; i < needs->items.size(); ++i) {
        const YamlNode& item = needs->items[i];
        const std::string path = StagePath(*def, absl::StrCat("needs[", i, "]"));
        Need need;
        need.line = item.line;
        if (item.IsScalar()) {
          need.stage = item.scalar;
        } else if (item.IsMap()) {
          const YamlNode* stage = item.Find("stage");
          if (stage == nullptr || !stage->IsScalar())
            return Error(item.line, path, "write {stage: S, where: {axis: value}}");
          need.stage = stage->scalar;
          for (size_t k = 0; k + 1 < item.items.size(); k += 2) {
            const std::string& key = item.items[k].scalar;
            if (key == "stage") continue;
            if (key == "all") {
              need.all = item.items[k + 1].IsScalar() && item.items[k + 1].scalar == "true";
              continue;
            }
            if (key != "where")
              return Error(item.items[k].line, absl::StrCat(path, ".", key),
                           "unknown field (allowed: stage, where, all)");
            const YamlNode& where = item.items[k + 1];
            if (!where.IsMap())
              return Error(where.line, absl::StrCat(path, ".where"),
                           "must be a mapping of axis to value(s)");
            for (size_t w = 0; w + 1 < where.items.size(); w += 2) {
              std::vector<std::string> values;
              const YamlNode& v = where.items[w + 1];
              if (v.IsScalar()) {
                values.push_back(v.scalar);
              } else if (v.IsSequence()) {
                for (const YamlNode& x : v.items) values.push_back(x.scalar);
              } else {
                return Error(v.line, absl::StrCat(path, ".where.", where.items[w].scalar),
                             "must be a value or a list of values");
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
    std::vector<Axis> axes;
    Search search;
    const YamlNode* include = nullptr;
    const YamlNode* exclude = nullptr;
    for (size_t k = 0; k + 1 < m->items.size(); k += 2) {
      const std::string& axis = m->items[k].scalar;
      const YamlNode& values = m->items[k + 1];
      if (axis == "include") {
        include = &values;
        continue;
      }
      if (axis == "exclude") {
        exclude = &values;
        continue;
      }
      if (axis == "search") {
        RETURN_IF_ERROR(ReadSearch(values, absl::StrCat(mpath, ".search"), &search));
        continue;
      }
      if (axis.empty() || axis.find_first_of(" .[]=,$") != std::string::npos) {
        return Error(m->items[k].line, absl::StrCat(mpath, ".", axis),
                     "an axis name has no spaces, dots, brackets or commas");
      }
      std::vector<YamlNode> items;
      if (values.IsMap()) {
        // A distribution: {uniform: [lo, hi]}, {loguniform: [lo, hi]}, {int: [lo, hi]},
        // {choice: [a, b, ...]}.
        ASSIGN_OR_RETURN(Axis a, ReadDistribution(values, absl::StrCat(mpath, ".", axis)));
        a.name = axis;
        a.line = m->items[k].line;
        axes.push_back(std::move(a));
        def->axes.push_back(axis);
        continue;
      }
      if (values.IsSequence()) {
        items = values.items;
      } else if (values.IsScalar() && IsExpression(values.scalar)) {
        // An axis from a variable: `lr: ${{ vars.lrs }}`.
        ASSIGN_OR_RETURN(YamlNode expanded, Substitute(values, {}, absl::StrCat(mpath, ".", axis)));
        if (!expanded.IsSequence())
          return Error(values.line, absl::StrCat(mpath, ".", axis), "must be a list of values");
        items = expanded.items;
      } else {
        return Error(values.line, absl::StrCat(mpath, ".", axis), "must be a list of values");
      }
      if (items.empty())
        return Error(values.line, absl::StrCat(mpath, ".", axis),
                     "is empty: the matrix would have no cells");
      std::vector<std::string> texts;
      for (const YamlNode& v : items) {
        if (!v.IsScalar())
          return Error(v.line, absl::StrCat(mpath, ".", axis), "values must be scalars");
        if (v.scalar.find_first_of(",[]=") != std::string::npos) {
          return Error(v.line, absl::StrCat(mpath, ".", axis),
                       absl::StrCat("value '", v.scalar, "' may not hold ',', '[', ']' or '='"));
        }
        texts.push_back(v.scalar);
      }
      Axis a;
      a.name = axis;
      a.line = m->items[k].line;
      a.dist = Axis::kList;
      a.values = std::move(texts);
      axes.push_back(std::move(a));
      def->axes.push_back(axis);
    }
    if (search.random && axes.empty()) {
      return Error(search.line, absl::StrCat(mpath, ".search"),
                   "a random search needs at least one axis to sample");
    }
    std::vector<Coords> cells;
    if (search.random) {
      ASSIGN_OR_RETURN(cells, Sample(axes, search));
    } else {
      ASSIGN_OR_RETURN(cells, Grid(axes, mpath));
    }
    auto entries = [&](const YamlNode* list,
                       const char* what) -> absl::StatusOr<std::vector<Coords>> {
      std::vector<Coords> out;
      if (list == nullptr) return out;
      if (!list->IsSequence())
        return Error(list->line, absl::StrCat(mpath, ".", what), "must be a list of mappings");
      for (size_t i = 0; i < list->items.size(); ++i) {
        const YamlNode& e = list->items[i];
        if (!e.IsMap() || e.size() == 0)
          return Error(e.line, absl::StrCat(mpath, ".", what, "[", i, "]"),
                       "must be a mapping of axis to value");
        Coords c;
        for (size_t k = 0; k + 1 < e.items.size(); k += 2) {
          if (!e.items[k + 1].IsScalar())
            return Error(e.items[k + 1].line,
                         absl::StrCat(mpath, ".", what, "[", i, "].", e.items[k].scalar),
                         "must be a value");
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
      cells.erase(std::remove_if(cells.begin(), cells.end(),
                                 [&](const Coords& c) {
                                   for (const auto& [axis, v] : excludes[i]) {
                                     if (Get(c, axis) != v) return false;
                                   }
                                   return true;
                                 }),
                  cells.end());
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
          const bool original = std::find(def->axes.begin(), def->axes.begin() + original_axes,
                                          axis) != def->axes.begin() + original_axes;
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
        if (std::find(def->axes.begin(), def->axes.end(), axis) == def->axes.end())
          def->axes.push_back(axis);
      }
    }
    if (cells.empty())
      return Error(m->line, mpath, "has no cells (every combination was excluded)");
    // Cells in axis order, and distinct (a random search over discrete axes may draw one
    // cell twice: it is kept once).
    std::set<std::string> seen;
    std::vector<Coords> distinct;
    for (Coords& c : cells) {
      Coords ordered;
      for (const std::string& axis : def->axes) {
        if (Has(c, axis)) ordered.emplace_back(axis, Get(c, axis));
      }
      if (!seen.insert(CellName(def->name, ordered)).second) {
        if (search.random) continue;
        return Error(m->line, mpath,
                     absl::StrCat("cell ", CellName(def->name, ordered), " appears twice"));
      }
      distinct.push_back(std::move(ordered));
    }
    def->cells = std::move(distinct);
    return absl::OkStatus();
  }

  // --- Search: grid or random over lists and distributions -----------------------------

  struct Search {
    bool random = false;
    bool seeded = false;
    uint64_t seed = 0;
    int64_t samples = 0;
    int line = 0;
  };
  static constexpr int64_t kMaxSamples = 10000;

  struct Axis {
    enum Dist { kList, kUniform, kLogUniform, kInt };
    std::string name;
    int line = 0;
    Dist dist = kList;
    std::vector<std::string> values;  // kList (and choice)
    double lo = 0, hi = 0;            // kUniform, kLogUniform
    int64_t ilo = 0, ihi = 0;         // kInt (inclusive)
  };

  absl::Status ReadSearch(const YamlNode& n, const std::string& path, Search* search) {
    search->line = n.line;
    const YamlNode* method = &n;
    if (n.IsMap()) {
      method = n.Find("method");
      for (size_t k = 0; k + 1 < n.items.size(); k += 2) {
        const std::string& key = n.items[k].scalar;
        if (key != "method" && key != "seed" && key != "samples") {
          return Error(n.items[k].line, absl::StrCat(path, ".", key),
                       "unknown field (allowed: method, seed, samples)");
        }
      }
      if (method == nullptr)
        return Error(n.line, absl::StrCat(path, ".method"), "is required: grid or random");
    }
    if (!method->IsScalar() || (method->scalar != "grid" && method->scalar != "random")) {
      return Error(method->line, n.IsMap() ? absl::StrCat(path, ".method") : path,
                   absl::StrCat("'", method->IsScalar() ? method->scalar : "",
                                "' is not a search (use grid or random)"));
    }
    search->random = method->scalar == "random";
    const YamlNode* seed = n.IsMap() ? n.Find("seed") : nullptr;
    const YamlNode* samples = n.IsMap() ? n.Find("samples") : nullptr;
    if (!search->random) {
      if (seed != nullptr)
        return Error(seed->line, absl::StrCat(path, ".seed"),
                     "is for search method random (a grid has no randomness)");
      if (samples != nullptr)
        return Error(samples->line, absl::StrCat(path, ".samples"),
                     "is for search method random (a grid runs every cell)");
      return absl::OkStatus();
    }
    if (seed == nullptr) {
      return Error(
          n.line, absl::StrCat(path, ".seed"),
          "a random search needs a seed: a seedless random sweep would draw other trials on every "
          "submission and never be memoized");
    }
    if (!seed->IsScalar() || !absl::SimpleAtoi(seed->scalar, &search->seed)) {
      return Error(seed->line, absl::StrCat(path, ".seed"), "must be a non-negative integer");
    }
    search->seeded = true;
    if (samples == nullptr)
      return Error(n.line, absl::StrCat(path, ".samples"), "is required: how many trials to draw");
    if (!samples->IsScalar() || !absl::SimpleAtoi(samples->scalar, &search->samples) ||
        search->samples < 1 || search->samples > kMaxSamples) {
      return Error(
          samples->line, absl::StrCat(path, ".samples"),
          absl::StrCat("'", samples->scalar, "' must be a whole number in 1..", kMaxSamples));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Axis> ReadDistribution(const YamlNode& n, const std::string& path) {
    Axis a;
    if (n.size() != 1) {
      return Error(n.line, path,
                   "a distribution is one of {uniform: [lo, hi]}, {loguniform: [lo, hi]}, "
                   "{int: [lo, hi]}, {choice: [a, b, ...]}");
    }
    const std::string& kind = n.items[0].scalar;
    const YamlNode& args = n.items[1];
    const std::string dpath = absl::StrCat(path, ".", kind);
    if (kind != "uniform" && kind != "loguniform" && kind != "int" && kind != "choice") {
      return Error(n.items[0].line, dpath,
                   absl::StrCat("unknown distribution '", kind,
                                "' (use uniform, loguniform, int or choice)"));
    }
    if (!args.IsSequence())
      return Error(args.line, dpath,
                   kind == "choice" ? "must be a list of values" : "must be [lo, hi]");
    if (kind == "choice") {
      if (args.items.empty())
        return Error(args.line, dpath, "is empty: the matrix would have no cells");
      a.dist = Axis::kList;
      for (const YamlNode& v : args.items) {
        if (!v.IsScalar()) return Error(v.line, dpath, "values must be scalars");
        if (v.scalar.find_first_of(",[]=") != std::string::npos) {
          return Error(v.line, dpath,
                       absl::StrCat("value '", v.scalar, "' may not hold ',', '[', ']' or '='"));
        }
        a.values.push_back(v.scalar);
      }
      return a;
    }
    if (args.items.size() != 2 || !args.items[0].IsScalar() || !args.items[1].IsScalar()) {
      return Error(args.line, dpath, "must be [lo, hi]");
    }
    const std::string& lo = args.items[0].scalar;
    const std::string& hi = args.items[1].scalar;
    if (kind == "int") {
      a.dist = Axis::kInt;
      if (!absl::SimpleAtoi(lo, &a.ilo) || !absl::SimpleAtoi(hi, &a.ihi)) {
        return Error(args.line, dpath, absl::StrCat("[", lo, ", ", hi, "] must be whole numbers"));
      }
      if (a.ilo > a.ihi)
        return Error(args.line, dpath, absl::StrCat("lo ", lo, " is above hi ", hi));
      if (a.ihi - a.ilo > (int64_t{1} << 52))
        return Error(args.line, dpath, "the range is too wide (at most 2^52 values)");
      return a;
    }
    a.dist = kind == "uniform" ? Axis::kUniform : Axis::kLogUniform;
    if (!absl::SimpleAtod(lo, &a.lo) || !absl::SimpleAtod(hi, &a.hi) || !std::isfinite(a.lo) ||
        !std::isfinite(a.hi)) {
      return Error(args.line, dpath, absl::StrCat("[", lo, ", ", hi, "] must be numbers"));
    }
    if (a.lo > a.hi) return Error(args.line, dpath, absl::StrCat("lo ", lo, " is above hi ", hi));
    if (a.dist == Axis::kLogUniform && a.lo <= 0) {
      return Error(
          args.line, dpath,
          absl::StrCat("lo ", lo, " must be > 0 (a log-uniform range is over positive numbers)"));
    }
    return a;
  }

  // The product of the axes, first axis outermost. Only lists, choices and integer ranges
  // can be enumerated.
  absl::StatusOr<std::vector<Coords>> Grid(const std::vector<Axis>& axes,
                                           const std::string& mpath) {
    std::vector<Coords> cells = {{}};
    for (const Axis& a : axes) {
      std::vector<std::string> values = a.values;
      if (a.dist == Axis::kUniform || a.dist == Axis::kLogUniform) {
        return Error(
            a.line, absl::StrCat(mpath, ".", a.name),
            absl::StrCat(
                a.dist == Axis::kUniform ? "uniform" : "loguniform",
                " is a distribution to sample: set search: {method: random, seed: N, samples: N}, "
                "or give a list of values"));
      }
      if (a.dist == Axis::kInt) {
        if (a.ihi - a.ilo >= kMaxSamples) {
          return Error(a.line, absl::StrCat(mpath, ".", a.name),
                       absl::StrCat("a grid over int [", a.ilo, ", ", a.ihi,
                                    "] would have more than ", kMaxSamples, " values"));
        }
        for (int64_t v = a.ilo; v <= a.ihi; ++v) values.push_back(absl::StrCat(v));
      }
      std::vector<Coords> next;
      for (const Coords& c : cells) {
        for (const std::string& v : values) {
          Coords d = c;
          d.emplace_back(a.name, v);
          next.push_back(std::move(d));
        }
      }
      cells = std::move(next);
      if (cells.size() > 100000) return Error(a.line, mpath, "the grid has more than 100000 cells");
    }
    if (axes.empty()) cells.clear();
    return cells;
  }

  // A real drawn in [lo, hi] as the shortest text (3 significant digits, more only when the
  // rounding would leave the range): the text is both the cell's name and the spec's value,
  // so a trial is what its name says.
  static std::string ShortReal(double v, double lo, double hi) {
    char buf[64];
    for (int digits = 3; digits <= 17; ++digits) {
      std::snprintf(buf, sizeof buf, "%.*g", digits, v);
      double back = 0;
      if (absl::SimpleAtod(buf, &back) && back >= lo && back <= hi) break;
    }
    return buf;
  }

  // `search.samples` cells, each axis drawn independently in matrix order from a 64-bit
  // Mersenne Twister seeded with `search.seed` (the same file always draws the same cells).
  absl::StatusOr<std::vector<Coords>> Sample(const std::vector<Axis>& axes, const Search& search) {
    std::mt19937_64 rng(search.seed);
    // 53 random bits as a real in [0, 1): the same on every platform (std's distributions
    // are not specified bit for bit).
    auto unit = [&] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };
    auto index = [&](uint64_t n) {
      return std::min<uint64_t>(n - 1, static_cast<uint64_t>(unit() * static_cast<double>(n)));
    };
    std::vector<Coords> cells;
    for (int64_t i = 0; i < search.samples; ++i) {
      Coords c;
      for (const Axis& a : axes) {
        switch (a.dist) {
          case Axis::kList:
            c.emplace_back(a.name, a.values[index(a.values.size())]);
            break;
          case Axis::kInt:
            c.emplace_back(
                a.name, absl::StrCat(a.ilo + static_cast<int64_t>(
                                                 index(static_cast<uint64_t>(a.ihi - a.ilo) + 1))));
            break;
          case Axis::kUniform:
            c.emplace_back(a.name, ShortReal(a.lo + unit() * (a.hi - a.lo), a.lo, a.hi));
            break;
          case Axis::kLogUniform: {
            const double l = std::log(a.lo), h = std::log(a.hi);
            c.emplace_back(a.name, ShortReal(std::clamp(std::exp(l + unit() * (h - l)), a.lo, a.hi),
                                             a.lo, a.hi));
            break;
          }
        }
      }
      cells.push_back(std::move(c));
    }
    return cells;
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
  absl::StatusOr<std::vector<int>> Matching(const StageDef& def, const Coords& coords,
                                            const std::string& stage, int line,
                                            const std::string& path) {
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
      return Error(line, path,
                   absl::StrCat("reads no cell of stage '", stage, "' (no cell of it matches ",
                                CellName(def.name, coords), " and the need's where)"));
    }
    return out;
  }

  // One `${{ ... }}` expression: vars.X, matrix.X or needs.S.outputs.O. For needs, `target`
  // is the one upstream cell to read (the caller chose it), or -1 when it must be unique.
  absl::StatusOr<YamlNode> Evaluate(std::string_view expr, const YamlNode& at,
                                    const CellContext& ctx, const std::string& path, int target) {
    std::string e(absl::StripAsciiWhitespace(absl::string_view(expr.data(), expr.size())));
    if (absl::StartsWith(e, "vars.")) {
      auto it = vars_.find(e.substr(5));
      if (it == vars_.end())
        return Error(at.line, path,
                     absl::StrCat("unknown variable '", e.substr(5), "' (vars: ", VarNames(), ")"));
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
        return Error(
            at.line, path,
            absl::StrCat("matrix key '", axis, "' is not defined for this cell (axes: ",
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
          ASSIGN_OR_RETURN(std::vector<int> m,
                           Matching(*ctx.def, *ctx.coords, parts[1], at.line, path));
          if (m.size() != 1)
            return Error(at.line, path,
                         absl::StrCat("reads ", m.size(), " cells of stage '", parts[1], "'"));
          cell = m[0];
        }
        if (!Has(cell_coords_[cell], parts[3])) {
          return Error(at.line, path,
                       absl::StrCat("stage '", parts[1], "' has no matrix key '", parts[3], "'"));
        }
        return Scalar(Get(cell_coords_[cell], parts[3]), at.line, true);
      }
      if (parts.size() != 4 || parts[2] != "outputs") {
        return Error(
            at.line, path,
            absl::StrCat(
                "write ${{ needs.STAGE.outputs.NAME }} or ${{ needs.STAGE.matrix.KEY }}, not '", e,
                "'"));
      }
      const std::string& stage = parts[1];
      const std::string& output = parts[3];
      if (stage_index_.count(stage) == 0) {
        return Error(at.line, path,
                     absl::StrCat("stage '", stage, "' is not in this stage's needs"));
      }
      const PlanStage& up = plan_.stages[stage_index_.at(stage)];
      const std::vector<std::string> outs = OutputsOfKind(up.kind);
      if (std::find(outs.begin(), outs.end(), output) == outs.end()) {
        return Error(
            at.line, path,
            absl::StrCat("stage '", stage, "' (", up.kind, ") has no output '", output,
                         "' (outputs: ", outs.empty() ? "none" : absl::StrJoin(outs, ", "), ")"));
      }
      int cell = target;
      if (cell < 0) {
        ASSIGN_OR_RETURN(std::vector<int> m, Matching(*ctx.def, *ctx.coords, stage, at.line, path));
        if (m.size() != 1) {
          return Error(
              at.line, path,
              absl::StrCat("reads ", m.size(), " cells of stage '", stage,
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
    return Error(at.line, path,
                 absl::StrCat("unknown expression '${{ ", e,
                              " }}' (use vars.X, matrix.X or needs.S.outputs.O)"));
  }

  std::string VarNames() const {
    std::vector<std::string> names;
    for (const auto& [k, v] : vars_) names.push_back(k);
    return names.empty() ? "none" : absl::StrJoin(names, ", ");
  }

  // A scalar with expressions: a whole-scalar expression takes the value (any node); text
  // around expressions makes a string.
  absl::StatusOr<YamlNode> SubstituteScalar(const YamlNode& node, const CellContext& ctx,
                                            const std::string& path, int target) {
    const std::string& s = node.scalar;
    if (!IsExpression(s)) return node;
    std::string out;
    size_t pos = 0;
    while (true) {
      const size_t open = s.find("${{", pos);
      if (open == std::string::npos) break;
      const size_t close = s.find("}}", open);
      if (close == std::string::npos)
        return Error(node.line, path, "an expression is not closed with }}");
      ASSIGN_OR_RETURN(YamlNode v, Evaluate(std::string_view(s).substr(open + 3, close - open - 3),
                                            node, ctx, path, target));
      if (open == 0 && close + 2 == s.size()) return v;  // the whole scalar
      if (!v.IsScalar())
        return Error(node.line, path, "a list or mapping cannot be part of a text");
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

  absl::StatusOr<YamlNode> Substitute(const YamlNode& node, const CellContext& ctx,
                                      const std::string& path, int target = -1) {
    if (node.IsScalar()) return SubstituteScalar(node, ctx, path, target);
    YamlNode out = node;
    out.items.clear();
    if (node.IsMap()) {
      for (size_t k = 0; k + 1 < node.items.size(); k += 2) {
        // Keys may hold expressions too ({"${{ matrix.family }}": 0.9}); they stay text.
        ASSIGN_OR_RETURN(YamlNode key, SubstituteScalar(node.items[k], ctx, path, target));
        if (!key.IsScalar()) return Error(node.items[k].line, path, "a key must be a single value");
        out.items.push_back(std::move(key));
        ASSIGN_OR_RETURN(YamlNode v,
                         Substitute(node.items[k + 1], ctx,
                                    absl::StrCat(path, ".", node.items[k].scalar), target));
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
        if (stages.size() > 1)
          return Error(item.line, ipath, "one list item may read one upstream stage");
        if (stages.size() == 1 && target < 0 && ctx.def != nullptr) {
          // Fan-in: one item per upstream cell this cell reads.
          ASSIGN_OR_RETURN(std::vector<int> cells,
                           Matching(*ctx.def, *ctx.coords, *stages.begin(), item.line, ipath));
          for (int c : cells) {
            ASSIGN_OR_RETURN(YamlNode v, Substitute(item, ctx, ipath, c));
            out.items.push_back(std::move(v));
          }
          continue;
        }
        ASSIGN_OR_RETURN(YamlNode v, Substitute(item, ctx, ipath, target));
        if (v.IsSequence() && item.IsScalar() && IsExpression(item.scalar)) {
          for (YamlNode& x : v.items)
            out.items.push_back(std::move(x));  // a list variable spliced in
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
        if (key == "matrix" || key == "needs" || key == "cache" || key == "early_stop") continue;
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
      if (const YamlNode* es = def.node->Find("early_stop")) {
        ASSIGN_OR_RETURN(std::string label, EarlyStopLabel(def, *es, cell));
        labels[kEarlyStopLabel] = label;
      }
      // Dependencies: the cells it reads, and for a need it reads nothing from, every
      // matching cell (an order-only edge).
      std::set<std::string> deps(reads.begin(), reads.end());
      for (const Need& n : def.needs) {
        bool read_any = false;
        const PlanStage& up = plan_.stages[stage_index_.at(n.stage)];
        for (int i = up.first_cell; i < up.first_cell + up.cells; ++i)
          read_any |= reads.count(plan_.cells[i].job_name) > 0;
        if (read_any) continue;
        ASSIGN_OR_RETURN(std::vector<int> m,
                         Matching(def, coords, n.stage, n.line, StagePath(def, "needs")));
        for (int i : m) deps.insert(plan_.cells[i].job_name);
      }
      for (const std::string& d : deps) cell.spec.add_depends_on(d);
      cell.reads.assign(reads.begin(), reads.end());
      // An unset output path gets its place under the experiment.
      if (google::protobuf::Message* engine = MutableEngineSpecOf(&cell.spec)) {
        const pb::FieldDescriptor* out = engine->GetDescriptor()->FindFieldByName("out");
        if (out != nullptr && out->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING &&
            !out->is_repeated() && engine->GetReflection()->GetString(*engine, out).empty()) {
          // Under the job's id, so a rerun with other inputs never meets an earlier output.
          engine->GetReflection()->SetString(
              engine, out,
              absl::StrCat("experiments/", plan_.name, "/", CellDir(def.name, coords),
                           "/${{ self.id }}"));
        }
      }
      // Checked now, as the coordinator would at submit, with the stage's lines.
      absl::Status st = CheckJobAsSubmitted(cell.spec, file_, StagePath(def), lines);
      if (!st.ok())
        return absl::InvalidArgumentError(
            absl::StrCat(st.message(), " (in cell ", cell.job_name, ")"));
      cell_coords_.push_back(coords);
      plan_.cells.push_back(std::move(cell));
    }
    return absl::OkStatus();
  }

  // `early_stop:` of a train stage as the trial's label (early_stop.h), checked against
  // this cell's spec: every rung before the end of training.
  absl::StatusOr<std::string> EarlyStopLabel(const StageDef& def, const YamlNode& n,
                                             const PlanCell& cell) {
    const std::string path = StagePath(def, "early_stop");
    if (def.kind != "train") {
      return Error(
          n.line, path,
          absl::StrCat("early stopping needs a train stage (this one runs ", def.kind, ")"));
    }
    if (!n.IsMap())
      return Error(n.line, path,
                   "write {metric: heldout_loss, mode: min, rungs: [STEP, ...], keep: 0.5}");
    EarlyStopConfig c;
    const YamlNode* rungs = nullptr;
    const YamlNode* rungs_tokens = nullptr;
    for (size_t k = 0; k + 1 < n.items.size(); k += 2) {
      const std::string& key = n.items[k].scalar;
      const YamlNode& v = n.items[k + 1];
      const std::string field = absl::StrCat(path, ".", key);
      if (key == "metric") {
        if (!v.IsScalar() ||
            (v.scalar != "loss" && v.scalar != "heldout_loss" &&
             !(absl::StartsWith(v.scalar, "heldout_loss/") && v.scalar.size() > 13))) {
          return Error(v.line, field,
                       absl::StrCat("'", v.scalar,
                                    "' is not a metric the trainer reports (use loss, "
                                    "heldout_loss or heldout_loss/<dataset>)"));
        }
        c.metric = v.scalar;
      } else if (key == "mode") {
        if (!v.IsScalar() || (v.scalar != "min" && v.scalar != "max"))
          return Error(v.line, field, "must be min or max");
        c.maximize = v.scalar == "max";
      } else if (key == "rungs") {
        rungs = &v;
      } else if (key == "rungs_tokens") {
        rungs_tokens = &v;
      } else if (key == "keep") {
        if (!v.IsScalar() || !absl::SimpleAtod(v.scalar, &c.keep) || !(c.keep > 0 && c.keep < 1)) {
          return Error(v.line, field,
                       absl::StrCat("'", v.scalar,
                                    "' must be a fraction in (0, 1): the share kept at each rung"));
        }
      } else if (key == "min_trials") {
        if (!v.IsScalar() || !absl::SimpleAtoi(v.scalar, &c.min_trials) || c.min_trials < 1 ||
            c.min_trials > 100000) {
          return Error(v.line, field, "must be a whole number >= 1");
        }
      } else {
        return Error(
            n.items[k].line, field,
            "unknown field (allowed: metric, mode, rungs, rungs_tokens, keep, min_trials)");
      }
    }
    if (c.metric.empty())
      return Error(n.line, absl::StrCat(path, ".metric"),
                   "is required (loss, heldout_loss or heldout_loss/<dataset>)");
    if ((rungs == nullptr) == (rungs_tokens == nullptr)) {
      return Error(n.line, absl::StrCat(path, ".rungs"),
                   "give exactly one of rungs (steps) and rungs_tokens");
    }
    const v1::TrainSpec& t = cell.spec.train();
    const int64_t tokens_per_step = std::max<int64_t>(1, t.has_batch_size() ? t.batch_size() : 1) *
                                    std::max<int64_t>(1, t.has_grad_accum() ? t.grad_accum() : 1) *
                                    std::max<int64_t>(1, t.data().seq_len());
    const YamlNode& list = rungs != nullptr ? *rungs : *rungs_tokens;
    const std::string lpath = absl::StrCat(path, rungs != nullptr ? ".rungs" : ".rungs_tokens");
    if (!list.IsSequence() || list.items.empty() || list.items.size() > 16) {
      return Error(list.line, lpath, "must be a list of 1 to 16 ascending positive numbers");
    }
    for (const YamlNode& r : list.items) {
      int64_t v = 0;
      if (!r.IsScalar() || !absl::SimpleAtoi(r.scalar, &v) || v < 1) {
        return Error(r.line, lpath,
                     absl::StrCat("'", r.scalar, "' must be a positive whole number"));
      }
      // Tokens become the first step whose tokens reach them.
      const int64_t step = rungs != nullptr ? v : (v + tokens_per_step - 1) / tokens_per_step;
      if (!c.rungs.empty() && step <= c.rungs.back()) {
        return Error(r.line, lpath,
                     rungs != nullptr
                         ? "must ascend"
                         : absl::StrCat("must ascend (", v, " tokens is step ", step, ")"));
      }
      c.rungs.push_back(step);
    }
    const int64_t total = t.has_steps() ? t.steps()
                          : t.has_max_tokens()
                              ? (t.max_tokens() + tokens_per_step - 1) / tokens_per_step
                              : 0;
    if (total > 0 && c.rungs.back() >= total) {
      return Error(
          list.line, lpath,
          absl::StrCat("rung at step ", c.rungs.back(), " is not before the end of training (",
                       total, " steps) in cell ", cell.job_name));
    }
    if (absl::StartsWith(c.metric, "heldout_loss") &&
        !(t.eval().has_every() && t.eval().every() > 0)) {
      return Error(n.line, absl::StrCat(path, ".metric"),
                   absl::StrCat(c.metric, " is reported only with train.eval.every > 0 (in cell ",
                                cell.job_name, ")"));
    }
    std::string label = FormatEarlyStop(c);
    if (label.size() > 253)
      return Error(list.line, lpath, "too long once written as a label (fewer rungs)");
    return label;
  }

  static bool ValidLabel(const std::string& key) {
    if (key.empty() || key.size() > 63) return false;
    for (char c : key) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.')
        return false;
    }
    return true;
  }

  static std::string CellDir(const std::string& stage, const Coords& c) {
    std::string dir = stage;
    for (const auto& [a, v] : c) absl::StrAppend(&dir, "/", a, "=", v);
    return dir;
  }

  // `models: {PATH: {params: N, layers: L}}`: sizes of models that are not readable where
  // the plan is made (a cluster's checkpoints), for the GPU-hours estimate.
  absl::Status ReadModels(const YamlNode& value) {
    if (!value.IsMap())
      return Error(value.line, "models", "must be a mapping of model path to {params, layers}");
    for (size_t m = 0; m + 1 < value.items.size(); m += 2) {
      const std::string& path = value.items[m].scalar;
      const YamlNode& info = value.items[m + 1];
      const std::string where = absl::StrCat("models.", path);
      if (!info.IsMap()) return Error(info.line, where, "must be a mapping {params: N, layers: L}");
      int64_t params = 0;
      for (size_t f = 0; f + 1 < info.items.size(); f += 2) {
        const std::string& field = info.items[f].scalar;
        const YamlNode& v = info.items[f + 1];
        double number = 0;
        if (!v.IsScalar() || !absl::SimpleAtod(v.scalar, &number) || number <= 0 || number > 1e15) {
          return Error(v.line, absl::StrCat(where, ".", field), "must be a positive number");
        }
        if (field == "params") {
          params = static_cast<int64_t>(number);
        } else if (field != "layers") {
          return Error(info.items[f].line, absl::StrCat(where, ".", field),
                       "unknown field (allowed: params, layers)");
        }
      }
      if (params <= 0) return Error(info.line, absl::StrCat(where, ".params"), "is required");
      model_params_[path] = params;
    }
    return absl::OkStatus();
  }
  // Parameters of the model a spec reads: an upstream cell's output (as estimated for that
  // cell), a model declared under `models:`, or a readable config.json.
  std::optional<int64_t> InputParams(const std::string& model,
                                     const std::map<std::string, int64_t>& produced) const {
    if (model.rfind("${{ ", 0) == 0) {
      const size_t dot = model.rfind(".outputs.");
      if (dot == std::string::npos) return std::nullopt;
      auto it = produced.find(model.substr(4, dot - 4));
      return it == produced.end() ? std::nullopt : std::optional<int64_t>(it->second);
    }
    if (auto it = model_params_.find(model); it != model_params_.end()) return it->second;
    return ModelParams(model);
  }
  // An init cell's model from its sizes (the byte tokenizer's 259 ids unless vocab_size).
  static std::optional<int64_t> InitParams(const pb::Message& init) {
    auto get = [&](const char* name) -> int64_t {
      const pb::FieldDescriptor* f = init.GetDescriptor()->FindFieldByName(name);
      if (f == nullptr || f->is_repeated() || !init.GetReflection()->HasField(init, f)) return 0;
      if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_INT64)
        return init.GetReflection()->GetInt64(init, f);
      if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_INT32)
        return init.GetReflection()->GetInt32(init, f);
      return 0;
    };
    const int64_t layers = get("num_layers"), d = get("hidden_size"),
                  ffn = get("intermediate_size");
    if (layers <= 0 || d <= 0 || ffn <= 0) return std::nullopt;  // preset sizes live in the engine
    const int64_t vocab = get("vocab_size") > 0 ? get("vocab_size") : 259;
    const int64_t experts = std::max<int64_t>(1, get("num_experts"));
    return layers * (4 * d * d + experts * 3 * d * ffn) + 2 * vocab * d;
  }
  void Totals() {
    std::map<std::string, int> index;
    for (size_t i = 0; i < plan_.cells.size(); ++i)
      index[plan_.cells[i].job_name] = static_cast<int>(i);
    std::map<std::string, int64_t> produced;  // cell → estimated parameters of its model output
    for (const PlanCell& c : plan_.cells) {
      plan_.edges += c.spec.depends_on_size();
      plan_.gpus += static_cast<int64_t>(std::max(0, c.spec.resources().gpus())) *
                    std::max(1, c.spec.nodes());
      if (c.spec.has_init()) {
        if (auto p = InitParams(c.spec.init())) produced[c.job_name] = *p;
        continue;
      }
      if (const pb::Message* engine = EngineSpecOf(c.spec);
          engine != nullptr && !c.spec.has_train()) {
        // Merges, reverts, grafts keep the size of what they read; an upcycle multiplies the
        // FFN (about two thirds of a block) by its experts.
        if (auto p = InputParams(FirstInputModel(*engine), produced)) {
          int64_t n = *p;
          if (c.spec.has_upcycle())
            n += static_cast<int64_t>(
                static_cast<double>(n) * 2.0 / 3.0 *
                static_cast<double>(std::max<int64_t>(0, c.spec.upcycle().experts() - 1)));
          produced[c.job_name] = n;
        }
        continue;
      }
      if (!c.spec.has_train()) continue;
      const v1::JobSpec& s = c.spec;
      // 6·N·D: parameters from the model it reads, tokens from the budget.
      const std::string model = FirstInputModel(s.train());
      std::optional<int64_t> params = InputParams(model, produced);
      if (params.has_value()) produced[c.job_name] = *params;
      const double tokens = TrainTokens(s);
      if (!params.has_value() || tokens <= 0) {
        ++plan_.unknown_cost_cells;
        continue;
      }
      plan_.gpu_hours_estimate +=
          6.0 * static_cast<double>(*params) * tokens / (400e12 * 0.4) / 3600.0;
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
        case pb::FieldDescriptor::CPPTYPE_INT64:
          return static_cast<double>(m.GetReflection()->GetInt64(m, f));
        case pb::FieldDescriptor::CPPTYPE_INT32:
          return m.GetReflection()->GetInt32(m, f);
        case pb::FieldDescriptor::CPPTYPE_DOUBLE:
          return m.GetReflection()->GetDouble(m, f);
        default:
          return 0;
      }
    };
    if (double max_tokens = number(t, "max_tokens"); max_tokens > 0) return max_tokens;
    double seq = 0;
    if (const pb::FieldDescriptor* data = d->FindFieldByName("data");
        data != nullptr && data->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE &&
        r->HasField(t, data)) {
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
  std::map<std::string, int64_t> model_params_;  // `models:` declarations
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
  if (kind == "prepare") return {"corpus"};
  if (kind == "eval") return {"results"};
  if (kind == "analyze")
    return {"results", "mask", "random_mask", "selection", "routing", "drift", "alignment"};
  return {};
}

absl::StatusOr<ExperimentPlan> ExpandExperiment(std::string_view text, std::string_view file) {
  return Expander(file).Run(text);
}

std::string FormatPlan(const ExperimentPlan& plan) {
  std::string out =
      absl::StrCat("experiment ", plan.name, ": ", plan.stages.size(), " stages, ",
                   plan.cells.size(), " jobs, ", plan.edges, " edges, ", plan.gpus, " GPUs\n");
  for (const PlanStage& s : plan.stages) {
    absl::StrAppend(&out, "  ", s.name, " (", s.kind, ", ", s.cells,
                    s.cells == 1 ? " job" : " jobs");
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
