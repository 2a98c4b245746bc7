// One JSON object from a line of a JSONL file (datasets, translation pairs): the engine's
// readers share this so that their errors read alike.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

#include "absl/status/statusor.h"

namespace stemma {

// One JSON object: InvalidArgument "<where>: bad JSON: ..." or "<where>: expected a JSON
// object, got <type>" otherwise.
absl::StatusOr<nlohmann::json> ParseJsonObject(std::string_view text, std::string_view where);

}  // namespace stemma
