// Durable file helpers for checkpoint publishing. Every error names the path.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stemma::engine::io {

// Creates or truncates `path`, writes `contents`, fsyncs, closes.
absl::Status WriteFileSynced(const std::string& path, absl::string_view contents);
// Copies `from` to `to` (created or truncated) and fsyncs `to`.
absl::Status CopyFileSynced(const std::string& from, const std::string& to);
// fsync on a directory, so the names created in it survive a crash.
absl::Status SyncDir(const std::string& dir);
absl::StatusOr<std::string> ReadFile(const std::string& path);
bool PathExists(const std::string& path);
// Removes a file or a directory tree; a missing path is OK.
absl::Status RemoveTree(const std::string& path);

}  // namespace stemma::engine::io
