// The coordinator's door to artifact files: manifest hashes, deep verification and removal.
// Hashes through common/sha256.h (Sha256File). Thread-safe (no state); every function
// reads or changes the file system, so none may run under the core mutex.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/sha256.h"
#include "stemma/v1/user_service.pb.h"

namespace stemma::coordinator {

// The file whose sha256 is an artifact's manifest hash (manifest::ManifestPathOf):
// <path>/stemma.json for a directory (checkpoint, dataset), <path>/manifest.json for a
// prepared corpus, <path>/index.json for a token dataset without stemma.json, the file
// itself otherwise.
std::string ManifestFile(const std::string& path);

// The text of the manifest that stands for the artifact at `path` in a memoization key (an
// engine job's, memoization.h, and an exec job's, exec_cache_key.h): ManifestFile(path), so a
// token dataset without stemma.json is its index.json, which lists every shard's sha256.
// nullopt when the file cannot be read, is not a regular file, or is over 64 MiB.
std::optional<std::string> ReadArtifactManifest(const std::string& path);

// Whether the artifact at `path` is still there as its manifest says, by sizes only (a stat
// per listed file): a file exists; a directory has a readable manifest (ReadArtifactManifest)
// and every file it lists (stemma.json's `files: {name: {bytes}}`, a corpus manifest's
// `files: [{path, bytes}]`) with the size it records. A truncated or deleted shard is caught;
// a same-size corruption needs VerifyArtifactFiles.
bool ArtifactFilesPresent(const std::string& path);

struct ManifestCheck {
  v1::Verification result = v1::UNCHECKED;
  std::string detail;  // what differed or could not be read
  // The files as they were when the part reported them (StampFiles), kept with the artifact.
  std::vector<v1::FileStamp> files;
};
// Compares the manifest's sha256 with `expected`: VERIFIED, MISMATCH or UNREADABLE.
ManifestCheck CheckManifest(const std::string& path, const std::string& expected);

struct DeepCheck {
  ManifestCheck manifest;
  std::vector<std::string> problems;  // one line per file missing or different
  int files_checked = 0;
};
// The manifest check, then (for directories) every file the manifest lists: present, of
// its recorded size, with its recorded sha256; for a corpus also its content_hash; for a
// token dataset every shard and index.bin its index.json lists.
DeepCheck VerifyArtifactFiles(const std::string& path, const std::string& expected);

// Every regular file below `path` (or `path` itself when it is a file) as lstat(2) sees it,
// sorted by relative path; symlinks are listed, not followed. Empty when the path cannot be
// read or holds more than 100,000 files.
std::vector<v1::FileStamp> StampFiles(const std::string& path);
// True when `now` lists the same files with the same size, mtime, ctime and inode.
bool SameStamps(const google::protobuf::RepeatedPtrField<v1::FileStamp>& then,
                const std::vector<v1::FileStamp>& now);

// Removes an artifact's directory or file. OK when it is already gone.
absl::Status RemoveArtifactFiles(const std::string& path);

}  // namespace stemma::coordinator
