// The concrete tokenizers behind Tokenizer::Load, one per file format. Internal to
// engine/tokenizer/ (tests may use them directly).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"

namespace stemma::engine::tokenizer::internal {

// A Hugging Face tokenizer.json with a byte-level BPE model (see Tokenizer::Load).
// Unimplemented when the file is valid but uses a feature this loader does not have.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfBpe(const std::string& path);

// A SentencePiece model file (libsentencepiece).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePiece(const std::string& path);

// The byte tokenizer: ids 0..255 bytes, 256 BOS, 257 EOS, 258 PAD.
std::unique_ptr<Tokenizer> MakeByteTokenizer();

}  // namespace stemma::engine::tokenizer::internal
