// Torch-free checkpoint streaming for the merge commands: a reader that maps every
// safetensors file of a Hugging Face directory, and a writer that produces the same
// deterministic layout as io::CheckpointWriter (docs/engine-io.md) without ever holding a
// whole tensor: the caller fills each tensor chunk by chunk, the writer hashes the bytes as
// they go out and publishes the directory atomically with its stemma.json manifest.
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

namespace stemma::engine::merge {

// A checkpoint directory opened read-only: config.json (null when absent) and every tensor,
// memory-mapped. Does not verify the stemma.json manifest (the merge would read every byte
// twice); `stemma-engine verify` does. Immutable after Open; const methods thread-safe.
class SourceCheckpoint {
 public:
  struct Tensor {
    const io::TensorInfo* info = nullptr;
    const uint8_t* data = nullptr;  // info->nbytes() bytes
  };
  // Errors name the directory or file: NotFound (no weights), DataLoss (bad file, or a shard
  // missing a tensor the index names), InvalidArgument (malformed JSON).
  static absl::StatusOr<std::unique_ptr<SourceCheckpoint>> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }
  // nullptr info when absent.
  Tensor Find(absl::string_view name) const;
  // Sorted names.
  const std::vector<std::string>& names() const { return names_; }

  // Drops the mapped pages of [data, data + bytes) from this process (they stay in the page
  // cache): keeps resident memory near one chunk while streaming many gigabytes.
  static void Release(const uint8_t* data, uint64_t bytes);
  // Maps [data, data + bytes) in one call (MADV_POPULATE_READ) instead of one page fault
  // per few pages; a no-op where the kernel lacks it.
  static void Prefetch(const uint8_t* data, uint64_t bytes);

 private:
  std::string dir_;
  nlohmann::json config_;
  std::vector<std::shared_ptr<io::SafetensorsFile>> files_;
  std::map<std::string, Tensor, std::less<>> tensors_;
  std::vector<std::string> names_;
};

// One tensor of an output checkpoint.
struct OutputTensor {
  std::string name;
  io::Dtype dtype = io::Dtype::kF32;
  std::vector<int64_t> shape;
  int64_t numel() const;
  uint64_t nbytes() const;
};

// Fills elements [begin, end) of tensor `index` (of the list given to WriteCheckpoint) into
// `out`, which has room for (end - begin) elements of the tensor's dtype. Called from one
// worker thread, in file order, every tensor's chunks in increasing order; `first_chunk`
// is true for a tensor's first chunk (so a kernel may prepare per-tensor state then).
using ChunkFiller = std::function<absl::Status(size_t index, int64_t begin, int64_t end,
                                               bool first_chunk, uint8_t* out)>;

struct StreamWriterOptions {
  // As io::CheckpointWriterOptions: shards of at most this many tensor bytes, tensors in
  // name order; one shard is written as model.safetensors without an index.
  uint64_t max_shard_bytes = 5'000'000'000;
  bool overwrite = false;
  // Extra files written as given (e.g. config.json); they win over copies from carry_from.
  std::map<std::string, std::string> files;
  // Copy config.json, generation_config.json and tokenizer files present in this directory.
  std::string carry_from;
  std::vector<std::string> parents;
  io::ManifestProducer producer;
  int64_t created_ms = -1;  // -1: now (or SOURCE_DATE_EPOCH, for reproducible manifests)
  // Also record a sha256 per tensor in stemma.json (a second hash pass over every byte).
  bool tensor_hashes = false;
  // Write shards with O_DIRECT (no page-cache copy) where the filesystem supports it.
  bool direct_io = true;
  // Output chunk size in bytes (the unit of compute, hashing and writing).
  uint64_t chunk_bytes = 8u << 20;
  // Called on the main thread after each tensor is written (tensors_done counts them).
  std::function<void(size_t tensors_done)> on_tensor;
  // Test hook: called after the first shard file is complete in the staging directory.
  std::function<void()> after_first_shard_for_test;
};

// Writes `tensors` into `<out>.tmp-<pid>` (data computed by `fill` on a worker thread while
// this thread hashes and writes the previous chunk), fsyncs everything and renames the
// staging directory onto `out` (refusing an existing `out` unless overwrite). On any error
// nothing is published and the staging directory is removed; a killed process leaves only
// `<out>.tmp-<pid>` (removed by the next writer for `out` once that pid is gone).
// Output bytes depend only on the tensors' names, dtypes, shapes and filled bytes.
absl::Status WriteCheckpoint(const std::string& out, const std::vector<OutputTensor>& tensors,
                             const ChunkFiller& fill, const StreamWriterOptions& options);

}  // namespace stemma::engine::merge
