#include "engine/data/dataset_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/engine_spec.h"
#include "common/files.h"
#include "common/status.h"
#include "engine/io/durable.h"
#include "stemma/v1/specs/data.pb.h"

namespace stemma::engine::data {
namespace {

namespace fs = std::filesystem;

absl::Status WriteSynced(const std::string& path, const void* data, size_t size) {
  return files::WriteFileSynced(path, absl::string_view(static_cast<const char*>(data), size));
}

std::string ParentOf(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (p.has_filename() == false) p = p.parent_path();
  fs::path parent = p.parent_path();
  return parent.empty() ? "." : parent.string();
}

std::string ShardName(int64_t i) { return absl::StrFormat("shard-%05d.bin", i); }

}  // namespace

int64_t DefaultShardTokens() {
  static const int64_t tokens = [] {
    v1::TokenizeSpec spec;
    FillFieldDefaults(&spec);
    return spec.shard_tokens();
  }();
  return tokens;
}

DatasetWriter::DatasetWriter(DatasetWriterOptions options, std::string staging)
    : options_(std::move(options)), staging_(std::move(staging)) {}

DatasetWriter::~DatasetWriter() {
  if (shard_ != nullptr) std::fclose(shard_);
  if (!finished_) {
    std::error_code ec;
    fs::remove_all(staging_, ec);
  }
}

absl::StatusOr<std::unique_ptr<DatasetWriter>> DatasetWriter::Create(DatasetWriterOptions options) {
  if (options.out_dir.empty()) return absl::InvalidArgumentError("--out: empty path");
  if (options.language.empty()) return absl::InvalidArgumentError("--language: empty");
  if (options.shard_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shard-tokens: must be positive, got ", options.shard_tokens));
  }
  if (options.eos_appended && !options.tokenizer.eos_id.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--eos: tokenizer '", options.tokenizer.name, "' has no EOS token"));
  }
  while (options.out_dir.size() > 1 && options.out_dir.back() == '/') options.out_dir.pop_back();
  std::error_code ec;
  if (fs::exists(options.out_dir, ec) && !options.overwrite) {
    return absl::AlreadyExistsError(
        absl::StrCat("--out: ", options.out_dir, " already exists (pass --overwrite)"));
  }
  if (options.overwrite) RETURN_IF_ERROR(io::CheckReplaceable(options.out_dir));
  std::string staging = absl::StrCat(options.out_dir, ".staging-", ::getpid());
  fs::remove_all(staging, ec);
  fs::create_directories(staging, ec);
  if (ec) return absl::InternalError(absl::StrCat("mkdir ", staging, ": ", ec.message()));
  return std::unique_ptr<DatasetWriter>(new DatasetWriter(std::move(options), staging));
}

absl::Status DatasetWriter::OpenShard() {
  std::string path = absl::StrCat(staging_, "/", ShardName(shards_.size()));
  shard_ = std::fopen(path.c_str(), "wb");
  if (shard_ == nullptr) return ErrnoStatus("create " + path, errno);
  shard_count_ = 0;
  shard_hash_ = Sha256();
  return absl::OkStatus();
}

absl::Status DatasetWriter::CloseShard() {
  std::string name = ShardName(shards_.size());
  std::string path = absl::StrCat(staging_, "/", name);
  bool ok = std::fflush(shard_) == 0 && files::SyncFd(::fileno(shard_), path).ok();
  int err = errno;
  ok = (std::fclose(shard_) == 0) && ok;
  shard_ = nullptr;
  if (!ok) return ErrnoStatus("write " + path, err);
  shards_.push_back(
      {{"file", name}, {"num_tokens", shard_count_}, {"sha256", shard_hash_.HexDigest()}});
  return absl::OkStatus();
}

absl::Status DatasetWriter::AddDocument(std::span<const int32_t> tokens) {
  if (finished_) return absl::FailedPreconditionError("dataset writer already finished");
  if (tokens.empty()) return absl::OkStatus();
  for (int32_t t : tokens) {
    if (t < 0 || (options_.tokenizer.vocab_size > 0 && t >= options_.tokenizer.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", t, " outside the vocabulary [0, ",
                                                     options_.tokenizer.vocab_size, ")"));
    }
  }
  doc_starts_.push_back(static_cast<uint64_t>(num_tokens_));
  // Little-endian on disk; every platform the engine builds for is little-endian.
  static_assert(std::endian::native == std::endian::little);
  size_t i = 0;
  while (i < tokens.size()) {
    if (shard_ == nullptr) RETURN_IF_ERROR(OpenShard());
    size_t take = std::min<size_t>(tokens.size() - i, options_.shard_tokens - shard_count_);
    const void* p = tokens.data() + i;
    if (std::fwrite(p, sizeof(uint32_t), take, shard_) != take) {
      return ErrnoStatus(absl::StrCat("write ", staging_, "/", ShardName(shards_.size())), errno);
    }
    shard_hash_.Update(p, take * sizeof(uint32_t));
    shard_count_ += static_cast<int64_t>(take);
    num_tokens_ += static_cast<int64_t>(take);
    i += take;
    if (shard_count_ == options_.shard_tokens) RETURN_IF_ERROR(CloseShard());
  }
  return absl::OkStatus();
}

absl::Status DatasetWriter::Finish(const std::vector<SourceFile>& sources) {
  if (finished_) return absl::FailedPreconditionError("dataset writer already finished");
  if (num_tokens_ == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("empty dataset for ", options_.out_dir, ": the inputs have no documents"));
  }
  if (shard_ != nullptr) RETURN_IF_ERROR(CloseShard());

