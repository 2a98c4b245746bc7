#include "engine/data/dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status.h"
#include "engine/io/sha256.h"
#include "nlohmann/json.hpp"

namespace stemma::engine::data {

using io::Sha256;
using io::Sha256File;
using io::Sha256Hex;
namespace {

using nlohmann::json;

absl::Status FieldError(const std::string& file, const std::string& field,
                        const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": field '", field, "': ", what));
}

// The value of `field` in object `j` converted to T, or an error naming file and field.
template <typename T>
absl::StatusOr<T> Get(const json& j, const std::string& file, const std::string& key,
                      std::string field = "") {
  if (field.empty()) field = key;
  if (!j.is_object()) return FieldError(file, field, "its parent is not an object");
  auto it = j.find(key);
  if (it == j.end()) return FieldError(file, field, "missing");
  try {
    return it->get<T>();
  } catch (const json::exception& e) {
    return FieldError(file, field, absl::StrCat("wrong type (", it->type_name(), ")"));
  }
}

// index.json as a JSON object: NotFound when it cannot be read, InvalidArgument when it is
// not an object.
absl::StatusOr<json> ReadIndex(const std::string& dir, const std::string& index_path) {
  absl::StatusOr<std::string> text = files::ReadFile(index_path);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat("dataset ", dir, ": cannot open index.json"));
  }
  json index;
  try {
    index = json::parse(*text);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": bad JSON: ", e.what()));
  }
  if (!index.is_object()) return absl::InvalidArgumentError(index_path + ": not an object");
  return index;
}

// index.json's "tokenizer" object (fields of another type are left unset).
TokenizerInfo TokenizerFrom(const json& tok) {
  TokenizerInfo info;
  auto sub = [&](const char* f) -> const json* {
    auto it = tok.find(f);
    return it == tok.end() ? nullptr : &*it;
  };
  if (const json* v = sub("name"); v && v->is_string()) info.name = *v;
  if (const json* v = sub("kind"); v && v->is_string()) info.kind = *v;
  if (const json* v = sub("file"); v && v->is_string()) info.file = *v;
  if (const json* v = sub("sha256"); v && v->is_string()) info.sha256 = *v;
  if (const json* v = sub("vocab_size"); v && v->is_number_integer()) info.vocab_size = *v;
  if (const json* v = sub("bos_id"); v && v->is_number_integer()) info.bos_id = *v;
  if (const json* v = sub("eos_id"); v && v->is_number_integer()) info.eos_id = *v;
  return info;
}

}  // namespace

Dataset::~Dataset() {
  for (const Mapping& m : mappings_) {
    if (m.addr != nullptr && m.size > 0) ::munmap(m.addr, m.size);
  }
}

