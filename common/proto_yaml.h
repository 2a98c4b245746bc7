// YAML (and JSON, which is YAML) straight into a protobuf message by reflection: what job
// files, experiment files and engine spec files share. Field names are the proto's
// (snake_case) or their JSON camelCase. Errors are InvalidArgument
// "<where>: line L: <field path>: <problem>", e.g.
//   "train.yaml: line 4: train.stepz: unknown field (allowed: model, out, data, ...)".
#pragma once

#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/yaml_json.h"
#include "google/protobuf/message.h"

namespace stemma {

// Where each field of a message read from YAML was written: "train.optimizer.lr" → line 7.
// Checks that run after reading (ranges, cross-field rules) use it to name the line.
class FieldLines {
 public:
  void Set(std::string path, int line) { lines_[std::move(path)] = line; }
  // The line of `path`, or of its nearest enclosing field that has one; 0 when unknown.
  int Line(std::string_view path) const;
  bool empty() const { return lines_.empty(); }

 private:
  absl::flat_hash_map<std::string, int> lines_;
};

// Reads `node` (a mapping) into `msg`, merging into what it holds. `where` names the source
// ("job.yaml", "job.yaml document 3"); `path` is the field path of `msg` itself ("" at the
// top, "train" for a job's engine spec). `lines` may be null.
//
// Besides the proto's types: a scalar for a repeated field is refused; a field whose rules
// (stemma/v1/spec_options.proto) give it ROLE_LAYER_RANGE refuses a bare integer, which
// earlier versions read as an inclusive bound ([2, 5] meant layers 2..5).
absl::Status ReadYamlInto(const YamlNode& node, google::protobuf::Message* msg,
                          std::string_view where, const std::string& path, FieldLines* lines);

// "<where>: line L: <path>: <what>" (no line part when line is 0; no path part when empty).
absl::Status SpecError(std::string_view where, int line, std::string_view path,
                       std::string_view what);

}  // namespace stemma
