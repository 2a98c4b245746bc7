#include "engine/merge/checkpoint_stream.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "engine/io/durable.h"
#include "engine/io/fs.h"
#include "engine/io/sha256.h"

namespace stemma::engine::merge {
namespace {

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";
// Start writeback of written data every this many bytes, so the final fsync has little
// left to do and the disk works while we compute.
constexpr uint64_t kWritebackBytes = 64u << 20;
constexpr int kSlots = 4;

std::string Join(const std::string& dir, absl::string_view name) {
  return absl::StrCat(dir, "/", name);
}

std::string Quote(absl::string_view s) { return nlohmann::json(std::string(s)).dump(); }

absl::StatusOr<nlohmann::json> ReadJson(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, io::ReadFile(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return absl::InvalidArgumentError(path + ": not valid JSON");
  return j;
}

int64_t CreatedMs(int64_t option) {
  if (option >= 0) return option;
  if (const char* epoch = std::getenv("SOURCE_DATE_EPOCH"); epoch != nullptr) {
    int64_t seconds = 0;
    if (absl::SimpleAtoi(epoch, &seconds)) return seconds * 1000;
  }
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The safetensors header io::WriteSafetensors writes for these tensors, and the file
// order of the data (element size descending, then name).
std::string ShardHeader(std::vector<const OutputTensor*>& order) {
  std::sort(order.begin(), order.end(), [](const OutputTensor* a, const OutputTensor* b) {
    int sa = io::DtypeSize(a->dtype), sb = io::DtypeSize(b->dtype);
    if (sa != sb) return sa > sb;
    return a->name < b->name;
  });
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
  uint64_t offset = 0;
  for (const OutputTensor* t : order) {
    absl::StrAppend(&header, ",", Quote(t->name), ":{\"dtype\":\"", io::DtypeName(t->dtype),
                    "\",\"shape\":[");
    for (size_t d = 0; d < t->shape.size(); ++d)
      absl::StrAppend(&header, d ? "," : "", t->shape[d]);
    absl::StrAppend(&header, "],\"data_offsets\":[", offset, ",", offset + t->nbytes(), "]}");
    offset += t->nbytes();
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  return header;
}

// Writes a file sequentially, hashing the bytes as they go. Data goes out with O_DIRECT
// where the filesystem allows it: from aligned staging buffers straight to the device, with
// no copy into (and no dirtying of) the page cache, which is most of the kernel's CPU cost
// of a buffered write. Two buffers and an I/O thread keep the device busy while the caller
// hashes and fills the next buffer. The tail is padded to the alignment and truncated back.
// Elsewhere (tmpfs, or O_DIRECT refused) it falls back to buffered writes.
class FileOut {
 public:
  static constexpr uint64_t kAlign = 4096;
  static constexpr uint64_t kBuffer = 8u << 20;

  ~FileOut() {
    StopIo();
    for (uint8_t* b : buffers_) std::free(b);
  }
  absl::Status Open(const std::string& path, bool try_direct) {
    path_ = path;
    constexpr int kFlags = O_WRONLY | O_CREAT | O_TRUNC;
    if (try_direct) {
      // O_DIRECT refused (tmpfs): buffered writes below.
      if (auto direct = files::Open(path, kFlags | O_DIRECT); direct.ok()) {
        for (uint8_t*& b : buffers_) b = static_cast<uint8_t*>(std::aligned_alloc(kAlign, kBuffer));
        if (buffers_[0] != nullptr && buffers_[1] != nullptr) {
          fd_ = std::move(*direct);
          direct_ = true;
          io_ = std::thread([this] { IoLoop(); });
          return absl::OkStatus();
        }
      }
    }
    ASSIGN_OR_RETURN(fd_, files::Open(path, kFlags));
    return absl::OkStatus();
  }
  absl::Status Write(const void* data, uint64_t size) {
    hash_.Update(data, size);
    written_ += size;
    const uint8_t* p = static_cast<const uint8_t*>(data);
    if (!direct_) return WriteAll(p, size, /*writeback=*/true);
    while (size > 0) {
      const uint64_t n = std::min(size, kBuffer - fill_);
      std::memcpy(buffers_[current_] + fill_, p, n);
      fill_ += n;
      p += n;
      size -= n;
      if (fill_ == kBuffer) RETURN_IF_ERROR(Submit(kBuffer));
    }
    return absl::OkStatus();
  }
  absl::Status Finish() {
    if (direct_) {
      if (fill_ > 0) {
        const uint64_t padded = (fill_ + kAlign - 1) / kAlign * kAlign;
        std::memset(buffers_[current_] + fill_, 0, padded - fill_);
        RETURN_IF_ERROR(Submit(padded));
      }
      RETURN_IF_ERROR(StopIo());
      if (::ftruncate(fd_.get(), static_cast<off_t>(written_)) != 0)
        return ErrnoStatus("truncate " + path_, errno);
    }
    RETURN_IF_ERROR(files::SyncFd(fd_.get(), path_));
    return fd_.Close(path_);
  }
  uint64_t written() const { return written_; }
  std::string HexDigest() { return hash_.HexDigest(); }

 private:
  // Hands the current buffer (`bytes` of it) to the I/O thread and switches to the other,
  // waiting until that one's previous write is done.
  absl::Status Submit(uint64_t bytes) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return pending_bytes_ == 0 || !io_status_.ok(); });
    if (!io_status_.ok()) return io_status_;
    pending_ = current_;
    pending_bytes_ = bytes;
    cv_.notify_all();
    current_ ^= 1;
    fill_ = 0;
    return absl::OkStatus();
  }
  void IoLoop() {
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return pending_bytes_ > 0 || stop_; });
      if (pending_bytes_ == 0) return;  // stopped with nothing left
      const int which = pending_;
      const uint64_t bytes = pending_bytes_;
      lock.unlock();
      absl::Status s = WriteAll(buffers_[which], bytes, false);
      lock.lock();
      if (!s.ok() && io_status_.ok()) io_status_ = s;
      pending_bytes_ = 0;
      cv_.notify_all();
    }
  }
  absl::Status StopIo() {
    if (!io_.joinable()) return io_status_;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return pending_bytes_ == 0; });
      stop_ = true;
      cv_.notify_all();
    }
    io_.join();
    return io_status_;
  }
  absl::Status WriteAll(const uint8_t* p, uint64_t size, bool writeback) {
    while (size > 0) {
      ssize_t n =
          ::pwrite(fd_.get(), p, std::min<uint64_t>(size, 1u << 30), static_cast<off_t>(offset_));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus("write " + path_, errno);
      }
      p += n;
      size -= static_cast<uint64_t>(n);
      offset_ += static_cast<uint64_t>(n);
    }
    if (writeback && offset_ - flushed_ >= kWritebackBytes) {
      ::sync_file_range(fd_.get(), flushed_, offset_ - flushed_, SYNC_FILE_RANGE_WRITE);
      flushed_ = offset_;
    }
    return absl::OkStatus();
  }

  std::string path_;
  files::UniqueFd fd_;
  bool direct_ = false;
  uint8_t* buffers_[2] = {nullptr, nullptr};  // aligned staging buffers (O_DIRECT only)
  int current_ = 0;                           // the buffer being filled
  uint64_t fill_ = 0;
  uint64_t written_ = 0;  // logical bytes
  uint64_t offset_ = 0;   // bytes handed to the kernel (padded with O_DIRECT); I/O thread's
  uint64_t flushed_ = 0;
  io::Sha256 hash_;
  // The I/O thread's hand-off: at most one buffer in flight.
  std::thread io_;
  std::mutex mu_;
  std::condition_variable cv_;
  int pending_ = 0;
  uint64_t pending_bytes_ = 0;
  bool stop_ = false;
  absl::Status io_status_;
};

