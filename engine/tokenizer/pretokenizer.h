// The split patterns of byte-level BPE tokenizers, as hand-written scanners that give the
// same pieces as the `tokenizers` package (Oniguruma, leftmost match, alternatives tried in
// order with backtracking) for these exact patterns:
//
//   kLlama3  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   kQwen2   the same with \p{N} instead of \p{N}{1,3}
//   kGpt2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//            (ByteLevel's own pattern when use_regex is true)
//
// Internal to engine/tokenizer/. Stateless and thread-safe.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

namespace stemma::engine::tokenizer::internal {

enum class SplitPattern { kLlama3, kQwen2, kGpt2 };

// The pattern whose regex source (as written in tokenizer.json) is `regex`, if known.
std::optional<SplitPattern> SplitPatternFromRegex(std::string_view regex);

// Splits `text` into consecutive pieces (Split with behavior Isolated: matches and the text
// between them; these patterns leave none between). The pieces view `text` and cover it.
std::vector<std::string_view> SplitText(std::string_view text, SplitPattern pattern);

}  // namespace stemma::engine::tokenizer::internal
