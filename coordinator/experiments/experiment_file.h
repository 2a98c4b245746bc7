// The envelope of an experiment file (experiment_plan.h shows one): its name, variables,
// model sizes and stages, read and checked before any cell is expanded. `name` and `models`
// are read into a v1::ExperimentFile by the one YAML→proto reader (common/proto_yaml.h), and
// each stage's `cache` and `early_stop` into a v1::ExperimentStage; variables and the stages'
// job fields hold `${{ }}` expressions, so they stay YAML until each cell substitutes them
// (expansion.h). Pure: no store, no clock, no files.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/proto_yaml.h"
#include "common/yaml_json.h"
#include "coordinator/experiments/matrix.h"
#include "coordinator/experiments/search.h"
#include "stemma/v1/experiment.pb.h"

namespace stemma::experiments {

// One entry of a stage's `needs`.
struct Need {
  std::string stage;
  std::vector<std::pair<std::string, std::vector<std::string>>> where;  // axis → allowed values
  bool all = false;  // read every cell (that passes where), whatever the shared axes say
  int line = 0;
  // `where:` as written when it holds expressions (of variables): read into `where` once
  // they are evaluated (ReadWhere), before any cell is expanded.
  const YamlNode* where_node = nullptr;
  std::string where_path;
};

// Reads a need's `where:` mapping (axis → a value or a list of values) into `need->where`.
absl::Status ReadWhere(const YamlNode& where, const std::string& path, std::string_view file,
                       Need* need);

struct StageDef {
  std::string name;
  int line = 0;
  const YamlNode* node = nullptr;  // the stage's mapping, in the file's YAML tree
  std::string kind;                // the one kind key: noop, exec, or an engine command
  std::vector<Need> needs;
  v1::ExperimentStage options;           // cache, early_stop
  FieldLines option_lines;               // where each of `options`' fields is written
  const YamlNode* early_stop = nullptr;  // `early_stop:` as written, or null
  // From the matrix (matrix.h): its axes and cells, in order.
  std::vector<std::string> axes;
  std::vector<Coords> cells;
  Variants variants;  // axis → variant name → the fields it sets on the job
};

struct ExperimentFile {
  v1::ExperimentFile envelope;                  // name, models
  std::map<std::string, const YamlNode*> vars;  // name → value, in the file's YAML tree
  std::vector<StageDef> stages;                 // in file order
  std::map<std::string, size_t> index;          // stage name → its position in `stages`
};

// Reads the envelope from `root` (the file's one document), which must outlive the result.
// Errors are InvalidArgument "<file>: line L: <path>: <problem>".
absl::StatusOr<ExperimentFile> ReadExperimentFile(const YamlNode& root, std::string_view file);

// The stages in an order where each comes after the stages it needs; InvalidArgument naming
// the stages that form a cycle.
absl::StatusOr<std::vector<size_t>> StageOrder(const ExperimentFile& f, std::string_view file);

// "stages.<name>" or "stages.<name>.<rest>": the path errors name.
std::string StagePath(const StageDef& def, std::string_view rest = "");

// True for the keys that name a stage's kind: noop, exec and the engine commands.
bool IsKind(const std::string& key);

}  // namespace stemma::experiments
