#include "engine/analyze/analyze_inputs.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/json_line.h"
#include "common/status.h"
#include "engine/data/dataset.h"
#include "engine/events.h"
#include "engine/io/durable.h"
#include "engine/io/fs.h"

namespace stemma::engine::analyze {
namespace {

using nlohmann::json;

bool IsBlank(const std::string& line) {
  return line.find_first_not_of(" \t\r\n") == std::string::npos;
}

// Calls `fn(line_number, line)` for each non-blank line until it returns false or fails.
template <typename Fn>
absl::Status ForEachLine(const std::string& path, Fn&& fn) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (IsBlank(line)) continue;
    ASSIGN_OR_RETURN(bool more, fn(number, line));
    if (!more) break;
  }
  return absl::OkStatus();
}

absl::StatusOr<json> ParseJsonLine(const std::string& path, int64_t number,
                                   const std::string& line) {
  json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (record.is_discarded() || !record.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ":", number, ": not a JSON object on one line"));
  }
  return record;
}

absl::StatusOr<std::string> StringField(const json& record, const std::string& field,
                                        const std::string& path, int64_t number) {
  auto it = record.find(field);
  if (it == record.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ":", number, ": field '", field, "' missing"));
  }
  if (!it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": field '", field, "' is a ",
                                                   it->type_name(), ", not a string"));
  }
  return it->get<std::string>();
}

absl::StatusOr<std::vector<int32_t>> DatasetTokens(const LanguageSource& source,
                                                   int64_t max_tokens) {
  ASSIGN_OR_RETURN(auto dataset, data::Dataset::Open(source.path));
  int64_t n = dataset->num_tokens();
  if (max_tokens > 0) n = std::min(n, max_tokens);
  std::vector<int32_t> tokens(n);
  if (n > 0) dataset->Read(0, tokens);
  return tokens;
}

absl::StatusOr<std::vector<int32_t>> FileTokens(const LanguageSource& source,
                                                const tokenizer::Tokenizer& tokenizer,
                                                int64_t max_tokens) {
  std::vector<int32_t> tokens;
  RETURN_IF_ERROR(ForEachLine(
      source.path, [&](int64_t number, const std::string& line) -> absl::StatusOr<bool> {
        std::string text = line;
        if (source.kind == LanguageSource::Kind::kJsonl) {
          ASSIGN_OR_RETURN(json record, ParseJsonLine(source.path, number, line));
          ASSIGN_OR_RETURN(text, StringField(record, source.field, source.path, number));
        }
        std::vector<int32_t> ids = tokenizer.Encode(text);
        tokens.insert(tokens.end(), ids.begin(), ids.end());
        return max_tokens <= 0 || static_cast<int64_t>(tokens.size()) < max_tokens;
      }));
  if (max_tokens > 0 && static_cast<int64_t>(tokens.size()) > max_tokens) tokens.resize(max_tokens);
  return tokens;
}

}  // namespace

LanguageSource LanguageSourceFromProto(const v1::LanguageSource& proto) {
  LanguageSource source;
  source.language = proto.language();
  if (!proto.dataset().empty()) {
    source.kind = LanguageSource::Kind::kDataset;
    source.path = proto.dataset();
  } else if (!proto.jsonl().empty()) {
    source.kind = LanguageSource::Kind::kJsonl;
    source.path = proto.jsonl();
    if (!proto.field().empty()) source.field = proto.field();
  } else {
    source.kind = LanguageSource::Kind::kText;
    source.path = proto.text();
  }
  return source;
}

