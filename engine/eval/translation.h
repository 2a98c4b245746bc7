// k-shot translation (FLORES-style) for `stemma-engine eval` (docs/eval.md, "translation"):
// the JSONL reader, the prompt, and the stop rule applied to generated text. Torch-free;
// generation is EvalModel::Generate, scoring chrf.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stemma::engine::eval {

struct TranslationPair {
  std::string source;
  std::string target;
};

// One JSON object per non-blank line with string fields `source_field` and `target_field`.
// InvalidArgument naming file:line and the field (missing, not a string, empty); NotFound
// for a missing file; an empty file is an error.
absl::StatusOr<std::vector<TranslationPair>> ReadTranslationPairs(const std::string& path,
                                                                  const std::string& source_field,
                                                                  const std::string& target_field);

// The prompt: for each shot "{S}: {source}\n{T}: {target}\n\n", then "{S}: {source}\n{T}:",
// where S and T are the language names. The model continues after "{T}:".
std::string TranslationPrompt(const std::vector<const TranslationPair*>& shots,
                              const TranslationPair& pair, const std::string& source_name,
                              const std::string& target_name);

// Whether generation can stop: the text (after a leading run of whitespace) holds a newline.
bool TranslationComplete(const std::string& generated);

// The hypothesis from generated text: cut at the first newline after any leading
// whitespace, then Python-stripped.
std::string TranslationHypothesis(const std::string& generated);

}  // namespace stemma::engine::eval