struct Job {
  size_t tensor;  // index into the caller's list
  int64_t begin, end;
  bool first, last;
};

// Writes one shard: a worker thread fills chunks (and hashes each tensor's bytes) into a
// ring of slots while this thread writes them out and hashes the file.
absl::Status WriteShard(const std::string& path, const std::vector<OutputTensor>& tensors,
                        std::vector<size_t> members, const ChunkFiller& fill,
                        const StreamWriterOptions& options, size_t* tensors_done,
                        io::ManifestFile* record) {
  std::vector<const OutputTensor*> order;
  for (size_t i : members) order.push_back(&tensors[i]);
  const std::string header = ShardHeader(order);
  std::vector<Job> jobs;
  for (const OutputTensor* t : order) {
    const size_t index = static_cast<size_t>(t - tensors.data());
    const int64_t step =
        std::max<int64_t>(1, static_cast<int64_t>(options.chunk_bytes) / io::DtypeSize(t->dtype));
    const int64_t n = t->numel();
    if (n == 0) {
      jobs.push_back({index, 0, 0, true, true});
      continue;
    }
    for (int64_t b = 0; b < n; b += step)
      jobs.push_back({index, b, std::min(n, b + step), b == 0, b + step >= n});
  }

  FileOut file;
  RETURN_IF_ERROR(file.Open(path, options.direct_io));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  RETURN_IF_ERROR(file.Write(len, 8));
  RETURN_IF_ERROR(file.Write(header.data(), header.size()));

  std::vector<std::vector<uint8_t>> slots(kSlots);
  std::mutex mu;
  std::condition_variable cv;
  size_t produced = 0, consumed = 0;
  bool abort = false;
  absl::Status worker_status;
  std::map<std::string, std::string> tensor_sha;

  std::thread worker([&] {
    io::Sha256 tensor_hash;
    for (size_t j = 0; j < jobs.size(); ++j) {
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return abort || j - consumed < kSlots; });
        if (abort) return;
      }
      const Job& job = jobs[j];
      const OutputTensor& t = tensors[job.tensor];
      std::vector<uint8_t>& slot = slots[j % kSlots];
      slot.resize(static_cast<size_t>(job.end - job.begin) * io::DtypeSize(t.dtype));
      absl::Status s = fill(job.tensor, job.begin, job.end, job.first, slot.data());
      if (options.tensor_hashes) {
        if (job.first) tensor_hash = io::Sha256();
        tensor_hash.Update(slot.data(), slot.size());
      }
      std::lock_guard lock(mu);
      if (!s.ok()) {
        worker_status = s;
        abort = true;
        cv.notify_all();
        return;
      }
      if (job.last && options.tensor_hashes) tensor_sha[t.name] = tensor_hash.HexDigest();
      ++produced;
      cv.notify_all();
    }
  });

  absl::Status status;
  for (size_t j = 0; j < jobs.size() && status.ok(); ++j) {
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return abort || produced > j; });
      if (produced <= j) break;  // the worker failed
    }
    const std::vector<uint8_t>& slot = slots[j % kSlots];
    status = file.Write(slot.data(), slot.size());
    if (jobs[j].last && options.on_tensor) options.on_tensor(++*tensors_done);
    std::lock_guard lock(mu);
    ++consumed;
    cv.notify_all();
  }
  {
    std::lock_guard lock(mu);
    if (!status.ok()) abort = true;
    cv.notify_all();
  }
  worker.join();
  RETURN_IF_ERROR(worker_status);
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(file.Finish());
  record->bytes = file.written();
  record->sha256 = file.HexDigest();
  record->tensor_sha256 = std::move(tensor_sha);
  return absl::OkStatus();
}

