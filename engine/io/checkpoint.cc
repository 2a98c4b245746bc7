#include "engine/io/checkpoint.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/engine_contract.h"
#include "common/status.h"
#include "engine/io/durable.h"
#include "engine/io/fs.h"
#include "engine/io/sha256.h"

namespace stemma::engine::io {
namespace {

std::string Join(const std::string& dir, absl::string_view name) {
  return absl::StrCat(dir, "/", name);
}

absl::StatusOr<nlohmann::json> ReadJson(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return absl::InvalidArgumentError(path + ": not valid JSON");
  return j;
}

c10::ScalarType ToScalarType(Dtype d) {
  switch (d) {
    case Dtype::kF64:
      return c10::kDouble;
    case Dtype::kF32:
      return c10::kFloat;
    case Dtype::kF16:
      return c10::kHalf;
    case Dtype::kBF16:
      return c10::kBFloat16;
    case Dtype::kI64:
      return c10::kLong;
    case Dtype::kI32:
      return c10::kInt;
    case Dtype::kI16:
      return c10::kShort;
    case Dtype::kI8:
      return c10::kChar;
    case Dtype::kU8:
      return c10::kByte;
    case Dtype::kBool:
      return c10::kBool;
  }
  return c10::kFloat;
}

absl::StatusOr<Dtype> FromScalarType(c10::ScalarType t) {
  switch (t) {
    case c10::kDouble:
      return Dtype::kF64;
    case c10::kFloat:
      return Dtype::kF32;
    case c10::kHalf:
      return Dtype::kF16;
    case c10::kBFloat16:
      return Dtype::kBF16;
    case c10::kLong:
      return Dtype::kI64;
    case c10::kInt:
      return Dtype::kI32;
    case c10::kShort:
      return Dtype::kI16;
    case c10::kChar:
      return Dtype::kI8;
    case c10::kByte:
      return Dtype::kU8;
    case c10::kBool:
      return Dtype::kBool;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", c10::toString(t), " cannot be stored in safetensors here"));
  }
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// ---- reading ----

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& dir, const CheckpointReaderOptions& options) {
  std::unique_ptr<CheckpointReader> r(new CheckpointReader());
  r->dir_ = dir;
  const std::string manifest_path = Join(dir, kManifestName);
  r->has_manifest_ = PathExists(manifest_path);
  const CheckpointReaderOptions::Verify verify = VerifyForThisRank(options.verify);
  if (verify == CheckpointReaderOptions::Verify::kAlways && !r->has_manifest_) {
    return absl::FailedPreconditionError(dir + ": no " + kManifestName + " manifest to verify");
  }
  if (r->has_manifest_ && verify == CheckpointReaderOptions::Verify::kSizes) {
    RETURN_IF_ERROR(VerifyCheckpointSizes(dir));
  } else if (r->has_manifest_ && verify != CheckpointReaderOptions::Verify::kNever) {
    RETURN_IF_ERROR(VerifyCheckpoint(dir));
  }
  if (std::string config = Join(dir, "config.json"); PathExists(config)) {
    ASSIGN_OR_RETURN(r->config_, ReadJson(config));
  }

  // name -> file, from the index or from the single file.
  std::map<std::string, std::string> weight_map;
  const std::string index_path = Join(dir, kIndexName);
  if (PathExists(index_path)) {
    ASSIGN_OR_RETURN(nlohmann::json index, ReadJson(index_path));
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError(index_path + ": no weight_map object");
    }
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": weight_map.", it.key(), " is not a file name"));
      }
      std::string file = it.value().get<std::string>();
      if (file.find('/') != std::string::npos || file == "..") {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": weight_map.", it.key(), " points outside the directory"));
      }
      weight_map[it.key()] = file;
      if (std::find(r->shard_names_.begin(), r->shard_names_.end(), file) ==
          r->shard_names_.end()) {
        r->shard_names_.push_back(file);
      }
    }
    std::sort(r->shard_names_.begin(), r->shard_names_.end());
  } else if (PathExists(Join(dir, kSingleFileName))) {
    r->shard_names_.push_back(kSingleFileName);
  } else {
    return absl::NotFoundError(absl::StrCat(dir, ": neither ", kSingleFileName, " nor ", kIndexName,
                                            " (not a checkpoint directory?)"));
  }

  for (size_t i = 0; i < r->shard_names_.size(); ++i) {
    ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(Join(dir, r->shard_names_[i])));
    for (const TensorInfo& t : file->tensors()) {
      if (!weight_map.empty()) {
        auto it = weight_map.find(t.name);
        // A tensor the index places elsewhere (or not at all) is not part of the model.
        if (it == weight_map.end() || it->second != r->shard_names_[i]) continue;
      }
      r->entries_[t.name] = Entry{&t, static_cast<int>(i)};
    }
    r->files_.push_back(std::move(file));
  }
  for (const auto& [name, file] : weight_map) {
    if (r->entries_.find(name) == r->entries_.end()) {
      return absl::DataLossError(absl::StrCat(Join(dir, file), ": tensor \"", name, "\" listed in ",
                                              kIndexName, " is missing"));
    }
  }
  return r;
}

