#include "engine/data/text_input.h"

#include <fcntl.h>
#include <glob.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status.h"

namespace stemma::engine::data {
namespace {

constexpr size_t kChunk = 1 << 20;

class PlainReader : public LineReader {
 public:
  PlainReader(files::UniqueFd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}

 protected:
  size_t Read(char* buffer, size_t size) override {
    while (true) {
      const ssize_t n = ::read(fd_.get(), buffer, size);
      if (n >= 0) return static_cast<size_t>(n);
      if (errno == EINTR) continue;
      status_ = absl::DataLossError(absl::StrCat("read ", path_, ": ", std::strerror(errno)));
      return 0;
    }
  }

 private:
  files::UniqueFd fd_;
  std::string path_;
};

// Compressed bytes from the file, decoded by a codec in Decode().
class CompressedReader : public LineReader {
 public:
  CompressedReader(files::UniqueFd fd, std::string path)
      : fd_(std::move(fd)), path_(std::move(path)), in_(kChunk, '\0') {}

 protected:
  // Refills in_ when it is used up; false at the end of the file (or on error).
  bool Fill() {
    if (in_pos_ < in_len_) return true;
    while (true) {
      const ssize_t n = ::read(fd_.get(), in_.data(), in_.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        status_ = absl::DataLossError(absl::StrCat("read ", path_, ": ", std::strerror(errno)));
        return false;
      }
      in_pos_ = 0;
      in_len_ = static_cast<size_t>(n);
      return n > 0;
    }
  }
  void Corrupt(absl::string_view codec, absl::string_view why) {
    status_ = absl::DataLossError(
        absl::StrCat(path_, ": corrupt or truncated ", codec, " data (", why, ")"));
  }

  files::UniqueFd fd_;
  std::string path_;
  std::string in_;
  size_t in_pos_ = 0;
  size_t in_len_ = 0;
};

class GzipReader : public CompressedReader {
 public:
  using CompressedReader::CompressedReader;
  ~GzipReader() override {
    if (initialised_) inflateEnd(&z_);
  }

 protected:
  size_t Read(char* buffer, size_t size) override {
    if (!initialised_) {
      std::memset(&z_, 0, sizeof(z_));
      if (inflateInit2(&z_, 16 + MAX_WBITS) != Z_OK) {
        Corrupt("gzip", "inflateInit2 failed");
        return 0;
      }
      initialised_ = true;
    }
    while (true) {
      if (!Fill()) {
        if (status_.ok() && in_member_) Corrupt("gzip", "unexpected end of file");
        return 0;
      }
      z_.next_in = reinterpret_cast<Bytef*>(in_.data() + in_pos_);
      z_.avail_in = static_cast<uInt>(in_len_ - in_pos_);
      z_.next_out = reinterpret_cast<Bytef*>(buffer);
      z_.avail_out = static_cast<uInt>(size);
      const int rc = inflate(&z_, Z_NO_FLUSH);
      in_pos_ = in_len_ - z_.avail_in;
      in_member_ = true;
      if (rc == Z_STREAM_END) {
        inflateReset(&z_);  // another member may follow (concatenated .gz files)
        in_member_ = false;
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        Corrupt("gzip", z_.msg != nullptr ? z_.msg : "inflate failed");
        return 0;
      }
      const size_t produced = size - z_.avail_out;
      if (produced > 0) return produced;
    }
  }

 private:
  z_stream z_;
  bool initialised_ = false;
  bool in_member_ = false;
};

class ZstdReader : public CompressedReader {
 public:
  using CompressedReader::CompressedReader;
  ~ZstdReader() override { ZSTD_freeDCtx(ctx_); }

 protected:
  size_t Read(char* buffer, size_t size) override {
    if (ctx_ == nullptr) ctx_ = ZSTD_createDCtx();
    while (true) {
      if (!Fill()) {
        if (status_.ok() && pending_ != 0) Corrupt("zstd", "unexpected end of file");
        return 0;
      }
      ZSTD_inBuffer in{in_.data(), in_len_, in_pos_};
      ZSTD_outBuffer out{buffer, size, 0};
      pending_ = ZSTD_decompressStream(ctx_, &out, &in);
      if (ZSTD_isError(pending_)) {
        Corrupt("zstd", ZSTD_getErrorName(pending_));
        return 0;
      }
      in_pos_ = in.pos;
      if (out.pos > 0) return out.pos;
    }
  }

