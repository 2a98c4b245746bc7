// safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header length N, N bytes of JSON, then the tensor data. Pure C++: no LibTorch here, so
// tools and tests can read and write checkpoints without it (engine/io/checkpoint.h adds
// the torch::Tensor side).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stemma::engine::io {

class MappedFile;  // engine/io/durable.h

// The element types the engine reads and writes. Names as in the format ("BF16", ...).
enum class Dtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

const char* DtypeName(Dtype dtype);
// Bytes per element.
int DtypeSize(Dtype dtype);
// "F32" -> kF32; InvalidArgument for any other name (F8 variants, U16... are not supported).
absl::StatusOr<Dtype> ParseDtype(absl::string_view name);

// One tensor in a file. [begin, end) is relative to the start of the data section.
struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;  // empty: a 0-d (scalar) tensor
  uint64_t begin = 0;
  uint64_t end = 0;

  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

// A safetensors file opened read-only through mmap. The header is parsed and validated in
// Open: known dtypes, non-negative shapes whose size matches the byte range, ranges inside
// the file, no two ranges overlapping, no bytes of the data section left unindexed (as
// Python's safetensors requires). Errors name the file and, where there is one, the tensor.
//
// The mapping is private and writable (copy-on-write): a caller may modify the bytes it
// gets (e.g. a tensor used as a trainable parameter) without touching the file. Immutable
// after Open; const methods are thread-safe. Keep the shared_ptr alive as long as any
// pointer into the data is used.
class SafetensorsFile {
 public:
  // Error codes: NotFound (no such file), DataLoss (truncated or inconsistent file),
  // InvalidArgument (not a safetensors file: bad header length or JSON), Internal (mmap).
  static absl::StatusOr<std::shared_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_bytes() const { return file_bytes_; }
  uint64_t header_bytes() const { return header_bytes_; }
  // Tensors sorted by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorInfo* Find(absl::string_view name) const;
  // The `__metadata__` object (string to string), empty when absent.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Start of a tensor's bytes (nbytes() of them) in the mapping.
  uint8_t* Data(const TensorInfo& info) const { return data_ + info.begin; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  std::unique_ptr<MappedFile> map_;
  uint64_t file_bytes_ = 0;
  uint64_t header_bytes_ = 0;
  uint8_t* data_ = nullptr;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A tensor to write: its bytes are read from `data` (nbytes = numel * dtype size, host
// memory, row-major contiguous) during WriteSafetensors.
struct TensorToWrite {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t nbytes = 0;
};

struct WriteResult {
  uint64_t bytes = 0;  // file size
  std::string sha256;  // of the whole file, lowercase hex
  // sha256 of each tensor's bytes, by name (for the manifest: a damaged file can then name
  // the damaged tensor).
  std::map<std::string, std::string> tensor_sha256;
};

// Writes `tensors` to `path` (created; an existing file is replaced) and fsyncs it. The
// output is a function of the tensors alone: data ordered by element size (largest first,
// so every tensor is aligned to its element size, as Python's safetensors orders them),
// then by name; header keys in the same order after `__metadata__` = `metadata` (default
// {"format":"pt"}, which transformers expects); the header padded with spaces to a
// multiple of 8 bytes. InvalidArgument for duplicate names or a size mismatch.
absl::StatusOr<WriteResult> WriteSafetensors(const std::string& path,
                                             std::vector<TensorToWrite> tensors,
                                             const std::map<std::string, std::string>& metadata = {
                                                 {"format", "pt"}});

// Where WriteSafetensors would put everything for `tensors` (their data is not read): the
// bytes before the data (the 8-byte header length and the padded header) and each tensor's
// offset in the file. For writing a file's tensors one by one, in any order, each straight
// into its place (CheckpointWriter::WriteTensor). Errors as WriteSafetensors'.
struct SafetensorsLayout {
  std::string head;
  std::map<std::string, uint64_t> offsets;  // tensor name -> file offset of its first byte
  uint64_t file_bytes = 0;
};
absl::StatusOr<SafetensorsLayout> LayOutSafetensors(
    const std::string& path, std::vector<TensorToWrite> tensors,
    const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace stemma::engine::io