absl::Status RecordFile(const std::string& staging, const std::string& name, io::Manifest& m) {
  uint64_t bytes = 0;
  ASSIGN_OR_RETURN(std::string sha, io::Sha256File(Join(staging, name), &bytes));
  m.files[name] = io::ManifestFile{sha, bytes, {}};
  return absl::OkStatus();
}

absl::Status WriteStaging(const std::string& staging, const std::vector<OutputTensor>& tensors,
                          const ChunkFiller& fill, const StreamWriterOptions& options) {
  io::Manifest manifest;
  // Shards: tensors in name order, a new shard when the next would pass the limit.
  std::vector<size_t> by_name(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) by_name[i] = i;
  std::sort(by_name.begin(), by_name.end(),
            [&](size_t a, size_t b) { return tensors[a].name < tensors[b].name; });
  for (size_t i = 1; i < by_name.size(); ++i) {
    if (tensors[by_name[i]].name == tensors[by_name[i - 1]].name) {
      return absl::InvalidArgumentError("output tensor " + Quote(tensors[by_name[i]].name) +
                                        " is produced twice");
    }
  }
  std::vector<std::vector<size_t>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (size_t i : by_name) {
    const uint64_t n = tensors[i].nbytes();
    if (!shards.back().empty() && shard_bytes + n > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(i);
    shard_bytes += n;
    total_bytes += n;
  }
  const size_t count = shards.size();
  nlohmann::json weight_map = nlohmann::json::object();
  size_t tensors_done = 0;
  for (size_t s = 0; s < count; ++s) {
    const std::string file = count == 1
                                 ? std::string(kSingleFile)
                                 : absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, count);
    for (size_t i : shards[s]) weight_map[tensors[i].name] = file;
    io::ManifestFile record;
    RETURN_IF_ERROR(
        WriteShard(Join(staging, file), tensors, shards[s], fill, options, &tensors_done, &record));
    manifest.files[file] = std::move(record);
    if (s == 0 && options.after_first_shard_for_test) options.after_first_shard_for_test();
  }
  if (count > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}},
                            {"weight_map", weight_map}};
    RETURN_IF_ERROR(io::WriteFileSynced(Join(staging, kIndexFile), index.dump(2) + "\n"));
    RETURN_IF_ERROR(RecordFile(staging, kIndexFile, manifest));
  }
  for (const auto& [name, contents] : options.files) {
    RETURN_IF_ERROR(io::WriteFileSynced(Join(staging, name), contents));
    RETURN_IF_ERROR(RecordFile(staging, name, manifest));
  }
  if (!options.carry_from.empty()) {
    for (const char* name : io::kCarriedFiles) {
      const std::string from = Join(options.carry_from, name);
      if (options.files.count(name) || !io::PathExists(from)) continue;
      RETURN_IF_ERROR(io::CopyFileSynced(from, Join(staging, name)));
      RETURN_IF_ERROR(RecordFile(staging, name, manifest));
    }
  }
  for (const std::string& parent : options.parents) {
    io::ManifestParent p{parent, ""};
    const std::string parent_manifest = Join(parent, io::kManifestName);
    if (io::PathExists(parent_manifest)) {
      ASSIGN_OR_RETURN(p.manifest_sha256, io::Sha256File(parent_manifest));
    }
    manifest.parents.push_back(std::move(p));
  }
  manifest.producer = options.producer;
  manifest.created_ms = CreatedMs(options.created_ms);
  return io::WriteFileSynced(Join(staging, io::kManifestName),
                             io::ManifestToJson(manifest).dump(2) + "\n");
}

}  // namespace