 private:
  ZSTD_DCtx* ctx_ = nullptr;
  size_t pending_ = 0;  // 0: at a frame boundary
};

absl::StatusOr<std::string> Magic(int fd, const std::string& path) {
  char head[4] = {};
  const ssize_t n = ::pread(fd, head, sizeof(head), 0);
  if (n < 0) return ErrnoStatus(absl::StrCat("read ", path), errno);
  const std::string_view h(head, static_cast<size_t>(n));
  if (h.size() >= 2 && static_cast<unsigned char>(h[0]) == 0x1f &&
      static_cast<unsigned char>(h[1]) == 0x8b)
    return std::string("gzip");
  if (h == std::string_view("\x28\xb5\x2f\xfd", 4)) return std::string("zstd");
  return std::string();
}

}  // namespace

bool IsGlob(std::string_view path) { return path.find_first_of("*?[") != std::string_view::npos; }

absl::StatusOr<std::vector<std::string>> ExpandInputs(const std::vector<std::string>& inputs,
                                                      absl::string_view what) {
  std::vector<std::string> out;
  for (const std::string& input : inputs) {
    if (!IsGlob(input)) {
      out.push_back(input);
      continue;
    }
    glob_t g;
    std::memset(&g, 0, sizeof(g));
    // Unreadable or missing directories on the way match nothing (then: no file matches).
    const int rc = ::glob(input.c_str(), 0, nullptr, &g);
    std::vector<std::string> matched;
    for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) {
      std::error_code ec;
      if (std::filesystem::is_regular_file(g.gl_pathv[i], ec)) matched.emplace_back(g.gl_pathv[i]);
    }
    globfree(&g);
    if (rc != 0 && rc != GLOB_NOMATCH) {
      return absl::PermissionDeniedError(
          absl::StrCat(what, " ", input, ": cannot read a directory"));
    }
    if (matched.empty()) {
      return absl::NotFoundError(absl::StrCat(what, " ", input, ": no file matches"));
    }
    std::sort(matched.begin(), matched.end());
    out.insert(out.end(), matched.begin(), matched.end());
  }
  return out;
}

absl::StatusOr<std::string> CompressionOf(const std::string& path) {
  ASSIGN_OR_RETURN(files::UniqueFd fd, files::Open(path, O_RDONLY));
  return Magic(fd.get(), path);
}

absl::StatusOr<std::unique_ptr<LineReader>> LineReader::Open(const std::string& path) {
  ASSIGN_OR_RETURN(files::UniqueFd fd, files::Open(path, O_RDONLY));
  ASSIGN_OR_RETURN(std::string codec, Magic(fd.get(), path));
  if (codec == "gzip") return std::unique_ptr<LineReader>(new GzipReader(std::move(fd), path));
  if (codec == "zstd") return std::unique_ptr<LineReader>(new ZstdReader(std::move(fd), path));
  return std::unique_ptr<LineReader>(new PlainReader(std::move(fd), path));
}

bool LineReader::Next(std::string* line) {
  while (true) {
    const size_t nl = buffer_.find('\n', start_);
    if (nl != std::string::npos) {
      line->assign(buffer_, start_, nl - start_);
      start_ = nl + 1;
      return true;
    }
    if (eof_ || !status_.ok()) {
      if (!status_.ok() || start_ >= buffer_.size()) return false;
      line->assign(buffer_, start_, std::string::npos);  // a last line without "\n"
      start_ = buffer_.size();
      return true;
    }
    buffer_.erase(0, start_);
    start_ = 0;
    const size_t old = buffer_.size();
    buffer_.resize(old + kChunk);
    const size_t n = Read(buffer_.data() + old, kChunk);
    buffer_.resize(old + n);
    if (n == 0) eof_ = true;
  }
}

absl::StatusOr<std::string> LineReader::ReadRest() {
  std::string all = buffer_.substr(start_);
  buffer_.clear();
  start_ = 0;
  while (!eof_ && status_.ok()) {
    const size_t old = all.size();
    all.resize(old + kChunk);
    const size_t n = Read(all.data() + old, kChunk);
    all.resize(old + n);
    if (n == 0) eof_ = true;
  }
  RETURN_IF_ERROR(status_);
  return all;
}

absl::StatusOr<std::string> ReadDecompressed(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<LineReader> reader, LineReader::Open(path));
  return reader->ReadRest();
}

}  // namespace stemma::engine::data
