// Tokenizer::Load: picks the tokenizer by the files of a model directory and resolves the
// special ids (tokenizer.h).
#include "engine/tokenizer/tokenizer.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/tokenizer/loaders.h"
#include "nlohmann/json.hpp"

namespace stemma::engine::tokenizer {
namespace {

using json = nlohmann::json;

bool IsFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The JSON object in `path`, or null when the file does not exist.
absl::StatusOr<json> ReadJsonIfExists(const std::string& path) {
  if (!IsFile(path)) return json();
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    json j = json::parse(buffer.str());
    if (!j.is_object())
      return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
    return j;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not JSON: ", e.what()));
  }
}

// {"type": "bytes"}: stemma_tokenizer.json itself (`field` ""), or config.json's
// "stemma_tokenizer" (`field` "stemma_tokenizer").
absl::Status CheckStemmaTokenizer(const json& spec, const std::string& file,
                                  const std::string& field) {
  const std::string type_field = field.empty() ? "type" : field + ".type";
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": field '", type_field, "' must be a string (\"bytes\")"));
  }
  if (spec["type"] != "bytes") {
    return absl::InvalidArgumentError(absl::StrCat(file, ": field '", type_field, "' is \"",
                                                   spec["type"].get<std::string>(),
                                                   "\"; the only type is \"bytes\""));
  }
  return absl::OkStatus();
}

// tokenizer_config.json's bos_token / eos_token / pad_token: a string, {"content": ...} or null.
absl::Status ResolveTokenField(const Tokenizer& tok, const json& config, const std::string& file,
                               const char* key, std::optional<int32_t>* out) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return absl::OkStatus();
  std::string content;
  if (it->is_string()) {
    content = it->get<std::string>();
  } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    content = (*it)["content"].get<std::string>();
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": field '", key, "' must be a string, {\"content\": string} or null"));
  }
  const std::optional<int32_t> id = tok.TokenToId(content);
  if (!id) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": field '", key, "' is \"", content, "\", which is not a token"));
  }
  *out = id;
  return absl::OkStatus();
}

// config.json's bos_token_id / eos_token_id / pad_token_id: an id, a list of ids (the first
// is taken) or null.
absl::Status ResolveIdField(const Tokenizer& tok, const json& config, const std::string& file,
                            const char* key, std::optional<int32_t>* out) {
  if (out->has_value()) return absl::OkStatus();
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return absl::OkStatus();
  const json* value = &*it;
  if (value->is_array()) {
    if (value->empty()) return absl::OkStatus();
    value = &(*value)[0];
  }
  if (!value->is_number_integer() || value->get<int64_t>() < 0 ||
      value->get<int64_t>() >= tok.vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": field '", key, "' is ", it->dump(),
                                                   ", not an id below the vocabulary size ",
                                                   tok.vocab_size()));
  }
  *out = value->get<int32_t>();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat(dir, ": not a directory"));
  }
  const std::string stemma_path = dir + "/stemma_tokenizer.json";
  const std::string config_path = dir + "/config.json";
  const std::string hf_path = dir + "/tokenizer.json";
  const std::string sp_path = dir + "/tokenizer.model";
  const std::string tok_config_path = dir + "/tokenizer_config.json";
  ASSIGN_OR_RETURN(json stemma, ReadJsonIfExists(stemma_path));
  ASSIGN_OR_RETURN(json config, ReadJsonIfExists(config_path));

  if (!stemma.is_null()) {
    RETURN_IF_ERROR(CheckStemmaTokenizer(stemma, stemma_path, ""));
    return internal::MakeByteTokenizer();
  }
  if (config.is_object() && config.contains("stemma_tokenizer")) {
    RETURN_IF_ERROR(
        CheckStemmaTokenizer(config["stemma_tokenizer"], config_path, "stemma_tokenizer"));
    return internal::MakeByteTokenizer();
  }

  std::unique_ptr<Tokenizer> tok;
  if (IsFile(hf_path)) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> hf = internal::LoadHfBpe(hf_path);
    if (hf.ok()) {
      tok = *std::move(hf);
    } else if (!absl::IsUnimplemented(hf.status()) || !IsFile(sp_path)) {
      return hf.status();
    }
  }
  if (tok == nullptr && IsFile(sp_path)) {
    ASSIGN_OR_RETURN(tok, internal::LoadSentencePiece(sp_path));
  }
  if (tok == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        dir, ": no tokenizer (tokenizer.json, tokenizer.model or stemma_tokenizer.json)"));
  }

  ASSIGN_OR_RETURN(json tok_config, ReadJsonIfExists(tok_config_path));
  if (tok_config.is_object()) {
    RETURN_IF_ERROR(
        ResolveTokenField(*tok, tok_config, tok_config_path, "bos_token", &tok->special_.bos));
    RETURN_IF_ERROR(
        ResolveTokenField(*tok, tok_config, tok_config_path, "eos_token", &tok->special_.eos));
    RETURN_IF_ERROR(
        ResolveTokenField(*tok, tok_config, tok_config_path, "pad_token", &tok->special_.pad));
  }
  if (config.is_object()) {
    RETURN_IF_ERROR(ResolveIdField(*tok, config, config_path, "bos_token_id", &tok->special_.bos));
    RETURN_IF_ERROR(ResolveIdField(*tok, config, config_path, "eos_token_id", &tok->special_.eos));
    RETURN_IF_ERROR(ResolveIdField(*tok, config, config_path, "pad_token_id", &tok->special_.pad));
  }
  return tok;
}

}  // namespace stemma::engine::tokenizer
