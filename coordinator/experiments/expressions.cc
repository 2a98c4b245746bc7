#include "coordinator/experiments/expressions.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/proto_yaml.h"
#include "common/status.h"
#include "coordinator/experiments/matrix.h"

namespace stemma::experiments {
namespace {

YamlNode Scalar(std::string text, int line, bool plain) {
  YamlNode n;
  n.kind = YamlNode::Kind::kScalar;
  n.scalar = std::move(text);
  n.plain = plain;
  n.line = line;
  return n;
}

// The `needs.S` stages an item's expressions read (for list fan-in).
void NeedsIn(const YamlNode& n, std::set<std::string>* stages) {
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

}  // namespace

absl::Status Expressions::Error(int line, std::string_view path, std::string_view what) const {
  return SpecError(file_name_, line, path, what);
}

const PlanStage* Expressions::FindStage(const std::string& name) const {
  for (const PlanStage& s : plan_.stages) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::string Expressions::VarNames() const {
  std::vector<std::string> names;
  for (const auto& [k, v] : file_.vars) names.push_back(k);
  return names.empty() ? "none" : absl::StrJoin(names, ", ");
}

absl::StatusOr<std::vector<int>> Expressions::Matching(const StageDef& def, const Coords& coords,
                                                       const std::string& stage, int line,
                                                       const std::string& path) const {
  const Need* need = nullptr;
  for (const Need& n : def.needs) {
    if (n.stage == stage) need = &n;
  }
  const PlanStage* up = FindStage(stage);
  if (need == nullptr || up == nullptr) {
    return Error(line, path, absl::StrCat("stage '", stage, "' is not in this stage's needs"));
  }
  std::vector<int> out;
  for (int i = up->first_cell; i < up->first_cell + up->cells; ++i) {
    const Coords& uc = plan_.cells[i].coords;
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

absl::StatusOr<int> Expressions::OneCell(const std::string& stage, const YamlNode& at,
                                         const CellContext& ctx, const std::string& path,
                                         int target, const char* many) const {
  if (target >= 0) return target;
  ASSIGN_OR_RETURN(std::vector<int> m, Matching(*ctx.def, *ctx.coords, stage, at.line, path));
  if (m.size() != 1) {
    return Error(at.line, path,
                 absl::StrCat("reads ", m.size(), " cells of stage '", stage, "'", many));
  }
  return m[0];
}

absl::StatusOr<YamlNode> Expressions::Variable(const std::string& name, const YamlNode& at,
                                               const CellContext& ctx, const std::string& path,
                                               int target) {
  auto it = file_.vars.find(name);
  if (it == file_.vars.end()) {
    return Error(at.line, path,
                 absl::StrCat("unknown variable '", name, "' (vars: ", VarNames(), ")"));
  }
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

absl::StatusOr<YamlNode> Expressions::Needs(const std::string& e, const YamlNode& at,
                                            const CellContext& ctx, const std::string& path,
                                            int target) {
  const std::vector<std::string> parts = absl::StrSplit(e, '.');
  if (parts.size() == 4 && parts[2] == "matrix" && FindStage(parts[1]) != nullptr) {
    // A coordinate of the upstream cell read (in a fan-in item: that item's cell).
    ASSIGN_OR_RETURN(int cell, OneCell(parts[1], at, ctx, path, target, ""));
    if (!Has(plan_.cells[cell].coords, parts[3])) {
      return Error(at.line, path,
                   absl::StrCat("stage '", parts[1], "' has no matrix key '", parts[3], "'"));
    }
    return Scalar(Get(plan_.cells[cell].coords, parts[3]), at.line, true);
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
  const PlanStage* up = FindStage(stage);
  if (up == nullptr) {
    return Error(at.line, path, absl::StrCat("stage '", stage, "' is not in this stage's needs"));
  }
  std::vector<std::string> outs = OutputsOfKind(up->kind);
  if (up->kind == "exec" && up->cells > 0) {  // an exec stage's are the ones it declares
    for (const auto& [name, declared] : plan_.cells[up->first_cell].spec.exec().outputs())
      outs.push_back(name);
    std::sort(outs.begin(), outs.end());
  }
  if (std::find(outs.begin(), outs.end(), output) == outs.end()) {
    return Error(
        at.line, path,
        absl::StrCat("stage '", stage, "' (", up->kind, ") has no output '", output,
                     "' (outputs: ", outs.empty() ? "none" : absl::StrJoin(outs, ", "), ")"));
  }
  ASSIGN_OR_RETURN(int cell,
                   OneCell(stage, at, ctx, path, target,
                           "; put it in a list to take them all, or narrow the need with where"));
  ctx.reads->insert(plan_.cells[cell].job_name);
  return Scalar(OutputToken(plan_.cells[cell].job_name, output), at.line, false);
}

absl::StatusOr<std::string> Expressions::Key(std::string_view inner, const YamlNode& at,
                                             const CellContext& ctx, const std::string& path,
                                             int target) {
  std::string k(absl::StripAsciiWhitespace(absl::string_view(inner.data(), inner.size())));
  if (k.size() >= 2 && (k[0] == '\'' || k[0] == '"') && k.back() == k[0])
    return k.substr(1, k.size() - 2);
  if (!k.empty() && std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return k;
  if (absl::StartsWith(k, "vars.") || absl::StartsWith(k, "matrix.") ||
      absl::StartsWith(k, "needs.")) {
    ASSIGN_OR_RETURN(YamlNode v, Evaluate(k, at, ctx, path, target));
    if (!v.IsScalar())
      return Error(at.line, path, absl::StrCat("[", k, "] must be a single value to look up"));
    return v.scalar;
  }
  return Error(at.line, path,
               absl::StrCat("[", k, "]: quote a literal key ('", k,
                            "') or look up by an expression ([matrix.AXIS])"));
}

absl::StatusOr<YamlNode> Expressions::Access(YamlNode value, std::string_view rest,
                                             std::string what, const YamlNode& at,
                                             const CellContext& ctx, const std::string& path,
                                             int target) {
  while (!rest.empty()) {
    const std::string before = what;
    std::string key;
    if (rest[0] == '.') {
      const size_t cut = rest.find_first_of(".[", 1);
      key = std::string(rest.substr(1, cut == std::string_view::npos ? cut : cut - 1));
      rest = cut == std::string_view::npos ? std::string_view() : rest.substr(cut);
      absl::StrAppend(&what, ".", key);
    } else if (rest[0] == '[') {
      const size_t close = rest.find(']');
      if (close == std::string_view::npos)
        return Error(at.line, path, absl::StrCat("'[' without ']' after ", what));
      ASSIGN_OR_RETURN(key, Key(rest.substr(1, close - 1), at, ctx, path, target));
      absl::StrAppend(&what, "[", key, "]");
      rest = rest.substr(close + 1);
    } else {
      return Error(at.line, path,
                   absl::StrCat("cannot read '", std::string(rest), "' after ", what));
    }
    const YamlNode* next = nullptr;
    size_t index = 0;
    if (value.IsMap()) {
      next = value.Find(key);
    } else if (value.IsSequence() && absl::SimpleAtoi(key, &index) && index < value.items.size()) {
      next = &value.items[index];
    } else {
      return Error(
          at.line, path,
          absl::StrCat(what, ": ", before, " is not a mapping (nor a list and an index in it)"));
    }
    if (next == nullptr) {
      std::vector<std::string> keys;
      for (size_t k = 0; k + 1 < value.items.size(); k += 2) keys.push_back(value.items[k].scalar);
      return Error(at.line, path,
                   absl::StrCat(what, ": no key '", key, "' (keys: ",
                                keys.empty() ? "none" : absl::StrJoin(keys, ", "), ")"));
    }
    YamlNode copy = *next;
    value = std::move(copy);
  }
  if (value.IsScalar()) value.line = at.line;
  return value;
}

absl::StatusOr<YamlNode> Expressions::MatrixValue(const std::string& e, const YamlNode& at,
                                                  const CellContext& ctx, const std::string& path,
                                                  int target) {
  const std::string rest = e.substr(7);
  const size_t cut = rest.find_first_of(".[");
  const std::string axis = rest.substr(0, cut);
  if (ctx.coords == nullptr) {
    return Error(at.line, path,
                 absl::StrCat("${{ ", e, " }}: only ${{ vars.X }} is known here (a matrix, ",
                              "include, exclude or where is read before any cell)"));
  }
  if (!Has(*ctx.coords, axis)) {
    return Error(at.line, path,
                 absl::StrCat("matrix key '", axis, "' is not defined for this cell (axes: ",
                              ctx.def != nullptr ? absl::StrJoin(ctx.def->axes, ", ") : "", ")"));
  }
  const std::string value = Get(*ctx.coords, axis);
  if (cut == std::string::npos) return Scalar(value, at.line, true);
  auto variants = ctx.def->variants.find(axis);
  if (variants == ctx.def->variants.end() || variants->second.count(value) == 0) {
    return Error(at.line, path,
                 absl::StrCat("axis '", axis, "' has no variants ({name: N, FIELD: ...}): ${{ ",
                              "matrix.", axis, " }} is its value"));
  }
  ASSIGN_OR_RETURN(YamlNode fields, Substitute(variants->second.at(value), ctx, path, target));
  return Access(std::move(fields), std::string_view(rest).substr(cut),
                absl::StrCat("matrix.", axis), at, ctx, path, target);
}

absl::StatusOr<YamlNode> Expressions::Evaluate(std::string_view expr, const YamlNode& at,
                                               const CellContext& ctx, const std::string& path,
                                               int target) {
  std::string e(absl::StripAsciiWhitespace(absl::string_view(expr.data(), expr.size())));
  if (absl::StartsWith(e, "vars.")) {
    const std::string rest = e.substr(5);
    if (file_.vars.count(rest) > 0) return Variable(rest, at, ctx, path, target);
    const size_t cut = rest.find_first_of(".[");
    ASSIGN_OR_RETURN(YamlNode v, Variable(rest.substr(0, cut), at, ctx, path, target));
    if (cut == std::string::npos) return v;
    return Access(std::move(v), std::string_view(rest).substr(cut),
                  absl::StrCat("vars.", rest.substr(0, cut)), at, ctx, path, target);
  }
  if (absl::StartsWith(e, "matrix.")) return MatrixValue(e, at, ctx, path, target);
  if (absl::StartsWith(e, "needs.")) {
    if (ctx.def == nullptr) {
      return Error(at.line, path,
                   absl::StrCat("${{ ", e, " }}: only ${{ vars.X }} is known here (a matrix, ",
                                "include, exclude or where is read before any cell)"));
    }
    return Needs(e, at, ctx, path, target);
  }
  return Error(at.line, path,
               absl::StrCat("unknown expression '${{ ", e,
                            " }}' (use vars.X, matrix.X or needs.S.outputs.O)"));
}

// A scalar with expressions: a whole-scalar expression takes the value (any node); text
// around expressions makes a string.
absl::StatusOr<YamlNode> Expressions::SubstituteScalar(const YamlNode& node, const CellContext& ctx,
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

absl::StatusOr<YamlNode> Expressions::SubstituteList(const YamlNode& node, const CellContext& ctx,
                                                     const std::string& path, int target) {
  YamlNode out = node;
  out.items.clear();
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
      for (YamlNode& x : v.items) out.items.push_back(std::move(x));  // a list variable spliced in
    } else {
      out.items.push_back(std::move(v));
    }
  }
  return out;
}

absl::StatusOr<YamlNode> Expressions::Substitute(const YamlNode& node, const CellContext& ctx,
                                                 const std::string& path, int target) {
  if (node.IsScalar()) return SubstituteScalar(node, ctx, path, target);
  if (node.IsSequence()) return SubstituteList(node, ctx, path, target);
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
  }
  return out;
}

}  // namespace stemma::experiments