int64_t OutputTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t OutputTensor::nbytes() const {
  return static_cast<uint64_t>(numel()) * static_cast<uint64_t>(io::DtypeSize(dtype));
}

absl::StatusOr<std::unique_ptr<SourceCheckpoint>> SourceCheckpoint::Open(
    const std::string& dir_in) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  auto ckpt = std::unique_ptr<SourceCheckpoint>(new SourceCheckpoint());
  ckpt->dir_ = dir;
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(dir + ": no such checkpoint directory");
  }
  if (io::PathExists(Join(dir, "config.json"))) {
    ASSIGN_OR_RETURN(ckpt->config_, ReadJson(Join(dir, "config.json")));
  }
  std::vector<std::string> files;
  const std::string index_path = Join(dir, kIndexFile);
  nlohmann::json weight_map;
  if (io::PathExists(index_path)) {
    ASSIGN_OR_RETURN(nlohmann::json index, ReadJson(index_path));
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError(index_path + ": no \"weight_map\" object");
    }
    weight_map = index["weight_map"];
    for (const auto& [name, file] : weight_map.items()) {
      if (!file.is_string())
        return absl::InvalidArgumentError(index_path + ": weight_map[" + Quote(name) +
                                          "] is not a string");
      if (std::find(files.begin(), files.end(), file.get<std::string>()) == files.end()) {
        files.push_back(file.get<std::string>());
      }
    }
  } else if (io::PathExists(Join(dir, kSingleFile))) {
    files.push_back(kSingleFile);
  } else {
    return absl::NotFoundError(dir + ": no model.safetensors or model.safetensors.index.json");
  }
  std::sort(files.begin(), files.end());
  for (const std::string& name : files) {
    ASSIGN_OR_RETURN(auto file, io::SafetensorsFile::Open(Join(dir, name)));
    for (const io::TensorInfo& info : file->tensors()) {
      if (!weight_map.is_null()) {
        auto it = weight_map.find(info.name);
        if (it == weight_map.end() || it->get<std::string>() != name) continue;  // not indexed here
      }
      if (!ckpt->tensors_.emplace(info.name, Tensor{&info, file->Data(info)}).second) {
        return absl::DataLossError(
            absl::StrCat(dir, ": tensor ", Quote(info.name), " is in two files"));
      }
    }
    ckpt->files_.push_back(std::move(file));
  }
  if (!weight_map.is_null()) {
    for (const auto& [name, file] : weight_map.items()) {
      if (!ckpt->tensors_.count(name)) {
        return absl::DataLossError(absl::StrCat(Join(dir, file.get<std::string>()),
                                                ": missing tensor ", Quote(name), " named by ",
                                                kIndexFile));
      }
    }
  }
  for (const auto& [name, t] : ckpt->tensors_) ckpt->names_.push_back(name);
  return ckpt;
}

