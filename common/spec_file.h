// Spec files of engine commands (`stemma-engine train|merge|eval|analyze --spec FILE`): YAML
// or JSON documents read into nlohmann::json, with errors that name the file and the field.
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stemma {

// Parses one YAML document (JSON is YAML too). `where` names the source in errors
// ("spec.yaml: line 3, column 5: ...").
absl::StatusOr<nlohmann::json> ParseSpecText(std::string_view text, std::string_view where);

// Reads and parses FILE; NotFound / InvalidArgument errors name it.
absl::StatusOr<nlohmann::json> ReadSpecFile(const std::string& path);

// One JSON object, e.g. a line of a JSONL file: InvalidArgument "<where>: bad JSON: ..." or
// "<where>: expected a JSON object, got <type>" otherwise.
absl::StatusOr<nlohmann::json> ParseJsonObject(std::string_view text, std::string_view where);

// InvalidArgument unless `object` is a JSON object whose keys are all in `allowed`; the error
// names `where` (e.g. "spec.yaml: optimizer"), the unknown key and the keys allowed there.
absl::Status CheckKeys(const nlohmann::json& object,
                       std::initializer_list<std::string_view> allowed, std::string_view where);

}  // namespace stemma
