#include "worker/job_confinement.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/landlock.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

extern char** environ;

namespace stemma::worker {
namespace {

constexpr uint64_t kRead = LANDLOCK_ACCESS_FS_READ_FILE;

bool AllowBeneath(int ruleset, int dir_fd, const char* name) {
  const int fd = openat(dir_fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  bool ok = false;
  // A symbolic link is never a rule: what it names is reached, and checked, at its target.
  if (fstat(fd, &st) == 0 && !S_ISLNK(st.st_mode)) {
    struct landlock_path_beneath_attr rule = {.allowed_access = kRead, .parent_fd = fd};
    ok = syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0) == 0;
  }
  close(fd);
  return ok;
}

// Every entry of `dir` but `except`.
absl::Status AllowEntriesBut(int ruleset, const std::string& dir, const std::string& except) {
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return absl::NotFoundError(absl::StrCat(dir, ": ", strerror(errno)));
  DIR* d = fdopendir(dup(dir_fd));
  if (d == nullptr) {
    close(dir_fd);
    return absl::InternalError(absl::StrCat(dir, ": ", strerror(errno)));
  }
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == ".." || name == except) continue;
    if (!AllowBeneath(ruleset, dir_fd, e->d_name)) {
      spdlog::debug("job confinement: no read rule for {}/{}", dir, name);
    }
  }
  closedir(d);
  close(dir_fd);
  return absl::OkStatus();
}

bool Inside(const std::string& path, const std::string& dir) {
  if (dir == "/") return true;
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
         path[dir.size()] == '/';
}

}  // namespace

int LandlockAbi() {
  const long abi =
      syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  return abi < 0 ? 0 : static_cast<int>(abi);
}

absl::StatusOr<int> MakeJobRuleset(
    const std::string& secret_file,
    const std::vector<std::pair<std::string, std::string>>& job_dirs) {
  std::string secret;
  if (!secret_file.empty()) {
    std::error_code ec;
    secret = std::filesystem::canonical(secret_file, ec).string();
    if (ec) return absl::NotFoundError(absl::StrCat(secret_file, ": ", ec.message()));
    for (const auto& [flag, dir] : job_dirs) {
      const std::string real = std::filesystem::weakly_canonical(dir, ec).string();
      if (!ec && Inside(secret, real)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--token-file ", secret_file, " lies inside ", flag, " ", dir,
            ": jobs read that directory, so they could read the token; keep the token file "
            "in a directory of its own"));
      }
    }
  }
  if (LandlockAbi() < 1) {
    return absl::UnimplementedError("this kernel has no Landlock (or it is disabled)");
  }
  struct landlock_ruleset_attr attr = {.handled_access_fs = kRead};
  const int ruleset = static_cast<int>(
      syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0));  // O_CLOEXEC by the kernel
  if (ruleset < 0) return absl::InternalError(absl::StrCat("landlock: ", strerror(errno)));
  absl::Status st;
  if (secret.empty()) {
    const int root = open("/", O_PATH | O_CLOEXEC);
    struct landlock_path_beneath_attr rule = {.allowed_access = kRead, .parent_fd = root};
    if (syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0) != 0) {
      st = absl::InternalError(absl::StrCat("landlock: a rule for /: ", strerror(errno)));
    }
    close(root);
  } else {
    // /a/b/token: every entry of / but a, of /a but b, of /a/b but token.
    std::string dir = "/";
    size_t at = 1;
    while (st.ok() && at <= secret.size()) {
      size_t end = secret.find('/', at);
      if (end == std::string::npos) end = secret.size();
      const std::string step = secret.substr(at, end - at);
      st = AllowEntriesBut(ruleset, dir, step);
      dir = secret.substr(0, end);
      at = end + 1;
    }
  }
  if (!st.ok()) {
    close(ruleset);
    return st;
  }
  return ruleset;
}

absl::Status HideFileFromJobs(const std::string& path) {
  std::error_code ec;
  const std::string real = std::filesystem::canonical(path, ec).string();
  if (ec) return absl::NotFoundError(absl::StrCat(path, ": ", ec.message()));
  if (unshare(CLONE_NEWNS) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("unshare(CLONE_NEWNS): ", strerror(errno)));
  }
  // Slave: mounts the host makes later still reach this namespace; this one's never leave.
  if (mount("none", "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0) {
    return absl::InternalError(absl::StrCat("mount --make-rslave /: ", strerror(errno)));
  }
  if (mount("/dev/null", real.c_str(), nullptr, MS_BIND, nullptr) != 0) {
    return absl::InternalError(absl::StrCat("bind /dev/null over ", real, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

std::string TakeEnvironmentSecret(const char* name) {
  const char* value = getenv(name);
  if (value == nullptr) return "";
  std::string secret = value;
  const size_t len = strlen(name);
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (strncmp(*e, name, len) == 0 && (*e)[len] == '=') {
      // The original block (the stack the kernel set up) is what /proc/PID/environ reads.
      memset(*e + len + 1, 0, strlen(*e + len + 1));
    }
  }
  unsetenv(name);
  return secret;
}

}  // namespace stemma::worker