  std::vector<uint64_t> offsets = doc_starts_;
  offsets.push_back(static_cast<uint64_t>(num_tokens_));
  std::string index_bin = staging_ + "/index.bin";
  RETURN_IF_ERROR(WriteSynced(index_bin, offsets.data(), offsets.size() * sizeof(uint64_t)));
  ASSIGN_OR_RETURN(std::string index_sha, Sha256File(index_bin));

  const TokenizerInfo& t = options_.tokenizer;
  nlohmann::json tok = {{"name", t.name},
                        {"kind", t.kind},
                        {"file", t.file},
                        {"sha256", t.sha256},
                        {"vocab_size", t.vocab_size},
                        {"bos_id", nullptr},
                        {"eos_id", nullptr}};
  if (t.bos_id) tok["bos_id"] = *t.bos_id;
  if (t.eos_id) tok["eos_id"] = *t.eos_id;
  nlohmann::json src = nlohmann::json::array();
  for (const SourceFile& s : sources) {
    src.push_back({{"path", s.path}, {"sha256", s.sha256}, {"bytes", s.bytes}});
  }
  nlohmann::json index = {
      {"format", kDatasetFormat},
      {"language", options_.language},
      {"tokenizer", tok},
      {"dtype", "uint32"},
      {"byte_order", "little"},
      {"num_tokens", num_tokens_},
      {"num_documents", static_cast<int64_t>(doc_starts_.size())},
      {"eos_appended", options_.eos_appended},
      {"shard_tokens", options_.shard_tokens},
      {"documents", {{"file", "index.bin"}, {"dtype", "uint64"}, {"sha256", index_sha}}},
      {"shards", shards_},
      {"sources", src}};
  if (!options_.parents.empty()) {
    nlohmann::json parents = nlohmann::json::array();
    for (const DatasetParent& p : options_.parents) {
      nlohmann::json parent = {{"path", p.path}, {"role", p.role}};
      if (!p.manifest_sha256.empty()) parent["manifest_sha256"] = p.manifest_sha256;
      parents.push_back(std::move(parent));
    }
    index["parents"] = std::move(parents);
  }
  std::string text = index.dump(2) + "\n";
  RETURN_IF_ERROR(WriteSynced(staging_ + "/index.json", text.data(), text.size()));
  RETURN_IF_ERROR(files::SyncDir(staging_));

  // The durability door (engine/io/durable.h): a replaced dataset is swapped atomically,
  // so `out_dir` is the old dataset or the new one at every instant, never missing.
  RETURN_IF_ERROR(io::PublishDir(staging_, options_.out_dir, options_.overwrite));
  finished_ = true;
  return absl::OkStatus();
}

}  // namespace stemma::engine::data
