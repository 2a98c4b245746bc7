// The inputs of `tokenize` and `prepare` as people have them (docs/data-format.md § Inputs):
// plain, gzip- or zstd-compressed text and JSONL (told apart by the file's first bytes, not
// its name, so `a.txt.gz`, `a.jsonl.zst` and a renamed file all read), Parquet files (one
// string column; Apache Arrow's C++ reader, from the pyarrow wheel as LibTorch comes from the
// torch wheel), and glob patterns. Errors name the file (and pattern, column, row).
// Plain C++: no LibTorch. Thread-compatible (one reader per thread).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stemma::engine::data {

// Expands each input that holds a glob character (`*`, `?`, `[`) to the files it matches,
// sorted by name (directories left out); other inputs are kept as given, in order. A pattern
// that matches no file is NotFound naming `what` and the pattern ("--input raw/*.txt: no
// file matches"). Duplicates are kept (a file named twice is read twice, as before).
absl::StatusOr<std::vector<std::string>> ExpandInputs(const std::vector<std::string>& inputs,
                                                      absl::string_view what);

// True when `path` holds a glob character.
bool IsGlob(std::string_view path);

// How a file's bytes are stored: "" (plain), "gzip" or "zstd", from its magic bytes.
absl::StatusOr<std::string> CompressionOf(const std::string& path);

// The lines of a file, decompressed on the fly when it is gzip (concatenated members too)
// or zstd (concatenated frames too). Lines come without their "\n"; a trailing "\r" is kept
// (callers strip it). A truncated or corrupt compressed file is DataLoss naming the path.
class LineReader {
 public:
  static absl::StatusOr<std::unique_ptr<LineReader>> Open(const std::string& path);
  virtual ~LineReader() = default;

  // The next line; false at the end of the file or after an error (see status()).
  bool Next(std::string* line);
  // Every byte not yet returned by Next, decompressed.
  absl::StatusOr<std::string> ReadRest();
  const absl::Status& status() const { return status_; }

 protected:
  LineReader() = default;
  // Up to `size` decompressed bytes into `buffer`; 0 at the end. Errors: set status_.
  virtual size_t Read(char* buffer, size_t size) = 0;
  absl::Status status_;

 private:
  std::string buffer_;
  size_t start_ = 0;
  bool eof_ = false;
};

// The whole file, decompressed as LineReader does.
absl::StatusOr<std::string> ReadDecompressed(const std::string& path);

// True when this engine was built with the Parquet reader (pyarrow found at configure time).
bool ParquetSupported();

// Calls `fn(text, row)` for every non-null value of the string column `column` of a Parquet
// file, in row order (row: 1-based, for errors). Errors: the file is not Parquet, the column
// is missing ("x.parquet: no column 'text' (columns: id, content)") or not a string column,
// or this engine has no Parquet reader (Unimplemented, saying how to get one).
absl::Status ForEachParquetString(const std::string& path, const std::string& column,
                                  const std::function<absl::Status(std::string_view, int64_t)>& fn);

}  // namespace stemma::engine::data
