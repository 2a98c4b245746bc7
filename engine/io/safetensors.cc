#include "engine/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/io/durable.h"
#include "engine/io/fs.h"
#include "engine/io/sha256.h"

namespace stemma::engine::io {
namespace {

// Python's safetensors refuses headers above 100 MB; so do we (a corrupt length would
// otherwise make us parse gigabytes of tensor data as JSON).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeRow {
  Dtype dtype;
  const char* name;
  int size;
};
constexpr DtypeRow kDtypes[] = {
    {Dtype::kF64, "F64", 8},   {Dtype::kF32, "F32", 4}, {Dtype::kF16, "F16", 2},
    {Dtype::kBF16, "BF16", 2}, {Dtype::kI64, "I64", 8}, {Dtype::kI32, "I32", 4},
    {Dtype::kI16, "I16", 2},   {Dtype::kI8, "I8", 1},   {Dtype::kU8, "U8", 1},
    {Dtype::kBool, "BOOL", 1},
};

std::string Quote(absl::string_view s) { return nlohmann::json(std::string(s)).dump(); }

// The header's __metadata__: an object of strings.
absl::Status ReadMetadata(const std::string& path, const nlohmann::json& v,
                          std::map<std::string, std::string>* out) {
  if (!v.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": __metadata__ is not an object"));
  }
  for (auto m = v.begin(); m != v.end(); ++m) {
    if (!m.value().is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": __metadata__.", m.key(), " is not a string"));
    }
    (*out)[m.key()] = m.value().get<std::string>();
  }
  return absl::OkStatus();
}

// One tensor's header entry {dtype, shape, data_offsets}, checked against itself and the
// data section's size.
absl::StatusOr<TensorInfo> ParseTensorEntry(const std::string& path, const std::string& name,
                                            const nlohmann::json& v, uint64_t data_bytes) {
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(path, ": tensor ", Quote(name), ": ", why));
  };
  if (!v.is_object()) return bad("header entry is not an object");
  TensorInfo info;
  info.name = name;
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) return bad("missing dtype");
  auto dtype = ParseDtype(dt->get<std::string>());
  if (!dtype.ok()) return bad(dtype.status().message());
  info.dtype = *dtype;
  auto shape = v.find("shape");
  if (shape == v.end() || !shape->is_array()) return bad("missing shape");
  uint64_t numel = 1;
  for (const auto& d : *shape) {
    if (!d.is_number_unsigned()) return bad("shape has a negative or non-integer dimension");
    uint64_t dim = d.get<uint64_t>();
    if (dim > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, dim, &numel)) {
      return bad("shape overflows");
    }
    info.shape.push_back(static_cast<int64_t>(dim));
  }
  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned()) {
    return bad("data_offsets is not [begin, end]");
  }
  info.begin = (*off)[0].get<uint64_t>();
  info.end = (*off)[1].get<uint64_t>();
  if (info.begin > info.end) return bad("data_offsets begin > end");
  if (info.end > data_bytes) {
    return bad(absl::StrCat("data_offsets [", info.begin, ", ", info.end,
                            ") beyond the data section of ", data_bytes,
                            " bytes (truncated file?)"));
  }
  uint64_t want = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(DtypeSize(info.dtype)), &want) ||
      want != info.nbytes()) {
    return bad(absl::StrCat("shape and dtype need ", want, " bytes but data_offsets hold ",
                            info.nbytes()));
  }
  return info;
}