std::vector<std::string> CheckpointReader::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(entries_.size());
  for (const auto& [name, e] : entries_) names.push_back(name);
  return names;
}

const TensorInfo* CheckpointReader::Find(absl::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second.info;
}

std::string CheckpointReader::ShardOf(absl::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? std::string() : shard_names_[it->second.file];
}

absl::StatusOr<at::Tensor> CheckpointReader::Tensor(absl::string_view name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": no tensor \"", name, "\""));
  }
  const TensorInfo& info = *it->second.info;
  std::shared_ptr<SafetensorsFile> file = files_[it->second.file];
  uint8_t* data = file->Data(info);
  const c10::ScalarType type = ToScalarType(info.dtype);
  auto options = at::TensorOptions().dtype(type).device(at::kCPU);
  if (reinterpret_cast<uintptr_t>(data) % DtypeSize(info.dtype) == 0) {
    // The deleter owns a reference to the mapping: the tensor keeps it alive.
    return at::from_blob(
        data, info.shape, [file](void*) {}, options);
  }
  // Misaligned (possible in files from other writers): copy into an aligned buffer.
  at::Tensor copy = at::empty(info.shape, options);
  std::memcpy(copy.data_ptr(), data, info.nbytes());
  return copy;
}

at::Tensor CheckpointReader::TensorOrThrow(absl::string_view name) const {
  auto t = Tensor(name);
  if (!t.ok()) throw std::runtime_error(std::string(t.status().message()));
  return *std::move(t);
}

// ---- verifying ----

namespace {

// `dir`/stemma.json, with every file it lists inside `dir` and present. NotFound without a
// manifest or for a missing file, InvalidArgument for a name outside the directory.
absl::StatusOr<Manifest> ReadListedManifest(const std::string& dir) {
  const std::string manifest_path = Join(dir, kManifestName);
  if (!PathExists(manifest_path)) {
    return absl::NotFoundError(absl::StrCat(dir, ": no ", kManifestName, " manifest"));
  }
  ASSIGN_OR_RETURN(std::string text, ReadFile(manifest_path));
  ASSIGN_OR_RETURN(Manifest manifest, ParseManifest(text, manifest_path));
  for (const auto& [name, want] : manifest.files) {
    if (name.find('/') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(manifest_path, ": file \"", name, "\" points outside the directory"));
    }
    const std::string path = Join(dir, name);
    if (!PathExists(path)) {
      return absl::NotFoundError(absl::StrCat(path, ": missing (listed in ", kManifestName, ")"));
    }
  }
  return manifest;
}

