// A stage's `matrix:`: its axes (lists, distributions, a variable holding a list), the cells
// a grid or random search makes of them (search.h), then GitHub Actions' exclude and include.
// Pure: no store, no clock, no files.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/yaml_json.h"
#include "coordinator/experiments/search.h"

namespace stemma::experiments {

// A list axis may hold named variants: mappings with a `name` (the value the cell's name
// and `${{ matrix.AXIS }}` use) and the fields the variant sets on its stage's job, merged
// over the stage's own as `extends:` merges (extends.h):
//   strategy: [{name: vanilla}, {name: freeze, train: {strategy: {freeze: {layers: [middle]}}}}]
// `${{ matrix.strategy.train }}` reads a variant's field.
using Variants = std::map<std::string, std::map<std::string, YamlNode>>;  // axis → name → fields

struct Matrix {
  std::vector<std::string> axes;  // in matrix order, then axes only an include adds
  std::vector<Coords> cells;      // each in axis order; distinct
  Variants variants;
};

// Evaluates what a matrix holds as an expression (`lr: ${{ vars.lrs }}`, an include list or
// a value in it) at `path`, with only variables known.
using AxisExpression =
    std::function<absl::StatusOr<YamlNode>(const YamlNode& value, const std::string& path)>;

// The cells of stage `stage`'s matrix `m` (null or empty: one cell without coordinates).
// Errors are InvalidArgument "<file>: line L: stages.<stage>.matrix...: <problem>".
absl::StatusOr<Matrix> ReadMatrix(const YamlNode* m, const std::string& stage,
                                  std::string_view file, const AxisExpression& expression);

// `<stage>[axis=value,...]`, or the stage's name for a cell without coordinates.
std::string CellName(const std::string& stage, const Coords& c);

}  // namespace stemma::experiments
