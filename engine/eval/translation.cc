#include "engine/eval/translation.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/json_line.h"
#include "common/status.h"
#include "engine/eval/eval_text.h"

namespace stemma::engine::eval {
namespace {

absl::StatusOr<std::string> StringField(const nlohmann::json& j, const std::string& field,
                                        const std::string& where) {
  if (!j.contains(field)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": field '", field, "' missing"));
  }
  if (!j[field].is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field '", field, "' is ", j[field].type_name(), ", not a string"));
  }
  std::string value = j[field].get<std::string>();
  if (PythonStrip(value).empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": field '", field, "' is empty"));
  }
  return value;
}

// Where the hypothesis text ends: the first newline after the leading whitespace (a model
// often starts with " " or "\n" right after "{T}:").
size_t HypothesisEnd(const std::string& text) {
  const size_t start = text.find_first_not_of(" \t\r\n");
  if (start == std::string::npos) return std::string::npos;
  return text.find('\n', start);
}

}  // namespace

absl::StatusOr<std::vector<TranslationPair>> ReadTranslationPairs(const std::string& path,
                                                                  const std::string& source_field,
                                                                  const std::string& target_field) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the dataset"));
  std::vector<TranslationPair> pairs;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = absl::StrCat(path, ":", number);
    ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonObject(line, where));
    TranslationPair pair;
    auto source = StringField(j, source_field, where);
    if (!source.ok()) return source.status();
    auto target = StringField(j, target_field, where);
    if (!target.ok()) return target.status();
    pairs.push_back({*std::move(source), *std::move(target)});
  }
  if (pairs.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no sentence pairs"));
  return pairs;
}

std::string TranslationPrompt(const std::vector<const TranslationPair*>& shots,
                              const TranslationPair& pair, const std::string& source_name,
                              const std::string& target_name) {
  std::string prompt;
  for (const TranslationPair* shot : shots) {
    absl::StrAppend(&prompt, source_name, ": ", shot->source, "\n", target_name, ": ", shot->target,
                    "\n\n");
  }
  absl::StrAppend(&prompt, source_name, ": ", pair.source, "\n", target_name, ":");
  return prompt;
}

bool TranslationComplete(const std::string& generated) {
  return HypothesisEnd(generated) != std::string::npos;
}

std::string TranslationHypothesis(const std::string& generated) {
  const size_t end = HypothesisEnd(generated);
  return PythonStrip(end == std::string::npos ? generated : generated.substr(0, end));
}

}  // namespace stemma::engine::eval