// DataLoss for the file at `path` that does not match `want` (`what`: how), narrowed down to
// a tensor where the file is a safetensors file and a tensor's own hash differs.
absl::Status Damaged(const std::string& path, const ManifestFile& want, const std::string& what) {
  if (absl::EndsWith(path, ".safetensors")) {
    auto file = SafetensorsFile::Open(path);
    if (!file.ok()) {
      return absl::DataLossError(absl::StrCat(file.status().message(), " (", what, ")"));
    }
    for (const TensorInfo& t : (*file)->tensors()) {
      auto expected = want.tensor_sha256.find(t.name);
      if (expected == want.tensor_sha256.end()) continue;
      if (Sha256Hex(absl::string_view(reinterpret_cast<const char*>((*file)->Data(t)),
                                      t.nbytes())) != expected->second) {
        return absl::DataLossError(
            absl::StrCat(path, ": tensor \"", t.name, "\" is damaged (", what, ")"));
      }
    }
  }
  return absl::DataLossError(absl::StrCat(path, ": damaged (", what, ")"));
}

}  // namespace

CheckpointReaderOptions::Verify VerifyForThisRank(CheckpointReaderOptions::Verify verify) {
  if (verify != CheckpointReaderOptions::Verify::kOncePerJob) return verify;
  const char* rank = std::getenv(std::string(engine_contract::kEnvRank).c_str());
  const bool rank0 = rank == nullptr || *rank == '\0' || std::string_view(rank) == "0";
  return rank0 ? CheckpointReaderOptions::Verify::kIfManifest
               : CheckpointReaderOptions::Verify::kSizes;
}

absl::Status VerifyCheckpoint(const std::string& dir) {
  ASSIGN_OR_RETURN(Manifest manifest, ReadListedManifest(dir));
  for (const auto& [name, want] : manifest.files) {
    const std::string path = Join(dir, name);
    uint64_t bytes = 0;
    ASSIGN_OR_RETURN(std::string sha, Sha256File(path, &bytes));
    if (bytes == want.bytes && sha == want.sha256) continue;
    return Damaged(path, want,
                   bytes != want.bytes ? absl::StrCat(bytes, " bytes, manifest says ", want.bytes)
                                       : "sha256 differs from the manifest");
  }
  return absl::OkStatus();
}

absl::Status VerifyCheckpointSizes(const std::string& dir) {
  ASSIGN_OR_RETURN(Manifest manifest, ReadListedManifest(dir));
  for (const auto& [name, want] : manifest.files) {
    const std::string path = Join(dir, name);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return ErrnoStatus("stat " + path, errno);
    const auto bytes = static_cast<uint64_t>(st.st_size);
    if (bytes != want.bytes) {
      return absl::DataLossError(
          absl::StrCat(path, ": damaged (", bytes, " bytes, manifest says ", want.bytes, ")"));
    }
  }
  return absl::OkStatus();
}

// ---- writing ----

struct CheckpointWriter::Impl {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> files;
  // Streaming (DeclareTensor / WriteTensor).
  struct Declared {
    Dtype dtype = Dtype::kF32;
    std::vector<int64_t> shape;
    uint64_t nbytes = 0;
    size_t shard = 0;     // index into shard_files
    uint64_t offset = 0;  // of its first byte in that file
    std::string sha256;   // empty until written
  };
  std::map<std::string, Declared> declared;
  bool laid_out = false;
  absl::Status layout;  // LayOutDeclared's result: a failure stays, no tensor is written after it
  std::vector<std::string> shard_files;
  std::vector<files::UniqueFd> shard_fds;
};

