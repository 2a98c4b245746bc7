// The engine's names for the file helpers of the one files door (common/files.h), kept so
// that engine code reads `io::ReadFile`. Every error names the path.
#pragma once

#include "common/files.h"

namespace stemma::engine::io {

using ::stemma::files::CopyFileSynced;
using ::stemma::files::PathExists;
using ::stemma::files::ReadFile;
using ::stemma::files::RemoveTree;
using ::stemma::files::SyncDir;
using ::stemma::files::UniqueFd;
using ::stemma::files::WriteFileSynced;

}  // namespace stemma::engine::io
