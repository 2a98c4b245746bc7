#include "common/json_line.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace stemma {

absl::StatusOr<nlohmann::json> ParseJsonObject(std::string_view text, std::string_view where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(where), ": bad JSON: ", e.what()));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(where), ": expected a JSON object, got ", j.type_name()));
  }
  return j;
}

}  // namespace stemma