// The tensors' ranges must tile the data section exactly: no overlap, no unindexed bytes.
absl::Status CheckTiling(const std::string& path, const std::vector<TensorInfo>& tensors,
                         uint64_t data_bytes) {
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : tensors) {
    if (t.nbytes() > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  uint64_t pos = 0;
  for (size_t i = 0; i < by_offset.size(); ++i) {
    const TensorInfo* t = by_offset[i];
    if (t->begin < pos) {
      return absl::DataLossError(absl::StrCat(path, ": tensor ", Quote(t->name),
                                              " overlaps tensor ", Quote(by_offset[i - 1]->name)));
    }
    if (t->begin > pos) {
      return absl::DataLossError(absl::StrCat(path, ": bytes [", pos, ", ", t->begin,
                                              ") of the data section belong to no tensor"));
    }
    pos = t->end;
  }
  if (pos != data_bytes) {
    return absl::DataLossError(absl::StrCat(path, ": ", data_bytes - pos,
                                            " bytes after the last tensor belong to no tensor"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* DtypeName(Dtype dtype) {
  for (const auto& row : kDtypes) {
    if (row.dtype == dtype) return row.name;
  }
  return "?";
}

int DtypeSize(Dtype dtype) {
  for (const auto& row : kDtypes) {
    if (row.dtype == dtype) return row.size;
  }
  return 0;
}

absl::StatusOr<Dtype> ParseDtype(absl::string_view name) {
  for (const auto& row : kDtypes) {
    if (name == row.name) return row.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported dtype ", Quote(name)));
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::~SafetensorsFile() = default;

const TensorInfo* SafetensorsFile::Find(absl::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, absl::string_view n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

absl::StatusOr<std::shared_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  // Private and writable: copy-on-write pages, so tensors over the mapping may be modified
  // by their users without changing the file.
  ASSIGN_OR_RETURN(file->map_, MappedFile::Open(path, /*writable=*/true));
  const uint64_t size = file->map_->size();
  if (size < 8) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", size, " bytes, too short for a safetensors header (truncated?)"));
  }
  file->file_bytes_ = size;
  uint8_t* map = file->map_->data();
  const auto* bytes = static_cast<const uint8_t*>(map);

  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  if (n > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", n, " exceeds ",
                                                   kMaxHeaderBytes, " (not a safetensors file?)"));
  }
  if (8 + n > size) {
    return absl::DataLossError(absl::StrCat(path, ": header of ", n, " bytes but the file has ",
                                            size, " bytes (truncated?)"));
  }
  file->header_bytes_ = n;
  file->data_ = static_cast<uint8_t*>(map) + 8 + n;
  const uint64_t data_bytes = size - 8 - n;

  nlohmann::json header = nlohmann::json::parse(bytes + 8, bytes + 8 + n, nullptr,
                                                /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header is not a JSON object (not a safetensors file, or damaged)"));
  }
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      RETURN_IF_ERROR(ReadMetadata(path, it.value(), &file->metadata_));
      continue;
    }
    ASSIGN_OR_RETURN(TensorInfo info, ParseTensorEntry(path, it.key(), it.value(), data_bytes));
    file->tensors_.push_back(std::move(info));
  }
  std::sort(file->tensors_.begin(), file->tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  RETURN_IF_ERROR(CheckTiling(path, file->tensors_, data_bytes));
  return file;
}

namespace {

// The file's order: by element size (largest first, so every tensor is aligned to its
// element size), then by name.
void SortForFile(std::vector<TensorToWrite>& tensors) {
  std::sort(tensors.begin(), tensors.end(), [](const TensorToWrite& a, const TensorToWrite& b) {
    int sa = DtypeSize(a.dtype), sb = DtypeSize(b.dtype);
    if (sa != sb) return sa > sb;
    return a.name < b.name;
  });
}

}  // namespace

absl::StatusOr<SafetensorsLayout> LayOutSafetensors(
    const std::string& path, std::vector<TensorToWrite> tensors,
    const std::map<std::string, std::string>& metadata) {
  SortForFile(tensors);
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      absl::StrAppend(&header, first ? "" : ",", Quote(k), ":", Quote(v));
      first = false;
    }
    header += "}";
  }
  SafetensorsLayout layout;
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorToWrite& t = tensors[i];
    if (t.name.empty() || t.name == "__metadata__") {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": invalid tensor name ", Quote(t.name)));
    }
    if (i > 0 && tensors[i - 1].name == t.name) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": duplicate tensor ", Quote(t.name)));
    }
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor ", Quote(t.name), ": negative dimension"));
      }
      numel *= static_cast<uint64_t>(d);
    }
    if (numel * DtypeSize(t.dtype) != t.nbytes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", Quote(t.name), ": ",
                                                     t.nbytes, " bytes given for its shape"));
    }
    absl::StrAppend(&header, (header.size() > 1 ? "," : ""), Quote(t.name), ":{\"dtype\":\"",
                    DtypeName(t.dtype), "\",\"shape\":[");
    for (size_t d = 0; d < t.shape.size(); ++d) {
      absl::StrAppend(&header, d ? "," : "", t.shape[d]);
    }
    absl::StrAppend(&header, "],\"data_offsets\":[", offset, ",", offset + t.nbytes, "]}");
    layout.offsets[t.name] = offset;
    offset += t.nbytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  // Duplicates are adjacent only within one dtype size; check across sizes too.
  {
    std::vector<absl::string_view> names;
    for (const auto& t : tensors) names.push_back(t.name);
    std::sort(names.begin(), names.end());
    auto dup = std::adjacent_find(names.begin(), names.end());
    if (dup != names.end()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": duplicate tensor ", Quote(*dup)));
    }
  }
  uint8_t len[8];
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  layout.head.assign(reinterpret_cast<const char*>(len), 8);
  layout.head += header;
  for (auto& [name, at] : layout.offsets) at += layout.head.size();
  layout.file_bytes = layout.head.size() + offset;
  return layout;
}

absl::StatusOr<WriteResult> WriteSafetensors(const std::string& path,
                                             std::vector<TensorToWrite> tensors,
                                             const std::map<std::string, std::string>& metadata) {
  for (const TensorToWrite& t : tensors) {
    if (t.nbytes > 0 && t.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", Quote(t.name), ": ",
                                                     t.nbytes, " bytes given for its shape"));
    }
  }
  ASSIGN_OR_RETURN(SafetensorsLayout layout, LayOutSafetensors(path, tensors, metadata));
  SortForFile(tensors);
  const int raw_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (raw_fd < 0) return ErrnoStatus("create " + path, errno);
  UniqueFd fd(raw_fd);
  Sha256 file_hash;
  WriteResult result;
  auto write_all = [&](const void* data, uint64_t size) -> absl::Status {
    file_hash.Update(data, size);
    return files::WriteAll(fd.get(), absl::string_view(static_cast<const char*>(data), size), path);
  };
  absl::Status s = write_all(layout.head.data(), layout.head.size());
  for (const auto& t : tensors) {
    if (!s.ok()) break;
    s = write_all(t.data, t.nbytes);
    Sha256 tensor_hash;
    tensor_hash.Update(t.data, t.nbytes);
    result.tensor_sha256[t.name] = tensor_hash.HexDigest();
  }
  if (s.ok()) s = files::SyncFd(fd.get(), path);
  if (s.ok()) s = fd.Close(path);
  if (!s.ok()) return s;
  result.bytes = layout.file_bytes;
  result.sha256 = file_hash.HexDigest();
  return result;
}

}  // namespace stemma::engine::io