SourceCheckpoint::Tensor SourceCheckpoint::Find(absl::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? Tensor{} : it->second;
}

void SourceCheckpoint::Release(const uint8_t* data, uint64_t bytes) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  uintptr_t begin = reinterpret_cast<uintptr_t>(data) & ~(page - 1);
  uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(page - 1);
  // The mapping is private and never written, so dropping pages (even ones shared with a
  // neighbouring tensor) only costs a re-fault from the page cache.
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

void SourceCheckpoint::Prefetch(const uint8_t* data, uint64_t bytes) {
#ifdef MADV_POPULATE_READ
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  uintptr_t begin = reinterpret_cast<uintptr_t>(data) & ~(page - 1);
  uintptr_t end = reinterpret_cast<uintptr_t>(data) + bytes;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ);
#endif
}

absl::Status WriteCheckpoint(const std::string& out_in, const std::vector<OutputTensor>& tensors,
                             const ChunkFiller& fill, const StreamWriterOptions& options) {
  std::string out = out_in;
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  if (out.empty()) return absl::InvalidArgumentError("output path is empty");
  if (options.max_shard_bytes == 0)
    return absl::InvalidArgumentError("shard size must be positive");
  // Refuses an existing `out` (unless overwrite, and then only one Stemma wrote), removes
  // staging directories of dead writers, creates `<out>.tmp-<pid>` (engine/io/durable.h).
  ASSIGN_OR_RETURN(const std::string staging, io::CreateStagingDir(out, options.overwrite));
  absl::Status s = WriteStaging(staging, tensors, fill, options);
  if (s.ok()) s = io::PublishDir(staging, out, options.overwrite);
  if (!s.ok()) io::RemoveTree(staging).IgnoreError();
  return s;
}

}  // namespace stemma::engine::merge
