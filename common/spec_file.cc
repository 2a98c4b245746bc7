#include "common/spec_file.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "common/yaml_json.h"

namespace stemma {

absl::StatusOr<nlohmann::json> ParseSpecText(std::string_view text, std::string_view where) {
  ASSIGN_OR_RETURN(std::vector<YamlNode> docs, LoadYamlDocuments(text, where));
  if (docs.empty() || !docs[0].IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(where), ": the spec must be a mapping"));
  }
  std::string json;
  AppendYamlAsJson(docs[0], &json);
  nlohmann::json parsed = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(where), ": cannot be read as JSON"));
  }
  return parsed;
}

absl::StatusOr<nlohmann::json> ReadSpecFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the spec file"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseSpecText(buffer.str(), path);
}

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

absl::Status CheckKeys(const nlohmann::json& object,
                       std::initializer_list<std::string_view> allowed, std::string_view where) {
  if (!object.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(where), ": expected a mapping"));
  }
  std::vector<std::string> names(allowed.begin(), allowed.end());
  for (const auto& [key, value] : object.items()) {
    bool known = false;
    for (std::string_view a : allowed) known |= key == a;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(where), ": unknown field '", key,
                                                     "' (allowed: ", absl::StrJoin(names, ", "),
                                                     ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace stemma
