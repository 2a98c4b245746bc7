// Hugging Face checkpoint directories: read (memory-mapped, zero-copy tensors) and write
// (sharded, manifest, atomic publish). See docs/engine-io.md for the on-disk contract.
//
// This header does not include LibTorch: at::Tensor (== torch::Tensor) is only declared.
// Code that calls Tensor() / AddTensor() includes <ATen/core/Tensor.h> or <torch/torch.h>.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/io/manifest.h"
#include "engine/io/safetensors.h"

namespace at {
class Tensor;
}  // namespace at

namespace stemma::engine::io {

inline constexpr char kSingleFileName[] = "model.safetensors";
inline constexpr char kIndexName[] = "model.safetensors.index.json";

struct CheckpointReaderOptions {
  enum class Verify {
    kIfManifest,  // verify stemma.json when present (the default: Hub checkpoints have none)
    kAlways,      // refuse a checkpoint without a manifest
    // Only the sizes of the files stemma.json lists (when present): each exists with the
    // manifest's byte count (VerifyCheckpointSizes). Reads no file's contents.
    kSizes,
    // For a directory that every rank of a job opens (the model of a multi-rank train or
    // eval): kIfManifest on the job's rank 0, kSizes on the others, so that the whole files
    // are hashed once per job, not once per rank. The rank is the worker's RANK (the engine
    // contract); unset (a single process) counts as rank 0. Rank 0 must open the same
    // directory for this to verify anything: every other rank's contents go unchecked.
    kOncePerJob,
    kNever,
  };
  Verify verify = Verify::kIfManifest;
};

// `verify` with kOncePerJob resolved for this process (by RANK); any other value as it is.
CheckpointReaderOptions::Verify VerifyForThisRank(CheckpointReaderOptions::Verify verify);

// An opened checkpoint: config.json, every safetensors file mapped, a name -> tensor table.
// Immutable after Open; const methods are thread-safe.
class CheckpointReader {
 public:
  // Reads `dir`/config.json (optional), then model.safetensors or the shards listed in
  // model.safetensors.index.json. Errors name the file (and tensor): NotFound (no weights),
  // DataLoss (damaged file, a shard missing a tensor the index names, manifest mismatch),
  // InvalidArgument (malformed config/index JSON), FailedPrecondition (kAlways, no manifest).
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(
      const std::string& dir, const CheckpointReaderOptions& options = {});

  const std::string& dir() const { return dir_; }
  // config.json, or null when the directory has none.
  const nlohmann::json& config() const { return config_; }
  bool has_manifest() const { return has_manifest_; }
  // Safetensors file names, relative to dir(), in index order.
  const std::vector<std::string>& shards() const { return shard_names_; }
  // All tensor names, sorted.
  std::vector<std::string> TensorNames() const;
  bool Has(absl::string_view name) const { return Find(name) != nullptr; }
  // Header entry of a tensor; nullptr when absent.
  const TensorInfo* Find(absl::string_view name) const;
  // File name (relative to dir()) holding `name`; empty when absent.
  std::string ShardOf(absl::string_view name) const;

  // The tensor as a CPU at::Tensor with the file's dtype and shape. Zero-copy over the
  // (private, copy-on-write) mapping when its address is aligned to the element size;
  // the tensor keeps the mapping alive, so it may outlive this reader. Writing into it
  // never changes the file. NotFound names the tensor and the directory.
  absl::StatusOr<at::Tensor> Tensor(absl::string_view name) const;
  // Same, throwing std::runtime_error: for model code, whose errors are exceptions.
  at::Tensor TensorOrThrow(absl::string_view name) const;

