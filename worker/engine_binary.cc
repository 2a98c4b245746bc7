#include "worker/engine_binary.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/engine_front.h"
#include "common/files.h"
#include "common/sha256.h"
#include "common/status.h"
#include "worker/spawn_plan.h"

namespace stemma::worker {
namespace {

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::string SelfDir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "" : exe.parent_path().string();
}

}  // namespace

std::string FindEngine(const std::string& engine_path) {
  if (!engine_path.empty()) return IsExecutableFile(engine_path) ? engine_path : "";
  if (const std::string beside = SelfDir() + "/stemma-engine"; IsExecutableFile(beside)) {
    return beside;
  }
  const char* path = std::getenv("PATH");
  return FindInPath("stemma-engine", path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin",
                    IsExecutableFile);
}

std::string EngineBuildId(const std::string& engine) {
  if (engine.empty()) return "";
  absl::StatusOr<files::UniqueFd> fd = files::Open(engine, O_RDONLY);
  if (!fd.ok()) return "";
  // Hashes of 1 MiB blocks, hashed again: the id of the binary's bytes.
  std::string blocks, buf(1 << 20, '\0');
  for (;;) {
    size_t filled = 0;
    while (filled < buf.size()) {
      const ssize_t n = ::read(fd->get(), buf.data() + filled, buf.size() - filled);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return "";
      if (n == 0) break;
      filled += static_cast<size_t>(n);
    }
    if (filled == 0) break;
    blocks += Sha256Hex(absl::string_view(buf.data(), filled));
    if (filled < buf.size()) break;
  }
  return "sha256:" + Sha256Hex(blocks).substr(0, 16);
}

absl::Status CheckEngine(const std::string& engine) {
  if (engine.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::string bytes, files::ReadFile(engine));
  if (bytes.find(engine_front::kFrontMarker) == std::string::npos) return absl::OkStatus();
  std::error_code ec;
  const std::filesystem::path resolved = std::filesystem::canonical(engine, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(engine, ": ", ec.message()));
  const std::string torch =
      (resolved.parent_path() / std::string(engine_front::kTorchEngineName)).string();
  if (IsExecutableFile(torch)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the engine ", engine, " is stemma-engine's torch-free front, which runs ", torch,
      " for every engine job but a fully cached eval, and ", torch,
      ::access(torch.c_str(), F_OK) == 0 ? " is not an executable file" : " does not exist",
      ": install stemma-engine-torch beside it (both binaries ship together), or give "
      "--engine a complete engine"));
}

}  // namespace stemma::worker