absl::StatusOr<std::unique_ptr<Dataset>> Dataset::Open(const std::string& dir,
                                                       bool verify_checksums) {
  std::string index_path = dir + "/index.json";
  ASSIGN_OR_RETURN(json index, ReadIndex(dir, index_path));

  std::unique_ptr<Dataset> ds(new Dataset());
  ds->dir_ = dir;
  ASSIGN_OR_RETURN(std::string format, Get<std::string>(index, index_path, "format"));
  if (format != kDatasetFormat) {
    return FieldError(index_path, "format",
                      absl::StrCat("'", format, "', expected '", kDatasetFormat, "'"));
  }
  ASSIGN_OR_RETURN(std::string dtype, Get<std::string>(index, index_path, "dtype"));
  if (dtype != "uint32") return FieldError(index_path, "dtype", "'" + dtype + "', expected uint32");
  ASSIGN_OR_RETURN(ds->language_, Get<std::string>(index, index_path, "language"));
  ASSIGN_OR_RETURN(ds->num_tokens_, Get<int64_t>(index, index_path, "num_tokens"));
  ASSIGN_OR_RETURN(int64_t num_docs, Get<int64_t>(index, index_path, "num_documents"));
  ASSIGN_OR_RETURN(ds->shard_tokens_, Get<int64_t>(index, index_path, "shard_tokens"));
  ASSIGN_OR_RETURN(ds->eos_appended_, Get<bool>(index, index_path, "eos_appended"));
  if (ds->num_tokens_ <= 0 || num_docs <= 0 || ds->shard_tokens_ <= 0) {
    return FieldError(index_path, "num_tokens",
                      "num_tokens, num_documents and shard_tokens must be positive");
  }
  ASSIGN_OR_RETURN(json tok, Get<json>(index, index_path, "tokenizer"));
  if (!tok.is_object()) return FieldError(index_path, "tokenizer", "not an object");
  ds->tokenizer_ = TokenizerFrom(tok);
  if (ds->eos_appended_ && !ds->tokenizer_.eos_id) {
    return FieldError(index_path, "tokenizer.eos_id", "missing while eos_appended is true");
  }

  auto map_file = [&](const std::string& path, size_t expect_bytes) -> absl::StatusOr<void*> {
    ASSIGN_OR_RETURN(files::UniqueFd fd, files::Open(path, O_RDONLY));
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("stat " + path, errno);
    if (static_cast<size_t>(st.st_size) != expect_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", st.st_size, " bytes, ", index_path, " implies ", expect_bytes));
    }
    void* addr = ::mmap(nullptr, expect_bytes, PROT_READ, MAP_SHARED, fd.get(), 0);
    int err = errno;
    if (addr == MAP_FAILED) return ErrnoStatus("mmap " + path, err);
    ds->mappings_.push_back({addr, expect_bytes});
    return addr;
  };
  auto check_sha = [&](const std::string& path, const json& entry,
                       const std::string& field) -> absl::Status {
    if (!verify_checksums) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::string want, Get<std::string>(entry, index_path, "sha256", field));
    ASSIGN_OR_RETURN(std::string got, Sha256File(path));
    if (got != want) {
      return absl::DataLossError(
          absl::StrCat(path, ": sha256 ", got, " differs from ", index_path, " (", want, ")"));
    }
    return absl::OkStatus();
  };

  ASSIGN_OR_RETURN(json shards, Get<json>(index, index_path, "shards"));
  if (!shards.is_array() || shards.empty()) {
    return FieldError(index_path, "shards", "must be a non-empty array");
  }
  int64_t total = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    std::string field = absl::StrCat("shards[", i, "]");
    ASSIGN_OR_RETURN(std::string file,
                     Get<std::string>(shards[i], index_path, "file", field + ".file"));
    auto n_it = shards[i].find("num_tokens");
    if (n_it == shards[i].end() || !n_it->is_number_integer()) {
      return FieldError(index_path, field + ".num_tokens", "missing or not an integer");
    }
    int64_t n = *n_it;
    bool last = i + 1 == shards.size();
    if (n <= 0 || n > ds->shard_tokens_ || (!last && n != ds->shard_tokens_)) {
      return FieldError(index_path, field + ".num_tokens",
                        absl::StrCat(n, " (every shard but the last holds shard_tokens = ",
                                     ds->shard_tokens_, ")"));
    }
    if (file.find('/') != std::string::npos) {
      return FieldError(index_path, field + ".file", "must be a plain file name");
    }
    std::string path = dir + "/" + file;
    RETURN_IF_ERROR(check_sha(path, shards[i], field + ".sha256"));
    ASSIGN_OR_RETURN(void* addr, map_file(path, static_cast<size_t>(n) * sizeof(uint32_t)));
    ds->shards_.push_back(static_cast<const uint32_t*>(addr));
    total += n;
  }
  if (total != ds->num_tokens_) {
    return FieldError(index_path, "num_tokens",
                      absl::StrCat(ds->num_tokens_, " but the shards hold ", total));
  }
  ASSIGN_OR_RETURN(json docs, Get<json>(index, index_path, "documents"));
  std::string docs_path = dir + "/index.bin";
  RETURN_IF_ERROR(check_sha(docs_path, docs, "documents.sha256"));
  ASSIGN_OR_RETURN(void* addr,
                   map_file(docs_path, static_cast<size_t>(num_docs + 1) * sizeof(uint64_t)));
  ds->offsets_ = std::span<const uint64_t>(static_cast<const uint64_t*>(addr), num_docs + 1);
  // Offsets must start at 0, end at num_tokens and strictly increase (no empty documents).
  if (ds->offsets_[0] != 0 || ds->offsets_[num_docs] != static_cast<uint64_t>(total)) {
    return absl::InvalidArgumentError(
        absl::StrCat(docs_path, ": offsets must start at 0 and end at num_tokens"));
  }
  for (int64_t d = 0; d < num_docs; ++d) {
    if (ds->offsets_[d + 1] <= ds->offsets_[d]) {
      return absl::InvalidArgumentError(
          absl::StrCat(docs_path, ": document ", d, " is empty or out of order"));
    }
  }
  return ds;
}

void Dataset::Read(uint64_t begin, std::span<int32_t> out) const {
  size_t done = 0;
  while (done < out.size()) {
    uint64_t pos = begin + done;
    uint64_t shard = pos / static_cast<uint64_t>(shard_tokens_);
    uint64_t in_shard = pos % static_cast<uint64_t>(shard_tokens_);
    uint64_t shard_end = std::min<uint64_t>((shard + 1) * shard_tokens_, num_tokens_);
    size_t take = std::min<uint64_t>(out.size() - done, shard_end - pos);
    std::memcpy(out.data() + done, shards_[shard] + in_shard, take * sizeof(uint32_t));
    done += take;
  }
}

std::vector<int32_t> Dataset::Document(int64_t doc) const {
  std::vector<int32_t> out(document_size(doc));
  Read(document_begin(doc), out);
  return out;
}

}  // namespace stemma::engine::data