namespace {

// Tensors in name order (name, bytes) -> the names of each shard: a new shard when the next
// tensor would overflow `max_bytes` (a larger tensor gets one of its own).
std::vector<std::vector<std::string>> AssignShards(
    const std::vector<std::pair<std::string, uint64_t>>& tensors, uint64_t max_bytes) {
  std::vector<std::vector<std::string>> shards(1);
  uint64_t bytes = 0;
  for (const auto& [name, n] : tensors) {
    if (!shards.back().empty() && bytes + n > max_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(name);
    bytes += n;
  }
  return shards;
}

std::string ShardFileName(size_t index, size_t count) {
  return count == 1 ? std::string(kSingleFileName)
                    : absl::StrFormat("model-%05d-of-%05d.safetensors", index + 1, count);
}

// pwrite(2) of all of `data` at `offset`; errors name `path`.
absl::Status WriteAllAt(int fd, const uint8_t* data, uint64_t size, uint64_t offset,
                        const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, data, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("write " + path, errno);
    data += n;
    size -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Create(
    const std::string& out, CheckpointWriterOptions options) {
  if (out.empty()) return absl::InvalidArgumentError("checkpoint output path is empty");
  std::string target = out;
  while (target.size() > 1 && target.back() == '/') target.pop_back();
  if (options.max_shard_bytes == 0) {
    return absl::InvalidArgumentError("max_shard_bytes must be positive");
  }
  std::unique_ptr<CheckpointWriter> w(new CheckpointWriter());
  w->out_ = target;
  w->options_ = std::move(options);
  w->impl_ = std::make_unique<Impl>();
  // Refuses an existing `out` (unless overwrite, and then only one Stemma wrote) and
  // creates `<out>.tmp-<pid>` (engine/io/durable.h).
  ASSIGN_OR_RETURN(w->staging_, CreateStagingDir(target, w->options_.overwrite));
  return w;
}

CheckpointWriter::~CheckpointWriter() {
  if (!done_ && !staging_.empty()) RemoveTree(staging_).IgnoreError();
}

absl::Status CheckpointWriter::AddTensor(const std::string& name, const at::Tensor& tensor) {
  if (done_) return absl::FailedPreconditionError(out_ + ": writer already committed");
  if (name.empty() || name == "__metadata__") {
    return absl::InvalidArgumentError(absl::StrCat("invalid tensor name \"", name, "\""));
  }
  auto dtype = FromScalarType(tensor.scalar_type());
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", name, "\": ", dtype.status().message()));
  }
  if (!impl_->declared.empty()) {
    return absl::FailedPreconditionError(out_ + ": AddTensor and DeclareTensor do not mix");
  }
  if (!impl_->tensors.emplace(name, tensor).second) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\" added twice"));
  }
  return absl::OkStatus();
}

absl::Status CheckpointWriter::AddFile(const std::string& name, std::string contents) {
  if (name.empty() || name.find('/') != std::string::npos || name == kManifestName ||
      absl::EndsWith(name, ".safetensors") || name == kIndexName) {
    return absl::InvalidArgumentError(absl::StrCat("cannot add file \"", name, "\""));
  }
  impl_->files[name] = std::move(contents);
  return absl::OkStatus();
}

absl::Status CheckpointWriter::DeclareTensor(const std::string& name, Dtype dtype,
                                             std::vector<int64_t> shape) {
  if (done_ || impl_->laid_out) {
    return absl::FailedPreconditionError(out_ + ": DeclareTensor after WriteTensor or Commit");
  }
  if (!impl_->tensors.empty()) {
    return absl::FailedPreconditionError(out_ + ": AddTensor and DeclareTensor do not mix");
  }
  if (name.empty() || name == "__metadata__") {
    return absl::InvalidArgumentError(absl::StrCat("invalid tensor name \"", name, "\""));
  }
  Impl::Declared d;
  d.dtype = dtype;
  d.nbytes = DtypeSize(dtype);
  for (int64_t n : shape) d.nbytes *= static_cast<uint64_t>(std::max<int64_t>(n, 0));
  d.shape = std::move(shape);
  if (!impl_->declared.emplace(name, std::move(d)).second) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\" declared twice"));
  }
  return absl::OkStatus();
}

// The shard files of the declared tensors, laid out once, before the first tensor is written.
absl::Status CheckpointWriter::LaidOut() {
  if (!impl_->laid_out) {
    impl_->laid_out = true;
    impl_->layout = LayOutDeclared();
  }
  return impl_->layout;
}

