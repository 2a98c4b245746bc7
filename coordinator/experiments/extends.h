// `extends:` — an experiment file written as overrides over another (a paper-scale twin over
// the tiny file): the base's tree with the file's own mapping merged over it. The base is
// one of the files the client sent beside the text (SubmitExperimentRequest.imports, read by
// the CLI relative to the experiment file); the coordinator reads no client files. The same
// merge applies a matrix variant's fields over its stage (matrix.h). Pure: no store, no
// clock, no files.
//
// The merge (Helm's and Kustomize's rule for values):
//   - two mappings merge key by key, recursively; keys only the override has are appended;
//   - anything else (a list, a scalar, a mapping over a scalar) replaces the base's value:
//     lists are replaced whole, never concatenated;
//   - a key whose override is null (`key: ~` or `key: null`) is deleted from the result.
// A base may extend another (at most 8 deep); a cycle is an error.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/yaml_json.h"

namespace stemma::experiments {

// `over` merged over `base` by the rules above.
YamlNode MergeYaml(const YamlNode& base, const YamlNode& over);

// `root` (the file's one document, named `file`) with its `extends:` resolved against
// `imports` (name as written → text), recursively; `root` itself when it extends nothing.
// InvalidArgument "<file>: line L: extends: <problem>" for a base that was not sent, is not
// one mapping, or forms a cycle.
absl::StatusOr<YamlNode> ResolveExtends(const YamlNode& root, std::string_view file,
                                        const std::map<std::string, std::string>& imports);

// For the fields no expression is evaluated in (names, `needs` stages, `cache`,
// `early_stop`, `search`, `models`): InvalidArgument naming the field ("<file>: line L:
// <path>.<key>: expressions are not evaluated here ...") when `node` holds one, so that none
// is taken literally.
absl::Status RefuseExpressions(const YamlNode& node, std::string_view file,
                               const std::string& path);

}  // namespace stemma::experiments
