// Tokenizers of model directories: Hugging Face byte-level BPE (tokenizer.json),
// SentencePiece (tokenizer.model) and Stemma's byte tokenizer for tiny models. No LibTorch.
//
// Token ids equal those of the `tokenizers` / `sentencepiece` Python packages for the same
// files (tests/engine/hf_tokenize.py checks a multilingual sample). Encode never adds
// BOS/EOS (tokenizer.json's post_processor is not applied; transformers'
// `encode(text, add_special_tokens=False)`): callers add bos_id()/eos_id() themselves.
//
// The byte tokenizer ("bytes"): id b in 0..255 is the byte b; 256 is BOS, 257 EOS, 258 PAD;
// vocab_size 259. Encode(text) is the bytes of text; Decode skips BOS/EOS/PAD and replaces
// invalid UTF-8 with U+FFFD.
//
// Thread-safety: a loaded Tokenizer is immutable; all methods are const and may be called
// from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace stemma::engine::tokenizer {

struct SpecialTokenIds {
  std::optional<int32_t> bos;
  std::optional<int32_t> eos;
  std::optional<int32_t> pad;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Loads the tokenizer of model directory `dir`, choosing by the files present:
  //  1. stemma_tokenizer.json {"type": "bytes"}, or config.json with
  //     "stemma_tokenizer": {"type": "bytes"}: the byte tokenizer;
  //  2. tokenizer.json: byte-level BPE (model BPE, pre_tokenizer ByteLevel or a Sequence of
  //     Split with the Llama-3 / Qwen2 / GPT-2 pattern then ByteLevel, normalizer none or NFC,
  //     decoder ByteLevel). A tokenizer.json that is not byte-level (e.g. Metaspace) falls back
  //     to tokenizer.model when the directory has one;
  //  3. tokenizer.model: SentencePiece.
  // Special ids: the tokenizer's own (SentencePiece's bos/eos/pad, the byte tokenizer's), then
  // tokenizer_config.json's bos_token/eos_token/pad_token (string or {"content": ...}), then
  // config.json's bos_token_id/eos_token_id (first of a list)/pad_token_id for those still
  // unknown (the byte tokenizer keeps its own).
  // Errors: NotFound (no directory, no tokenizer file), InvalidArgument (a damaged file or a
  // bad field; the message names the file and the field), Unimplemented (a tokenizer.json
  // feature outside the list above, named).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& dir);

  // Token ids of UTF-8 `text`. Special tokens written in the text (e.g. "<|eot_id|>") are
  // matched as such, as `tokenizers` does. Invalid UTF-8 is tokenized byte by byte by the
  // byte-level tokenizers; SentencePiece sees U+FFFD.
  virtual std::vector<int32_t> Encode(std::string_view text) const = 0;

  // The text of `ids` (special tokens included as their text, as transformers'
  // decode(skip_special_tokens=False); the byte tokenizer's have none). Ids outside the
  // vocabulary are skipped. Byte sequences that are not valid UTF-8 become U+FFFD.
  virtual std::string Decode(std::span<const int32_t> ids) const = 0;

  // 1 + the largest id (vocabulary and added tokens).
  virtual int32_t vocab_size() const = 0;

  // The id of a token's text (added tokens included), if it has one.
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;

  // Whether `id` is a special (control) token.
  virtual bool IsSpecial(int32_t id) const = 0;

  // "hf_bpe", "sentencepiece" or "bytes".
  virtual std::string_view kind() const = 0;

  std::optional<int32_t> bos_id() const { return special_.bos; }
  std::optional<int32_t> eos_id() const { return special_.eos; }
  std::optional<int32_t> pad_id() const { return special_.pad; }
  const SpecialTokenIds& special_ids() const { return special_; }

 protected:
  SpecialTokenIds special_;
};

}  // namespace stemma::engine::tokenizer