// The shard files of the declared tensors, created with their headers at their full size.
absl::Status CheckpointWriter::LayOutDeclared() {
  std::vector<std::pair<std::string, uint64_t>> sizes;
  for (const auto& [name, d] : impl_->declared) sizes.emplace_back(name, d.nbytes);
  const auto shards = AssignShards(sizes, options_.max_shard_bytes);
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = ShardFileName(i, shards.size()), path = Join(staging_, file);
    std::vector<TensorToWrite> entries;
    for (const std::string& name : shards[i]) {
      const Impl::Declared& d = impl_->declared.at(name);
      entries.push_back(TensorToWrite{name, d.dtype, d.shape, nullptr, d.nbytes});
    }
    ASSIGN_OR_RETURN(SafetensorsLayout layout, LayOutSafetensors(path, std::move(entries)));
    for (const std::string& name : shards[i]) {
      Impl::Declared& d = impl_->declared.at(name);
      d.shard = i;
      d.offset = layout.offsets.at(name);
    }
    ASSIGN_OR_RETURN(files::UniqueFd fd, files::Open(path, O_WRONLY | O_CREAT | O_TRUNC));
    RETURN_IF_ERROR(files::WriteAll(fd.get(), layout.head, path));
    if (::ftruncate(fd.get(), static_cast<off_t>(layout.file_bytes)) != 0) {
      return ErrnoStatus("truncate " + path, errno);
    }
    impl_->shard_files.push_back(file);
    impl_->shard_fds.push_back(std::move(fd));
  }
  return absl::OkStatus();
}

absl::Status CheckpointWriter::WriteTensor(const std::string& name, const at::Tensor& tensor) {
  if (done_) return absl::FailedPreconditionError(out_ + ": writer already committed");
  auto it = impl_->declared.find(name);
  if (it == impl_->declared.end()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\" was not declared"));
  }
  Impl::Declared& d = it->second;
  auto dtype = FromScalarType(tensor.scalar_type());
  if (!d.sha256.empty() || !dtype.ok() || *dtype != d.dtype || tensor.sizes() != d.shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", name, "\": written twice, or not the declared dtype and shape"));
  }
  RETURN_IF_ERROR(LaidOut());
  const at::Tensor host = tensor.detach().to(at::kCPU).contiguous();
  const auto* data = static_cast<const uint8_t*>(host.data_ptr());
  const std::string path = Join(staging_, impl_->shard_files[d.shard]);
  RETURN_IF_ERROR(WriteAllAt(impl_->shard_fds[d.shard].get(), data, d.nbytes, d.offset, path));
  Sha256 hash;
  hash.Update(data, d.nbytes);
  d.sha256 = hash.HexDigest();
  return absl::OkStatus();
}

absl::StatusOr<size_t> CheckpointWriter::FinishDeclared(Manifest& manifest,
                                                        nlohmann::json& weight_map,
                                                        uint64_t& total_bytes) {
  RETURN_IF_ERROR(LaidOut());
  std::vector<std::map<std::string, std::string>> tensor_sha256(impl_->shard_files.size());
  for (const auto& [name, d] : impl_->declared) {
    if (d.sha256.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(out_, ": tensor \"", name, "\" was declared but never written"));
    }
    weight_map[name] = impl_->shard_files[d.shard];
    tensor_sha256[d.shard][name] = d.sha256;
    total_bytes += d.nbytes;
  }
  for (size_t i = 0; i < impl_->shard_files.size(); ++i) {
    const std::string& file = impl_->shard_files[i];
    const std::string path = Join(staging_, file);
    RETURN_IF_ERROR(files::SyncFd(impl_->shard_fds[i].get(), path));
    RETURN_IF_ERROR(impl_->shard_fds[i].Close(path));
    uint64_t bytes = 0;
    ASSIGN_OR_RETURN(std::string sha, Sha256File(path, &bytes));
    manifest.files[file] = ManifestFile{sha, bytes, std::move(tensor_sha256[i])};
    if (options_.after_file_for_test) RETURN_IF_ERROR(options_.after_file_for_test(file));
  }
  return impl_->shard_files.size();
}

absl::Status CheckpointWriter::Commit() {
  if (done_) return absl::FailedPreconditionError(out_ + ": writer already committed");
  absl::Status s = CommitImpl();
  done_ = true;
  if (!s.ok()) RemoveTree(staging_).IgnoreError();
  return s;
}

