// Text and JSONL files to a token dataset (the library behind `stemma-engine tokenize`).
//
// Documents (docs/data-format.md):
//  - text: one document per paragraph, i.e. per run of lines separated by one or more blank
//    lines (lines of only whitespace). A paragraph's lines are joined with "\n"; the trailing
//    newline is dropped; "\r\n" counts as "\n". With line_docs, each non-blank line is one
//    document.
//  - jsonl: one JSON object per non-blank line; the document is the string in `field`.
// Documents that tokenize to nothing (an empty string field) are skipped. Files are read in
// the order given. Errors name the file, the 1-based line and the field:
//   "in.jsonl:7: bad JSON: ...", "in.jsonl:9: field 'text' missing",
//   "in.jsonl:9: field 'text' is a number, not a string", "...: empty dataset ...".
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"
#include "stemma/v1/specs/data.pb.h"

namespace stemma::engine::data {

struct TokenizeSummary {
  int64_t num_documents = 0;
  int64_t num_tokens = 0;
  int64_t num_shards = 0;
  // The longest document (in input bytes), its line count and where it starts ("a.txt:1").
  int64_t largest_document_bytes = 0;
  int64_t largest_document_lines = 0;
  std::string largest_document_where;
};

// A text document this large, made of this many lines, is most likely a file with one
// paragraph per line read without line_docs (paragraphs end at blank lines).
inline constexpr int64_t kLineDocsHintBytes = 1 << 20;
inline constexpr int64_t kLineDocsHintLines = 100;

// The hint to print when `summary` looks like that ("" when it does not).
std::string LineDocsHint(const v1::TokenizeSpec& spec, const TokenizeSummary& summary);

// Loads the tokenizer from spec.tokenizer and writes the dataset to spec.out atomically.
// `spec` is checked and has its defaults filled (ParseEngineCommandLine).
absl::StatusOr<TokenizeSummary> TokenizeFiles(const v1::TokenizeSpec& spec);

}  // namespace stemma::engine::data
