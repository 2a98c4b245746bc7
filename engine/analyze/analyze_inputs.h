// Inputs and outputs of `stemma-engine analyze` that need no LibTorch: per-language token
// streams (token datasets, text or JSONL files), parallel sentences, atomic JSON outputs and
// the event lines on stdout. docs/eval.md describes the formats.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "stemma/v1/engine_event.pb.h"
#include "stemma/v1/specs/eval.pb.h"

namespace stemma::engine::analyze {

// Where one language's text comes from (spec `languages[i]`, stemma.v1.LanguageSource):
// exactly one of a token dataset directory (`stemma-engine tokenize` output), a UTF-8 text
// file (each non-blank line tokenized on its own) or a JSONL file (the string in `field` of
// each non-blank line).
struct LanguageSource {
  std::string language;
  enum class Kind { kDataset, kText, kJsonl } kind = Kind::kText;
  std::string path;
  std::string field = "text";
};

// The command's view of a checked spec entry (spec_checks_eval made sure exactly one
// source is given).
LanguageSource LanguageSourceFromProto(const v1::LanguageSource& proto);

// FailedPrecondition / NotFound naming `languages.<lang>` and the path when the source
// does not exist (a file, or a dataset directory with its index.json): checked at start,
// before the model loads.
absl::Status CheckLanguageSourceExists(const LanguageSource& source);

// The language's tokens in document order, concatenated, at most `max_tokens` (0: all).
// `tokenizer` is needed for text and JSONL (FailedPrecondition without one). Errors name the
// file and line: a missing or non-string field, bad JSON, a token id >= vocab_size, and
// InvalidArgument "languages.<lang>: no tokens" for an empty language.
absl::StatusOr<std::vector<int32_t>> LoadLanguageTokens(const LanguageSource& source,
                                                        const tokenizer::Tokenizer* tokenizer,
                                                        int64_t max_tokens, int64_t vocab_size);

// Parallel sentences: a JSONL file whose every non-blank line is an object with a non-empty
// string for each of `languages` (other fields are ignored). Returns [sentence][language],
// at most `max_sentences` (0: all). Errors name file:line and the field; InvalidArgument when
// the file has no sentences.
absl::StatusOr<std::vector<std::vector<std::string>>> ReadParallelSentences(
    const std::string& path, const std::vector<std::string>& languages, int64_t max_sentences);

// Parallel sentences from line-aligned text files, one per language (`paths[k]` holds
// `languages[k]`): line i of every file is sentence i. All files must have the same number
// of lines, and no line may be blank (errors name the file and line). At most
// `max_sentences` (0: all).
absl::StatusOr<std::vector<std::vector<std::string>>> ReadLineAlignedTexts(
    const std::vector<std::string>& paths, const std::vector<std::string>& languages,
    int64_t max_sentences);

// The language keys of the first record of a parallel JSONL file, sorted.
absl::StatusOr<std::vector<std::string>> ParallelLanguages(const std::string& path);

// Writes `value` (2-space indented) to `path` through a temporary file in the same directory,
// fsynced and renamed, so a reader never sees half a file.
absl::Status WriteJsonAtomically(const std::string& path, const nlohmann::json& value);

// One event line on stdout (docs/engine-events.md) through engine/events.h's EventWriter.
void EmitEvent(const v1::EngineEvent& event);

}  // namespace stemma::engine::analyze
