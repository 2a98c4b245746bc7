// `${{ }}` expressions of an experiment file, evaluated cell by cell:
//   vars.X                  a variable (any YAML value; it may hold expressions itself)
//   vars.X.k, vars.X[E]     a key of a mapping variable: literal, or looked up by an expression
//                           (`vars.lr[matrix.family]`: a per-cell value that is not an axis)
//   matrix.X                this cell's coordinate on axis X
//   matrix.X.f              field f of the cell's variant on axis X (matrix.h)
//   needs.S.outputs.O       output O of the cell(s) of stage S this cell reads: a wiring token
//                           (OutputToken) the coordinator replaces with the path at release
//   needs.S.matrix.K        coordinate K of the cell of S read
// A scalar that is only an expression takes the value's type; text around expressions makes
// a string. In a list, an item that reads `needs.S` becomes one item per cell of S read
// (fan-in). Pure: no store, no clock, no files.
#pragma once

#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/yaml_json.h"
#include "coordinator/experiments/experiment_file.h"
#include "coordinator/experiments/experiment_plan.h"

namespace stemma::experiments {

// The cell an expression is evaluated in (no stage: while reading a matrix, where only
// variables are known).
struct CellContext {
  const StageDef* def = nullptr;
  const Coords* coords = nullptr;
  std::set<std::string>* reads = nullptr;  // job names whose outputs it reads, so far
};

class Expressions {
 public:
  // `plan` holds the stages and cells expanded so far (the upstream ones); both it and
  // `file` outlive this.
  Expressions(std::string_view file_name, const ExperimentFile& file, const ExperimentPlan& plan)
      : file_name_(file_name), file_(file), plan_(plan) {}

  // `node` with every expression substituted for cell `ctx`; `path` names it in errors.
  // `target` is the one upstream cell a fan-in item reads, or -1.
  absl::StatusOr<YamlNode> Substitute(const YamlNode& node, const CellContext& ctx,
                                      const std::string& path, int target = -1);

  // The upstream cells (indexes into the plan's cells) of need `stage` that a cell of `def`
  // with `coords` reads; InvalidArgument when the stage is not needed or no cell matches.
  absl::StatusOr<std::vector<int>> Matching(const StageDef& def, const Coords& coords,
                                            const std::string& stage, int line,
                                            const std::string& path) const;

 private:
  absl::Status Error(int line, std::string_view path, std::string_view what) const;
  absl::StatusOr<YamlNode> SubstituteScalar(const YamlNode& node, const CellContext& ctx,
                                            const std::string& path, int target);
  absl::StatusOr<YamlNode> SubstituteList(const YamlNode& node, const CellContext& ctx,
                                          const std::string& path, int target);
  absl::StatusOr<YamlNode> Evaluate(std::string_view expr, const YamlNode& at,
                                    const CellContext& ctx, const std::string& path, int target);
  // `value` read along `rest` (".key", "[expr]", "['key']", "[0]", ...); `what` names the
  // expression so far in errors.
  absl::StatusOr<YamlNode> Access(YamlNode value, std::string_view rest, std::string what,
                                  const YamlNode& at, const CellContext& ctx,
                                  const std::string& path, int target);
  absl::StatusOr<std::string> Key(std::string_view inner, const YamlNode& at,
                                  const CellContext& ctx, const std::string& path, int target);
  absl::StatusOr<YamlNode> MatrixValue(const std::string& e, const YamlNode& at,
                                       const CellContext& ctx, const std::string& path, int target);
  absl::StatusOr<YamlNode> Variable(const std::string& name, const YamlNode& at,
                                    const CellContext& ctx, const std::string& path, int target);
  absl::StatusOr<YamlNode> Needs(const std::string& e, const YamlNode& at, const CellContext& ctx,
                                 const std::string& path, int target);
  // The one upstream cell of `stage` read here: `target`, or the only matching cell.
  absl::StatusOr<int> OneCell(const std::string& stage, const YamlNode& at, const CellContext& ctx,
                              const std::string& path, int target, const char* many) const;
  const PlanStage* FindStage(const std::string& name) const;
  std::string VarNames() const;

  std::string file_name_;
  const ExperimentFile& file_;
  const ExperimentPlan& plan_;
  int depth_ = 0;  // variables within variables
};

// True when `s` holds an expression.
inline bool IsExpression(std::string_view s) { return s.find("${{") != std::string_view::npos; }

}  // namespace stemma::experiments
