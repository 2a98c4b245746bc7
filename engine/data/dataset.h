// Reads a token dataset written by DatasetWriter (docs/data-format.md): index.json is parsed
// and checked, index.bin and every shard are mmapped read-only.
//
// Thread-safety: an open Dataset is immutable; all methods are const and may be called from
// any number of threads. The mappings live as long as the Dataset.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/data/dataset_writer.h"

namespace stemma::engine::data {

class Dataset {
 public:
  // Opens dataset directory `dir`. NotFound (no directory or index.json), InvalidArgument
  // (a bad field in index.json, named; a shard or index.bin whose size disagrees with
  // index.json), errno statuses naming the file. With `verify_checksums`, every shard's and
  // index.bin's sha256 is recomputed and compared (DataLoss on a mismatch, naming the file).
  static absl::StatusOr<std::unique_ptr<Dataset>> Open(const std::string& dir,
                                                       bool verify_checksums = false);
  ~Dataset();
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;

  const std::string& dir() const { return dir_; }
  const std::string& language() const { return language_; }
  const TokenizerInfo& tokenizer() const { return tokenizer_; }
  bool eos_appended() const { return eos_appended_; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_documents() const { return static_cast<int64_t>(offsets_.size()) - 1; }

  // Token range [begin, end) of document `doc` in the dataset's global token order.
  uint64_t document_begin(int64_t doc) const { return offsets_[doc]; }
  uint64_t document_end(int64_t doc) const { return offsets_[doc + 1]; }
  int64_t document_size(int64_t doc) const {
    return static_cast<int64_t>(offsets_[doc + 1] - offsets_[doc]);
  }

  // Copies tokens [begin, begin + out.size()) (global positions; may cross shards) into out.
  // The range must lie inside [0, num_tokens()).
  void Read(uint64_t begin, std::span<int32_t> out) const;
  std::vector<int32_t> Document(int64_t doc) const;

 private:
  struct Mapping {
    void* addr = nullptr;
    size_t size = 0;
  };
  Dataset() = default;

  std::string dir_;
  std::string language_;
  TokenizerInfo tokenizer_;
  bool eos_appended_ = false;
  int64_t num_tokens_ = 0;
  int64_t shard_tokens_ = 0;
  std::vector<Mapping> mappings_;        // shards, then index.bin
  std::vector<const uint32_t*> shards_;  // token data of each shard
  std::span<const uint64_t> offsets_;    // num_documents + 1 entries
};

}  // namespace stemma::engine::data