 private:
  struct Entry {
    const TensorInfo* info;
    int file;  // index into files_
  };
  CheckpointReader() = default;
  std::string dir_;
  nlohmann::json config_;
  bool has_manifest_ = false;
  std::vector<std::string> shard_names_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry, std::less<>> entries_;
};

// Recomputes the sha256 and size of every file listed in `dir`/stemma.json. OK when all
// match. Otherwise DataLoss naming the file, and for a safetensors file the damaged tensor
// when it can be found (by its header, or by the per-tensor hashes); NotFound when there is
// no manifest or a listed file is missing.
absl::Status VerifyCheckpoint(const std::string& dir);

// The cheap part of VerifyCheckpoint: every file listed in `dir`/stemma.json exists and has
// the manifest's size. DataLoss naming the file (with both sizes) otherwise; NotFound as
// VerifyCheckpoint's. Catches a truncated or partly copied file, not changed bytes.
absl::Status VerifyCheckpointSizes(const std::string& dir);

struct CheckpointWriterOptions {
  // Shards hold at most this many tensor bytes (a larger single tensor gets its own shard);
  // one shard -> model.safetensors without an index. transformers' default, 5 GB.
  uint64_t max_shard_bytes = 5'000'000'000;
  // Replace an existing target directory (atomically swapped, the old one removed).
  bool overwrite = false;
  // Copy config.json, generation_config.json and tokenizer files from this checkpoint
  // (those present) unless AddFile gave them. Empty: none.
  std::string source_dir;
  // Recorded in stemma.json with the sha256 of each parent's own stemma.json.
  std::vector<std::string> parents;
  ManifestProducer producer;
  int64_t created_ms = -1;  // -1: now
  // Test hook, called with each file name after it is written into the staging
  // directory; an error aborts the publish.
  std::function<absl::Status(absl::string_view file)> after_file_for_test;
};

// Writes a checkpoint directory. Everything goes into `<out>.tmp-<pid>` beside `out`; Commit
// fsyncs every file and the directories and renames the staging directory onto `out` (with
// RENAME_NOREPLACE unless overwrite is set). If Commit fails or the writer is destroyed
// without Commit, the staging directory is removed and nothing is published. A crash leaves
// only a `<out>.tmp-<pid>` directory behind, never a partial `out`. Not thread-safe.
class CheckpointWriter {
 public:
  // Creates the staging directory. AlreadyExists when `out` exists and !overwrite.
  static absl::StatusOr<std::unique_ptr<CheckpointWriter>> Create(
      const std::string& out, CheckpointWriterOptions options = {});
  ~CheckpointWriter();

  // Adds a tensor under its Hugging Face name. Keeps a reference; its bytes are read (and
  // copied to the CPU when on a device) during Commit, one shard at a time. Any dtype the
  // format supports; InvalidArgument otherwise or for a duplicate name.
  absl::Status AddTensor(const std::string& name, const at::Tensor& tensor);
  // A file written as given (e.g. "config.json"); overrides the copy from source_dir.
  absl::Status AddFile(const std::string& name, std::string contents);

  // Streaming, for a model no process holds whole (the sharded trainer gathers it one layer
  // at a time): declare every tensor first, then write each exactly once, in any order. The
  // shard files are laid out at the first WriteTensor as Commit lays out added tensors (the
  // same files and bytes), and each tensor's bytes go straight to their place: the writer
  // keeps none of them. Commit fails (FailedPrecondition) when a declared tensor was not
  // written. Not mixable with AddTensor. InvalidArgument for a duplicate declaration, an
  // undeclared or rewritten tensor, or a dtype or shape other than declared.
  absl::Status DeclareTensor(const std::string& name, Dtype dtype, std::vector<int64_t> shape);
  absl::Status WriteTensor(const std::string& name, const at::Tensor& tensor);

  absl::Status Commit();

  const std::string& out() const { return out_; }
  const std::string& staging_dir() const { return staging_; }

 private:
  struct Impl;
  CheckpointWriter() = default;
  absl::Status CommitImpl();
  absl::Status LaidOut();
  absl::Status LayOutDeclared();
  // Commit's part for declared tensors: checks all were written, syncs and hashes the shard
  // files into `manifest` and `weight_map`; returns the number of shards.
  absl::StatusOr<size_t> FinishDeclared(Manifest& manifest, nlohmann::json& weight_map,
                                        uint64_t& total_bytes);
  std::string out_;
  std::string staging_;
  CheckpointWriterOptions options_;
  bool done_ = false;
  std::unique_ptr<Impl> impl_;
};

}  // namespace stemma::engine::io