absl::Status CheckpointWriter::CommitImpl() {
  Manifest manifest;
  auto after = [&](const std::string& file) -> absl::Status {
    return options_.after_file_for_test ? options_.after_file_for_test(file) : absl::OkStatus();
  };
  auto record = [&](const std::string& file) -> absl::Status {
    uint64_t bytes = 0;
    ASSIGN_OR_RETURN(std::string sha, Sha256File(Join(staging_, file), &bytes));
    manifest.files[file] = ManifestFile{sha, bytes, {}};
    return after(file);
  };

  // Shards: tensors in name order, a new shard when the next tensor would overflow.
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total_bytes = 0;
  size_t count = 0;
  if (!impl_->declared.empty()) {
    ASSIGN_OR_RETURN(count, FinishDeclared(manifest, weight_map, total_bytes));
  } else {
    std::vector<std::pair<std::string, uint64_t>> sizes;
    for (const auto& [name, t] : impl_->tensors) {
      sizes.emplace_back(name, t.numel() * t.element_size());
      total_bytes += sizes.back().second;
    }
    const auto shards = AssignShards(sizes, options_.max_shard_bytes);
    count = shards.size();
    for (size_t i = 0; i < count; ++i) {
      const std::string file = ShardFileName(i, count);
      std::vector<at::Tensor> host;  // keeps this shard's CPU copies alive while writing
      std::vector<TensorToWrite> writes;
      for (const std::string& name : shards[i]) {
        at::Tensor t = impl_->tensors.at(name).detach().to(at::kCPU).contiguous();
        host.push_back(t);
        writes.push_back(TensorToWrite{name, *FromScalarType(t.scalar_type()), t.sizes().vec(),
                                       t.data_ptr(),
                                       static_cast<uint64_t>(t.numel() * t.element_size())});
        weight_map[name] = file;
      }
      ASSIGN_OR_RETURN(WriteResult written,
                       WriteSafetensors(Join(staging_, file), std::move(writes)));
      manifest.files[file] = ManifestFile{written.sha256, written.bytes, written.tensor_sha256};
      RETURN_IF_ERROR(after(file));
    }
  }
  if (count > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}},
                            {"weight_map", weight_map}};
    RETURN_IF_ERROR(WriteFileSynced(Join(staging_, kIndexName), index.dump(2) + "\n"));
    RETURN_IF_ERROR(record(kIndexName));
  }

  for (const auto& [name, contents] : impl_->files) {
    RETURN_IF_ERROR(WriteFileSynced(Join(staging_, name), contents));
    RETURN_IF_ERROR(record(name));
  }
  if (!options_.source_dir.empty()) {
    for (const char* name : kCarriedFiles) {
      if (impl_->files.count(name)) continue;
      std::string from = Join(options_.source_dir, name);
      if (!PathExists(from)) continue;
      RETURN_IF_ERROR(CopyFileSynced(from, Join(staging_, name)));
      RETURN_IF_ERROR(record(name));
    }
  }

  for (const std::string& parent : options_.parents) {
    ManifestParent p{parent, ""};
    std::string parent_manifest = Join(parent, kManifestName);
    if (PathExists(parent_manifest)) {
      ASSIGN_OR_RETURN(p.manifest_sha256, Sha256File(parent_manifest));
    }
    manifest.parents.push_back(std::move(p));
  }
  manifest.producer = options_.producer;
  manifest.created_ms = options_.created_ms >= 0 ? options_.created_ms : NowMs();
  RETURN_IF_ERROR(
      WriteFileSynced(Join(staging_, kManifestName), ManifestToJson(manifest).dump(2) + "\n"));
  RETURN_IF_ERROR(after(kManifestName));

  // Publish through the durability door: `out` is the old checkpoint or the new one at
  // every instant, never missing.
  return PublishDir(staging_, out_, options_.overwrite);
}

}  // namespace stemma::engine::io
