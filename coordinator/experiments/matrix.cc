#include "coordinator/experiments/matrix.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/proto_yaml.h"
#include "common/status.h"
#include "coordinator/experiments/extends.h"

namespace stemma::experiments {
namespace {

bool IsExpression(std::string_view s) { return s.find("${{") != std::string_view::npos; }

// What a matrix holds besides its cells' product.
struct MatrixParts {
  std::vector<Axis> axes;
  Search search;
  const YamlNode* include = nullptr;
  const YamlNode* exclude = nullptr;
};

// A list axis whose items are named variants ({name: N, FIELD: ...}): the names are the
// axis's values, the other fields go to `variants`.
absl::StatusOr<Axis> VariantAxis(const std::vector<YamlNode>& items, int line,
                                 std::string_view file, const std::string& path,
                                 std::map<std::string, YamlNode>* variants) {
  std::vector<YamlNode> names;
  for (size_t i = 0; i < items.size(); ++i) {
    const YamlNode& item = items[i];
    const std::string ipath = absl::StrCat(path, "[", i, "]");
    const YamlNode* name = item.IsMap() ? item.Find("name") : nullptr;
    if (name == nullptr || !name->IsScalar() || name->scalar.empty()) {
      return SpecError(file, item.line, ipath,
                       "a variant is a mapping with a name: {name: N, FIELD: ...} (the other "
                       "items of the axis are variants too)");
    }
    RETURN_IF_ERROR(RefuseExpressions(*name, file, absl::StrCat(ipath, ".name")));
    YamlNode fields = item;
    fields.items.clear();
    for (size_t k = 0; k + 1 < item.items.size(); k += 2) {
      if (item.items[k].scalar == "name") continue;
      fields.items.push_back(item.items[k]);
      fields.items.push_back(item.items[k + 1]);
    }
    if (!variants->emplace(name->scalar, std::move(fields)).second)
      return SpecError(file, name->line, ipath, absl::StrCat("variant '", name->scalar, "' twice"));
    names.push_back(*name);
  }
  return ListAxis(names, line, file, path);
}

// A list axis: values, or named variants when any item is a mapping.
absl::StatusOr<Axis> ListOrVariants(const std::vector<YamlNode>& items, int line,
                                    std::string_view file, const std::string& path,
                                    const std::string& axis, Variants* variants) {
  for (const YamlNode& item : items) {
    if (item.IsMap()) return VariantAxis(items, line, file, path, &(*variants)[axis]);
  }
  return ListAxis(items, line, file, path);
}

// The axes of `m` in order, its search and its include/exclude lists.
absl::StatusOr<MatrixParts> ReadAxes(const YamlNode& m, const std::string& mpath,
                                     std::string_view file, const AxisExpression& expression,
                                     std::vector<std::string>* names, Variants* variants) {
  MatrixParts parts;
  for (size_t k = 0; k + 1 < m.items.size(); k += 2) {
    const std::string& axis = m.items[k].scalar;
    const YamlNode& values = m.items[k + 1];
    const std::string path = absl::StrCat(mpath, ".", axis);
    if (axis == "include" || axis == "exclude") {
      (axis == "include" ? parts.include : parts.exclude) = &values;
      continue;
    }
    if (axis == "search") {
      RETURN_IF_ERROR(RefuseExpressions(values, file, path));
      RETURN_IF_ERROR(ReadSearch(values, file, path, &parts.search));
      continue;
    }
    RETURN_IF_ERROR(RefuseExpressions(m.items[k], file, path));
    if (axis.empty() || axis.find_first_of(" .[]=,$") != std::string::npos) {
      return SpecError(file, m.items[k].line, path,
                       "an axis name has no spaces, dots, brackets or commas");
    }
    Axis a;
    if (values.IsMap()) {
      // A distribution: {uniform: [lo, hi]}, {loguniform: [lo, hi]}, {int: [lo, hi]},
      // {choice: [a, b, ...]}.
      RETURN_IF_ERROR(RefuseExpressions(values, file, path));
      ASSIGN_OR_RETURN(a, ReadDistribution(values, file, path));
    } else if (values.IsSequence() &&
               std::any_of(values.items.begin(), values.items.end(),
                           [](const YamlNode& item) { return item.IsMap(); })) {
      // Named variants: their fields are substituted per cell, as the stage's own.
      ASSIGN_OR_RETURN(a, VariantAxis(values.items, values.line, file, path, &(*variants)[axis]));
    } else if (values.IsSequence() || (values.IsScalar() && IsExpression(values.scalar))) {
      // A list, or a variable holding one (`lr: ${{ vars.lrs }}`); its items may hold
      // expressions of variables too.
      ASSIGN_OR_RETURN(YamlNode expanded, expression(values, path));
      if (!expanded.IsSequence())
        return SpecError(file, values.line, path, "must be a list of values");
      ASSIGN_OR_RETURN(a, ListOrVariants(expanded.items, values.line, file, path, axis, variants));
    } else {
      return SpecError(file, values.line, path, "must be a list of values");
    }
    a.name = axis;
    a.line = m.items[k].line;
    parts.axes.push_back(std::move(a));
    names->push_back(axis);
  }
  return parts;
}

// The entries of an include or exclude list: each a mapping of axis to value.
absl::StatusOr<std::vector<Coords>> Entries(const YamlNode* list, const std::string& mpath,
                                            const char* what, std::string_view file) {
  std::vector<Coords> out;
  if (list == nullptr) return out;
  if (!list->IsSequence())
    return SpecError(file, list->line, absl::StrCat(mpath, ".", what),
                     "must be a list of mappings");
  for (size_t i = 0; i < list->items.size(); ++i) {
    const YamlNode& e = list->items[i];
    if (!e.IsMap() || e.size() == 0)
      return SpecError(file, e.line, absl::StrCat(mpath, ".", what, "[", i, "]"),
                       "must be a mapping of axis to value");
    Coords c;
    for (size_t k = 0; k + 1 < e.items.size(); k += 2) {
      if (!e.items[k + 1].IsScalar())
        return SpecError(file, e.items[k + 1].line,
                         absl::StrCat(mpath, ".", what, "[", i, "].", e.items[k].scalar),
                         "must be a value");
      c.emplace_back(e.items[k].scalar, e.items[k + 1].scalar);
    }
    out.push_back(std::move(c));
  }
  return out;
}

// Exclude: an entry removes every cell it matches on all of its axes (a partial match
// removes), and names only axes of the matrix.
absl::Status Exclude(const YamlNode* exclude, const std::string& mpath, std::string_view file,
                     const std::vector<std::string>& axes, std::vector<Coords>* cells) {
  ASSIGN_OR_RETURN(std::vector<Coords> excludes, Entries(exclude, mpath, "exclude", file));
  for (size_t i = 0; i < excludes.size(); ++i) {
    for (const auto& [axis, v] : excludes[i]) {
      if (std::find(axes.begin(), axes.end(), axis) == axes.end()) {
        return SpecError(file, exclude->items[i].line,
                         absl::StrCat(mpath, ".exclude[", i, "].", axis),
                         absl::StrCat("'", axis, "' is not an axis of this matrix"));
      }
    }
    cells->erase(std::remove_if(cells->begin(), cells->end(),
                                [&](const Coords& c) {
                                  for (const auto& [axis, v] : excludes[i]) {
                                    if (Get(c, axis) != v) return false;
                                  }
                                  return true;
                                }),
                 cells->end());
  }
  return absl::OkStatus();
}

// Include: an entry extends every original cell whose original values it does not change
// (adding or overwriting the others), else it adds a cell; axes it names that the matrix
// has not become axes.
absl::Status Include(const YamlNode* include, const std::string& mpath, std::string_view file,
                     std::vector<std::string>* axes, std::vector<Coords>* cells) {
  const size_t original_axes = axes->size();
  ASSIGN_OR_RETURN(std::vector<Coords> includes, Entries(include, mpath, "include", file));
  const size_t original_cells = cells->size();
  for (const Coords& inc : includes) {
    bool extended = false;
    for (size_t ci = 0; ci < original_cells; ++ci) {
      Coords& c = (*cells)[ci];
      bool fits = true;
      for (const auto& [axis, v] : inc) {
        const bool original = std::find(axes->begin(), axes->begin() + original_axes, axis) !=
                              axes->begin() + original_axes;
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
    if (!extended) cells->push_back(inc);
    for (const auto& [axis, v] : inc) {
      if (std::find(axes->begin(), axes->end(), axis) == axes->end()) axes->push_back(axis);
    }
  }
  return absl::OkStatus();
}

// Every value a cell has on an axis of variants names one (an include may add cells).
absl::Status CheckVariants(const Variants& variants, const std::vector<Coords>& cells,
                           const YamlNode* include, const std::string& mpath,
                           std::string_view file) {
  for (const auto& [axis, named] : variants) {
    for (const Coords& c : cells) {
      if (!Has(c, axis) || named.count(Get(c, axis)) > 0) continue;
      std::vector<std::string> names;
      for (const auto& [n, fields] : named) names.push_back(n);
      return SpecError(file, include != nullptr ? include->line : 0,
                       absl::StrCat(mpath, ".include"),
                       absl::StrCat("'", Get(c, axis), "' is not a variant of axis '", axis,
                                    "' (variants: ", absl::StrJoin(names, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Matrix> ReadMatrix(const YamlNode* m, const std::string& stage,
                                  std::string_view file, const AxisExpression& expression) {
  Matrix out;
  if (m == nullptr || m->IsNull()) {
    out.cells.push_back({});
    return out;
  }
  const std::string mpath = absl::StrCat("stages.", stage, ".matrix");
  if (!m->IsMap()) return SpecError(file, m->line, mpath, "must be a mapping of axis to values");
  ASSIGN_OR_RETURN(MatrixParts parts,
                   ReadAxes(*m, mpath, file, expression, &out.axes, &out.variants));
  // include and exclude, or values in them, may come from variables.
  YamlNode include, exclude;
  for (auto [list, value, name] : {std::tuple{&parts.include, &include, "include"},
                                   std::tuple{&parts.exclude, &exclude, "exclude"}}) {
    if (*list == nullptr) continue;
    for (size_t i = 0; (*list)->IsSequence() && i < (*list)->items.size(); ++i) {
      const YamlNode& e = (*list)->items[i];
      for (size_t k = 0; e.IsMap() && k + 1 < e.items.size(); k += 2)
        RETURN_IF_ERROR(
            RefuseExpressions(e.items[k], file, absl::StrCat(mpath, ".", name, "[", i, "]")));
    }
    ASSIGN_OR_RETURN(*value, expression(**list, absl::StrCat(mpath, ".", name)));
    *list = value;
  }
  if (parts.search.random && parts.axes.empty()) {
    return SpecError(file, parts.search.line, absl::StrCat(mpath, ".search"),
                     "a random search needs at least one axis to sample");
  }
  std::vector<Coords> cells;
  if (parts.search.random) {
    cells = Sample(parts.axes, parts.search);
  } else {
    ASSIGN_OR_RETURN(cells, Grid(parts.axes, file, mpath));
  }
  // GitHub Actions' order: exclude first (a partial match removes), then include (extends a
  // cell whose original values it does not change, else adds a cell).
  RETURN_IF_ERROR(Exclude(parts.exclude, mpath, file, out.axes, &cells));
  RETURN_IF_ERROR(Include(parts.include, mpath, file, &out.axes, &cells));
  if (cells.empty())
    return SpecError(file, m->line, mpath, "has no cells (every combination was excluded)");
  RETURN_IF_ERROR(CheckVariants(out.variants, cells, parts.include, mpath, file));
  // Cells in axis order, and distinct (a random search over discrete axes may draw one
  // cell twice: it is kept once).
  std::set<std::string> seen;
  for (Coords& c : cells) {
    Coords ordered;
    for (const std::string& axis : out.axes) {
      if (Has(c, axis)) ordered.emplace_back(axis, Get(c, axis));
    }
    if (!seen.insert(CellName(stage, ordered)).second) {
      if (parts.search.random) continue;
      return SpecError(file, m->line, mpath,
                       absl::StrCat("cell ", CellName(stage, ordered), " appears twice"));
    }
    out.cells.push_back(std::move(ordered));
  }
  return out;
}

std::string CellName(const std::string& stage, const Coords& c) {
  if (c.empty()) return stage;
  std::vector<std::string> parts;
  for (const auto& [a, v] : c) parts.push_back(absl::StrCat(a, "=", v));
  return absl::StrCat(stage, "[", absl::StrJoin(parts, ","), "]");
}

}  // namespace stemma::experiments