absl::Status CheckLanguageSourceExists(const LanguageSource& source) {
  const std::string where = absl::StrCat("languages.", source.language);
  std::error_code ec;
  if (source.kind == LanguageSource::Kind::kDataset) {
    if (!std::filesystem::is_directory(source.path, ec) ||
        !std::filesystem::exists(std::filesystem::path(source.path) / "index.json", ec)) {
      return absl::NotFoundError(absl::StrCat(where, ".dataset: ", source.path,
                                              " is not a token dataset (no index.json)"));
    }
    return absl::OkStatus();
  }
  if (!std::filesystem::is_regular_file(source.path, ec)) {
    return absl::NotFoundError(absl::StrCat(
        where, source.kind == LanguageSource::Kind::kJsonl ? ".jsonl: " : ".text: ", source.path,
        ": no such file"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> LoadLanguageTokens(const LanguageSource& source,
                                                        const tokenizer::Tokenizer* tokenizer,
                                                        int64_t max_tokens, int64_t vocab_size) {
  const std::string where = absl::StrCat("languages.", source.language);
  std::vector<int32_t> tokens;
  if (source.kind == LanguageSource::Kind::kDataset) {
    ASSIGN_OR_RETURN(tokens, DatasetTokens(source, max_tokens));
  } else {
    if (tokenizer == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(where,
                       ": text input needs a tokenizer (spec field 'tokenizer' or "
                       "tokenizer files in the model directory)"));
    }
    ASSIGN_OR_RETURN(tokens, FileTokens(source, *tokenizer, max_tokens));
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": no tokens in ", source.path, " (an empty language)"));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", source.path, ": token ", tokens[i], " at position ", i,
                       " is outside the model's vocabulary of ", vocab_size));
    }
  }
  return tokens;
}

absl::StatusOr<std::vector<std::vector<std::string>>> ReadParallelSentences(
    const std::string& path, const std::vector<std::string>& languages, int64_t max_sentences) {
  std::vector<std::vector<std::string>> sentences;
  RETURN_IF_ERROR(
      ForEachLine(path, [&](int64_t number, const std::string& line) -> absl::StatusOr<bool> {
        ASSIGN_OR_RETURN(json record, ParseJsonLine(path, number, line));
        std::vector<std::string> row;
        for (const auto& lang : languages) {
          ASSIGN_OR_RETURN(std::string text, StringField(record, lang, path, number));
          if (text.empty()) {
            return absl::InvalidArgumentError(
                absl::StrCat(path, ":", number, ": field '", lang, "' is empty"));
          }
          row.push_back(std::move(text));
        }
        sentences.push_back(std::move(row));
        return max_sentences <= 0 || static_cast<int64_t>(sentences.size()) < max_sentences;
      }));
  if (sentences.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no parallel sentences"));
  }
  return sentences;
}

absl::StatusOr<std::vector<std::vector<std::string>>> ReadLineAlignedTexts(
    const std::vector<std::string>& paths, const std::vector<std::string>& languages,
    int64_t max_sentences) {
  std::vector<std::vector<std::string>> columns;  // [language][sentence]
  for (const std::string& path : paths) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (IsBlank(line)) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ":", lines.size() + 1,
                         ": blank line (line-aligned files need a sentence on "
                         "every line)"));
      }
      lines.push_back(std::move(line));
    }
    if (lines.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no sentences"));
    if (!columns.empty() && lines.size() != columns[0].size()) {
      return absl::InvalidArgumentError(absl::StrCat(path, " has ", lines.size(), " lines but ",
                                                     paths[0], " has ", columns[0].size(),
                                                     " (line-aligned files must match)"));
    }
    columns.push_back(std::move(lines));
  }
  size_t n = columns.empty() ? 0 : columns[0].size();
  if (max_sentences > 0) n = std::min<size_t>(n, max_sentences);
  std::vector<std::vector<std::string>> sentences(n);
  for (size_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < languages.size(); ++k) sentences[i].push_back(columns[k][i]);
  }
  return sentences;
}

absl::StatusOr<std::vector<std::string>> ParallelLanguages(const std::string& path) {
  std::vector<std::string> languages;
  RETURN_IF_ERROR(
      ForEachLine(path, [&](int64_t number, const std::string& line) -> absl::StatusOr<bool> {
        ASSIGN_OR_RETURN(json record, ParseJsonLine(path, number, line));
        for (const auto& [key, value] : record.items()) languages.push_back(key);  // sorted keys
        return false;
      }));
  if (languages.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no parallel sentences"));
  }
  return languages;
}

absl::Status WriteJsonAtomically(const std::string& path, const json& value) {
  return io::WriteFileAtomic(path, value.dump(2) + "\n");
}

void EmitEvent(const v1::EngineEvent& event) { EventWriter().Emit(event); }

}  // namespace stemma::engine::analyze
