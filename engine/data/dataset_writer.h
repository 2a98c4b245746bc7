// Writes one token dataset (docs/data-format.md): shard-NNNNN.bin files of little-endian
// uint32 token ids, index.bin (uint64 document start offsets, plus the end) and index.json.
//
// Atomic: everything is written into a staging directory `<out>.staging-<pid>` beside `out`,
// each file fsynced, the staging directory fsynced, then renamed to `out` and the parent
// directory fsynced. A reader never sees a partial dataset; a crashed writer leaves only a
// staging directory. Deterministic: the same documents, tokenizer and options give
// byte-identical files (index.json has no timestamps; keys are sorted).
//
// Thread-safety: none; one writer per dataset, used from one thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/io/sha256.h"
#include "nlohmann/json.hpp"

namespace stemma::engine::data {

using io::Sha256;
using io::Sha256File;
using io::Sha256Hex;

inline constexpr char kDatasetFormat[] = "stemma-tokens-v1";
// Tokens per shard when the options do not say: the default of TokenizeSpec.shard_tokens
// (proto/stemma/v1/specs/data.proto), read from the schema so it is written in one place.
int64_t DefaultShardTokens();

struct TokenizerInfo {
  std::string name;    // e.g. the tokenizer directory's base name
  std::string kind;    // "hf_bpe", "sentencepiece", "bytes"
  std::string file;    // the file hashed, relative to the tokenizer directory
  std::string sha256;  // of that file
  int64_t vocab_size = 0;
  std::optional<int32_t> bos_id;
  std::optional<int32_t> eos_id;
};

struct SourceFile {
  std::string path;  // as given on the command line
  std::string sha256;
  uint64_t bytes = 0;
};

// What a dataset was made from, recorded in index.json's `parents` (its lineage): the
// tokenizer's directory and the Stemma corpus its inputs lie in.
struct DatasetParent {
  std::string path;             // as given (lexically normal)
  std::string role;             // "tokenizer" | "corpus"
  std::string manifest_sha256;  // a corpus: the sha256 of its manifest.json; else ""
};

struct DatasetWriterOptions {
  std::string out_dir;
  std::string language;
  TokenizerInfo tokenizer;
  int64_t shard_tokens = DefaultShardTokens();
  // Whether each document already ends with tokenizer.eos_id (tokenize --eos). The loader
  // inserts EOS between documents only when this is false.
  bool eos_appended = false;
  // Replace an existing `out_dir` (renamed aside, then removed, after the new one is in).
  bool overwrite = false;
  // index.json's `parents` (written only when there are some).
  std::vector<DatasetParent> parents;
};

class DatasetWriter {
 public:
  // Creates the staging directory. InvalidArgument for bad options, AlreadyExists when
  // out_dir exists and !overwrite, errno statuses naming the path.
  static absl::StatusOr<std::unique_ptr<DatasetWriter>> Create(DatasetWriterOptions options);
  ~DatasetWriter();  // removes the staging directory unless Finish succeeded

  // Appends one document. Empty documents are skipped (they have no tokens to train on).
  // InvalidArgument for a negative id or one >= tokenizer.vocab_size (when that is > 0).
  absl::Status AddDocument(std::span<const int32_t> tokens);

  // Writes index.bin and index.json and publishes the dataset. FailedPrecondition for a
  // dataset without tokens.
  absl::Status Finish(const std::vector<SourceFile>& sources);

  int64_t num_documents() const { return static_cast<int64_t>(doc_starts_.size()); }
  int64_t num_tokens() const { return num_tokens_; }

 private:
  explicit DatasetWriter(DatasetWriterOptions options, std::string staging);
  absl::Status OpenShard();
  absl::Status CloseShard();

  DatasetWriterOptions options_;
  std::string staging_;
  bool finished_ = false;
  std::vector<uint64_t> doc_starts_;
  int64_t num_tokens_ = 0;
  std::FILE* shard_ = nullptr;
  int64_t shard_count_ = 0;  // tokens in the open shard
  Sha256 shard_hash_;
  nlohmann::json shards_ = nlohmann::json::array();
};

}  // namespace stemma::engine::data
