// The engine's policy over the files door (common/files.h, where the crash rules are
// written once; docs/engine-io.md § Durability): every directory the engine publishes
// (checkpoints, datasets) and every file it must not leave half-written goes through here:
//
//   - a directory is built in a staging directory `<out>.tmp-<pid>` beside `out`, every file
//     in it and the directory itself fsynced, then renamed onto `out` and the parent
//     fsynced. Replacing an existing `out` swaps the two atomically (RENAME_EXCHANGE), so
//     at every instant `out` is the old directory or the new one, never missing or mixed;
//   - `overwrite` replaces only a directory Stemma wrote (its stemma.json parses, or it is a
//     token dataset with its index.json), never an arbitrary directory, a symlink or a
//     regular file;
//   - a file is written to `<path>.tmp-<pid>`, fsynced, renamed, and its directory fsynced.
//
// Errors are absl::Status naming the path (errno converted once, common/status.h).
// Thread-safety: the functions are safe to call concurrently on different paths.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/files.h"

namespace stemma::engine::io {

// The files that travel with the weights into a checkpoint derived from another (a trained,
// merged or reverted model keeps its base's config and tokenizer): copied, when present and
// not written anew, by io::CheckpointWriter (source_dir) and merge's streaming writer
// (carry_from). One list, so the two writers cannot drift apart.
inline constexpr const char* kCarriedFiles[] = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
};

// `<out>.tmp-<pid>` for this process.
std::string StagingDirFor(const std::string& out);

// OK when `out` is missing, or is a directory that `overwrite` may replace: one holding a
// stemma.json manifest that parses, a token dataset (index.json with format
// stemma-tokens-*), or a prepared corpus (manifest.json with format stemma.corpus/*).
// FailedPrecondition naming `out` otherwise (a regular file, a symlink, any other directory).
absl::Status CheckReplaceable(const std::string& out);

// Before any work: AlreadyExists when `out` exists and !overwrite; FailedPrecondition when
// it exists and is not replaceable (CheckReplaceable); removes staging directories of `out`
// left by processes that are gone; creates an empty StagingDirFor(out) (an old one of this
// pid is removed first) and returns its path.
absl::StatusOr<std::string> CreateStagingDir(const std::string& out, bool overwrite);

// Publishes the complete directory `staging` as `out` (files::PublishDir): fsyncs every
// regular file in it and the directory, renames it onto `out` (RENAME_NOREPLACE,
// AlreadyExists unless overwrite; with overwrite an existing replaceable `out` is swapped
// with RENAME_EXCHANGE and the old one removed afterwards), then fsyncs the parent. On error
// `staging` is left for the caller to remove; `out` is untouched unless the swap happened.
absl::Status PublishDir(const std::string& staging, const std::string& out, bool overwrite);

// Writes `contents` to `path` atomically: `<path>.tmp-<pid>`, fsync, rename, fsync of the
// directory. A reader sees the old file or the new one, never a prefix (common/files.h).
using ::stemma::files::WriteFileAtomic;

// A whole file mapped read-only (MAP_PRIVATE; `writable` makes the private mapping
// writable, copy-on-write, for callers that hand the bytes to code that may write them).
// Immutable after Open; thread-safe. An empty file maps to data() == nullptr, size() 0.
class MappedFile {
 public:
  // NotFound / errno statuses naming the path.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path,
                                                          bool writable = false);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  MappedFile() = default;
  std::string path_;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// Crash tests: when $STEMMA_IO_CRASH_AT equals `point`, the process kills itself (SIGKILL,
// no cleanup) right there. The points: "publish:before-rename", "publish:after-swap"
// (replaced, the old directory not yet removed), "write-file:before-rename" (common/files.h).
using ::stemma::files::CrashPointForTest;

}  // namespace stemma::engine::io
